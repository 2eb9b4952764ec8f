"""Looking at a path a user named, without an exception the user cannot act on.

``Path.exists()`` and ``Path.is_dir()`` answer False for a missing file but raise for a
name no file system takes: ``OSError`` (ENAMETOOLONG: a name part over 255 bytes, a path
over 4,096) or ``ValueError`` (a NUL byte). Every probe of a configured or command-line
path goes through :func:`path_kind`, which turns those into :class:`PathNotUsable` with a
reason to show beside the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Literal

from gpu_ops.errors import PathNotUsable


def refuse_nul(path: Path | str) -> None:
    """:class:`PathNotUsable` when ``path`` holds a NUL byte (``open()`` and ``os.stat()``
    raise ValueError on one)."""
    if "\0" in str(path):
        raise PathNotUsable("the name holds a NUL byte")


def path_kind(path: Path) -> Literal["file", "dir", "missing", "special"]:
    """What ``path`` is: a regular file, a folder, nothing, or ``special`` (a FIFO, device
    or socket: reading one can block for ever or never end); or :class:`PathNotUsable`."""
    refuse_nul(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:  # a file where a folder of the path should be
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise PathNotUsable("the name is too long for the file system") from None
        if exc.errno == errno.ELOOP:
            raise PathNotUsable("a symbolic link loop") from None
        raise PathNotUsable(f"cannot be looked at: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "special"


NOT_REGULAR = "not a regular file (a FIFO, device or socket is not read)"
