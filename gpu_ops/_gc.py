"""Garbage collection around work that builds many long-lived, acyclic objects. Pure.

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
