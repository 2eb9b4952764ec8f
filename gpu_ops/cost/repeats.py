"""Which identity-key hashes repeat, in memory bounded by a setting.

The engine's screening pass streams one 64-bit hash per row (each good row's; with a
tally, every row's: see
:meth:`gpu_ops.cost.engine.UsageEngine.check`); the hashes several rows share are the only
candidates for the identity rules. Each batch of hashes is split into ``2**k`` buckets by
the top ``k`` bits of its values (equal hashes always share a bucket), and each bucket is
then sorted on its own, :data:`SORTERS` at a time (numpy sorts without the GIL): at 10M
rows, 16 buckets sorted on two threads take 0.3 s where one array took 0.8 s. Up to
:data:`MEMORY_BYTES` of hashes (32M rows) the buckets are held in memory; beyond that
they are written, batch by batch, to bucket files, read back one bucket at a time per
sorter: memory then follows the buckets being sorted (each at most a quarter of the
setting), not the rows (800 MB of hashes at 100M rows).
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Hashes held in memory before they go to bucket files (8 bytes a row: 32M rows).
MEMORY_BYTES = 256 * 2**20
HELD_BITS = 4  # buckets held in memory: 16 (a tenth of a second's sorting each at 10M rows)
SORTERS = 2  # buckets sorted at once, each on a thread of its own
_BUFFER_BYTES = 1 << 20  # each bucket file's write buffer


def bucket_bits(rows: int, memory_bytes: int) -> int:
    """Bits of the hash that pick a bucket file (0: the buckets held in memory), so that
    one bucket of ``rows`` hashes holds at most a quarter of ``memory_bytes``."""
    bits = 0
    while rows * 8 > memory_bytes and (rows * 8 >> bits) > memory_bytes // 4 and bits < 8:
        bits += 1
    return bits


def repeated(sorted_hashes: Any) -> Any:
    """The distinct values that occur more than once in a sorted uint64 array."""
    import numpy as np

    h = sorted_hashes
    twice = h[1:][h[1:] == h[:-1]]  # sorted: each value once where it first repeats (np.unique would import numpy.ma)
    return twice[np.concatenate(([True], twice[1:] != twice[:-1]))] if len(twice) else twice


class RepeatedHashes:
    """Collects uint64 hashes (:meth:`add`), then gives those that occur more than once
    (:meth:`repeats`, sorted). ``rows``: how many are expected (more may come; they only
    decide whether bucket files are needed); ``memory_bytes``: what may be held in memory
    before they go to bucket files."""

    def __init__(self, rows: int, memory_bytes: int = MEMORY_BYTES):
        self.bits = bucket_bits(rows, memory_bytes)  # of the bucket files (0: none)
        self._split = self.bits or HELD_BITS
        self._held: list[list[Any]] = [[] for _ in range(1 << self._split)]
        self._dir: Path | None = None
        self._files: list[Any] = []
        self.paths: list[Path] = []  # the bucket files, if any
        if self.bits:
            self._dir = Path(tempfile.mkdtemp(prefix="gpu_ops-key-hashes-"))
            self.paths = [self._dir / f"{i:03d}" for i in range(1 << self.bits)]
            self._files = [open(p, "wb", buffering=_BUFFER_BYTES) for p in self.paths]

    def add(self, hashes: Any) -> None:
        """One batch of hashes (a uint64 array; not kept: its buckets are copies)."""
        import numpy as np

        bucket = (hashes >> np.uint64(64 - self._split)).astype(np.uint8)
        order = np.argsort(bucket, kind="stable")  # a radix sort of small integers
        ends = np.cumsum(np.bincount(bucket, minlength=len(self._held)))
        grouped = hashes[order]
        for i, (lo, hi) in enumerate(zip((0, *ends[:-1]), ends)):
            if hi <= lo:
                continue
            if self._files:
                self._files[i].write(grouped[lo:hi].tobytes())
            else:
                self._held[i].append(grouped[lo:hi])

    def _bucket(self, i: int) -> Any:
        """Bucket ``i``'s hashes in one array (what held or wrote them let go)."""
        import numpy as np

        if not self._files:
            held, self._held[i] = self._held[i], []
            return np.concatenate(held) if held else np.empty(0, np.uint64)
        f = self._files[i]
        f.close()
        keys = np.fromfile(f.name, np.uint64)
        Path(f.name).unlink()
        return keys

    def _repeated_in(self, i: int) -> Any:
        keys = self._bucket(i)
        keys.sort()
        return repeated(keys)

    def repeats(self) -> Any:
        """The hashes added more than once, sorted (uint64); the collected hashes are gone."""
        import numpy as np

        try:
            with ThreadPoolExecutor(SORTERS, thread_name_prefix="gpu_ops-key-sort") as pool:
                return np.concatenate(list(pool.map(self._repeated_in, range(len(self._held)))))
        finally:
            self.close()

    def close(self) -> None:
        """Lets go of the held hashes and removes the bucket files, if any."""
        self._held = [[] for _ in self._held]
        for f in self._files:
            f.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
