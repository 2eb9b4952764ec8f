"""CheckpointStore: atomic writes, checksums, fallback, pruning, fsspec URLs, and real
writer processes SIGKILLed in the middle of writes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_ops.flows.training.checkpoint import CheckpointStore, checkpoint_url_for

REPO = Path(__file__).resolve().parents[2]


def test_roundtrip_and_keep_last(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "c", keep_last=2)
    assert store.load() is None
    for i in range(1, 5):
        info = store.save({"step": i, "w": [i] * 10}, step=i, attempt=1)
        # torch.save when torch is loaded in this process (tensors), plain pickle otherwise
        expected = "torch" if "torch" in sys.modules else "pickle"
        assert info.seq == i and info.step == i and info.size > 0 and info.format == expected
    assert store.load() == {"step": 4, "w": [4] * 10}
    assert [c.seq for c in store.list()] == [4, 3]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "ckpt-000000003.bin",
        "ckpt-000000003.json",
        "ckpt-000000004.bin",
        "ckpt-000000004.json",
    ]


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path) -> None:
    messages: list[str] = []
    store = CheckpointStore(tmp_path, keep_last=3, log=messages.append)
    store.save({"step": 1}, step=1)
    store.save({"step": 2}, step=2)
    data = tmp_path / "ckpt-000000002.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # flip a bit
    data.write_bytes(bytes(raw))
    state, info = store.load_with_info()
    assert state == {"step": 1} and info.seq == 1
    assert any("corrupt" in m and "falling back" in m for m in messages)
    assert store.latest_valid().seq == 1


def test_truncated_data_and_broken_manifest_are_skipped(tmp_path: Path) -> None:
    messages: list[str] = []
    store = CheckpointStore(tmp_path, keep_last=5, log=messages.append)
    for i in (1, 2, 3):
        store.save({"step": i}, step=i)
    (tmp_path / "ckpt-000000003.bin").write_bytes((tmp_path / "ckpt-000000003.bin").read_bytes()[:5])
    (tmp_path / "ckpt-000000002.json").write_text('{"seq": 2, "sha2')  # half-written manifest
    assert store.load() == {"step": 1}
    assert any("partial" in m for m in messages) and any("manifest unreadable" in m for m in messages)


def test_data_without_manifest_is_not_a_checkpoint_and_is_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"step": 1}, step=1)
    (tmp_path / "ckpt-000000002.bin").write_bytes(b"half")  # killed before the manifest
    (tmp_path / ".tmp-ckpt-000000003.bin.abcd1234").write_bytes(b"partial")  # killed mid-write
    assert store.load() == {"step": 1}
    assert store.remove_partial() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000001.bin", "ckpt-000000001.json"]
    assert store.save({"step": 2}, step=2).seq == 2


def test_manifest_content(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    info = store.save({"x": 1}, step=7, attempt=2, metadata={"loss": 0.5})
    manifest = json.loads((tmp_path / "ckpt-000000001.json").read_text())
    assert manifest["sha256"] == info.sha256 and manifest["step"] == 7 and manifest["attempt"] == 2
    assert manifest["metadata"] == {"loss": 0.5}
    assert info.written_at_dt.tzinfo is not None


def test_torch_state_uses_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = CheckpointStore(tmp_path)
    model = torch.nn.Linear(4, 2)
    info = store.save({"model": model.state_dict(), "rng": torch.get_rng_state()}, step=1)
    assert info.format == "torch"
    loaded = store.load()
    assert torch.equal(loaded["model"]["weight"], model.state_dict()["weight"])


def test_fsspec_memory_url() -> None:
    url = f"memory://gpu-ops-test-{random.randrange(10**9)}/ckpts"
    store = CheckpointStore(url, keep_last=2)
    assert not store.local
    for i in range(3):
        store.save({"i": i}, step=i)
    assert store.load() == {"i": 2}
    assert [c.seq for c in store.list()] == [3, 2]
    store.fs.pipe_file(f"{store.root}/ckpt-000000003.bin", b"garbage")
    assert store.load() == {"i": 1}


def test_checkpoint_url_for() -> None:
    assert checkpoint_url_for("/data/ckpt", "team/model", "2026-11-20", "run-1") == "/data/ckpt/team/model/2026-11-20/run-1"
    assert checkpoint_url_for("s3://bucket/ckpt/", "model", None, "abc") == "s3://bucket/ckpt/model/abc"


def test_kill_during_writes_never_breaks_resume(tmp_path: Path) -> None:
    """A real writer process is SIGKILLed at random points while it writes 8 MB checkpoints."""
    url = tmp_path / "ckpts"
    mid_write_kills = 0
    rng = random.Random(4)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    last_seen = 0
    trials = 0
    # Six kills at random moments, and more until one lands inside a write (up to 40): on a
    # loaded machine the writer can spend a whole draw between writes (a CI run saw 0 of 6).
    while trials < 6 or (mid_write_kills == 0 and trials < 40):
        trials += 1
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from gpu_ops_tests.training.workloads import checkpoint_writer; checkpoint_writer({str(url)!r}, 8, 2)"],
            env=env,
        )
        # Let it write a few checkpoints, then kill it at a random moment.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(list(url.glob("*.json"))) < 1:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.2, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        leftovers = [p for p in url.iterdir() if p.name.startswith(".tmp-")]
        orphans = [p for p in url.glob("*.bin") if not p.with_suffix(".json").exists()]
        mid_write_kills += bool(leftovers or orphans)
        store = CheckpointStore(url, keep_last=2)
        state, info = store.load_with_info()  # always something valid
        assert len(state["blob"]) == 8 * 2**20 and state["i"] == info.step
        assert info.seq >= last_seen  # never goes back past an acknowledged checkpoint
        last_seen = info.seq
        store.remove_partial()
    assert mid_write_kills >= 1, f"no kill of {trials} landed in the middle of a write"
