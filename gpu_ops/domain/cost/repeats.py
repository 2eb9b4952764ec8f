"""Which identity-key hashes repeat, in memory bounded by a setting.

The engine's screening pass streams one 64-bit hash per row (each good row's; with a
tally, every row's: see
:meth:`gpu_ops.flows.cost.engine.UsageEngine.check`); the hashes several rows share are the only
candidates for the identity rules. Up to :data:`MEMORY_BYTES` of hashes (32M rows) they
are copied, batch by batch, into one array allocated for the rows expected, and that
array is sorted once, in place (numpy's vectorised sort, of the hashes' bits read as
int64: equal hashes end up side by side either way, and numpy sorts int64 faster than
uint64, 0.67 s against 0.84 s for 10M on the 2-core development machine; splitting each
batch into buckets by its top bits and sorting the buckets cost 0.9-3 s, most of it the
split). Beyond that they are written, batch by batch, to ``2**k`` bucket
files by the top ``k`` bits of their values (equal hashes always share a bucket), read
back one bucket at a time per sorter (:data:`SORTERS` at once, numpy sorts without the
GIL): memory then follows the buckets being sorted (each at most a quarter of the
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
SORTERS = 2  # bucket files sorted at once, each on a thread of its own
_BUFFER_BYTES = 1 << 20  # each bucket file's write buffer


def bucket_bits(rows: int, memory_bytes: int) -> int:
    """Bits of the hash that pick a bucket file (0: the buckets held in memory), so that
    one bucket of ``rows`` hashes holds at most a quarter of ``memory_bytes``."""
    bits = 0
    while rows * 8 > memory_bytes and (rows * 8 >> bits) > memory_bytes // 4 and bits < 8:
        bits += 1
    return bits


def sort_in_place(hashes: Any) -> None:
    """Sorts a uint64 array in place by its bits read as int64 (faster than as uint64):
    equal values become neighbours, which is all :func:`repeated` needs; values with the
    top bit set come first."""
    import numpy as np

    hashes.view(np.int64).sort()


def repeated(sorted_hashes: Any) -> Any:
    """The distinct values that occur more than once in a uint64 array whose equal values
    are neighbours (sorted, as uint64 or by :func:`sort_in_place`), in that array's order."""
    import numpy as np

    h = sorted_hashes
    twice = h[1:][h[1:] == h[:-1]]  # sorted: each value once where it first repeats (np.unique would import numpy.ma)
    return twice[np.concatenate(([True], twice[1:] != twice[:-1]))] if len(twice) else twice


class RepeatedHashes:
    """Collects uint64 hashes (:meth:`add`), then gives those that occur more than once
    (:meth:`repeats`, sorted). ``rows``: how many are expected (more may come: the array
    grows; they decide whether bucket files are needed and the array's first size);
    ``memory_bytes``: what may be held in memory before they go to bucket files."""

    def __init__(self, rows: int, memory_bytes: int = MEMORY_BYTES):
        import numpy as np

        self.bits = bucket_bits(rows, memory_bytes)  # of the bucket files (0: none, one array)
        self._all = np.empty(0 if self.bits else max(rows, 0), np.uint64)
        self._n = 0  # hashes in the array
        self.repeated_rows = 0  # after repeats(): how many of the hashes added are repeated ones
        self._dir: Path | None = None
        self._files: list[Any] = []
        self.paths: list[Path] = []  # the bucket files, if any
        if self.bits:
            self._dir = Path(tempfile.mkdtemp(prefix="gpu_ops-key-hashes-"))
            self.paths = [self._dir / f"{i:03d}" for i in range(1 << self.bits)]
            self._files = [open(p, "wb", buffering=_BUFFER_BYTES) for p in self.paths]

    def add(self, hashes: Any) -> None:
        """One batch of hashes (a uint64 array; not kept: copied into the array or the files)."""
        import numpy as np

        if self._files:
            bucket = (hashes >> np.uint64(64 - self.bits)).astype(np.uint8)
            order = np.argsort(bucket, kind="stable")  # a radix sort of small integers
            ends = np.cumsum(np.bincount(bucket, minlength=len(self._files)))
            grouped = hashes[order]
            for i, (lo, hi) in enumerate(zip((0, *ends[:-1]), ends)):
                if hi > lo:
                    self._files[i].write(grouped[lo:hi].tobytes())
            return
        end = self._n + len(hashes)
        if end > len(self._all):  # more than expected: a larger array
            grown = np.empty(max(end, 2 * len(self._all)), np.uint64)
            grown[: self._n] = self._all[: self._n]
            self._all = grown
        self._all[self._n : end] = hashes
        self._n = end

    def _bucket(self, i: int) -> Any:
        """Bucket file ``i``'s hashes in one array (the file removed)."""
        import numpy as np

        f = self._files[i]
        f.close()
        keys = np.fromfile(f.name, np.uint64)
        Path(f.name).unlink()
        return keys

    def _repeated_in(self, i: int) -> Any:
        keys = self._bucket(i)
        sort_in_place(keys)
        return repeated(keys)

    def repeats(self) -> Any:
        """The hashes added more than once, sorted (uint64); the collected hashes are gone."""
        import numpy as np

        try:
            if not self._files:
                held = self._all[: self._n]
                sort_in_place(held)
                out = repeated(held)  # (a copy: boolean indexing)
                # Each run of one value of length L has L - 1 equal neighbours.
                self.repeated_rows = int(np.count_nonzero(held[1:] == held[:-1])) + len(out)
            else:
                with ThreadPoolExecutor(SORTERS, thread_name_prefix="gpu_ops-key-sort") as pool:
                    out = np.concatenate(list(pool.map(self._repeated_in, range(len(self._files)))))
                self.repeated_rows = -1  # not counted through bucket files
            out.sort()  # the few repeated hashes, in uint64 order
            return out
        finally:
            self.close()

    def close(self) -> None:
        """Lets go of the held hashes and removes the bucket files, if any."""
        import numpy as np

        self._all, self._n = np.empty(0, np.uint64), 0
        for f in self._files:
            f.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class Fingerprints:
    """The top 32 bits of each hash of a stream, by its place in the stream (4 bytes a row
    beside the hashes' 8): once the repeated hashes are known, the places whose
    fingerprint is one of theirs (every place of a repeated hash, and a few others) are
    found without another pass over the rows."""

    def __init__(self, rows: int):
        import numpy as np

        self._fp = np.empty(max(rows, 0), np.uint32)
        self.n = 0  # places filled

    def add(self, hashes: Any) -> None:
        """The hashes of the next places of the stream (uint64; a place without a hash holds any value)."""
        import numpy as np

        end = self.n + len(hashes)
        if end > len(self._fp):
            grown = np.empty(max(end, 2 * len(self._fp)), np.uint32)
            grown[: self.n] = self._fp[: self.n]
            self._fp = grown
        np.right_shift(hashes, np.uint64(32), out=self._fp[self.n : end], casting="unsafe")
        self.n = end

    def places(self, hashes: Any) -> Any:
        """The places (int64, ascending) whose fingerprint is that of one of ``hashes`` (uint64)."""
        import numpy as np

        want = np.sort((hashes >> np.uint64(32)).astype(np.uint32))
        if not len(want):
            return np.empty(0, np.int64)
        low = np.uint32((1 << _BITMAP_BITS) - 1)
        bitmap = np.zeros(1 << _BITMAP_BITS, bool)
        bitmap[want & low] = True
        out = []
        for lo in range(0, self.n, _PLACES_BATCH):
            chunk = self._fp[lo : min(lo + _PLACES_BATCH, self.n)]
            near = np.flatnonzero(bitmap[chunk & low])  # the fingerprint's low bits are some wanted one's
            if len(near):
                fp = chunk[near]
                i = np.minimum(np.searchsorted(want, fp), len(want) - 1)
                out.append(near[want[i] == fp] + lo)
        return np.concatenate(out).astype(np.int64) if out else np.empty(0, np.int64)

    def close(self) -> None:
        import numpy as np

        self._fp, self.n = np.empty(0, np.uint32), 0


_BITMAP_BITS = 24  # a 16 MiB table of the wanted fingerprints' low bits
_PLACES_BATCH = 1 << 20
