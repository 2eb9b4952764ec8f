"""The identity-key hashes that repeat: in one array, or through bucket files once they
would hold more than the setting allows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_ops.domain.cost.repeats import RepeatedHashes, bucket_bits


def _hashes(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    twins = rng.choice(n, n // 50, replace=False)  # 2 % of the rows repeat an earlier one, some thrice
    h[twins] = h[rng.integers(0, n, len(twins))]
    h[:5] = [0, 0, 2**64 - 1, 2**64 - 1, 2**63]  # the edges of every bucket
    return h


def _collect(h: np.ndarray, memory_bytes: int, rows: int | None = None) -> tuple[np.ndarray, int, list[Path]]:
    keys = RepeatedHashes(len(h) if rows is None else rows, memory_bytes)
    files = list(keys.paths)
    try:
        for lo in range(0, len(h), 7_001):  # uneven batches
            keys.add(h[lo:lo + 7_001])
        return keys.repeats(), keys.bits, files
    finally:
        keys.close()


@pytest.mark.parametrize("seed", range(3))
def test_held_and_filed_buckets_find_the_repeats_numpy_finds(seed: int) -> None:
    h = _hashes(seed, 200_000)
    values, counts = np.unique(h, return_counts=True)
    want = values[counts > 1]
    in_memory, bits, _ = _collect(h, memory_bytes=8 * len(h))
    spilled, spill_bits, files = _collect(h, memory_bytes=64 * 1024)  # 1.6 MB of hashes against 64 KiB
    assert bits == 0 and spill_bits >= 3  # held in memory; then 2**k buckets of at most 16 KiB... as near as 8 bits go
    np.testing.assert_array_equal(in_memory, want)
    np.testing.assert_array_equal(spilled, want)
    assert len(want) > 3_000 and {0, 2**64 - 1} <= set(want.tolist())
    assert files and not any(f.exists() for f in files)  # the bucket files are gone, and their folder
    assert not files[0].parent.exists()


def test_more_rows_than_expected_still_count() -> None:
    h = _hashes(7, 50_000)
    values, counts = np.unique(h, return_counts=True)
    got, _, _ = _collect(h, memory_bytes=1 << 30, rows=10)
    np.testing.assert_array_equal(got, values[counts > 1])


def test_the_engine_prices_and_quarantines_the_same_when_the_hashes_go_to_bucket_files(tmp_path: Path) -> None:
    """Copies and snapshots of one interval across files, hostile rows around them: the
    identity rules see the same repeated keys through bucket files as through one array."""
    from gpu_ops_tests.cost.helpers import MATRIX
    from gpu_ops_tests.cost.random_files import WE, WS, random_files

    from gpu_ops.flows.cost.engine import UsageEngine
    from gpu_ops.flows.cost.pipeline import load_raw
    from gpu_ops.domain.cost.sources import SourceSet
    from gpu_ops.flows.cost.window import Window

    paths = random_files(tmp_path, 3)
    out = []
    for memory in (None, 1024):
        usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
        eng = UsageEngine(MATRIX)
        try:
            usage.add_to(eng)
            if memory:
                eng.key_memory_bytes = memory
                assert bucket_bits(sum(p.rows for p in eng.parts), memory) >= 2  # hundreds of rows against 1 KiB: bucket files
            out.append(eng.run())
        finally:
            eng.close()
    pd.testing.assert_frame_equal(out[0].rows, out[1].rows)
    pd.testing.assert_frame_equal(out[0].quarantine, out[1].quarantine)
    assert (out[1].quarantine["field"] == "<row>").any() and len(out[1].rows) > 10  # copies and snapshots found, rows priced
