"""The exceptions of gpu_ops: one family under :class:`GpuOpsError`, all defined here.

    try:
        ...
    except gpu_ops.GpuOpsError as exc:   # anything gpu_ops raised on purpose
        ...

- **Plain errors** (configuration, catalog, storage, usage files, checkpoints, launches,
  remote answers): ``GpuOpsError`` plus the builtin they refine (``ConfigError`` is also a
  ``ValueError``). This module imports nothing but the standard library, so training
  workers and the CLI raise them cheaply; each is also importable from the module that
  raises it (``gpu_ops.domain.config.ConfigError``). :data:`PLAIN_ERRORS` is every one of them.
- **Step failures** (:mod:`gpu_ops.dagster.failures`): ``GpuOpsFailure`` and its subclasses are
  Dagster ``Failure``\\ s under the same base, kept apart because they import Dagster.

:class:`gpu_ops.domain.compute.backend.WorkerTerminated` is deliberately no ``GpuOpsError``: it
is the ``BaseException`` a worker's SIGTERM handler raises so that ``except Exception`` in
user code cannot swallow a preemption.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

ErrorKind = Literal["connect", "deadline", "dropped", "protocol", "too_large"]


class GpuOpsError(Exception):
    """Base class of every exception gpu_ops raises on purpose."""


# --------------------------------------------------------------------------- configuration and files


class ConfigError(GpuOpsError, ValueError):
    """One or more problems in a configuration file; each line names file and field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class YamlFileError(GpuOpsError, ValueError):
    """A YAML file that cannot be read, is not UTF-8 text or does not parse: ``str()`` is
    one line naming the file (and the line and column, or the byte)."""


class PathNotUsable(GpuOpsError, ValueError):
    """A path no file system takes, or that cannot be looked at: ``str()`` is the reason
    alone (the caller names the path)."""


class UnknownCheck(GpuOpsError, ValueError):
    """`gpu-ops validate --only` named a check that does not exist."""


class RemoteError(GpuOpsError):
    """An exchange that did not end in a complete answer (names the server, never a secret)."""

    def __init__(self, where: str, what: str, *, kind: ErrorKind, sent: bool):
        self.where, self.what, self.kind, self.sent = where, what, kind, sent
        super().__init__(f"{where}: {what}")


# --------------------------------------------------------------------------- storage


class StorageError(GpuOpsError, RuntimeError):
    """A table could not be read or written; the message says which and why."""


class StorageUnavailable(StorageError):
    """The database could not be reached, did not answer in time, or stayed locked.

    The message names the database (password hidden) and says what to check.
    """


# --------------------------------------------------------------------------- compute


class UnknownGpuType(GpuOpsError, ValueError):
    """A GPU name the catalog does not know; ``suggestions`` holds the close known names."""

    def __init__(self, name: str, suggestions: list[str], known: Iterable[str] = ()):
        self.name = name
        self.suggestions = suggestions
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown GPU type {name!r}{hint} (known: {', '.join(sorted(known))})")


class UnknownMigProfile(GpuOpsError, ValueError):
    pass


class NotManagedError(GpuOpsError, RuntimeError):
    """The object exists but was not created by gpu_ops: it is left alone."""


class ComputeSetupError(GpuOpsError, RuntimeError):
    """A launch could not be set up; ``fix`` says what to change."""

    def __init__(self, problem: str, fix: str, cause: BaseException | None = None):
        self.problem, self.fix, self.cause = problem, fix, cause
        super().__init__(f"{problem}\n  fix: {fix}")


class LaunchError(GpuOpsError, RuntimeError):
    """The launch could not start (the callable cannot be shipped, a worker cannot spawn)."""


class LeaseLost(GpuOpsError, RuntimeError):
    """The GPU lease expired (or is gone) before its workers were written on it: they must not start."""


class QuotaExceeded(GpuOpsError, ValueError):
    """The request alone is larger than a quota: waiting cannot help."""


class SharedSqliteLeases(QuotaExceeded):
    """Two hosts launch on one SQLite file: their clocks, not one database clock, would time the leases."""


# --------------------------------------------------------------------------- training


class TrainingPreempted(GpuOpsError):
    """Raised by the worker wrapper when the function stopped after a preemption notice.

    An ``Exception``: in a Kubetorch server the function runs inside a request handler
    that must survive it, and the classifier knows the name. (The local backend's worker
    raises :class:`WorkerTerminated` instead, so the attempt reads as ended by SIGTERM,
    exit 143.) Either way the attempt is ``preempted``, not a user error.
    """


class TrainingFunctionError(GpuOpsError, TypeError):
    pass


class CheckpointError(GpuOpsError, RuntimeError):
    pass


class TransitionError(GpuOpsError, ValueError):
    """A move the attempt diagram does not allow (a bug, or two writers of one attempt)."""


# --------------------------------------------------------------------------- cost sources


class UsageSourceError(GpuOpsError, ValueError):
    """A source cannot be read at all (missing file, wrong format, missing columns)."""

    def __init__(self, location: Any, reason: str | None = None):
        self.location, self.reason = (str(location), reason) if reason is not None else ("", str(location))
        super().__init__(f"{self.location}: {self.reason}" if self.location else self.reason)


class BillingSourceError(GpuOpsError, ValueError):
    """A CUR file cannot be read at all (missing file, missing columns)."""


class UtilizationError(GpuOpsError):
    """Prometheus could not be queried, or answered something that is not a matrix of
    samples (names the server without credentials, the query, and what was wrong)."""


# Every plain error: derived from the classes above, so a new one cannot be left out.
PLAIN_ERRORS: tuple[type[GpuOpsError], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, type) and issubclass(value, GpuOpsError) and value is not GpuOpsError
)

__all__ = [
    "GpuOpsError",
    "PLAIN_ERRORS",
    "ErrorKind",
    "ConfigError",
    "YamlFileError",
    "PathNotUsable",
    "UnknownCheck",
    "RemoteError",
    "StorageError",
    "StorageUnavailable",
    "UnknownGpuType",
    "UnknownMigProfile",
    "NotManagedError",
    "ComputeSetupError",
    "LaunchError",
    "LeaseLost",
    "QuotaExceeded",
    "SharedSqliteLeases",
    "TrainingPreempted",
    "TrainingFunctionError",
    "CheckpointError",
    "TransitionError",
    "UsageSourceError",
    "BillingSourceError",
    "UtilizationError",
]
