"""`gpu-ops validate` looks and writes nothing, and every name it prints is one `--only` takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gpu_ops.cli.validate import check_names

BIN = Path(sys.executable).parent


def _validate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # No configuration named, no GPU_OPS_HOME or DAGSTER_HOME: the plain defaults, under the
    # user's data folder (HOME beside the working directory), never the working directory.
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_OPS_HOME", "GPU_OPS_CONFIG", "DAGSTER_HOME", "XDG_DATA_HOME")}
    env["HOME"] = str(cwd.parent / f"{cwd.name}-user")
    return subprocess.run([str(BIN / "gpu-ops"), "validate", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_validate_in_an_empty_folder_writes_nothing_there(tmp_path: Path):
    out = _validate(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    data = tmp_path.parent / f"{tmp_path.name}-user" / ".local" / "share" / "gpu_ops"
    assert f"ok   storage: sqlite:///{data / 'costs.db'}" in out.stdout and "does not exist yet" in out.stdout
    assert re.search(rf"ok   checkpoints: {re.escape(str(data / 'checkpoints'))} .*does not exist yet: the first checkpoint creates it", out.stdout), out.stdout
    assert sorted(tmp_path.rglob("*")) == []  # no ./.gpu_ops, no costs.db, no checkpoints folder
    assert not (tmp_path.parent / f"{tmp_path.name}-user").exists()  # nor in the data folder: validate writes nothing


def test_a_folder_that_cannot_be_created_fails_with_a_fix(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    prices = Path(__file__).resolve().parents[2] / "gpu_ops" / "demo" / "prices.yaml"
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(f"storage: {{url: 'sqlite:///file/sub/costs.db'}}\nprices: {prices}\ntraining: {{checkpoint_url: file/ckpt}}\n")
    out = _validate(tmp_path, "--config", str(cfg))
    assert out.returncode == 1
    assert f"FAIL storage: sqlite:///{tmp_path}/file/sub/costs.db does not exist and cannot be created: {blocker} is not a writable folder" in out.stdout
    assert "FAIL checkpoints:" in out.stdout and "fix: make" in out.stdout


def test_a_path_no_file_system_takes_fails_its_check_with_a_fix(tmp_path: Path):
    """A name past the file system's limit was 'the check itself failed: OSError: [Errno 36]'."""
    prices = Path(__file__).resolve().parents[2] / "gpu_ops" / "demo" / "prices.yaml"
    cfg = tmp_path / "gpu_ops.yaml"
    long = "x" * 3000
    cfg.write_text(f"storage: {{url: 'sqlite:///{long}.db'}}\nprices: {prices}\ntraining: {{checkpoint_url: {long}}}\n")
    out = _validate(tmp_path, "--config", str(cfg))
    assert out.returncode == 1 and "the check itself failed" not in out.stdout, out.stdout
    assert f"FAIL storage: sqlite:///{tmp_path}/{long}.db: the name is too long for the file system" in out.stdout
    assert f"FAIL checkpoints: {tmp_path}/{long} (training.checkpoint_url): the name is too long for the file system" in out.stdout
    assert "fix: point training.checkpoint_url at a path the file system takes" in out.stdout


def test_every_printed_check_name_is_what_only_takes(tmp_path: Path):
    out = _validate(tmp_path)
    printed = re.findall(r"^(?:ok  |FAIL|skip) ([a-z_ ]+):", out.stdout, re.M)
    assert printed[0] == "config"
    assert printed[1:] == check_names(), out.stdout  # one line per registered check, under its own name
    for name in ("channels", "usage_sources"):
        one = _validate(tmp_path, "--only", name)
        assert one.returncode == 0 and re.findall(r"^(?:ok  |FAIL|skip) ([a-z_ ]+):", one.stdout, re.M) == ["config", name], one.stdout
    assert sorted(tmp_path.rglob("*")) == []
