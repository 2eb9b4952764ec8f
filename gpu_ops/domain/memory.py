"""Garbage collection and the allocator around work that builds many objects or large tables. Pure.

A fleet configuration is about ten objects per budget, a sensor tick about ten more per
budget evaluated in detail. Python's collector walks every tracked object at each full
collection, and building that many objects triggers several: at 100,000 budgets they
were most of the configuration's validation and a good part of a tick. Nothing these
build is a reference cycle (their garbage is freed by reference counting), so the
collector waits until they are done (`collection_deferred`), and the objects that live
as long as the process (a loaded fleet configuration) can be left out of every later
collection (`freeze_long_lived`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def collection_deferred() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_long_lived() -> None:
    """Move every object alive now to the collector's permanent generation (``gc.freeze``),
    after collecting the young generations: they are still freed when no longer
    referenced; only reference cycles among them would wait for ``gc.unfreeze``."""
    gc.collect(1)
    gc.freeze()


# glibc's M_MMAP_THRESHOLD (mallopt parameter -3) and the size set for it.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def freed_blocks_back_at_once() -> bool:
    """Blocks of 128 KiB and more are mapped from the system and unmapped when freed
    (glibc ``mallopt(M_MMAP_THRESHOLD)``), for the rest of the process.

    glibc starts there but raises the threshold to the size of each mapped block freed:
    after a few one-MiB column chunks were freed, later ones come from the heap, whose free
    memory stays resident. A step that builds a million-row table batch by batch then
    kept both the batches and the table (about 90 MiB more at a million usage pieces).
    Fixed, a freed column goes back to the system at once. True where it was set (Linux
    with glibc), False elsewhere (nothing changed)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_allocates_from_the_system() -> None:
    """pyarrow's default memory pool is the system allocator, unless
    ``ARROW_DEFAULT_MEMORY_POOL`` already chooses one. mimalloc, pyarrow's own default,
    keeps the pages of what was freed for later use, and a step that reads a day's million
    pieces into pandas held them at its peak: the ROI step 390-410 -> 337-352 MiB, the whole
    daily job (1M intervals, multiprocess executor) 1,014-1,034 -> 925-969 MiB of summed
    RSS and 769-797 -> 692-712 MiB of PSS. Set in the environment, which pyarrow reads
    when it first allocates, in this process and the processes it starts (the code
    location sets it as it loads, before any step imports pyarrow), and, where pyarrow is
    already loaded, as its default pool for what it allocates from Python.

    Not for the CLI: over 10M rows its reads allocate and free row groups fast enough that
    mapping and unmapping them cost 0.4-0.6 s (0.8 s of system time) for 40 MiB less."""
    if os.environ.get(ARROW_POOL_VARIABLE):
        return
    os.environ[ARROW_POOL_VARIABLE] = "system"
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
