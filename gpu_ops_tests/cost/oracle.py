"""The pandas oracle: the row-by-row reference of what a valid usage interval is, and the
pandas day split, pricing and idle rows, kept in the tests as the independent check of
the DuckDB engine (issue 19: pandas leaves the path of usage rows and stays here).

``validate_usage`` is the reader the package used before the engine (vectorised pandas,
one rule at a time); the differential test (test_engine.py) and the hostile corpus hold
the engine to it. Nothing in ``gpu_ops`` imports this module.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.compute.catalog import CATALOG, UnknownGpuType, canonical_gpu_type
from gpu_ops.domain.cost.columns import CAPACITY_TYPES, SHARING_MODES
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.flows.cost.attribution import utc
from gpu_ops.flows.cost.window import Window
from gpu_ops.flows.cost.usage import (
    blank_mask,
    factorized,
    json_object,
    lut,
    show_value,
    PROVENANCE_COLUMNS,
    Validated,
    const_column,
    parse_times,
)
from gpu_ops.domain.cost.columns import NS_PER_HOUR
from gpu_ops.flows.cost.frames import empty_quarantine, utc_series
from gpu_ops.domain.cost.rules import TIME_RANGE

from gpu_ops.domain.cost.rules import FILE_FIELD, LINE_FIELD

from .oracle_read import CELL_ERRORS, FILE_ERROR

ATTRIBUTE_COLUMNS = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id")


DUPLICATE_FIELD = "<row>"


# More GPUs than this in one interval is a unit or export error, not a job.
MAX_GPUS_PER_ROW = 100_000


def _map_distinct(s: pd.Series, fn: Callable[[Any], Any]) -> tuple[np.ndarray, list[Any]]:
    """Apply ``fn`` once per distinct value; returns (codes, results per code); NA code -1."""
    codes, uniques = factorized(s)
    return codes, [fn(u) for u in uniques]


_EDGE_SPACE = re.compile(r"(?:\A|\x00)\s|\s(?:\x00|\Z)")


def _stripped_text(cats: pd.Index) -> bool:
    """All categories are distinct ``str`` with nothing ``str.strip`` would remove.

    One regular-expression pass over the values joined by NUL, not a Python loop per value:
    a unique column such as ``pod`` has as many categories as rows. ``\\s`` in a ``str``
    pattern is exactly ``str.isspace``, what ``strip()`` removes; a NUL inside a value can
    only make this say no (then the caller takes its exact per-value path)."""
    values = cats.to_numpy(dtype=object)
    try:
        joined = "\x00".join(values)
    except TypeError:  # not all str
        return False
    return _EDGE_SPACE.search(joined) is None and cats.is_unique


def _as_text(s: pd.Series) -> pd.Series:
    """Missing -> "" and everything else stripped text; categorical in, categorical out."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        if _stripped_text(s.cat.categories) and not (s.cat.codes.to_numpy() < 0).any():
            return s  # the common Parquet case: nothing to normalise, no pass over the rows
    if isinstance(s.dtype, pd.StringDtype) and s.dtype.storage == "pyarrow":
        # Arrow-backed text (a high-cardinality column read plainly): strip and factorize
        # in C rather than once per distinct value in Python.
        codes, uniques = pd.factorize(s.str.strip().fillna(""), use_na_sentinel=True)
        cats = pd.Index(uniques) if "" in uniques else pd.Index([*uniques, ""])  # "" always a category, as below
        return pd.Series(pd.Categorical.from_codes(codes, categories=cats), index=s.index)
    codes, uniques = factorized(s)
    cats = [str(u).strip() for u in uniques]
    if "" not in cats:
        cats.append("")
    empty = cats.index("")
    # Distinct values may collapse after stripping ("a " and "a"): re-factorize the labels.
    labels, remap = np.unique(np.array(cats, dtype=object), return_inverse=True)
    lut = np.append(remap, remap[empty]).astype(np.int32)
    return pd.Series(pd.Categorical.from_codes(lut[codes], categories=list(labels)), index=s.index)


_NAT = np.iinfo(np.int64).min
# Text columns no value of which may hold a control character once trimmed: C0 controls
# but tab, line feed and carriage return, and DEL (written here apart from the rule book;
# a choice column's odd value is already not one of its choices).
_CONTROL_CHECKED = (*ATTRIBUTE_COLUMNS, "region", "labels", "run_id", "asset_key", "outcome", "instance_type")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def time_problem(value: Any) -> str:
    """Why a time value was refused: outside the datetime64[ns] range, or unparseable."""
    when = value if isinstance(value, (pd.Timestamp, dt.date)) else None
    if when is None:
        try:
            parsed = pd.to_datetime(pd.Series([str(value).strip()]), utc=True, errors="coerce", format="ISO8601").iloc[0]
            when = None if pd.isna(parsed) else parsed
        except (ValueError, OverflowError):
            when = None
    if when is None:
        return f"unparseable time {show_value(value)}"
    if isinstance(value, pd.Timestamp):
        text = (value.tz_convert("UTC").tz_localize(None) if value.tzinfo else value).isoformat()
    else:
        text = value.isoformat() if isinstance(value, dt.date) else show_value(value)
    return f"{text} is outside the range of supported times ({TIME_RANGE}); a \"still running\" interval has an empty end"


def _numbers(s: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (float values, blank mask, bad mask); bad: unparseable, NaN text or not finite
    (``inf``, ``1e400``). Bad values are NaN in the result, so no check downstream can
    take them for a number; :func:`number_problem` says what was wrong."""
    if pd.api.types.is_integer_dtype(s.dtype) and not isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
        vals = s.to_numpy()  # plain ints have no missing values; no float copy needed
        return vals, np.zeros(len(s), bool), np.zeros(len(s), bool)
    if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        vals = s.to_numpy(dtype=float, na_value=np.nan)
        inf = np.isinf(vals)
        if inf.any():
            vals = np.where(inf, np.nan, vals)
        return vals, np.isnan(vals) & ~inf, inf
    codes, uniques = factorized(s)
    parsed = []
    for u in uniques:
        text = str(u).strip()
        try:
            value = float(text) if text else np.nan
        except ValueError:
            value = np.nan
        parsed.append(value if np.isfinite(value) else np.nan)
    blank = lut([str(u).strip() == "" for u in uniques], True, bool)[codes]
    vals = lut(parsed, np.nan, float)[codes]
    return vals, blank, ~blank & np.isnan(vals)


def number_problem(value: Any) -> str:
    try:
        f = float(str(value).strip())
    except ValueError:
        return f"not a number: {show_value(value)}"
    if np.isnan(f):
        return f"not a number: {show_value(value)}"
    return f"not a finite number: {show_value(value)}"


def _row_numbers(raw: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """1-based row numbers within each file for positions ``idx``."""
    if "row" in raw:
        return raw["row"].to_numpy()[idx]
    loc = raw["location"]
    codes = loc.cat.codes.to_numpy() if isinstance(loc.dtype, pd.CategoricalDtype) else pd.factorize(loc)[0]
    first: dict[int, int] = {}
    change = np.flatnonzero(np.diff(codes, prepend=-2) != 0)  # where each file's rows begin
    for start in change:
        first.setdefault(int(codes[start]), int(start))
    return np.array([i - first[int(codes[i])] + 1 for i in idx], dtype=np.int64)


class Problems:
    """Per-row problems, collected as (mask, field, message-per-row) and rendered once."""

    def __init__(self, n: int):
        self.n = n
        self.bad = np.zeros(n, bool)
        self.items: list[tuple[np.ndarray, str, Callable[[np.ndarray], list[str]]]] = []
        self.fields: dict[str, np.ndarray] = {}  # rows already given a reason, per field

    def add(self, mask: np.ndarray, field: str, message: str | Callable[[np.ndarray], list[str]]) -> None:
        mask = np.asarray(mask, bool)
        if not mask.any():
            return
        if field in self.fields:  # one reason per field and row: the first, most specific one
            mask = mask & ~self.fields[field]
            if not mask.any():
                return
            self.fields[field] |= mask
        else:
            self.fields[field] = mask.copy()
        self.bad |= mask
        msg = message if callable(message) else (lambda idx, m=message: [m] * len(idx))
        self.items.append((mask, field, msg))

    def render(self, raw: pd.DataFrame, start: pd.Series, end: pd.Series) -> pd.DataFrame:
        idx = np.flatnonzero(self.bad)
        if not len(idx):
            return empty_quarantine()
        reasons: dict[int, list[str]] = {int(i): [] for i in idx}
        first_field: dict[int, str] = {}
        for mask, field, msg in self.items:
            rows = np.flatnonzero(mask)
            for i, text in zip(rows, msg(rows)):
                reasons[int(i)].append(f"{field}: {text}")
                first_field.setdefault(int(i), field)
        sub = raw.iloc[idx]
        records = []
        for rec in sub.drop(columns=[c for c in PROVENANCE_COLUMNS if c in sub.columns]).astype(object).to_dict("records"):
            records.append(json.dumps({k: _jsonable(v) for k, v in rec.items()}, sort_keys=True))
        return pd.DataFrame(
            {
                "source": sub["source"].astype(str).to_numpy() if "source" in sub else "",
                "location": sub["location"].astype(str).to_numpy() if "location" in sub else "",
                "row": pd.array(_row_numbers(raw, idx) if ("row" in raw or "location" in raw) else [None] * len(idx), dtype="Int64"),
                "field": [first_field[int(i)] for i in idx],
                "reason": ["; ".join(reasons[int(i)]) for i in idx],
                "record": records,
                # Parsed times (NaT when unparseable) place the row in its day's partition.
                "start": start.iloc[idx].reset_index(drop=True),
                "end": end.iloc[idx].reset_index(drop=True),
            }
        )


def _jsonable(v: Any) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NaT:
        return None
    if isinstance(v, (pd.Timestamp,)):
        return v.isoformat()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def _canonical_or_error(name: Any) -> tuple[str | None, str | None]:
    try:
        return canonical_gpu_type(str(name)), None
    except UnknownGpuType as exc:
        return None, str(exc)


def _choice_codes(s: pd.Series, choices: Sequence[str], blank: int = -1) -> tuple[np.ndarray, list[Any]]:
    """-> (index into choices per row, -1 when not one of them; ``blank`` for blank values)."""
    codes, uniques = _map_distinct(s, lambda v: str(v).strip().lower())
    table = lut([choices.index(u) if u in choices else (blank if u == "" else -1) for u in uniques], blank, np.int8)
    return table[codes], list(uniques)


def _price_columns(
    prices: PriceMatrix, gpu_types: list[str], gcodes: np.ndarray, cap_codes: np.ndarray, region_mult: list[float], r_codes: np.ndarray | None
) -> tuple[pd.Categorical, pd.Categorical]:
    """Price and on-demand price per row, as categoricals over the few distinct prices.

    Prices depend only on (gpu type, capacity, region): a small dense table of those
    combinations is priced once and each row gets a one- or two-byte code into it, so
    ten million rows cost no 80 MB float arrays (attribution sums GPU-hours per price
    and multiplies afterwards). Missing prices are code -1 (NaN), never 0.
    """
    G, C = len(gpu_types), len(CAPACITY_TYPES)
    mults = [1.0] if r_codes is None else region_mult
    R = len(mults)
    # Slot 0 of each axis is "missing" (code -1 shifted by one).
    table = np.full((G + 1, C + 1, R + 1), np.nan)
    od_table = np.full((G + 1, C + 1, R + 1), np.nan)
    for gi, g in enumerate(gpu_types):
        od_price = prices.price(g, "on-demand")
        for ci, c in enumerate(CAPACITY_TYPES):
            base = prices.price(g, c)
            for ri, m in enumerate(mults):
                table[gi + 1, ci + 1, ri + 1] = base * m
                od_table[gi + 1, ci + 1, ri + 1] = od_price * m
    if r_codes is None:
        table[:, :, 0], od_table[:, :, 0] = table[:, :, 1], od_table[:, :, 1]  # no region column: multiplier 1
    idx = gcodes.astype(np.int32) + 1
    idx *= C + 1
    idx += cap_codes + 1
    idx *= R + 1
    if r_codes is not None:
        idx += r_codes + 1
    return _coded(table.ravel(), idx), _coded(od_table.ravel(), idx)


def _coded(values: np.ndarray, idx: np.ndarray) -> pd.Categorical:
    cats = np.unique(values[~np.isnan(values)])
    lut = np.where(np.isnan(values), -1, np.searchsorted(cats, np.nan_to_num(values))).astype(np.int16 if len(cats) > 120 else np.int8)
    return pd.Categorical.from_codes(lut[idx], categories=cats)


_REQUIRED_TEXT = {
    "team": "missing (every interval must name the team that pays)",
    "node": "missing (the inventory is matched to usage by node name)",
}


def validate_usage(raw: pd.DataFrame, prices: PriceMatrix, required: Sequence[str] = ("team",)) -> Validated:  # noqa: C901  (the oracle as the package had it)
    """Check every row; return typed, priced rows and the quarantined ones with reasons.

    Rules: ``start`` required and ``end`` optional, both parseable and within what
    datetime64[ns] holds, ``end`` not before ``start``; ``team`` not blank; ``gpu_type``
    known to the catalog (aliases mapped); ``gpu_count`` a whole number in
    (0, MAX_GPUS_PER_ROW]; ``capacity_type`` one of spot/on-demand/reserved; ``sharing``
    one of none/mig/mps/timeslice (blank = none); ``gpu_share`` in (0, 1], 1 (or blank)
    for unshared GPUs; numbers finite; ``labels`` a JSON object; no list/struct cells;
    a price for gpu type × capacity and, when the table lists regions, for the row's
    region. Rows identical to an earlier good row are counted once (the copy is
    quarantined as a duplicate); ``seen`` carries the rows of earlier batches when a
    read is validated batch by batch. ``identity``: text columns that are only needed to
    tell rows apart; the typed rows carry a 64-bit hash of their stripped text
    (:func:`text_identity`) instead of categories, the quarantine record the text. File-level rows from the readers become quarantine rows with field
    ``<file>`` and no row number.
    """
    file_q = empty_quarantine()
    if FILE_ERROR in raw:
        failed = raw[FILE_ERROR].notna().to_numpy()
        file_q = _file_quarantine(raw[failed])
        raw = raw[~failed].drop(columns=FILE_ERROR).reset_index(drop=True)
    n = len(raw)
    problems = Problems(n)
    _cell_errors(raw, problems)  # first: a blanked list cell is reported as such, not as "missing"
    out: dict[str, Any] = {}

    no_times = (pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]"), np.zeros(n, bool))
    start, bad_start = parse_times(raw["start"]) if "start" in raw else no_times
    problems.add(bad_start, "start", lambda idx: [time_problem(raw["start"].iloc[i]) for i in idx])
    problems.add(start.isna().to_numpy() & ~bad_start, "start", "missing")
    end, bad_end = parse_times(raw["end"]) if "end" in raw else no_times
    problems.add(bad_end, "end", lambda idx: [time_problem(raw["end"].iloc[i]) for i in idx])
    s_ns, e_ns = start.array.asi8, end.array.asi8
    # NaT is the smallest int64: a missing end is "before" any start, so exclude it.
    problems.add((e_ns < s_ns) & (e_ns != _NAT), "end", lambda idx: [f"{end.iloc[i].isoformat()} is before start {start.iloc[i].isoformat()}" for i in idx])
    out["start"], out["end"] = start, end

    for col in ATTRIBUTE_COLUMNS:
        out[col] = _as_text(raw[col]) if col in raw else pd.Series(const_column(n, ""), index=raw.index)
    for col in required:
        problems.add(blank_mask(raw[col]) if col in raw else np.ones(n, bool), col, _REQUIRED_TEXT[col])

    # gpu type: once per distinct name; aliases map to canonical names, unknown names are errors.
    if "gpu_type" in raw:
        codes, results = _map_distinct(raw["gpu_type"], _canonical_or_error)
        canon = [r[0] for r in results]
        errors = [r[1] for r in results]
        known = lut([c is not None for c in canon], False, bool)[codes]
        problems.add(codes < 0, "gpu_type", "missing")
        problems.add((codes >= 0) & ~known, "gpu_type", lambda idx: [errors[codes[i]] for i in idx])
        cats = sorted({c for c in canon if c})
        canon_codes = lut([cats.index(c) if c else -1 for c in canon], -1, np.int16)[codes]
        out["gpu_type"] = pd.Series(pd.Categorical.from_codes(canon_codes, categories=cats), index=raw.index)
    else:
        problems.add(np.ones(n, bool), "gpu_type", "missing")
        out["gpu_type"] = pd.Series(pd.Categorical.from_codes(np.full(n, -1), categories=[]), index=raw.index)

    count = _number_column(raw, "gpu_count", problems, required=True)
    # NaN (blank or bad, reported above) compares False below.
    problems.add(count <= 0, "gpu_count", lambda idx: [f"must be > 0, got {count[i]:g}" for i in idx])
    problems.add(count > MAX_GPUS_PER_ROW, "gpu_count", lambda idx: [f"implausibly large: {count[i]:g} GPUs in one interval (at most {MAX_GPUS_PER_ROW:,})" for i in idx])
    if count.dtype.kind == "f":
        problems.add(np.isfinite(count) & (count != np.floor(count)), "gpu_count", lambda idx: [f"must be a whole number of GPUs, got {count[i]:g} (a fraction of a GPU is gpu_share with sharing mig, mps or timeslice)" for i in idx])
    out["gpu_count"] = count

    cap_codes, cap_uniques = _choice_codes(raw["capacity_type"], CAPACITY_TYPES) if "capacity_type" in raw else (np.full(n, -1), [])
    cap_blank = blank_mask(raw["capacity_type"]) if "capacity_type" in raw else np.ones(n, bool)
    problems.add(cap_blank, "capacity_type", "missing (spot, on-demand or reserved)")
    problems.add((cap_codes < 0) & ~cap_blank, "capacity_type", lambda idx: [f"{str(raw['capacity_type'].iloc[i])!r} is not one of {', '.join(CAPACITY_TYPES)}" for i in idx])
    out["capacity_type"] = pd.Series(pd.Categorical.from_codes(cap_codes, categories=list(CAPACITY_TYPES)), index=raw.index)

    if "sharing" in raw:
        sh_codes, _ = _choice_codes(raw["sharing"], SHARING_MODES, blank=0)  # blank = not shared
        problems.add(sh_codes < 0, "sharing", lambda idx: [f"{str(raw['sharing'].iloc[i])!r} is not one of {', '.join(SHARING_MODES)}" for i in idx])
    else:
        sh_codes = np.zeros(n, np.int8)
    out["sharing"] = pd.Series(pd.Categorical.from_codes(sh_codes, categories=list(SHARING_MODES)), index=raw.index)

    share, share_blank = _number_column(raw, "gpu_share", problems, required=False, with_blank=True)
    unshared = sh_codes == 0
    # A whole GPU is a share of 1 by definition; a shared one must say how much it got.
    if share_blank.any():
        share = np.where(share_blank & unshared, 1.0, share)
    problems.add(share_blank & (sh_codes > 0), "gpu_share", "missing (required when sharing is mig, mps or timeslice)")
    problems.add((share <= 0) | (share > 1), "gpu_share", lambda idx: [f"must be in (0, 1], got {share[i]:g}" for i in idx])
    problems.add(unshared & (share < 1), "gpu_share", lambda idx: [f"{share[i]:g} but sharing is none: a share below 1 needs sharing mig, mps or timeslice" for i in idx])
    out["gpu_share"] = share

    if "region" in raw:
        region = _as_text(raw["region"])
        r_codes = region.cat.codes.to_numpy()
        region_mult = [prices.region_multiplier(c) for c in region.cat.categories]
        bad_region = lut([np.isnan(m) for m in region_mult], False, bool)[r_codes]
        problems.add(bad_region, "region", lambda idx: [f"no price multiplier for region {region.iloc[i]!r} (regions: {', '.join(sorted(prices.regions))})" for i in idx])
    else:
        region = pd.Series(const_column(n, ""), index=raw.index)
        r_codes, region_mult, bad_region = None, [], None
    out["region"] = region

    gpu_cats = out["gpu_type"].cat.categories
    gcodes = out["gpu_type"].cat.codes.to_numpy()
    price, od = _price_columns(prices, list(gpu_cats), gcodes, cap_codes, region_mult, r_codes)
    priceable = (cap_codes >= 0) & (gcodes >= 0)
    if bad_region is not None:
        priceable &= ~bad_region
    problems.add(priceable & (price.codes < 0), "price", lambda idx: [prices.describe_missing(gpu_cats[gcodes[i]], CAPACITY_TYPES[cap_codes[i]]) for i in idx])
    out["price_per_gpu_hour"] = pd.Series(price, index=raw.index, copy=False)
    out["on_demand_price_per_gpu_hour"] = pd.Series(od, index=raw.index, copy=False)

    if "labels" in raw:
        out["labels"] = _as_text(raw["labels"])
        lab = out["labels"]
        verdicts = [None if c == "" else json_object(c) for c in lab.cat.categories]
        bad_labels = lut([isinstance(v, str) for v in verdicts], False, bool)[lab.cat.codes.to_numpy()]
        problems.add(bad_labels, "labels", lambda idx: [verdicts[lab.cat.codes.iloc[i]] for i in idx])
    for col in ("run_id", "asset_key", "outcome", "instance_type"):
        if col in raw:
            out[col] = _as_text(raw[col])
    if "attempt" in raw:
        out["attempt"], _, _ = _numbers(raw["attempt"])
    if "last_checkpoint_at" in raw:
        out["last_checkpoint_at"], _ = parse_times(raw["last_checkpoint_at"])
    if "lost_seconds" in raw:
        lost, _, lost_bad = _numbers(raw["lost_seconds"])
        problems.add(lost_bad | (~np.isnan(lost) & (lost < 0)), "lost_seconds", lambda idx: [f"must be a finite number >= 0, got {show_value(raw['lost_seconds'].iloc[i])}" for i in idx])
        out["lost_seconds"] = np.nan_to_num(lost, nan=0.0)
    for col in PROVENANCE_COLUMNS:
        if col in raw:
            out[col] = raw[col]
        elif col != "row":
            out[col] = pd.Series(const_column(n, "unknown"), index=raw.index)

    for col in _CONTROL_CHECKED:  # a control character left after the trim (checked last): refused before any database sees it
        if col in raw:
            text = _as_text(raw[col])
            control = lut([_CONTROL.search(str(c)) is not None for c in text.cat.categories], False, bool)[text.cat.codes.to_numpy()]
            problems.add(control, col, "contains a control character")

    typed = pd.DataFrame(out, index=raw.index, copy=False)
    _duplicates(typed, raw, problems)
    quarantine = problems.render(raw, start, end)
    if len(file_q):
        quarantine = pd.concat([file_q, quarantine], ignore_index=True) if len(quarantine) else file_q
    good = ~problems.bad
    rows = typed if good.all() else typed.loc[good].reset_index(drop=True)
    return Validated(rows.reset_index(drop=True), quarantine)


def _number_column(raw: pd.DataFrame, col: str, problems: Problems, required: bool, with_blank: bool = False) -> Any:
    """A numeric column with its blank (when required) and bad values reported."""
    n = len(raw)
    vals, blank, bad = _numbers(raw[col]) if col in raw else (np.full(n, np.nan), np.ones(n, bool), np.zeros(n, bool))
    if required:
        problems.add(blank, col, "missing")
    problems.add(bad, col, lambda idx: [number_problem(raw[col].iloc[i]) for i in idx])
    return (vals, blank) if with_blank else vals


def _cell_errors(raw: pd.DataFrame, problems: Problems) -> None:
    """Report the list/struct/map cells the reader recorded (:data:`CELL_ERRORS`), per field."""
    if CELL_ERRORS not in raw:
        return
    errors = raw[CELL_ERRORS].to_numpy()
    rows = np.flatnonzero(pd.notna(errors))
    fields = sorted({f for i in rows for f in errors[i]})
    for field in fields:
        mask = np.zeros(len(raw), bool)
        mask[[i for i in rows if field in errors[i]]] = True
        problems.add(mask, field, lambda idx, f=field: [errors[i][f] for i in idx])  # type: ignore[misc]


def _duplicates(typed: pd.DataFrame, raw: pd.DataFrame, problems: Problems) -> None:
    """Quarantine good rows identical (after parsing) to an earlier good row: counted once."""
    good = np.flatnonzero(~problems.bad)
    cols = [c for c in typed.columns if c not in PROVENANCE_COLUMNS and c != CELL_ERRORS]
    sub = typed.iloc[good][cols] if len(good) < len(typed) else typed[cols]
    # Numbers hash as floats: a CSV's "1" and a Parquet file's integer 1 are the same count.
    ints = {c: sub[c].astype(float) for c in ("gpu_count", "attempt") if c in sub and sub[c].dtype.kind in "iu"}
    hashes = pd.util.hash_pandas_object(sub.assign(**ints) if ints else sub, index=False).to_numpy() if len(good) else np.empty(0, np.uint64)
    dup = np.array(pd.Series(hashes).duplicated(keep="first")) if len(good) > 1 else np.zeros(len(good), bool)
    earlier: dict[int, str] = {}  # row position -> "row N" or "<file> row N" of its first copy
    location = raw["location"] if "location" in raw else pd.Series([""] * len(raw), dtype=object)

    def loc(idx: Any) -> np.ndarray:  # location text of some rows (not a pass over all of them)
        idx = np.atleast_1d(idx)
        if isinstance(location.dtype, pd.CategoricalDtype):  # files: a few names, coded
            names = np.array([str(c) for c in location.cat.categories] + [""], dtype=object)
            return names[location.cat.codes.to_numpy()[idx]]
        return np.array([str(v) for v in location.iloc[idx]], dtype=object)

    if dup.any():
        first_of = pd.Series(np.arange(len(hashes))).groupby(hashes).transform("first").to_numpy()
        later, first = np.flatnonzero(dup), first_of[dup]
        same = _same_values(sub, later, first)  # a hash collision is not a duplicate
        dup[later[~same]] = False
        later, first = good[later[same]], good[first[same]]
        numbers: Any = _row_numbers(raw, first) if len(first) else []
        for i, _j, n, li, lj in zip(later.tolist(), first.tolist(), numbers, loc(later), loc(first)):
            earlier[i] = f"row {n}" if lj == li else f"{lj} row {n}"
    if not earlier:
        return
    mask = np.zeros(len(typed), bool)
    mask[list(earlier)] = True
    problems.add(mask, DUPLICATE_FIELD, lambda idx: [f"duplicate of {earlier[int(i)]}: identical in every column, counted once" for i in idx])


def _same_values(sub: pd.DataFrame, later: np.ndarray, first: np.ndarray) -> np.ndarray:
    same = np.ones(len(later), bool)
    for c in sub.columns:
        col = sub[c]
        v = col.cat.codes.to_numpy() if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy()
        a, b = v[later], v[first]
        eq = a == b
        if v.dtype.kind == "f":
            eq |= np.isnan(a) & np.isnan(b)
        elif v.dtype.kind in "Mm" or isinstance(col.dtype, pd.DatetimeTZDtype):
            eq |= pd.isna(a) & pd.isna(b)
        same &= np.asarray(eq, bool)
    return same


def _file_quarantine(failed: pd.DataFrame) -> pd.DataFrame:
    """Reader problems: a whole file or pattern (no row: ``<file>``) or a CSV line (``<line>``)."""
    n = len(failed)
    q = empty_quarantine()
    row = pd.array(failed["row"].to_numpy() if "row" in failed else [None] * n, dtype="Int64")
    return pd.DataFrame(
        {
            "source": failed["source"].astype(str).to_numpy() if "source" in failed else ["file"] * n,
            "location": failed["location"].astype(str).to_numpy(),
            "row": row,
            "field": np.where(pd.isna(row), FILE_FIELD, LINE_FIELD),
            "reason": failed[FILE_ERROR].astype(str).to_numpy(),
            "record": [""] * n,
            "start": pd.Series(pd.NaT, index=range(n), dtype=q["start"].dtype),
            "end": pd.Series(pd.NaT, index=range(n), dtype=q["end"].dtype),
        }
    )


def validate_inventory(raw: pd.DataFrame, prices: PriceMatrix) -> Validated:
    """Node inventory rows; ``gpu_type``/``gpu_count`` may be derived from a known instance type."""
    raw = raw.copy()
    n = len(raw)
    if "instance_type" in raw:
        it = raw["instance_type"].astype(object).map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).strip())
        derived_type = it.map(lambda t: next((g for g, spec in CATALOG.items() if t in spec.instance_types), ""))
        derived_count = it.map(lambda t: next((spec.instance_types[t] for spec in CATALOG.values() if t in spec.instance_types), np.nan))
        if "gpu_type" in raw:
            raw["gpu_type"] = raw["gpu_type"].astype(object).where(~blank_mask(raw["gpu_type"]), derived_type.where(derived_type != "", None))
        else:
            raw["gpu_type"] = derived_type.where(derived_type != "", None)
        if "gpu_count" in raw:
            raw["gpu_count"] = raw["gpu_count"].astype(object).where(~blank_mask(raw["gpu_count"]), derived_count)
        else:
            raw["gpu_count"] = derived_count
    v = validate_usage(raw.assign(sharing=const_column(n, "none"), gpu_share=np.ones(n)), prices, required=("node",))
    return v


# --------------------------------------------------------------------------- the pandas day split, pricing and idle rows

DAY_NS = 86_400 * 10**9


def split_by_day(rows: pd.DataFrame, window_start: Any, window_end: Any, as_of: Any, drop_empty: bool = True) -> pd.DataFrame:
    """Pieces of every interval inside ``[window_start, min(window_end, as_of))``, one per UTC day.

    Adds ``interval_start``/``interval_end`` (the original interval), ``day`` (the UTC
    date), ``hours`` and, when ``lost_seconds`` is present, ``lost_hours``: the part of
    the piece after the last checkpoint (``[end - lost_seconds, end]``).

    With ``drop_empty=False`` and a one-day window, intervals outside the window are kept
    with zero hours instead of being filtered out: no copy of the frame, which is what
    makes a ten-million-row attribution cheap. Sums are unchanged; :func:`attribute`
    drops groups that had no hours at all.
    """
    lo = utc(window_start).value
    hi = min(utc(window_end).value, utc(as_of).value)
    s = rows["start"].array.asi8 if len(rows) else np.array([], np.int64)
    e = rows["end"].array.asi8 if len(rows) else np.array([], np.int64)
    # In place where possible: every temporary is 80 MB at ten million rows.
    e_eff = e.copy()
    e_eff[e_eff == _NAT] = hi  # open intervals run to the as-of time
    np.minimum(e_eff, hi, out=e_eff)
    s_eff = np.maximum(s, lo)
    one_day = (hi - 1) // DAY_NS == lo // DAY_NS
    if not drop_empty and one_day:
        ps, pe = s_eff, np.maximum(e_eff, s_eff, out=e_eff)
        # One day for every row: a read-only broadcast view, not an 80 MB array.
        day = np.broadcast_to(np.int64(lo // DAY_NS * DAY_NS), (len(rows),))
        pieces = rows
    else:
        keep = np.flatnonzero(e_eff > s_eff)
        s_eff, e_eff = s_eff[keep], e_eff[keep]
        day0 = s_eff // DAY_NS
        n = (e_eff - 1) // DAY_NS - day0 + 1
        if len(n) and n.max() > 1:
            rep = np.repeat(np.arange(len(keep)), n)
            k = np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
            dayn = day0[rep] + k
            ps = np.maximum(s_eff[rep], dayn * DAY_NS)
            pe = np.minimum(e_eff[rep], (dayn + 1) * DAY_NS)
            take = keep[rep]
        else:
            dayn, ps, pe, take = day0, s_eff, e_eff, keep
        day = dayn * DAY_NS
        whole = len(take) == len(rows) and (len(take) == 0 or (take[0] == 0 and bool((np.diff(take) == 1).all())))
        pieces = rows if whole else rows.take(take)
    cols: dict[str, Any] = {c: pieces[c].reset_index(drop=True) for c in pieces.columns}
    cols["interval_start"], cols["interval_end"] = cols["start"], cols["end"]
    cols["start"], cols["end"], cols["day"] = utc_series(ps), utc_series(pe), utc_series(day)
    hours = np.empty(len(ps))
    np.subtract(pe, ps, out=hours, casting="unsafe")
    hours /= NS_PER_HOUR
    cols["hours"] = hours
    if "lost_seconds" in cols:
        lost = cols["lost_seconds"].to_numpy(dtype=float)
        ie = cols["interval_end"].array.asi8
        has = (ie != _NAT) & (lost > 0)
        l0 = np.where(has, ie - (np.nan_to_num(lost) * 1e9).astype(np.int64), np.iinfo(np.int64).max)
        cols["lost_hours"] = np.where(has, np.clip(pe - np.maximum(ps, l0), 0, None), 0) / NS_PER_HOUR
    return pd.DataFrame(cols, copy=False)


def price_pieces(pieces: pd.DataFrame, per_row: bool = True) -> pd.DataFrame:
    """GPU-hours and dollars of allocated pieces (rows from :func:`split_by_day`).

    ``per_row=False`` computes only ``gpu_hours``: :func:`attribute` then sums GPU-hours
    per price and multiplies once per group (the ten-million-row path); prices stay coded.
    """
    physical = np.multiply(pieces["gpu_count"].to_numpy(), pieces["gpu_share"].to_numpy(dtype=float))
    lost_gpu_hours = physical * pieces["lost_hours"].to_numpy() if per_row and "lost_hours" in pieces else None
    gpu_hours = physical
    gpu_hours *= pieces["hours"].to_numpy()  # in place: physical is not needed any more
    cols: dict[str, Any] = {c: pieces[c] for c in pieces.columns}
    cols.update(gpu_hours=gpu_hours, kind=const_column(len(pieces), "allocated"))
    if lost_gpu_hours is not None:
        cols["lost_gpu_hours"] = lost_gpu_hours
    out = pd.DataFrame(cols, copy=False)
    return price_dollars(out) if per_row else out


def price_dollars(rows: pd.DataFrame) -> pd.DataFrame:
    """Dollars of priced GPU-hours: the one place where cost = GPU-hours × per-GPU price
    (and the on-demand equivalent, and the cost of lost GPU-hours). NaN prices stay NaN."""
    gpu_hours = rows["gpu_hours"].to_numpy(dtype=float)
    price = as_floats(rows["price_per_gpu_hour"])
    od = as_floats(rows["on_demand_price_per_gpu_hour"])
    cols: dict[str, Any] = {c: rows[c] for c in rows.columns}
    cols.update(price_per_gpu_hour=price, on_demand_price_per_gpu_hour=od, cost_usd=gpu_hours * price, on_demand_usd=gpu_hours * od)
    if "lost_gpu_hours" in rows:
        cols["lost_cost_usd"] = rows["lost_gpu_hours"].to_numpy(dtype=float) * price
    return pd.DataFrame(cols, copy=False)


def one_node_at_a_time(nodes: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    """A node is one machine, in the fleet once at any moment, record by record in Python:
    of a node's records with one start the closed, latest-ending, last-delivered one
    counts; then, by start, a record wholly inside the time of earlier ones is set aside
    and one partly inside counts from where they end. Returns (the rows that count, with
    their starts moved; position in ``nodes`` -> "superseded"/"overlaps" of those set aside)."""
    never = np.iinfo(np.int64).max
    starts, ends = nodes["start"].array.asi8.copy(), nodes["end"].array.asi8
    aside: dict[int, str] = {}
    for _, group in nodes.groupby(nodes["node"].astype(str), sort=False).indices.items():
        by_start: dict[int, list[int]] = {}
        for i in group.tolist():
            by_start.setdefault(int(starts[i]), []).append(i)
        kept = []
        for same in by_start.values():
            # the closed before the open, the later end, the later delivered
            best = max(same, key=lambda i: (ends[i] != _NAT, ends[i] if ends[i] != _NAT else 0, i))
            aside.update({i: "superseded" for i in same if i != best})
            kept.append(best)
        cover = None
        for i in sorted(kept, key=lambda i: (starts[i], i)):
            until = never if ends[i] == _NAT else int(ends[i])
            if cover is not None and until <= cover:
                aside[i] = "overlaps"
                continue
            if cover is not None and starts[i] < cover:
                starts[i] = cover
            cover = until if cover is None else max(cover, until)
    keep = np.array([i for i in range(len(nodes)) if i not in aside], dtype=np.int64)
    out = nodes.assign(start=utc_series(starts)).take(keep).reset_index(drop=True)
    return out, aside


def as_floats(s: pd.Series) -> np.ndarray:
    """A numeric column as float64; categorical price columns are expanded (NaN for -1)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        values = np.append(s.cat.categories.to_numpy(dtype=float), np.nan)
        return values[s.cat.codes.to_numpy()]
    return s.to_numpy(dtype=float, na_value=np.nan)


def touch_mask(start: pd.Series, end: pd.Series, window: Window) -> np.ndarray:
    """Rows that can touch ``window`` (the rule of gpu_ops.flows.cost.window), in pandas; any time column type."""
    s = parse_times(start)[0].array.asi8
    e = parse_times(end)[0].array.asi8 if end is not None else np.full(len(s), np.iinfo(np.int64).min)
    nat = np.iinfo(np.int64).min
    s_nat, e_nat = s == nat, e == nat
    lo = np.where(e_nat, s, np.minimum(s, e))
    hi = np.where(e_nat, s, np.maximum(s, e))
    return s_nat | ((lo < window.end_ns) & (e_nat | (hi >= window.start_ns)))
