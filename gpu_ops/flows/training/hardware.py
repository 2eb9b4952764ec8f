"""What a worker really ran on: GPU model (catalog name), count, MIG profile — or CPU.
Pure apart from :func:`detect`; no torch import.

Design: docs/concepts/compute.md#what-a-worker-really-ran-on
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpu_ops.domain.compute.catalog import UnknownGpuType, canonical_gpu_type

CPU = "cpu"
UNDETERMINED = "undetermined"
# Model tokens of the catalog's GPUs, matched as whole tokens of the device name.
_TOKENS = {"h200": "h200", "h100": "h100", "l40s": "l40s", "l4": "l4", "a10g": "a10g", "t4": "t4", "v100": "v100"}
_MIG_NAME = re.compile(r"^(?P<model>.*?)\s+MIG\s+(?P<profile>\d+g\.\d+gb)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Hardware:
    """GPUs one worker saw. ``gpu_count`` 0 and ``gpu_type`` ``cpu`` for a CPU run."""

    gpu_type: str
    gpu_count: int
    mig_profile: str | None = None
    names: tuple[str, ...] = ()  # the devices' own names, as the driver gives them
    uuids: tuple[str, ...] = ()
    memory_gib: float | None = None
    source: str = "unknown"  # how it was found: no-driver, cuda-visible-devices, nvml, torch
    known: bool = True  # gpu_type is a catalog name

    @property
    def is_cpu(self) -> bool:
        return self.gpu_type == CPU

    @property
    def determined(self) -> bool:
        """False when a driver exists but neither NVML nor torch could say what it drives."""
        return self.is_cpu or self.gpu_count > 0

    def describe(self) -> str:
        if self.is_cpu:
            return CPU
        mig = f" MIG {self.mig_profile}" if self.mig_profile else ""
        return f"{self.gpu_count}x {self.gpu_type}{mig}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["names"], d["uuids"] = list(self.names), list(self.uuids)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Hardware":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["names"] = tuple(fields.get("names") or ())
        fields["uuids"] = tuple(fields.get("uuids") or ())
        return cls(**fields)


def cpu(source: str) -> Hardware:
    return Hardware(CPU, 0, source=source)


def catalog_name(device_name: str, memory_gib: float | None = None) -> tuple[str, bool]:
    """A device name -> (catalog name, known). ``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``."""
    try:
        return canonical_gpu_type(device_name), True
    except UnknownGpuType:
        pass
    tokens = re.split(r"[^a-z0-9]+", device_name.lower())
    if "a100" in tokens:
        big = any(t in ("80gb", "80g") for t in tokens) or (memory_gib is not None and memory_gib > 45)
        return ("a100-80gb" if big else "a100"), True
    for token, name in _TOKENS.items():
        if token in tokens:
            return name, True
    return "-".join(t for t in tokens if t) or "unknown", False


def from_devices(names: list[str], uuids: list[str] | None = None, memory_gib: float | None = None, source: str = "nvml") -> Hardware:
    """The GPUs named ``names`` (one entry per visible device) as one :class:`Hardware`.

    Mixed models are reported by the first (a node has one model); a MIG device name
    (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``) gives the parent model and the profile.
    """
    if not names:
        return cpu(source)
    first = names[0].strip()
    profile = None
    m = _MIG_NAME.match(first)
    if m:
        first, profile = m.group("model"), m.group("profile").lower()
    gpu_type, known = catalog_name(first, memory_gib)
    return Hardware(gpu_type, len(names), profile, tuple(n.strip() for n in names), tuple(uuids or ()), memory_gib, source, known)


def _no_driver() -> bool:
    return not Path("/dev/nvidiactl").exists() and not Path("/proc/driver/nvidia").exists()


def _visible(env: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES entries; None when unset (every device is visible)."""
    if env is None:
        return None
    return [e.strip() for e in env.split(",") if e.strip()]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml(visible: list[str] | None) -> Hardware:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        devices = _nvml_devices(pynvml)
    finally:
        pynvml.nvmlShutdown()
    chosen = _chosen_devices(devices, visible)
    return from_devices([d[0] for d in chosen], [d[1] for d in chosen], chosen[0][2] if chosen else None, "nvml")


def _nvml_devices(pynvml: Any) -> list[tuple[str, str, float]]:
    """(name, uuid, memory GiB) of every GPU and, after each MIG-enabled one, its MIG devices."""
    devices: list[tuple[str, str, float]] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        name, uuid = _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h))
        mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
        devices.append((name, uuid, mem))
        devices.extend(_mig_devices(pynvml, h))
    return devices


def _mig_devices(pynvml: Any, h: Any) -> list[tuple[str, str, float]]:
    """The MIG devices of the GPU ``h``; none when MIG is off or NVML cannot tell."""
    try:
        mig_on = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError:
        mig_on = False
    if not mig_on:
        return []
    out = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except pynvml.NVMLError:
            continue
        out.append((_text(pynvml.nvmlDeviceGetName(mh)), _text(pynvml.nvmlDeviceGetUUID(mh)), pynvml.nvmlDeviceGetMemoryInfo(mh).total / 2**30))
    return out


def _chosen_devices(devices: list[tuple[str, str, float]], visible: list[str] | None) -> list[tuple[str, str, float]]:
    """The devices CUDA_VISIBLE_DEVICES names: an index counts whole GPUs only; a UUID
    (or its prefix) names a GPU or a MIG device. Unset: every whole GPU."""
    whole = [d for d in devices if not d[1].startswith("MIG-")]
    if visible is None:
        return whole
    chosen = []
    for entry in visible:
        if entry.isdigit():
            if int(entry) < len(whole):
                chosen.append(whole[int(entry)])
        else:
            chosen += [d for d in devices if d[1] == entry or d[1].startswith(entry)]
    return chosen


def _torch() -> Hardware:
    torch = sys.modules["torch"]
    if not torch.cuda.is_available():
        return cpu("torch")
    n = torch.cuda.device_count()
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    uuids = [str(getattr(p, "uuid", "")) for p in props]
    return from_devices([p.name for p in props], uuids, props[0].total_memory / 2**30 if props else None, "torch")


def detect() -> Hardware:
    """The GPUs this process can use (see the module docstring for the order asked)."""
    visible = _visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible == [] or (visible is not None and all(v in ("-1", "none", "NoDevFiles") for v in visible)):
        return cpu("cuda-visible-devices")
    if _no_driver():
        return cpu("no-driver")
    try:
        return _nvml(visible)
    except Exception as exc:  # no nvidia-ml-py, or NVML cannot talk to the driver
        if "torch" in sys.modules:
            return _torch()
        return Hardware(UNDETERMINED, 0, source=f"undetermined: {type(exc).__name__}: {exc}"[:200], known=False)


def combine(reports: list[Hardware]) -> Hardware | None:
    """Several ranks' reports -> the launch's GPUs: distinct devices by UUID (ranks on
    one machine see the same GPUs), else the sum over ranks."""
    if not reports:
        return None
    gpu = [r for r in reports if r.gpu_count > 0]
    if not gpu:
        return reports[0]
    first = gpu[0]
    if all(r.uuids for r in gpu):
        uuids = tuple(dict.fromkeys(u for r in gpu for u in r.uuids))
        count = len(uuids)
    else:
        uuids, count = (), sum(r.gpu_count for r in gpu)
    names = tuple(n for r in gpu for n in r.names)
    return Hardware(first.gpu_type, count, first.mig_profile, names, uuids, first.memory_gib, first.source, first.known)


def declared(gpu_type: str, gpu_count: int, mig_profile: str | None = None) -> str:
    return f"{gpu_count}x {gpu_type}" + (f" MIG {mig_profile}" if mig_profile else "") if gpu_count else CPU


def mismatch(gpu_type: str, gpu_count: int, mig_profile: str | None, actual: Hardware, simulated: bool = False) -> str | None:
    """Why what ran differs from what was declared, or None when it does not. ``simulated``:
    CPU attempts are priced as the declared GPUs in the asset's metadata (training.simulate_gpu_pricing)."""
    want = declared(gpu_type, gpu_count, mig_profile)
    if not actual.determined or actual.describe() == want:
        return None
    if actual.is_cpu and simulated:
        return (
            f"declared {want} but the worker had no GPU: the ledger records it as CPU (not priced); the asset's "
            f"cost_usd prices it as the declared {want} (simulated: training.simulate_gpu_pricing)"
        )
    if actual.is_cpu:
        return f"declared {want} but the worker had no GPU: recorded as CPU, not priced as a GPU"
    extra = "" if actual.known else " (not in the GPU catalog: the cost flow quarantines it until it is added with a price)"
    return f"declared {want} but the worker had {actual.describe()} ({', '.join(dict.fromkeys(actual.names))}){extra}: recorded and priced as what ran"
