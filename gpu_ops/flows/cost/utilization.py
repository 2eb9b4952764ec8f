"""GPU efficiency from DCGM metrics (dcgm-exporter) read through the Prometheus HTTP API.
Pure logic, no Dagster.

Design: docs/concepts/cost-sources.md#gpu-efficiency-from-dcgm
"""

from __future__ import annotations

import base64
import math
import re
import urllib.parse
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ijson
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpu_ops.flows.bounded_http import Bounds, RemoteError, exchange
from gpu_ops.domain.config import UtilizationConfig, parse_duration
from gpu_ops.flows.cost.attribution import is_idle, key_column, key_frame
from gpu_ops.domain.formatting import redact_url
from gpu_ops.errors import UtilizationError

if TYPE_CHECKING:
    from collections.abc import Sequence

ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
# What a sample of each metric may be; anything else (non-finite, out of range) is no
# measurement: dropped and counted, never clipped into one.
VALID_RANGE = {ACTIVE: (0.0, 1.0), GPU_UTIL: (0.0, 100.0), FB_USED: (0.0, math.inf), FB_FREE: (0.0, math.inf)}
# A sample's time (Unix seconds) must be one a timestamp holds (1677-09-22 .. 2262-04-11):
# another is no measurement either.
_TIME_RANGE_S = (-9.2e9, 9.2e9)
# Columns each usage row gains (NaN where there are no metrics).
EFFICIENCY_COLUMNS = (
    "active_gpu_hours", "metered_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib",
)
# Columns the attribution table gains.
GROUP_COLUMNS = ("active_gpu_hours", "efficiency", "unused_cost_usd")
SAMPLE_COLUMNS = ("namespace", "pod", "t", "activity", "devices", "memory_peak_mib", "memory_total_mib")
_SERIES = ("namespace", "pod", "UUID", "gpu", "GPU_I_ID")
_LABELS = (*_SERIES, "GPU_I_PROFILE")
MS_PER_HOUR = 3_600_000
MAX_POINTS = 10_000
MAX_DEPTH = 8
# A Prometheus sample value: Go's strconv.FormatFloat output, NaN and ±Inf (nothing else).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN", re.ASCII)


# --------------------------------------------------------------------------- Prometheus


@dataclass
class Series:
    """One series of a matrix answer: its labels, times (s) and values, compactly."""

    labels: dict[str, str]
    t: array = field(default_factory=lambda: array("d"))
    v: array = field(default_factory=lambda: array("d"))


class _Matrix:
    """Folds ijson events of a ``query_range`` answer into :class:`Series`, counting samples."""

    def __init__(self, fail: Any, max_samples: int):
        self.fail, self.max_samples = fail, max_samples
        self.status: str | None = None
        self.error = ""
        self.result_type: str | None = None
        self.series: list[Series] = []
        self.samples = 0
        self.odd = ""  # something under data.result that a matrix does not have
        self._current: Series | None = None
        self._pair: list[Any] = []
        self._path: list[str] = []  # one slot per open container: its current key, or "item"
        self._values_depth = 0  # len(path) inside a series' values, else 0

    def event(self, event: str, value: Any) -> None:
        """One ijson *basic* event (no prefixes: an endless ``[[[[`` would make them quadratic)."""
        path = self._path
        if self._values_depth and self._point_event(event, value, len(path)):
            return
        if event == "map_key":
            path[-1] = value
            self.feed(".".join(path[:-1]), event, value)
        elif event in ("start_map", "start_array"):
            prefix = ".".join(path)
            self.feed(prefix, event, value)
            path.append("" if event == "start_map" else "item")
            if len(path) > MAX_DEPTH:
                raise self.fail(f"JSON nested deeper than {MAX_DEPTH} levels (a query_range answer has 6)")
            if prefix == "data.result.item.values" and event == "start_array" and self._current is not None:
                self._values_depth = len(path)
        elif event in ("end_map", "end_array"):
            path.pop()
            if len(path) < self._values_depth:
                self._values_depth = 0
            self.feed(".".join(path), event, value)
        else:
            self.feed(".".join(path), event, value)

    def _point_event(self, event: str, value: Any, depth: int) -> bool:
        """The fast path for the points of a series' ``values`` (four events per sample)."""
        if depth == self._values_depth + 1:
            if event in ("number", "string"):
                self._pair.append(value)
                return True
            if event == "end_array":
                self._path.pop()
                self._point()
                return True
        elif depth == self._values_depth and event == "start_array":
            self._path.append("item")
            self._pair = []
            return True
        return False

    def feed(self, prefix: str, event: str, value: Any) -> None:
        if prefix.startswith("data.result.item"):
            self._result(prefix[len("data.result.item"):], event, value)
        elif prefix == "status" and event == "string":
            self.status = value
        elif prefix == "error" and event == "string":
            self.error = value
        elif prefix == "data.resultType" and event == "string":
            self.result_type = value
        elif prefix == "data.result" and event not in ("start_array", "end_array"):
            self.odd = self.odd or f"data.result is a {event}, not a list of series"

    def _result(self, rest: str, event: str, value: Any) -> None:
        if rest == "":
            self._series_event(event, value)
        elif self._current is None:
            return
        elif rest.startswith(".metric.") and event == "string":
            self._current.labels[rest[len(".metric."):]] = value
        elif rest == ".values.item":
            if event == "start_array":
                self._pair = []
            elif event == "end_array":
                self._point()
        elif rest.startswith(".values.item.item"):
            self.odd = self.odd or "a point of a series holds something other than a time and a value"

    def _series_event(self, event: str, value: Any) -> None:
        """An event of one element of ``data.result``: a series opens or closes."""
        if event == "start_map":
            self._current = Series({})
        elif event == "end_map" and self._current is not None:
            self.series.append(self._current)
            self._current = None
        elif event == "map_key":
            if value == "value":
                self.odd = self.odd or "a series with one value (an instant vector), not a range"
        elif event != "end_map":
            self.odd = self.odd or f"data.result holds a {event}, not a series"

    def _point(self) -> None:
        pair, series = self._pair, self._current
        assert series is not None
        if len(pair) != 2 or isinstance(pair[0], (str, bool)) or not isinstance(pair[0], (int, float)) or not math.isfinite(pair[0]):
            raise self.fail(f"a point of series {_labels_text(series.labels)} is {pair!r}, not [time, \"value\"]")
        if not isinstance(pair[1], str) or not _NUMBER.fullmatch(pair[1]):
            raise self.fail(f"series {_labels_text(series.labels)} has the value {pair[1]!r} at {pair[0]:.3f}, which is not a number")
        self.samples += 1
        if self.samples > self.max_samples:
            raise self.fail(f"answered more than {self.max_samples:,} samples (usage.utilization.max_samples); narrow usage.utilization.selector or raise the limit")
        series.t.append(float(pair[0]))
        series.v.append(float(pair[1]))

    def result(self) -> list[Series]:
        if self.status != "success":
            raise self.fail(f"status {self.status!r}: {self.error[:200]}" if self.status else "an answer without a status")
        if self.result_type is None:
            raise self.fail("an answer without data.resultType (no data)")
        if self.result_type != "matrix":
            raise self.fail(f"a {self.result_type} result, not a matrix")
        if self.odd:
            raise self.fail(self.odd)
        return self.series


def _labels_text(labels: dict[str, str]) -> str:
    shown = {k: labels[k] for k in ("namespace", "pod", "gpu") if k in labels}
    return "{" + ",".join(f"{k}={v!r}" for k, v in shown.items()) + "}"


@dataclass
class PrometheusClient:
    config: UtilizationConfig
    # Samples dropped per metric since the client was made (non-finite or out of range).
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return parse_duration(self.config.step).total_seconds()

    @property
    def where(self) -> str:
        return redact_url(self.config.url)

    def _headers(self) -> dict[str, str]:
        a = self.config.auth
        if a is None:
            return {}
        if a.basic is not None:
            pair = f"{a.basic.username}:{a.basic.password.get()}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {"Authorization": f"Bearer {a.bearer.get() if a.bearer is not None else ''}"}

    def query_range(self, query: str, start: float, end: float) -> list[Series]:
        """``/api/v1/query_range`` (a matrix), times in Unix seconds, parsed as it streams in
        within ``timeout_s`` (total), ``max_response_bytes`` and ``max_samples``."""
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{self.step_s:g}s"}
        url = self.config.url.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(params)
        bounds = Bounds(self.config.timeout_s, self.config.max_response_bytes)

        def fail(what: str) -> UtilizationError:
            return UtilizationError(f"Prometheus at {self.where} answered {what} (query {query!r})")

        matrix = _Matrix(fail, self.config.max_samples)
        try:
            with exchange("GET", url, bounds=bounds, headers={"Accept": "application/json", **self._headers()}) as answer:
                events = ijson.sendable_list()
                parser = ijson.basic_parse_coro(events, use_float=True)
                try:
                    for chunk in answer.chunks():
                        parser.send(chunk)
                        for event, value in events:
                            matrix.event(event, value)
                        del events[:]
                    parser.close()
                    for event, value in events:
                        matrix.event(event, value)
                except ijson.JSONError as exc:
                    if answer.status != 200:
                        raise fail(f"HTTP {answer.status} with a body that is not JSON") from None
                    raise fail(f"a body that is not valid JSON after {answer.read_bytes:,} bytes ({str(exc)[:80]})") from None
                if answer.status != 200:
                    raise fail(f"HTTP {answer.status}: {matrix.error[:200]}")
        except RemoteError as exc:
            raise UtilizationError(f"Prometheus at {self.where} could not be queried: {exc.what} (query {query!r})") from None
        return matrix.result()

    def frame(self, series: list[Series], metric: str) -> pd.DataFrame:
        """Matrix -> one row per (series, point): the exporter's labels, ``t`` (ms), ``v``.
        Samples outside the metric's :data:`VALID_RANGE` (or not finite), or at a time no
        timestamp holds, are left out and counted."""
        counts = np.fromiter((len(s.t) for s in series), dtype=np.int64, count=len(series))
        t = np.concatenate([np.frombuffer(s.t, dtype=float) for s in series]) if series else np.zeros(0)
        v = np.concatenate([np.frombuffer(s.v, dtype=float) for s in series]) if series else np.zeros(0)
        lo, hi = VALID_RANGE.get(metric, (-math.inf, math.inf))
        ok = np.isfinite(v) & (v >= lo) & (v <= hi) & (t > _TIME_RANGE_S[0]) & (t < _TIME_RANGE_S[1])  # NaN times compare False
        if not ok.all():
            self.rejected[metric] = self.rejected.get(metric, 0) + int((~ok).sum())
        cols: dict[str, Any] = {c: np.repeat(np.array([s.labels.get(c, "") for s in series], dtype=object), counts)[ok] for c in _LABELS}
        cols["t"] = np.rint(t[ok] * 1000).astype(np.int64)
        cols["v"] = v[ok]
        return pd.DataFrame(cols)


def _selector(config: UtilizationConfig) -> str:
    extra = config.selector.strip().strip("{}").strip()
    return '{pod!=""' + (f",{extra}" if extra else "") + "}"


def fetch_samples(client: PrometheusClient, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    """Per-pod activity and memory per step of ``[start, end)``: :data:`SAMPLE_COLUMNS`.

    ``t`` is the end of the step (Unix ms); ``activity`` is the mean over the pod's GPUs
    (or MIG instances) that reported in the step, ``devices`` how many did.
    Raises :class:`UtilizationError` when a query fails or its answer is malformed.
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
        parts = [client.frame(client.query_range(f"{fn}_over_time({metric}{sel}{w})", a, b), metric) for a, b in chunks]
        return pd.concat(parts, ignore_index=True) if parts else client.frame([], metric)

    return device_samples_to_pods(q("avg", ACTIVE), q("avg", GPU_UTIL), q("max", FB_USED), q("avg", FB_FREE), q("avg", FB_USED))


@dataclass
class Measurement:
    """Usage rows with the efficiency columns, and what the metrics source said."""

    rows: pd.DataFrame
    pod_steps: int = 0
    missing: str | None = None  # why the window has no metrics (the source failed), else None
    rejected: dict[str, int] = field(default_factory=dict)  # samples that were no measurement, per metric

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.missing:
            out["metrics_missing"] = self.missing
        if self.rejected:
            out["metrics_rejected_samples"] = ", ".join(f"{m}: {n}" for m, n in sorted(self.rejected.items())) + " (not finite or out of range; no measurement)"
        return out


def measured_rows(config: UtilizationConfig | None, rows: pd.DataFrame, window_start: Any, window_end: Any) -> Measurement:
    """Priced rows of a window with the efficiency columns, and how many pod steps were read.

    Prometheus is asked only for the span the allocated rows cover inside the window. When
    it cannot be read, or answers something malformed, the window has no metrics (every
    efficiency column empty, coverage 0) and :attr:`Measurement.missing` says why.
    """
    alloc = _allocated(rows)
    if config is None or not len(alloc):
        return Measurement(join_efficiency(rows, None, 0.0))
    client = PrometheusClient(config)
    lo = max(pd.Timestamp(window_start), pd.to_datetime(alloc["start"], utc=True).min())
    hi = min(pd.Timestamp(window_end), pd.to_datetime(alloc["end"], utc=True).max())
    try:
        samples = fetch_samples(client, lo, hi)
    except UtilizationError as exc:
        return Measurement(join_efficiency(rows, None, 0.0), 0, f"no metrics for {lo:%Y-%m-%d %H:%M} .. {hi:%Y-%m-%d %H:%M} UTC: {exc}", dict(client.rejected))
    return Measurement(join_efficiency(rows, samples, client.step_s), len(samples), None, dict(client.rejected))


def device_samples_to_pods(
    active: pd.DataFrame, util: pd.DataFrame, fb_used_max: pd.DataFrame, fb_free: pd.DataFrame, fb_used_avg: pd.DataFrame
) -> pd.DataFrame:
    """Per-device frames (from :meth:`PrometheusClient.frame`) -> per-pod steps.

    Activity per device: the profiling metric, else GPU_UTIL/100 for a whole GPU (never for
    a MIG instance). Memory: peak used, and total = used + free (averages).
    """
    key = [*_SERIES, "t"]
    dev = active.rename(columns={"v": "prof"})[[*key, "prof"]].merge(util.rename(columns={"v": "util"})[[*key, "util"]], on=key, how="outer")
    whole = dev["GPU_I_ID"].fillna("") == ""
    dev["activity"] = dev["prof"].where(dev["prof"].notna(), (dev["util"] / 100.0).where(whole))
    dev = dev[dev["activity"].notna()][[*key, "activity"]]
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
    """UTC timestamps (any unit: ns, us, ms, s) -> Unix ms (NaT -> int64 min)."""
    if not len(ts):
        return np.array([], np.int64)
    return np.asarray(pd.to_datetime(ts, utc=True).dt.as_unit("ms").array.asi8, dtype=np.int64)


def _codes_in(values: pd.Series, index: pd.Index) -> np.ndarray:
    """Position of each value in ``index`` (-1 when absent); categoricals via their categories."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        lut = np.append(index.get_indexer(values.cat.categories.astype(str)), -1)
        return lut[values.cat.codes.to_numpy()]  # code -1 (missing) lands on the trailing -1
    if hasattr(values.array, "__arrow_array__"):  # Arrow-backed text (Parquet): looked up in Arrow

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


def _all_nan(rows: pd.DataFrame, c: str) -> bool:
    return c in rows and rows[c].dtype == np.float64 and bool(rows[c].isna().all())


def join_efficiency(rows: pd.DataFrame, samples: pd.DataFrame | None, step_s: float) -> pd.DataFrame:
    """``rows`` (priced usage pieces, idle rows too) with :data:`EFFICIENCY_COLUMNS` added.

    ``samples``: per-pod steps from :func:`fetch_samples` (None: no utilisation source;
    every column NaN). Idle rows and pieces without any metrics stay NaN.
    """
    n = len(rows)
    if samples is None or not len(samples) or not n:  # no metrics: columns already empty stay as they are (no second copy)
        return rows.assign(**{c: np.full(n, np.nan) for c in EFFICIENCY_COLUMNS if not _all_nan(rows, c)})
    cols = {c: np.full(n, np.nan) for c in EFFICIENCY_COLUMNS}
    step_ms = int(round(step_s * 1000))
    sample_sid, row_sid = _series_ids(rows, samples)
    if "kind" in rows:
        row_sid = np.where(is_idle(rows), -1, row_sid)
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


def _allocated(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that are not idle (``rows`` itself when none is: no copy, no text column built)."""
    idle = is_idle(rows)
    return rows[~idle] if idle.any() else rows


def coverage(rows: pd.DataFrame) -> dict[str, Any]:
    """Fraction of allocated GPU-hours with metrics, and the fleet's efficiency over them."""
    alloc = _allocated(rows)
    gh = float(alloc["gpu_hours"].sum()) if len(alloc) else 0.0
    if "metered_gpu_hours" not in alloc:
        return {"metered_gpu_hours": 0.0, "coverage": None, "efficiency": None, "active_gpu_hours": None, "unused_cost_usd": None}
    return coverage_of_sums(gh, {c: float(alloc[c].sum()) for c in _MEASURED_SUMS})


def coverage_of_sums(gpu_hours: float, sums: dict[str, float]) -> dict[str, Any]:
    """:func:`coverage` from the allocated rows' sums: GPU-hours and :data:`_MEASURED_SUMS`
    (missing values summed as 0)."""
    metered, active = sums["metered_gpu_hours"], sums["active_gpu_hours"]
    return {
        "metered_gpu_hours": metered,
        "coverage": metered / gpu_hours if gpu_hours > 0 else None,
        "active_gpu_hours": active if metered > 0 else None,
        "efficiency": active / metered if metered > 0 else None,
        "unused_cost_usd": sums["unused_cost_usd"] if metered > 0 else None,
    }


_MEASURED_SUMS = ("active_gpu_hours", "metered_gpu_hours", "unused_cost_usd")  # summed per group by group_efficiency


def group_efficiency(table: pd.DataFrame, rows: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    """Attribution ``table`` with ``active_gpu_hours``, ``efficiency`` and ``unused_cost_usd``
    per group (summed from the usage rows; NaN for a group without metrics and for idle)."""
    table = table.drop(columns=[c for c in GROUP_COLUMNS if c in table])
    key_cols = [key_column(k) for k in group_by]
    if not len(table) or "metered_gpu_hours" not in rows or not key_cols:
        return table.assign(**dict.fromkeys(GROUP_COLUMNS, np.nan))
    alloc = _allocated(rows)
    if not any(alloc[c].notna().any() for c in _MEASURED_SUMS):  # no metrics on any piece: every group's sums are empty
        return table.assign(**dict.fromkeys(GROUP_COLUMNS, np.nan))
    keys = key_frame(alloc, list(group_by))
    g = pd.DataFrame({c: keys[c].astype(object).where(keys[c].notna(), "").astype(str).to_numpy() for c in key_cols})
    for c in _MEASURED_SUMS:
        g[c] = alloc[c].to_numpy(dtype=float)
    sums = g.groupby(key_cols, sort=False, as_index=False).sum(min_count=1)
    sums["efficiency"] = sums["active_gpu_hours"] / sums["metered_gpu_hours"]
    return table.merge(sums[[*key_cols, *GROUP_COLUMNS]], on=key_cols, how="left")
