"""`CheckpointStore`: checkpoints that survive being killed in the middle of a write.

Layout under the store's URL (a local folder or any fsspec URL: ``s3://``, ``gs://``,
a PVC path)::

    ckpt-000000007.bin    the serialized state
    ckpt-000000007.json   its manifest: sha256, size, step, written_at, save cost

A checkpoint exists only once its manifest does, and the manifest is written after
the data is durable:

- local folders: write ``.tmp-…``, ``fsync``, ``rename`` over the final name, ``fsync``
  the folder, for the data and then for the manifest;
- object stores: one PUT per object is atomic, data first, manifest last.

``load()`` walks manifests newest first, checks size and sha256 and falls back to the
previous checkpoint when the newest is corrupt or partial, so a kill at any point of a
save never breaks resume. The newest ``keep_last`` checkpoints are kept.

The state is written with ``torch.save`` when torch is loaded (tensors, optimizer and
RNG states), otherwise with pickle. Checkpoints are trusted data written by the job
itself: loading uses full unpickling, so never point a store at files from elsewhere.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import pickle
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from gpu_ops.errors import CheckpointError

# fsspec is imported when a store is opened, not when the code location loads (gpu_asset imports this module).

_NAME = re.compile(r"^ckpt-(\d{9})\.(bin|json)$")
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class CheckpointInfo:
    seq: int
    step: int | None
    sha256: str
    size: int
    written_at: str  # ISO 8601, UTC
    save_seconds: float
    format: str  # "torch" | "pickle"
    attempt: int | None = None
    metadata: dict[str, Any] | None = None

    @property
    def written_at_dt(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.written_at)


class _HashingWriter:
    """A write-only file wrapper that hashes and counts what passes through."""

    def __init__(self, f: Any):
        self._f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        self.sha.update(mv)
        self.size += mv.nbytes
        return self._f.write(mv)

    def flush(self) -> None:
        self._f.flush()


def _serialize(state: Any, f: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(state, f)
        return "torch"
    pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    return "pickle"


def _deserialize(data: bytes, fmt: str, map_location: Any = None) -> Any:
    if fmt == "torch":
        import torch

        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)
    if fmt == "pickle":
        return pickle.loads(data)
    raise CheckpointError(f"unknown checkpoint format {fmt!r}")


class CheckpointStore:
    """Atomic, checksummed checkpoints in a folder or at an fsspec URL."""

    def __init__(self, url: str | os.PathLike[str], keep_last: int = 3, *, log: Callable[[str], None] | None = None):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        import fsspec.core
        from fsspec.implementations.local import LocalFileSystem

        self.url = str(url)
        self.keep_last = keep_last
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        self._log = log or (lambda msg: None)
        self.fs.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        from gpu_ops.domain.formatting import redact_url

        return f"CheckpointStore({redact_url(self.url, keep_path=True)!r}, keep_last={self.keep_last})"

    # ---- names

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _entries(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        try:
            names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return out
        for name in names:
            m = _NAME.match(name)
            if m:
                out.setdefault(int(m.group(1)), set()).add(m.group(2))
        return out

    # ---- writing

    def _write_atomic(self, name: str, produce: Callable[[Any], Any]) -> Any:
        final = self._path(name)
        if not self.local:
            # Object stores: a PUT is atomic; nothing references the object until the
            # manifest is written, so a partial upload is never seen.
            with self.fs.open(final, "wb") as f:
                return produce(f)
        tmp = self._path(f"{_TMP_PREFIX}{name}.{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                result = produce(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        return result

    def save(self, state: Any, *, step: int | None = None, attempt: int | None = None, metadata: dict[str, Any] | None = None) -> CheckpointInfo:
        """Write ``state`` as the newest checkpoint and prune to ``keep_last``."""
        started = time.monotonic()
        entries = self._entries()
        seq = max(entries, default=0) + 1
        stem = f"ckpt-{seq:09d}"

        def write_data(f: Any) -> tuple[str, str, int]:
            w = _HashingWriter(f)
            fmt = _serialize(state, w)
            return fmt, w.sha.hexdigest(), w.size

        fmt, sha, size = self._write_atomic(f"{stem}.bin", write_data)
        info = CheckpointInfo(
            seq=seq,
            step=step,
            sha256=sha,
            size=size,
            written_at=dt.datetime.now(dt.timezone.utc).isoformat(),
            save_seconds=round(time.monotonic() - started, 6),
            format=fmt,
            attempt=attempt,
            metadata=metadata,
        )
        body = json.dumps(asdict(info), sort_keys=True, default=str).encode()
        self._write_atomic(f"{stem}.json", lambda f: f.write(body))
        self._prune(seq)
        return info

    def _prune(self, newest: int) -> None:
        entries = self._entries()
        committed = sorted((s for s, kinds in entries.items() if "json" in kinds), reverse=True)
        keep = set(committed[: self.keep_last])
        for seq, kinds in entries.items():
            if seq in keep or seq > newest:
                continue
            # Manifest first: a crash in between leaves an orphan data file, never a
            # manifest pointing at nothing.
            for kind in ("json", "bin"):
                if kind in kinds:
                    try:
                        self.fs.rm(self._path(f"ckpt-{seq:09d}.{kind}"))
                    except FileNotFoundError:
                        pass

    def remove_partial(self) -> int:
        """Delete temporary files left by writers that were killed; call when no writer runs."""
        removed = 0
        try:
            names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return 0
        entries = self._entries()
        for name in names:
            stale_tmp = name.startswith(_TMP_PREFIX)
            m = _NAME.match(name)
            orphan = m is not None and m.group(2) == "bin" and "json" not in entries.get(int(m.group(1)), set())
            if stale_tmp or orphan:
                try:
                    self.fs.rm(self._path(name))
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    # ---- reading

    def _manifest(self, seq: int) -> CheckpointInfo:
        raw = self.fs.cat_file(self._path(f"ckpt-{seq:09d}.json"))
        data = json.loads(raw)
        return CheckpointInfo(**{k: data.get(k) for k in CheckpointInfo.__dataclass_fields__})

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints, newest first (manifests only; data not verified)."""
        out = []
        for seq in sorted((s for s, k in self._entries().items() if "json" in k), reverse=True):
            try:
                out.append(self._manifest(seq))
            except (ValueError, TypeError, OSError) as exc:
                self._log(f"checkpoint #{seq}: manifest unreadable ({type(exc).__name__}); ignored")
        return out

    def _verified_bytes(self, info: CheckpointInfo) -> bytes:
        data = self.fs.cat_file(self._path(f"ckpt-{info.seq:09d}.bin"))
        if len(data) != info.size:
            raise CheckpointError(f"checkpoint #{info.seq} is partial: {len(data)} of {info.size} bytes")
        digest = hashlib.sha256(data).hexdigest()
        if digest != info.sha256:
            raise CheckpointError(f"checkpoint #{info.seq} is corrupt: sha256 {digest[:12]}… != manifest {info.sha256[:12]}…")
        return data

    def load_with_info(self, map_location: Any = None) -> tuple[Any, CheckpointInfo] | None:
        """The newest valid checkpoint and its manifest; None when there is none."""
        for info in self.list():
            try:
                data = self._verified_bytes(info)
                return _deserialize(data, info.format, map_location), info
            except (CheckpointError, OSError, EOFError, pickle.UnpicklingError, RuntimeError, ValueError) as exc:
                self._log(f"{exc}; falling back to the previous checkpoint")
        return None

    def load(self, map_location: Any = None) -> Any | None:
        found = self.load_with_info(map_location)
        return None if found is None else found[0]

    def latest_valid(self) -> CheckpointInfo | None:
        """The manifest of the newest checkpoint whose data verifies."""
        for info in self.list():
            try:
                self._verified_bytes(info)
                return info
            except (CheckpointError, OSError) as exc:
                self._log(f"{exc}")
        return None


def checkpoint_url_for(root: str, asset_key: str, partition_key: str | None, run_scope: str) -> str:
    """Where one run's checkpoints of one asset (partition) live under ``root``."""
    parts = [p for p in re.split(r"[/]", asset_key) if p] + ([_safe(partition_key)] if partition_key else []) + [_safe(run_scope)]
    base = root.rstrip("/")
    if "://" not in base:
        return str(Path(base).joinpath(*parts))
    return "/".join([base, *parts])


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", s)
