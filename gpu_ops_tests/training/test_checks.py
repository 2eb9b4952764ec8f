"""`gpu-ops validate`'s checkpoint check."""

from __future__ import annotations

from pathlib import Path

from gpu_ops.domain.config import parse_config
from gpu_ops.cli.checks.training import check_checkpoints
from gpu_ops.cli.validate import run_checks

PRICES = {"source": "test", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.21}}}


def test_writable_folder_passes(tmp_path: Path) -> None:
    config = parse_config({"prices": PRICES, "training": {"checkpoint_url": "ckpts"}}, tmp_path / "gpu_ops.yaml")
    result = check_checkpoints(config)  # not there yet: judged by its parent, nothing created (validate writes nothing)
    assert result.status == "ok" and f"{tmp_path / 'ckpts'} (training.checkpoint_url) does not exist yet" in result.detail
    assert not (tmp_path / "ckpts").exists()
    (tmp_path / "ckpts").mkdir()  # there: a probe is written, read back and removed
    result = check_checkpoints(config)
    assert result.status == "ok" and str(tmp_path / "ckpts") in result.detail
    assert list((tmp_path / "ckpts").iterdir()) == []  # the probe is gone


def test_unwritable_location_fails_with_a_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = parse_config({"prices": PRICES, "training": {"checkpoint_url": str(blocker / "ckpts")}}, tmp_path / "gpu_ops.yaml")
    result = check_checkpoints(config)
    assert result.failed and "cannot be created" in result.detail and "training.checkpoint_url" in result.fix


def test_registered_with_validate(tmp_path: Path) -> None:
    config = parse_config({"prices": PRICES, "training": {"checkpoint_url": "ckpts"}}, tmp_path / "gpu_ops.yaml")
    assert [r.status for r in run_checks(config, only="checkpoints")] == ["ok"]
