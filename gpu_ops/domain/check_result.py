"""What a `gpu-ops validate` check returns, and the probes of a path setting the checks share.

Below :mod:`gpu_ops.cli.validate` (which runs the checks) and every flow's ``checks`` module
(which :mod:`gpu_ops.cli.validate` registers), so that neither imports the other's home.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpu_ops.domain.paths import PathNotUsable, path_kind


@dataclass
class CheckResult:
    name: str
    status: str  # "ok" | "failed" | "skipped"
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (:class:`PathNotUsable` for a name no
    file system takes)."""
    return next(p for p in (path, *path.parents) if path_kind(p) != "missing")


def not_yet_created(name: str, path: Path, what: str, setting: str, shown: str | None = None) -> CheckResult | None:
    """For a local file or folder that does not exist yet: whether it could be created,
    decided without creating anything (`gpu-ops validate` writes nothing). None when
    ``path`` exists, so the check goes on to probe it."""
    try:
        if path_kind(path) != "missing":
            return None
        parent = nearest_existing(path.parent)
    except PathNotUsable as exc:
        return CheckResult(name, "failed", f"{shown or path}: {exc}", f"point {setting} at a path the file system takes")
    if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
        return CheckResult(name, "ok", f"{shown or path} does not exist yet: {what} creates it ({parent} is writable)")
    return CheckResult(name, "failed", f"{shown or path} does not exist and cannot be created: {parent} is not a writable folder",
                       f"make {parent} writable for this user, or point {setting} at a folder that is")


def folder_setting(name: str, path: Path, setting: str, what: str) -> CheckResult | None:
    """The folder a path setting names, judged without writing anything: a result when it
    does not exist yet (ok if it can be created) or cannot be used (a file, a folder this
    user cannot write, a name no file system takes), each naming the setting; None when it
    is a writable folder (the caller may probe it further)."""
    shown = f"{path} ({setting})"
    missing = not_yet_created(name, path, what, setting, shown=shown)
    if missing is not None:
        return missing
    kind = path_kind(path)
    if kind != "dir":
        return CheckResult(name, "failed", f"{shown} is a {'file' if kind == 'file' else 'special file (a FIFO, device or socket)'}, not a folder",
                           f"point {setting} at a folder (this one is taken by the file)")
    if not os.access(path, os.W_OK | os.X_OK):
        return CheckResult(name, "failed", f"{shown} is a folder that cannot be written by this user", f"make {path} writable for this user, or point {setting} at a folder that is")
    return None
