"""Which identity-key hashes repeat, in memory bounded by a setting.

The engine's screening pass streams one 64-bit hash per row (each good row's; with a
tally, every row's: see
:meth:`gpu_ops.cost.engine.UsageEngine.check`); the hashes several rows share are the only
candidates for the identity rules. Up to :data:`MEMORY_BYTES` of hashes (32M rows) are
gathered in one array and sorted. Beyond that they are written, batch by batch, to
``2**k`` bucket files by their top ``k`` bits (equal hashes always share a bucket), and
each bucket is then read back and sorted on its own: memory follows one bucket (at most a
quarter of the setting), not the rows (800 MB of hashes at 100M rows held in one array).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

# Hashes held in one array before they go to bucket files (8 bytes a row: 32M rows).
MEMORY_BYTES = 256 * 2**20
_BUFFER_BYTES = 1 << 20  # each bucket file's write buffer


def bucket_bits(rows: int, memory_bytes: int) -> int:
    """Bits of the hash that pick a bucket (0: one array in memory), so that one bucket of
    ``rows`` hashes holds at most a quarter of ``memory_bytes``."""
    bits = 0
    while rows * 8 > memory_bytes and (rows * 8 >> bits) > memory_bytes // 4 and bits < 8:
        bits += 1
    return bits


def repeated(sorted_hashes: Any) -> Any:
    """The distinct values that occur more than once in a sorted uint64 array."""
    import numpy as np

    h = sorted_hashes
    return np.unique(h[1:][h[1:] == h[:-1]])


class RepeatedHashes:
    """Collects uint64 hashes (:meth:`add`), then gives those that occur more than once
    (:meth:`repeats`, sorted). ``rows``: how many are expected (more may come);
    ``memory_bytes``: what one array of them may hold before they go to bucket files."""

    def __init__(self, rows: int, memory_bytes: int = MEMORY_BYTES):
        import numpy as np

        self.bits = bucket_bits(rows, memory_bytes)
        self._n = 0
        self._dir: Path | None = None
        self._files: list[Any] = []
        self.paths: list[Path] = []  # the bucket files, if any
        if self.bits:
            self._dir = Path(tempfile.mkdtemp(prefix="gpu_ops-key-hashes-"))
            self.paths = [self._dir / f"{i:03d}" for i in range(1 << self.bits)]
            self._files = [open(p, "wb", buffering=_BUFFER_BYTES) for p in self.paths]
            self._keys = np.empty(0, np.uint64)
        else:
            self._keys = np.empty(rows, np.uint64)

    def add(self, hashes: Any) -> None:
        """One batch of hashes (a uint64 array)."""
        import numpy as np

        if self.bits:
            self._spill(hashes)
            return
        if self._n + len(hashes) > len(self._keys):  # more rows than expected: room for them
            self._keys = np.concatenate([self._keys, np.empty(self._n + len(hashes) - len(self._keys), np.uint64)])
        self._keys[self._n:self._n + len(hashes)] = hashes
        self._n += len(hashes)

    def _spill(self, hashes: Any) -> None:
        import numpy as np

        bucket = (hashes >> np.uint64(64 - self.bits)).astype(np.uint8)
        order = np.argsort(bucket, kind="stable")  # a radix sort of small integers
        ends = np.cumsum(np.bincount(bucket, minlength=len(self._files)))
        grouped = hashes[order]
        for i, (lo, hi) in enumerate(zip((0, *ends[:-1]), ends)):
            if hi > lo:
                self._files[i].write(grouped[lo:hi].tobytes())

    def repeats(self) -> Any:
        """The hashes added more than once, sorted (uint64); the collected hashes are gone."""
        import numpy as np

        if not self.bits:
            keys, self._keys = self._keys[:self._n], np.empty(0, np.uint64)
            keys.sort()
            return repeated(keys)
        out = []
        for f in self._files:
            f.close()
            keys = np.fromfile(f.name, np.uint64)
            Path(f.name).unlink()
            keys.sort()
            out.append(repeated(keys))
            del keys
        self.close()
        return np.concatenate(out)

    def close(self) -> None:
        """Removes the bucket files, if any."""
        for f in self._files:
            f.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
