"""The GPU catalog: canonical names, aliases, memory, AWS instance shapes, MIG profiles.

Names are matched exactly after normalisation (case, ``_`` and spaces); there is no
prefix or fuzzy matching, so ``a10`` never becomes ``a100``. An unknown name raises
:class:`UnknownGpuType` listing the close matches. Pure data; no Dagster, no torch.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from fractions import Fraction
from gpu_ops.errors import UnknownGpuType, UnknownMigProfile


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "1g.10gb"
    compute_slices: int  # of 7
    memory_slices: int  # of 8

    @property
    def share(self) -> Fraction:
        # A slice costs whichever resource it takes more of: 1g.10gb takes 1/7 of the
        # compute and 1/8 of the memory, so 1/7; 1g.20gb takes 2/8 of the memory, so 1/4.
        return max(Fraction(self.compute_slices, 7), Fraction(self.memory_slices, 8))

    @property
    def resource_name(self) -> str:
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True)
class GpuSpec:
    name: str  # canonical
    memory_gib: int
    karpenter_gpu_name: str  # value of the karpenter.k8s.aws/instance-gpu-name label
    # AWS instance type -> GPUs per instance
    instance_types: dict[str, int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    mig_profiles: tuple[MigProfile, ...] = ()
    # The most a GPU-hour of this type usually costs on demand, in USD, with headroom:
    # big-cloud list prices per GPU, single-GPU instances with many vCPUs included.
    # A price above it is an error unless marked deliberate (see config.PriceTable).
    usual_max_usd_per_gpu_hour: float = 16.0

    def mig_profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.mig_profiles) or "none (this GPU has no MIG)"
        raise UnknownMigProfile(f"{self.name} has no MIG profile {name!r} (profiles: {known})")

    def instance_types_for(self, gpus: int) -> list[str]:
        """Instance types able to host ``gpus`` GPUs of this type on one node."""
        return sorted((t for t, n in self.instance_types.items() if n >= gpus), key=lambda t: (self.instance_types[t], t))


def _mig(*profiles: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(n, c, m) for n, c, m in profiles)


_MIG_80GB = _mig(("1g.10gb", 1, 1), ("1g.20gb", 1, 2), ("2g.20gb", 2, 2), ("3g.40gb", 3, 4), ("4g.40gb", 4, 4), ("7g.80gb", 7, 8))
_MIG_40GB = _mig(("1g.5gb", 1, 1), ("1g.10gb", 1, 2), ("2g.10gb", 2, 2), ("3g.20gb", 3, 4), ("4g.20gb", 4, 4), ("7g.40gb", 7, 8))
_MIG_141GB = _mig(("1g.18gb", 1, 1), ("1g.35gb", 1, 2), ("2g.35gb", 2, 2), ("3g.71gb", 3, 4), ("4g.71gb", 4, 4), ("7g.141gb", 7, 8))


def _sizes(family: str, counts: dict[str, int]) -> dict[str, int]:
    return {f"{family}.{size}": n for size, n in counts.items()}


_SPECS = [
    GpuSpec(
        "h200", 141, "h200",
        {"p5e.48xlarge": 8, "p5en.48xlarge": 8},
        ("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "NVIDIA H200", "nvidia-h200-141gb"),
        _MIG_141GB,
    ),
    GpuSpec(
        "h100", 80, "h100",
        {"p5.48xlarge": 8, "p5.4xlarge": 1},
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", "nvidia-h100-80gb", "nvidia-h100-mega-80gb"),
        _MIG_80GB,
    ),
    GpuSpec(
        "a100-80gb", 80, "a100",
        {"p4de.24xlarge": 8},
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb"),
        _MIG_80GB,
    ),
    GpuSpec(
        "a100", 40, "a100",
        {"p4d.24xlarge": 8},
        ("a100-40gb", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "NVIDIA A100-SXM4-40GB", "nvidia-tesla-a100"),
        _MIG_40GB,
    ),
    GpuSpec(
        "l40s", 48, "l40s",
        {**_sizes("g6e", {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8})},
        ("NVIDIA-L40S", "NVIDIA L40S"),
    ),
    GpuSpec(
        "l4", 24, "l4",
        {**_sizes("g6", {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8})},
        ("NVIDIA-L4", "NVIDIA L4", "nvidia-l4"),
    ),
    GpuSpec(
        "a10g", 24, "a10g",
        {**_sizes("g5", {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8})},
        ("NVIDIA-A10G", "NVIDIA A10G"),
    ),
    GpuSpec(
        "t4", 16, "t4",
        {**_sizes("g4dn", {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4, "metal": 8})},
        ("Tesla-T4", "NVIDIA-Tesla-T4", "Tesla T4", "nvidia-tesla-t4"),
    ),
    GpuSpec(
        "v100", 16, "v100",
        {"p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8},
        ("Tesla-V100-SXM2-16GB", "NVIDIA-Tesla-V100-SXM2-16GB", "Tesla V100-SXM2-16GB", "nvidia-tesla-v100"),
    ),
]

# Usual per-GPU on-demand maxima (USD/h), from AWS us-east-1 list prices (p5 $98.32/8 =
# $12.29 per H100; g6e.16xlarge $7.58 for one L40S; g5.16xlarge $4.10 for one A10G; ...)
# and the other big clouds, plus about a third of headroom.
_USUAL_MAX = {"h200": 16.0, "h100": 16.0, "a100-80gb": 8.0, "a100": 6.0, "l40s": 9.0, "l4": 4.5, "a10g": 5.5, "t4": 5.5, "v100": 5.0}
_SPECS = [replace(s, usual_max_usd_per_gpu_hour=_USUAL_MAX[s.name]) for s in _SPECS]

CATALOG: dict[str, GpuSpec] = {s.name: s for s in _SPECS}


def _norm(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", "-").split())


_ALIASES: dict[str, str] = {}
for _spec in _SPECS:
    for _name in (_spec.name, *_spec.aliases):
        _key = _norm(_name)
        assert _ALIASES.setdefault(_key, _spec.name) == _spec.name, f"alias {_name} is ambiguous"


def canonical_gpu_type(name: str) -> str:
    """``NVIDIA-A100-SXM4-80GB`` -> ``a100-80gb``; unknown names raise :class:`UnknownGpuType`."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownGpuType(str(name), [], CATALOG)
    key = _norm(name)
    if key in _ALIASES:
        return _ALIASES[key]
    close = difflib.get_close_matches(key, list(_ALIASES), n=3, cutoff=0.6)
    return_names = list(dict.fromkeys(_ALIASES[c] for c in close))
    raise UnknownGpuType(name, return_names, CATALOG)


def gpu_spec(name: str) -> GpuSpec:
    return CATALOG[canonical_gpu_type(name)]


def gpu_share(gpu_type: str, mig_profile: str | None = None, timeslice_replicas: int | None = None) -> float:
    """Share of one physical GPU: 1 for a whole GPU, a MIG profile's share, or 1/R."""
    if mig_profile:
        return float(gpu_spec(gpu_type).mig_profile(mig_profile).share)
    if timeslice_replicas:
        if timeslice_replicas < 1:
            raise ValueError(f"time-slice replicas must be >= 1, got {timeslice_replicas}")
        return 1.0 / timeslice_replicas
    return 1.0


# Per-GPU-hour prices are held against these in USD and in currencies of about its
# value; other currencies are not checked (the figures would mean nothing there).
PRICE_CHECK_CURRENCIES = ("USD", "EUR", "GBP", "CHF")


def price_problem(gpu_type: str, capacity: str, price: float) -> str | None:
    """Why a per-GPU-hour price looks wrong for this GPU (None when it looks right).

    Prices are per GPU, never per instance: a price above the usual per-GPU range that
    becomes a usual one when divided by the GPUs of one of the GPU's instance shapes is
    named as that instance's price, with the per-GPU figure it probably meant.
    """
    spec = CATALOG[canonical_gpu_type(gpu_type)]
    limit = spec.usual_max_usd_per_gpu_hour
    if price <= limit:
        return None
    shapes: dict[int, list[str]] = {}
    for instance, n in sorted(spec.instance_types.items()):
        shapes.setdefault(n, []).append(instance)
    fits = [n for n in sorted(shapes) if n > 1 and price / n <= limit]
    keep = "mark the entry `deliberate: true` if this per-GPU price is meant"
    if fits:
        # Several shapes may fit (4 and 8 GPUs): name each with the figure it implies.
        whole = " or ".join(f"{' or '.join(shapes[n])} ({n} {spec.name} GPUs: {price:g} / {n} = {price / n:.2f} per GPU-hour)" for n in fits)
        meant = " or ".join(f"{price / n:.2f}" for n in fits)
        return (
            f"{price:g} per GPU-hour looks like the price of a whole {whole}. Prices are per GPU: write {meant}, "
            f"or {keep} (usual for {spec.name}: up to about {limit:g} per GPU-hour)"
        )
    most = max(shapes) if shapes else 1
    return (
        f"{price:g} per GPU-hour is far above the usual range for {spec.name} (up to about {limit:g} per GPU-hour on demand"
        + (f"; even divided by the {most} GPUs of a {' or '.join(shapes[most])} it is {price / most:.2f}" if most > 1 else "")
        + f"). Check the figure, or {keep}"
    )
