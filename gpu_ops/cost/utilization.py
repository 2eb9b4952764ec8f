"""GPU efficiency from DCGM metrics (dcgm-exporter) read through the Prometheus HTTP API.

Pure logic, no Dagster; httpx is imported when a query runs.

- Activity: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (0..1) where the exporter has it, else
  ``DCGM_FI_DEV_GPU_UTIL`` / 100 (whole GPUs only: NVML has no utilisation per MIG
  instance). For a MIG instance the profiling metric is relative to the instance.
- Memory: ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB).
- Each range-query point at ``t`` is ``avg_over_time(metric[step])``: the mean of the
  samples Prometheus stored in the step ending at ``t``. A step without samples has no
  point: a gap, never a zero.
- Join: by (namespace, pod) and time. A usage piece ``[a, b)`` gets the integral of its
  pod's activity over the steps that overlap it (partial steps pro rata):

      active_gpu_hours  = gpu_count × gpu_share × ∫ activity dt   (activity averaged over the pod's GPUs / MIG instances)
      metered_gpu_hours = gpu_count × gpu_share × (time with metrics)
      efficiency        = active_gpu_hours / metered_gpu_hours
      unused_cost_usd   = (metered_gpu_hours − active_gpu_hours) × price per GPU-hour

  Time without metrics is neither idle nor busy: it is left out of all three and shows
  as coverage (metered ÷ allocated GPU-hours) below 1. A piece with no metrics at all
  has NaN in every efficiency column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpu_ops.config import UtilizationConfig, parse_duration, redact_url
from gpu_ops.errors import GpuOpsError

if TYPE_CHECKING:
    from collections.abc import Sequence

ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
# Columns each usage row gains (NaN where there are no metrics).
EFFICIENCY_COLUMNS = (
    "active_gpu_hours", "metered_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib",
)
# Columns the attribution table gains.
GROUP_COLUMNS = ("active_gpu_hours", "efficiency", "unused_cost_usd")
SAMPLE_COLUMNS = ("namespace", "pod", "t", "activity", "devices", "memory_peak_mib", "memory_total_mib")
_SERIES = ("namespace", "pod", "UUID", "gpu", "GPU_I_ID")
MS_PER_HOUR = 3_600_000
MAX_POINTS = 10_000


class UtilizationError(GpuOpsError):
    """Prometheus could not be queried (names the server without credentials)."""


# --------------------------------------------------------------------------- Prometheus


@dataclass
class PrometheusClient:
    config: UtilizationConfig

    @property
    def step_s(self) -> float:
        return parse_duration(self.config.step).total_seconds()

    def _auth(self) -> Any:
        import httpx

        a = self.config.auth
        if a is None:
            return None
        if a.basic is not None:
            return httpx.BasicAuth(a.basic.username, a.basic.password.get())
        token = a.bearer.get() if a.bearer is not None else ""

        def bearer(request: Any) -> Any:
            request.headers["Authorization"] = f"Bearer {token}"
            return request

        return bearer

    def query_range(self, query: str, start: float, end: float) -> list[dict[str, Any]]:
        """``/api/v1/query_range`` result (a matrix), times in Unix seconds."""
        import httpx

        where = redact_url(self.config.url)
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.step_s:g}s"}
        try:
            with httpx.Client(timeout=self.config.timeout_s, auth=self._auth()) as client:
                r = client.get(self.config.url.rstrip("/") + "/api/v1/query_range", params=params)
        except httpx.HTTPError as exc:
            raise UtilizationError(f"Prometheus at {where} could not be queried: {type(exc).__name__}") from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code != 200 or body.get("status") != "success":
            raise UtilizationError(f"Prometheus at {where} answered HTTP {r.status_code} to {query!r}: {str(body.get('error', ''))[:200]}")
        return list(body["data"]["result"])


def _selector(config: UtilizationConfig) -> str:
    extra = config.selector.strip().strip("{}").strip()
    return '{pod!=""' + (f",{extra}" if extra else "") + "}"


def _frame(result: list[dict[str, Any]], value: str) -> pd.DataFrame:
    """Matrix result -> one row per (series, point): the exporter's labels, ``t`` (ms), value."""
    rows: dict[str, list[Any]] = {c: [] for c in (*_SERIES, "GPU_I_PROFILE", "t", value)}
    for series in result:
        labels = series.get("metric", {})
        for t, v in series.get("values", []):
            for c in (*_SERIES, "GPU_I_PROFILE"):
                rows[c].append(str(labels.get(c, "")))
            rows["t"].append(int(round(float(t) * 1000)))
            rows[value].append(float(v))
    return pd.DataFrame(rows)


def fetch_samples(client: PrometheusClient, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    """Per-pod activity and memory per step of ``[start, end)``: :data:`SAMPLE_COLUMNS`.

    ``t`` is the end of the step (Unix ms); ``activity`` is the mean over the pod's GPUs
    (or MIG instances) that reported in the step, ``devices`` how many did.
    """
    sel, step = _selector(client.config), client.step_s
    w = f"[{step:g}s]"
    # Points on the step grid; at most MAX_POINTS per query (Prometheus refuses 11,000).
    t0 = (np.floor(start.timestamp() / step) + 1) * step
    t1 = end.timestamp()
    chunks = []
    while t0 <= t1:
        last = min(t1, t0 + (MAX_POINTS - 1) * step)
        chunks.append((t0, last))
        t0 = last + step

    def q(fn: str, metric: str) -> pd.DataFrame:
        parts = [_frame(client.query_range(f"{fn}_over_time({metric}{sel}{w})", a, b), "v") for a, b in chunks]
        return pd.concat(parts, ignore_index=True) if parts else _frame([], "v")

    return device_samples_to_pods(q("avg", ACTIVE), q("avg", GPU_UTIL), q("max", FB_USED), q("avg", FB_FREE), q("avg", FB_USED))


def measured_rows(config: UtilizationConfig | None, rows: pd.DataFrame, window_start: Any, window_end: Any) -> tuple[pd.DataFrame, int]:
    """Priced rows of a window with the efficiency columns, and how many pod steps were read.

    Prometheus is asked only for the span the allocated rows cover inside the window.
    """
    alloc = rows[rows["kind"].astype(str) != "idle"] if "kind" in rows and len(rows) else rows
    if config is None or not len(alloc):
        return join_efficiency(rows, None, 0.0), 0
    client = PrometheusClient(config)
    lo = max(pd.Timestamp(window_start), pd.to_datetime(alloc["start"], utc=True).min())
    hi = min(pd.Timestamp(window_end), pd.to_datetime(alloc["end"], utc=True).max())
    samples = fetch_samples(client, lo, hi)
    return join_efficiency(rows, samples, client.step_s), len(samples)


def device_samples_to_pods(
    active: pd.DataFrame, util: pd.DataFrame, fb_used_max: pd.DataFrame, fb_free: pd.DataFrame, fb_used_avg: pd.DataFrame
) -> pd.DataFrame:
    """Per-device frames (from :func:`_frame`) -> per-pod steps.

    Activity per device: the profiling metric, else GPU_UTIL/100 for a whole GPU (never for
    a MIG instance). Memory: peak used, and total = used + free (averages).
    """
    key = [*_SERIES, "t"]
    dev = active.rename(columns={"v": "prof"})[[*key, "prof"]].merge(util.rename(columns={"v": "util"})[[*key, "util"]], on=key, how="outer")
    whole = dev["GPU_I_ID"].fillna("") == ""
    dev["activity"] = dev["prof"].where(dev["prof"].notna(), (dev["util"] / 100.0).where(whole))
    dev = dev[dev["activity"].notna()][[*key, "activity"]]
    dev["activity"] = dev["activity"].clip(0.0, 1.0)
    mem = fb_used_max.rename(columns={"v": "used_max"})[[*key, "used_max"]]
    tot = fb_used_avg.rename(columns={"v": "u"})[[*key, "u"]].merge(fb_free.rename(columns={"v": "f"})[[*key, "f"]], on=key)
    tot["total"] = tot["u"] + tot["f"]
    dev = dev.merge(mem, on=key, how="left").merge(tot[[*key, "total"]], on=key, how="left")
    if dev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("namespace", "pod") else float) for c in SAMPLE_COLUMNS})
    out = dev.groupby(["namespace", "pod", "t"], sort=True, as_index=False).agg(
        activity=("activity", "mean"), devices=("activity", "size"), memory_peak_mib=("used_max", "max"), memory_total_mib=("total", "max"),
    )
    return out[list(SAMPLE_COLUMNS)]


# --------------------------------------------------------------------------- the join


def _ms(ts: pd.Series) -> np.ndarray:
    """UTC timestamps -> Unix ms (NaT -> int64 min)."""
    v = pd.to_datetime(ts, utc=True).array.asi8 if len(ts) else np.array([], np.int64)
    nat = v == np.iinfo(np.int64).min
    return np.where(nat, v, v // 1_000_000)


def _codes_in(values: pd.Series, index: pd.Index) -> np.ndarray:
    """Position of each value in ``index`` (-1 when absent); categoricals via their categories."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        lut = np.append(index.get_indexer(values.cat.categories.astype(str)), -1)
        return lut[values.cat.codes.to_numpy()]  # code -1 (missing) lands on the trailing -1
    if hasattr(values.array, "__arrow_array__"):  # Arrow-backed text (Parquet): looked up in Arrow
        import pyarrow as pa
        import pyarrow.compute as pc

        found = pc.index_in(pa.array(values.array), value_set=pa.array(index.to_numpy(dtype=object), pa.string()))
        return np.asarray(found.fill_null(-1), dtype=np.int64)
    return index.get_indexer(values.astype(object).where(values.notna(), "").astype(str))


def _series_ids(rows: pd.DataFrame, samples: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(series id per sample, series id per row; -1 where the pod has no metrics).

    Integer codes, never tuples of strings: ten million rows are looked up in the (much
    smaller) set of pods that have metrics.
    """
    ns_index, pod_index = (pd.Index(pd.unique(samples[c].astype(str))) for c in ("namespace", "pod"))
    width = len(pod_index)
    sample_key = _codes_in(samples["namespace"], ns_index).astype(np.int64) * width + _codes_in(samples["pod"], pod_index)
    codes, uniques = pd.factorize(sample_key)
    ns, pod = _codes_in(rows["namespace"], ns_index), _codes_in(rows["pod"], pod_index)
    row_key = np.where((ns >= 0) & (pod >= 0), ns.astype(np.int64) * width + pod, -1)
    return codes, pd.Index(uniques).get_indexer(row_key)


@dataclass
class _Steps:
    """The samples of every pod, sorted by (pod, step end), with prefix integrals."""

    key: np.ndarray  # (series id << 42) | (t - origin) in ms, sorted
    start: np.ndarray  # step start (ms since origin)
    activity: np.ndarray
    cum_active: np.ndarray  # ∫ activity over the steps before i (ms), length n + 1
    cum_covered: np.ndarray  # covered ms before i
    memory_peak: np.ndarray
    memory_total: np.ndarray
    origin: int
    step_ms: int

    def composite(self, sid: np.ndarray, t_ms: np.ndarray) -> np.ndarray:
        rel = np.clip(t_ms - self.origin, 0, (1 << 42) - 1)
        return (sid.astype(np.int64) << 42) | rel

    def integral(self, sid: np.ndarray, t_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(∫ activity, covered ms) of the pod from the beginning up to ``t``."""
        rel = np.clip(t_ms - self.origin, 0, (1 << 42) - 1)
        idx = np.searchsorted(self.key, (sid.astype(np.int64) << 42) | rel, side="right")
        ok = idx < len(self.key)
        j = np.where(ok, idx, 0)
        same = ok & ((self.key[j] >> 42) == sid) & (self.start[j] < rel)
        part = np.where(same, rel - self.start[j], 0)
        return self.cum_active[idx] + part * np.where(same, self.activity[j], 0.0), self.cum_covered[idx] + part


def _steps(samples: pd.DataFrame, sid: np.ndarray, step_ms: int) -> _Steps:
    t = samples["t"].to_numpy(dtype=np.int64)
    origin = int(t.min()) - step_ms if len(t) else 0
    key = (sid.astype(np.int64) << 42) | (t - origin)
    order = np.argsort(key, kind="stable")
    key = key[order]
    act = samples["activity"].to_numpy(dtype=float)[order]
    zero = np.zeros(1)
    return _Steps(
        key=key, start=(key & ((1 << 42) - 1)) - step_ms, activity=act,
        cum_active=np.concatenate([zero, np.cumsum(act * step_ms)]), cum_covered=np.concatenate([zero, np.cumsum(np.full(len(act), float(step_ms)))]),
        memory_peak=samples["memory_peak_mib"].to_numpy(dtype=float)[order], memory_total=samples["memory_total_mib"].to_numpy(dtype=float)[order],
        origin=origin, step_ms=step_ms,
    )


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per row, NaN for an empty range or all-NaN values."""
    out = np.full(len(lo), np.nan)
    ok = hi > lo
    if ok.any() and len(values):
        v = np.where(np.isnan(values), -np.inf, values)
        # reduceat over the index pairs (lo0, hi0, lo1, hi1, ...): every even result is
        # max(v[lo:hi]); the odd ones (hi -> next lo) are thrown away.
        r = np.maximum.reduceat(np.append(v, -np.inf), np.concatenate([lo[ok], hi[ok]]).reshape(2, -1).T.ravel())[::2]
        out[ok] = np.where(np.isinf(r), np.nan, r)
    return out


def join_efficiency(rows: pd.DataFrame, samples: pd.DataFrame | None, step_s: float) -> pd.DataFrame:
    """``rows`` (priced usage pieces, idle rows too) with :data:`EFFICIENCY_COLUMNS` added.

    ``samples``: per-pod steps from :func:`fetch_samples` (None: no utilisation source;
    every column NaN). Idle rows and pieces without any metrics stay NaN.
    """
    n = len(rows)
    cols = {c: np.full(n, np.nan) for c in EFFICIENCY_COLUMNS}
    if samples is not None and len(samples) and n:
        step_ms = int(round(step_s * 1000))
        sample_sid, row_sid = _series_ids(rows, samples)
        if "kind" in rows:
            row_sid = np.where(rows["kind"].astype(str).to_numpy() == "idle", -1, row_sid)
        has = np.flatnonzero(row_sid >= 0)
        steps = _steps(samples, sample_sid, step_ms)
        sid = row_sid[has]
        a = _ms(rows["start"].iloc[has])
        b = _ms(rows["end"].iloc[has])
        act_a, cov_a = steps.integral(sid, a)
        act_b, cov_b = steps.integral(sid, b)
        covered = cov_b - cov_a
        scale = rows["gpu_count"].to_numpy(dtype=float)[has] * rows["gpu_share"].to_numpy(dtype=float)[has] / MS_PER_HOUR
        metered = np.where(covered > 0, covered * scale, np.nan)
        active = np.where(covered > 0, (act_b - act_a) * scale, np.nan)
        price = pd.to_numeric(rows["price_per_gpu_hour"].iloc[has], errors="coerce").to_numpy(dtype=float)
        # Steps overlapping [a, b): end > a and start < b.
        lo = np.searchsorted(steps.key, steps.composite(sid, a), side="right")
        hi = np.searchsorted(steps.key, steps.composite(sid, b + step_ms), side="left")
        hi = np.maximum(lo, hi)
        cols["active_gpu_hours"][has] = active
        cols["metered_gpu_hours"][has] = metered
        cols["efficiency"][has] = active / metered
        cols["unused_cost_usd"][has] = (metered - active) * price
        cols["activity_peak"][has] = np.where(covered > 0, _range_max(steps.activity, lo, hi), np.nan)
        cols["memory_peak_mib"][has] = np.where(covered > 0, _range_max(steps.memory_peak, lo, hi), np.nan)
        cols["memory_total_mib"][has] = np.where(covered > 0, _range_max(steps.memory_total, lo, hi), np.nan)
    return rows.assign(**cols)


# --------------------------------------------------------------------------- summaries


def coverage(rows: pd.DataFrame) -> dict[str, Any]:
    """Fraction of allocated GPU-hours with metrics, and the fleet's efficiency over them."""
    alloc = rows[rows["kind"].astype(str) != "idle"] if "kind" in rows else rows
    gh = float(alloc["gpu_hours"].sum()) if len(alloc) else 0.0
    if "metered_gpu_hours" not in alloc:
        return {"metered_gpu_hours": 0.0, "coverage": None, "efficiency": None, "active_gpu_hours": None, "unused_cost_usd": None}
    metered = float(alloc["metered_gpu_hours"].sum())
    active = float(alloc["active_gpu_hours"].sum())
    return {
        "metered_gpu_hours": metered,
        "coverage": metered / gh if gh > 0 else None,
        "active_gpu_hours": active if metered > 0 else None,
        "efficiency": active / metered if metered > 0 else None,
        "unused_cost_usd": float(alloc["unused_cost_usd"].sum()) if metered > 0 else None,
    }


def group_efficiency(table: pd.DataFrame, rows: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    """Attribution ``table`` with ``active_gpu_hours``, ``efficiency`` and ``unused_cost_usd``
    per group (summed from the usage rows; NaN for a group without metrics and for idle)."""
    from gpu_ops.cost.attribution import key_column, key_frame

    table = table.drop(columns=[c for c in GROUP_COLUMNS if c in table])
    key_cols = [key_column(k) for k in group_by]
    if not len(table) or "metered_gpu_hours" not in rows or not key_cols:
        return table.assign(**dict.fromkeys(GROUP_COLUMNS, np.nan))
    alloc = rows[rows["kind"].astype(str) != "idle"] if "kind" in rows else rows
    keys = key_frame(alloc, list(group_by))
    g = pd.DataFrame({c: keys[c].astype(object).where(keys[c].notna(), "").astype(str).to_numpy() for c in key_cols})
    for c in ("active_gpu_hours", "metered_gpu_hours", "unused_cost_usd"):
        g[c] = alloc[c].to_numpy(dtype=float)
    sums = g.groupby(key_cols, sort=False, as_index=False).sum(min_count=1)
    sums["efficiency"] = sums["active_gpu_hours"] / sums["metered_gpu_hours"]
    return table.merge(sums[[*key_cols, *GROUP_COLUMNS]], on=key_cols, how="left")
