"""Every path setting is checked by `gpu-ops validate`, by name, before anything reads it:
``storage.row_level_path``, ``usage.billing.index_path`` (the CUR index) and a local
``training.checkpoint_url`` (a plain folder or a file:// URL). A folder under a regular
file, a regular file where the folder should be, and a folder this user cannot write
(as a non-root user: root writes anywhere) each fail naming the setting; nothing is
created (validate writes nothing). The CUR index under a regular file also fails the
usage asset with the setting's name, not a raw NotADirectoryError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_ops.domain.config import DEMO_CONFIG

BIN = Path(sys.executable).parent
DEMO = DEMO_CONFIG.parent
SETTINGS = {
    "row_level_path": ("storage.row_level_path", lambda p: {"storage": {"row_level_path": p}}),
    "cur_index": ("usage.billing.index_path", lambda p: {"usage": {"billing": {"type": "aws_cur", "path": "cur/*.csv", "index_path": p}}}),
    "checkpoints": ("training.checkpoint_url", lambda p: {"training": {"checkpoint_url": p}}),
}


# As root the check runs without the capabilities that let root write any folder
# (setpriv, util-linux), so that an unwritable folder is one for it too.
AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def validate(folder: Path, check: str, value: str, prefix: list[str] = []) -> subprocess.CompletedProcess[str]:  # noqa: B006 - never mutated
    setting, block = SETTINGS[check]
    cfg = {"storage": {"url": f"sqlite:///{folder / 'costs.db'}"}, "prices": str(DEMO / "prices.yaml")}
    for key, part in block(value).items():
        cfg[key] = {**cfg.get(key, {}), **part}
    (folder / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "GPU_OPS_HOME": str(folder / "home")}
    env.pop("GPU_OPS_CONFIG", None)
    return subprocess.run([*prefix, str(BIN / "gpu-ops"), "validate", "--config", str(folder / "gpu_ops.yaml"), "--only", check], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("check", list(SETTINGS))
def test_a_folder_under_a_regular_file_fails_naming_the_setting(tmp_path: Path, check: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = validate(tmp_path, check, str(tmp_path / "file" / "sub"))
    setting = SETTINGS[check][0]
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"FAIL {check}: {tmp_path / 'file' / 'sub'} ({setting}) does not exist and cannot be created: {tmp_path / 'file'} is not a writable folder" in out.stdout, out.stdout
    assert f"fix: make {tmp_path / 'file'} writable for this user, or point {setting} at a folder that is" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("check", list(SETTINGS))
def test_a_regular_file_where_the_folder_should_be_fails_naming_the_setting(tmp_path: Path, check: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    value = f"file://{tmp_path / 'file'}" if check == "checkpoints" else str(tmp_path / "file")
    out = validate(tmp_path, check, value)
    setting = SETTINGS[check][0]
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"FAIL {check}: {tmp_path / 'file'} ({setting}) is a file, not a folder" in out.stdout, out.stdout
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.parametrize("check", list(SETTINGS))
def test_a_folder_that_is_there_or_can_be_created_passes_and_nothing_is_created(tmp_path: Path, check: str) -> None:
    (tmp_path / "there").mkdir()
    for value in (str(tmp_path / "there"), str(tmp_path / "new" / "deeper")):
        out = validate(tmp_path, check, value)
        assert out.returncode == 0 and f"ok   {check}: " in out.stdout and SETTINGS[check][0] in out.stdout, out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_ops.yaml", "there"]
    assert list((tmp_path / "there").iterdir()) == []


@pytest.mark.parametrize("check", list(SETTINGS))
def test_a_folder_this_user_cannot_write_fails_naming_the_setting(tmp_path: Path, check: str) -> None:
    (tmp_path / "locked").mkdir(mode=0o555)
    try:
        out = validate(tmp_path, check, str(tmp_path / "locked"), prefix=AS_A_USER)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert out.returncode == 1 and f"({SETTINGS[check][0]})" in out.stdout and "cannot be written" in out.stdout, out.stdout


def test_an_unset_setting_is_skipped(tmp_path: Path) -> None:
    for check in ("row_level_path", "cur_index"):
        cfg = {"storage": {"url": f"sqlite:///{tmp_path / 'costs.db'}"}, "prices": str(DEMO / "prices.yaml")}
        (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
        out = subprocess.run([str(BIN / "gpu-ops"), "validate", "--config", str(tmp_path / "gpu_ops.yaml"), "--only", check], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and f"skip {check}: " in out.stdout, out.stdout
