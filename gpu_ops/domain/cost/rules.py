"""The usage rule book: what a valid usage interval is, written once, compiled to DuckDB SQL.

Pure data and string building (no DuckDB, pandas or Dagster import). The engine
(:mod:`gpu_ops.flows.cost.engine`) runs what :func:`compile_checks` builds over every source
(Parquet, CSV, the ledger and collected tables handed over as Arrow).

Three layers, each a pure function of the one before:

1. **Raw** (per source, depends on how a column is stored): each column's value as text
   (``r_<col>``, for messages and for text columns) and, for times and numbers, its parsed
   value. Storage problems are row problems here: invalid UTF-8 in a BINARY column, a
   list/struct/map cell where the format has one value.
2. **Typed** (:data:`COLUMNS`): times as UTC microseconds, numbers as DOUBLE, text
   trimmed (what ``str.strip`` removes), choices lower-cased, blanks given their meaning
   (``sharing`` blank = ``none``, ``gpu_share`` blank = 1 for an unshared GPU).
3. **Rules** (:data:`ROW_RULES`): ``(field, condition, reason)``. A row failing any rule
   is quarantined with every failing field's reason (``field: reason; ...``) and the
   first failing field named; it is never priced. Catalog and price rules
   (``gpu_type``, ``region``, ``price``) join small tables the engine builds from the
   catalog and the price table.

Identity rules (:data:`IDENTITY_KEY`, run by the engine after the row rules): a row
identical to an earlier good row in every typed column is a ``duplicate`` (counted once);
good rows with the same identity key are one interval seen several times, the closed
record superseding the open one, the latest end the earlier ends, and among equal ends
the last delivered (reading order) the others; the losers are quarantined as
``superseded``, naming the record that won and the fields in which they differ.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from gpu_ops.domain.cost.columns import CAPACITY_TYPES, SHARING_MODES

# What pandas' datetime64[ns] holds, in whole microseconds: the supported time range.
# (DuckDB holds more; a "9999-12-31" running sentinel or a year-75,000 unit error is
# still an error, reported on its own row.)
TIME_MIN_US = -9_223_372_036_854_775 + 1  # 1677-09-21T00:12:43.145225
TIME_MAX_US = 9_223_372_036_854_775  # 2262-04-11T23:47:16.854775
TIME_RANGE = "1677-09-21 to 2262-04-11"
# The UTC days wholly inside that range: the days a cost can be asked for.
FIRST_DAY = (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=TIME_MIN_US)).date() + dt.timedelta(days=1)
LAST_DAY = (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=TIME_MAX_US)).date() - dt.timedelta(days=1)
MAX_GPUS_PER_ROW = 100_000
# Exactly the characters str.isspace() accepts (what str.strip removes).
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
# Control characters left inside text after trimming (NUL first of all) are refused
# before any database sees them.
CONTROL = "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]"

FILE_FIELD = "<file>"  # a file or pattern that gave no rows
LINE_FIELD = "<line>"  # a CSV line that could not be split into the header's fields
ROW_FIELD = "<row>"  # a duplicate or superseded row

# Text columns: trimmed, missing = "".
TEXT_COLUMNS = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "region", "labels", "run_id", "asset_key", "outcome", "instance_type")
TIME_COLUMNS = ("start", "end", "last_checkpoint_at")
NUMBER_COLUMNS = ("gpu_count", "gpu_share", "attempt", "lost_seconds")
CHOICE_COLUMNS = ("gpu_type", "capacity_type", "sharing")
LOWERED = ("capacity_type", "sharing")  # choice columns compared lower-cased
USAGE_COLUMNS = (
    "start", "end", "namespace", "pod", "node", "team", "project", "cost_center", "experiment_id",
    "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share",
)
OPTIONAL_COLUMNS = ("region", "labels", "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds", "instance_type")
ALL_COLUMNS = (*USAGE_COLUMNS, *OPTIONAL_COLUMNS)
REQUIRED_COLUMNS = ("start", "end", "team", "gpu_type", "gpu_count", "capacity_type")
# An interval's identity: the same interval exported several times has the same key.
# ``pod`` stands for the attempt where a row has no pod (a ledger row: run_id/attempt).
IDENTITY_KEY = ("namespace", "pod", "start", "gpu_type")

# How a column is stored in a source; the engine says which (from the Arrow type).
STORED_TEXT, STORED_BINARY, STORED_TIME, STORED_NUMBER, STORED_NESTED, STORED_NULL, STORED_OTHER = (
    "text", "binary", "time", "number", "nested", "null", "other",
)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _show(expr: str) -> str:
    """SQL for Python's repr of a text value (quoted), as reasons show raw values."""
    return f"('''' || {expr} || '''')"


def _trim(expr: str) -> str:
    """What ``str.strip`` removes, trimmed; values with no space at either edge (nearly
    all) are left as they are without the per-character scan."""
    spaces = literal(SPACES)
    return f"(CASE WHEN contains({spaces}, left({expr}, 1)) OR contains({spaces}, right({expr}, 1)) THEN trim({expr}, {spaces}) ELSE {expr} END)"


# --------------------------------------------------------------------------- layer 1: raw


@dataclass(frozen=True)
class Stored:
    """How one column is stored in one source (``kind``: a STORED_* name; ``nested``: the
    kind of cell, list/struct/map, for nested columns)."""

    kind: str
    nested: str = ""
    unit: str = ""  # times: the integer unit they are handed over in (s, ms, us, ns, day)
    bounded: bool = False  # times: every value known to lie in the supported range (TIME_MIN_US..TIME_MAX_US)


def raw_text(col: str, stored: Stored) -> str:
    """SQL: the column's value as text (NULL when missing or not text)."""
    c = quote(col)
    if stored.kind == STORED_TEXT:
        return c
    if stored.kind == STORED_BINARY:
        return f"try(decode({c}))"
    if stored.kind == STORED_TIME:
        us = _epoch_us(c, stored)
        return f"CASE WHEN {us} IS NOT NULL THEN strftime(make_timestamp({us}), '%Y-%m-%dT%H:%M:%S') ELSE CAST({c} AS VARCHAR) || ' {stored.unit} since 1970-01-01' END"
    if stored.kind in (STORED_NUMBER, STORED_OTHER):
        return f"CAST({c} AS VARCHAR)"
    return "CAST(NULL AS VARCHAR)"


_US_PER = {"s": 10**6, "ms": 10**3, "us": 1, "day": 86_400 * 10**6}
# The largest magnitude per unit that DuckDB can still hold as a timestamp (year 294,247).
_DUCK_MAX_US = 9_000_000_000_000_000_000  # about year 287,000


def in_time_range(lo: int, hi: int, unit: str) -> bool:
    """Whether stored integers ``lo``..``hi`` of ``unit`` are all supported times."""
    def us(v: int) -> int:
        return v // 1000 if unit == "ns" else v * _US_PER[unit]

    return TIME_MIN_US <= us(lo) and us(hi) <= TIME_MAX_US


def _within(c: str, bound: int) -> str:
    """SQL: ``|c| < bound`` without abs(), which overflows on the smallest BIGINT (-2**63)."""
    return f"({c} > -{bound} AND {c} < {bound})"


def _epoch_us(c: str, stored: Stored) -> str:
    """SQL: an integer time of ``stored.unit`` as microseconds (NULL past what DuckDB holds)."""
    if stored.unit == "ns":
        return f"({c} // 1000)"
    scale = _US_PER[stored.unit]
    if scale == 1:
        return f"(CASE WHEN {_within(c, _DUCK_MAX_US)} THEN {c} END)"
    return f"(CASE WHEN {_within(c, _DUCK_MAX_US // scale)} THEN {c} * {scale} END)"


def raw_problems(col: str, stored: Stored) -> list[tuple[str, str, str]]:
    """(field, condition, reason) for how the value is stored, before any parsing."""
    c = quote(col)
    if stored.kind == STORED_BINARY:
        return [(col, f"{c} IS NOT NULL AND try(decode({c})) IS NULL", "'not UTF-8 text: ' || CAST({c} AS VARCHAR)".replace("{c}", c))]
    if stored.kind == STORED_NESTED:
        return [(col, f"{c} IS NOT NULL", f"'a {stored.nested} cell ' || CAST(to_json({c}) AS VARCHAR) || ', where the usage format has one value'")]
    return []


def parsed_time(col: str, stored: Stored) -> str:
    """SQL: a time column as UTC microseconds (NULL when missing or unparseable)."""
    c = quote(col)
    if stored.kind == STORED_TIME and stored.bounded:
        return f"({c} // 1000)" if stored.unit == "ns" else f"({c} * {_US_PER[stored.unit]})" if _US_PER[stored.unit] > 1 else c
    if stored.kind == STORED_TIME:  # past what DuckDB holds: the largest it does (out of range either way)
        return f"coalesce({_epoch_us(c, stored)}, CASE WHEN {c} IS NOT NULL THEN CAST({_DUCK_MAX_US} AS BIGINT) * sign({c}) END)"
    if stored.kind in (STORED_TEXT, STORED_BINARY, STORED_NUMBER, STORED_OTHER):
        return f"epoch_us(TRY_CAST(nullif({_trim(raw_text(col, stored))}, '') AS TIMESTAMPTZ))"
    return "CAST(NULL AS BIGINT)"


def parsed_number(col: str, stored: Stored) -> str:
    """SQL: a number column as DOUBLE (NULL when missing or unparseable; NaN stays NaN)."""
    c = quote(col)
    if stored.kind == STORED_NUMBER:
        return f"CAST({c} AS DOUBLE)"
    if stored.kind in (STORED_TEXT, STORED_BINARY, STORED_OTHER):
        return f"TRY_CAST(nullif({_trim(raw_text(col, stored))}, '') AS DOUBLE)"
    return "CAST(NULL AS DOUBLE)"


def label_value(labels: Any, name: str) -> str:
    """The value of label ``name`` in a good row's ``labels`` JSON text, as grouping shows
    it: "" when the label is absent or null, text as written, a number or boolean as JSON
    writes it (``5``, ``1.5``, ``true``): the one reading of every group-by and budget scope."""
    try:
        d = json.loads(labels) if isinstance(labels, str) and labels.strip() else {}
    except ValueError:
        return ""
    value = d.get(name) if isinstance(d, dict) else None
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def labels_text(layout: dict[str, Stored], label_columns: dict[str, Stored]) -> str:
    """SQL: the ``labels`` JSON object with the ``label:<name>`` columns merged in (a
    non-blank cell each); a ``labels`` cell that is not a JSON object is kept as written
    (its rule quarantines it)."""
    base = raw_text("labels", layout.get("labels", Stored(STORED_NULL)))
    if not label_columns:
        return base
    pairs = ", ".join(
        f"{{'k': {literal(c[len('label:'):])}, 'v': {_trim(raw_text(c, st))}}}" for c, st in label_columns.items()
    )
    extra = f"CAST(to_json(map_from_entries(list_filter([{pairs}], lambda x: coalesce(x.v, '') <> ''))) AS VARCHAR)"
    b = f"coalesce(nullif({_trim(base)}, ''), '{{}}')"
    return f"CASE WHEN json_valid({b}) THEN (CASE WHEN json_type({b}) = 'OBJECT' THEN CAST(json_merge_patch({b}, {extra}) AS VARCHAR) ELSE {base} END) ELSE {base} END"


def raw_select(layout: dict[str, Stored], label_columns: dict[str, Stored] | None = None, record: bool = False) -> list[str]:
    """The raw layer's select list for a source whose columns are stored as ``layout``.
    Typed times have no text here (their rules read the parsed value) unless ``record``:
    the text of every column, for the quarantine's record of the rows it holds."""
    out = []
    for col in ALL_COLUMNS:
        stored = layout.get(col, Stored(STORED_NULL))
        text = labels_text(layout, label_columns) if col == "labels" and label_columns else raw_text(col, stored)
        if stored.kind == STORED_TIME and not record or stored.kind == STORED_NUMBER and col in NUMBER_COLUMNS and not record:
            text = "CAST(NULL AS VARCHAR)"  # their rules read the parsed value
        out.append(f"{text} AS {quote('r_' + col)}")
        if record:
            continue
        if col in TIME_COLUMNS:
            out.append(f"{parsed_time(col, stored)} AS {quote('p_' + col)}")
        elif col in NUMBER_COLUMNS:
            out.append(f"{parsed_number(col, stored)} AS {quote('p_' + col)}")
    if record:
        return out
    out += [f"{'true' if v else 'false'} AS {quote(k)}" for k, v in flags(layout).items()]
    storage = [p for col, stored in layout.items() if col in ALL_COLUMNS for p in raw_problems(col, stored)]
    out.append(_problem_list(storage) + " AS storage_problems")
    out.append(("(" + " OR ".join(f"coalesce({cond}, false)" for _, cond, _ in storage) + ")" if storage else "false") + " AS storage_bad")
    return out


def _problem_list(items: list[tuple[str, str, str]]) -> str:
    if not items:
        return "CAST([] AS STRUCT(field VARCHAR, reason VARCHAR)[])"
    parts = ", ".join(f"CASE WHEN {cond} THEN {{'field': {literal(field)}, 'reason': {reason}}} END" for field, cond, reason in items)
    return f"list_filter([{parts}], lambda x: x IS NOT NULL)"


# --------------------------------------------------------------------------- layer 2: typed


def text_literal(text: str) -> str:
    """SQL: any text as a constant (a NUL, which cannot stand in a literal, as chr(0))."""
    return "(" + " || chr(0) || ".join(literal(part) for part in text.split("\x00")) + ")"


# Values of a text column that need a trim or hold a control character, by column: where a
# column's every such value is known (its text came as dictionaries), only the rows holding
# one of them are trimmed and searched, not every row of the column.
ByValue = dict[str, frozenset[str]]


def _among(raw: str, values: frozenset[str]) -> str:
    """SQL: whether ``raw`` is one of ``values``."""
    return f"{raw} IN ({', '.join(text_literal(v) for v in sorted(values))})"


def _text(col: str, clean: frozenset[str] = frozenset(), by_value: ByValue | None = None) -> str:
    """SQL: a text column trimmed, missing = "" (``clean``: columns known to need no trim;
    ``by_value``: the only values of a column that may need one)."""
    raw = quote("r_" + col)
    if col in clean:
        return f"coalesce({raw}, '')"
    if by_value and col in by_value:
        return f"coalesce(CASE WHEN {_among(raw, by_value[col])} THEN {_trim(raw)} ELSE {raw} END, '')"
    return f"coalesce({_trim(raw)}, '')"


def utc_text(expr: str) -> str:
    """SQL: a supported time (UTC microseconds) as reasons show it, ``…T…+00:00``."""
    return f"strftime(make_timestamp({expr}), '%Y-%m-%dT%H:%M:%S') || '+00:00'"


def _in_range(expr: str) -> str:
    return f"({expr} BETWEEN {TIME_MIN_US} AND {TIME_MAX_US})"


def typed_columns(clean: frozenset[str] = frozenset(), by_value: ByValue | None = None) -> dict[str, str]:
    """The typed layer (name -> SQL over the raw layer). ``clean``: text columns whose
    every value the engine found free of edge spaces and control characters (checked
    once per distinct value): they skip the per-row trim; ``by_value``: text columns
    only some known values of which need a trim: only rows holding one are trimmed;
    time columns every value of which is in the supported range: they skip the range
    test; ``lower:<choice>``: a choice column with no upper-case letter skips ``lower``;
    the answer is the same."""
    capacity, sharing = (_text(c, clean, by_value) if f"lower:{c}" in clean else f"lower({_text(c, clean, by_value)})" for c in LOWERED)
    sharing = f"coalesce(nullif({sharing}, ''), 'none')"
    return {
        **{c: _text(c, clean, by_value) for c in TEXT_COLUMNS},
        "gpu_type_raw": _text("gpu_type", clean, by_value),
        "capacity_type": capacity,
        "sharing": sharing,
        **{f"{c.removesuffix('_at')}_us": f"p_{c}" if c in clean else f"CASE WHEN {_in_range('p_' + c)} THEN p_{c} END" for c in TIME_COLUMNS},
        "gpu_count": "CASE WHEN isfinite(p_gpu_count) THEN p_gpu_count END",
        # A whole GPU is a share of 1 by definition; a shared one must say how much it got.
        "gpu_share": f"CASE WHEN p_gpu_share IS NULL OR isnan(p_gpu_share) THEN (CASE WHEN {sharing} = 'none' THEN 1.0 END) "
        "WHEN isfinite(p_gpu_share) THEN p_gpu_share END",
        "attempt": "CASE WHEN isfinite(p_attempt) THEN p_attempt END",
        "lost_seconds": "CASE WHEN isfinite(p_lost_seconds) AND p_lost_seconds >= 0 THEN p_lost_seconds ELSE 0.0 END",
    }


TYPED: dict[str, str] = typed_columns()


def typed_select(clean: frozenset[str] = frozenset(), by_value: ByValue | None = None) -> list[str]:
    return [f"{expr} AS {quote(name)}" for name, expr in typed_columns(clean, by_value).items()]


def text_control(clean: frozenset[str] = frozenset(), by_value: ByValue | None = None) -> str:
    """SQL over the typed layer: whether a text column that is not ``clean`` holds a
    control character (one look across them; the per-column rules name which); a column
    of ``by_value`` is looked at only in the rows holding one of its values."""
    by_value = by_value or {}
    cols = [c for c in TEXT_COLUMNS if c not in clean and c not in by_value]
    looks = [f"regexp_matches(concat({', '.join(cols)}), '{CONTROL}')"] if cols else []
    looks += [
        f"CASE WHEN {_among(quote('r_' + c), by_value[c])} THEN regexp_matches({quote(c)}, '{CONTROL}') ELSE false END"
        for c in TEXT_COLUMNS if c in by_value and c not in clean
    ]
    return " OR ".join(f"({x})" for x in looks) if looks else "false"


# What :func:`clean_pattern` finds in a value makes its column not clean.
CLEAN_COLUMNS = (*TEXT_COLUMNS, *CHOICE_COLUMNS)


def clean_pattern() -> str:
    """An RE2 pattern matching a value that needs a trim or holds a control character."""
    spaces = "".join(f"\\x{{{ord(c):x}}}" for c in SPACES)
    return f"^[{spaces}]|[{spaces}]$|{CONTROL}"


# --------------------------------------------------------------------------- layer 3: rules


def _time_display(p: str) -> str:
    return f"CASE WHEN {_within(p, _DUCK_MAX_US)} THEN strftime(make_timestamp({p}), '%Y-%m-%dT%H:%M:%S') WHEN {p} < 0 THEN 'a time before the year 283,000 BC' ELSE 'a time past the year 287,000' END"


def _time_rules(col: str, required: bool) -> list[tuple[str, str, str]]:
    p, r, typed = quote("p_" + col), quote("r_" + col), quote("typed_" + col)
    blank = f"(CASE WHEN {typed} THEN {p} IS NULL ELSE nullif({_trim(r)}, '') IS NULL END)"
    outside = f"{p} IS NOT NULL AND NOT {_in_range(p)}"
    shown = f"CASE WHEN {typed} THEN {_time_display(p)} ELSE {_show(_trim(r))} END"
    rules = [
        (col, outside, f"{shown} || ' is outside the range of supported times ({TIME_RANGE}); a \"still running\" interval has an empty end'"),
        (col, f"{p} IS NULL AND NOT ({blank})", f"'unparseable time ' || {_show(_trim(r))}"),
    ]
    if required:
        rules.append((col, f"{p} IS NULL AND {blank}", "'missing'"))
    return rules


def _num_shown(col: str) -> str:
    p, r = quote("p_" + col), quote("r_" + col)
    return f"CASE WHEN has_text_{col} THEN {_show(_trim(r))} ELSE {_show(f'CAST({p} AS VARCHAR)')} END"


def _number_rules(col: str, required: bool) -> list[tuple[str, str, str]]:
    p, r = quote("p_" + col), quote("r_" + col)
    blank = f"({p} IS NULL AND nullif({_trim(r)}, '') IS NULL) OR ({p} IS NOT NULL AND isnan({p}) AND NOT has_text_{col})"
    rules = []
    if required:
        rules.append((col, blank, "'missing'"))
    rules += [
        (col, f"{p} IS NULL AND nullif({_trim(r)}, '') IS NOT NULL", f"'not a number: ' || {_show(_trim(r))}"),
        (col, f"{p} IS NOT NULL AND isnan({p}) AND has_text_{col}", f"'not a number: ' || {_show(_trim(r))}"),
        (col, f"{p} IS NOT NULL AND isinf({p})", f"'not a finite number: ' || {_num_shown(col)}"),
    ]
    return rules


def _control_position(col: str) -> str:
    """SQL: 1-based position of the first control character of ``col``."""
    return f"(length(regexp_extract({col}, '^[^{CONTROL[1:-1]}]*')) + 1)"


def _fmt(expr: str) -> str:
    """SQL: a DOUBLE shown as Python's ``%g`` shows it (integers without a point)."""
    return f"CASE WHEN {expr} = floor({expr}) AND abs({expr}) < 1e15 THEN CAST(CAST({expr} AS BIGINT) AS VARCHAR) ELSE CAST({expr} AS VARCHAR) END"


# The text column every interval must name: the team that pays (usage) or the node (the
# node inventory, matched to usage by node name).
REQUIRED_TEXT = {
    "usage": ("team", "'missing (every interval must name the team that pays)'"),
    "inventory": ("node", "'missing (the inventory is matched to usage by node name)'"),
}
REQUIRED_TEXT_RULE = [("team", "team = ''", REQUIRED_TEXT["usage"][1])]  # replaced per kind by row_rules()

ROW_RULES: list[tuple[str, str, str]] = [
    *_time_rules("start", required=True),
    *_time_rules("end", required=False),
    ("end", "start_us IS NOT NULL AND end_us IS NOT NULL AND end_us < start_us",
     f"{utc_text('end_us')} || ' is before start ' || {utc_text('start_us')}"),
    *REQUIRED_TEXT_RULE,
    ("gpu_type", "gpu_type_raw = ''", "'missing'"),
    ("gpu_type", "gpu_type_raw <> '' AND gpu_type IS NULL", "gpu_type_error"),
    *_number_rules("gpu_count", required=True),
    ("gpu_count", "gpu_count <= 0", f"'must be > 0, got ' || {_fmt('gpu_count')}"),
    ("gpu_count", f"gpu_count > {MAX_GPUS_PER_ROW}", f"'implausibly large: ' || {_fmt('gpu_count')} || ' GPUs in one interval (at most {MAX_GPUS_PER_ROW:,})'"),
    ("gpu_count", "gpu_count <> floor(gpu_count)",
     f"'must be a whole number of GPUs, got ' || {_fmt('gpu_count')} || ' (a fraction of a GPU is gpu_share with sharing mig, mps or timeslice)'"),
    ("capacity_type", "capacity_type = ''", "'missing (spot, on-demand or reserved)'"),
    ("capacity_type", f"capacity_type <> '' AND capacity_type NOT IN ({', '.join(literal(c) for c in CAPACITY_TYPES)})",
     f"{_show(_text('capacity_type'))} || ' is not one of {', '.join(CAPACITY_TYPES)}'"),
    ("sharing", f"sharing NOT IN ({', '.join(literal(c) for c in SHARING_MODES)})", f"{_show(_text('sharing'))} || ' is not one of {', '.join(SHARING_MODES)}'"),
    ("gpu_share", "sharing IN ('mig', 'mps', 'timeslice') AND (p_gpu_share IS NULL AND nullif(trim(r_gpu_share), '') IS NULL OR isnan(p_gpu_share) AND NOT has_text_gpu_share)",
     "'missing (required when sharing is mig, mps or timeslice)'"),
    *[r for r in _number_rules("gpu_share", required=False)],
    ("gpu_share", "gpu_share <= 0 OR gpu_share > 1", f"'must be in (0, 1], got ' || {_fmt('gpu_share')}"),
    ("gpu_share", "sharing = 'none' AND gpu_share < 1", f"{_fmt('gpu_share')} || ' but sharing is none: a share below 1 needs sharing mig, mps or timeslice'"),
    ("region", "region_multiplier IS NULL", "region_error"),
    ("price", "gpu_type IS NOT NULL AND capacity_type IN ('spot', 'on-demand', 'reserved') AND region_multiplier IS NOT NULL AND price_per_gpu_hour IS NULL", "price_error"),
    ("labels", "labels <> '' AND NOT json_valid(labels)", f"'not valid JSON: ' || {_show('labels')}"),
    ("labels", "CASE WHEN labels <> '' AND json_valid(labels) THEN json_type(labels) <> 'OBJECT' OR list_has_any(json_type(labels, '$.*'), ['OBJECT', 'ARRAY']) ELSE false END",
     f"'must be a JSON object of label names to values, got ' || {_show('labels')}"),
    # A JSON escape (\u0000, \u001b) decodes to a control character the text rule cannot see:
    # looked for only where an escape is written (strpos), in the decoded names and values.
    ("labels", "CASE WHEN strpos(labels, '\\u') > 0 AND json_valid(labels) AND json_type(labels) = 'OBJECT' "
     f"THEN regexp_matches(array_to_string(list_concat(json_keys(labels), json_extract_string(labels, '$.*')), ''), '{CONTROL}') ELSE false END",
     f"'a label name or value holds a control character (NUL or another) once its JSON escapes are read: ' || {_show('labels')}"),
    ("lost_seconds", "p_lost_seconds IS NULL AND nullif(trim(r_lost_seconds), '') IS NOT NULL OR isinf(p_lost_seconds) OR p_lost_seconds < 0 OR isnan(p_lost_seconds) AND has_text_lost_seconds",
     f"'must be a finite number >= 0, got ' || {_num_shown('lost_seconds')}"),
    *[(c, f"regexp_matches({c}, '{CONTROL}')", f"'contains a control character (NUL or another) at character ' || CAST({_control_position(c)} AS VARCHAR)") for c in TEXT_COLUMNS],
]


def row_rules(kind: str = "usage") -> list[tuple[str, str, str]]:
    """The row rules of a usage file (``kind`` usage) or of the node inventory: the same
    rules, with the inventory's required ``node`` in place of ``team``."""
    col, reason = REQUIRED_TEXT[kind]
    return [(col, f"{col} = ''", reason) if rule == REQUIRED_TEXT_RULE[0] else rule for rule in ROW_RULES]


def rules_select(kind: str = "usage") -> str:
    """The rule layer: a list of (field, reason) per row, in rule order."""
    items = []
    for field, cond, reason in row_rules(kind):
        items.append((field, f"coalesce({cond}, false)", reason))
    return _problem_list(items)


# What the engine's lookup table adds to each typed row (catalog name, region multiplier, prices).
LOOKUP_COLUMNS = ("gpu_type", "gpu_type_error", "region_multiplier", "region_error", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "price_error")
_READS_LOOKUP = re.compile(r'(?<![\w"])"?(?:' + "|".join(LOOKUP_COLUMNS) + r')"?(?![\w"])')


# The lookup's keys, as the typed layer names them: a rule that reads nothing else is true
# or false alike on every row with the same keys, so one look at the lookup table (one row
# per combination present) tells whether it can fail on any row.
LOOKUP_KEYS = ("gpu_type_raw", "capacity_type", "region")
_SQL_WORDS = frozenset(("and", "or", "not", "in", "is", "null"))
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def reads_only_lookup_keys(cond: str) -> bool:
    """Whether a rule's condition reads :data:`LOOKUP_KEYS` and nothing else (its words
    outside string literals, SQL's few comparison words aside; a function or any other
    name says no)."""
    words = {w for w in _WORD.findall(_LITERAL.sub("", cond.replace('"', ""))) if w.lower() not in _SQL_WORDS}
    return bool(words) and words <= set(LOOKUP_KEYS)


def _in_group(cond: str, lookup: bool | None, keys: bool) -> bool:
    if cond.startswith("regexp_matches("):
        return False  # the control-character rules: text_control, one look across every column
    if lookup is None:
        return True
    if _READS_LOOKUP.search(cond):
        return lookup
    return not lookup and (keys or not reads_only_lookup_keys(cond))


def rules_bad(kind: str = "usage", layout: dict[str, Stored] | None = None, lookup: bool | None = None, keys: bool = True) -> str:
    """Whether any rule fails (cheap: no reason is built; one look for control
    characters across every text column instead of one per column). With the ``layout``
    of the one source it runs over, its :func:`flags` are written in as constants (so
    that DuckDB drops what cannot apply to how that source stores its columns).
    ``lookup``: only the rules that read :data:`LOOKUP_COLUMNS` (True), or only the others
    (False: they run before the lookup is joined, on the wide rows); with ``keys`` False,
    the others without the rules that read nothing but :data:`LOOKUP_KEYS` (for when no row
    of the lookup fails them: :func:`key_rules_bad`)."""
    conds = [f"({cond})" for _, cond, _ in row_rules(kind) if _in_group(cond, lookup, keys)]
    sql = f"(coalesce({' OR '.join(conds) or 'false'}, false){'' if lookup else ' OR text_control'})"  # text_control: see :func:`text_control`
    if layout is None:
        return sql
    known = constants(layout)
    return re.sub(r'(?<![\w"])"?((?:typed|has|r|p)_\w+)"?(?![\w"])', lambda m: known.get(m.group(1), m.group(0)), sql)


def key_rules_bad(kind: str = "usage") -> str:
    """Whether any rule that reads nothing but :data:`LOOKUP_KEYS` fails (SQL over a row of
    the lookup table, or a typed row)."""
    conds = [f"({cond})" for _, cond, _ in row_rules(kind) if reads_only_lookup_keys(cond)]
    return f"coalesce({' OR '.join(conds) or 'false'}, false)"


def constants(layout: dict[str, Stored]) -> dict[str, str]:
    """The raw layer's columns that are constants in a usage source stored as ``layout``
    (name -> SQL literal): its :func:`flags`, and the text (``r_``) and parsed (``p_``)
    values that are NULL there (a missing column, a typed time's or a number column's
    text). Not for the node inventory, whose raw layer fills blanks from instance types."""
    out = {k: "true" if v else "false" for k, v in flags(layout).items()}
    for col in ALL_COLUMNS:
        kind = layout[col].kind if col in layout else None  # None: missing (a present labels may merge label: columns)
        if kind in (None, STORED_NESTED, STORED_TIME) or kind == STORED_NUMBER and col in NUMBER_COLUMNS:
            out[f"r_{col}"] = "CAST(NULL AS VARCHAR)"
        if kind is None and col in TIME_COLUMNS + NUMBER_COLUMNS:
            out[f"p_{col}"] = f"CAST(NULL AS {'BIGINT' if col in TIME_COLUMNS else 'DOUBLE'})"
    return out


def flags(layout: dict[str, Stored]) -> dict[str, bool]:
    """The raw layer's flags of a source stored as ``layout``: ``typed_<time>`` (stored as a
    time), ``has_<column>`` (present), ``has_text_<number>`` (a number column stored as
    text: a NaN there is the text 'nan', an error; in a float column, a missing value)."""
    out = {f"typed_{c}": layout.get(c, Stored(STORED_NULL)).kind == STORED_TIME for c in TIME_COLUMNS}
    out.update({f"has_{c}": c in layout for c in ALL_COLUMNS})
    out.update({f"has_text_{c}": layout.get(c, Stored(STORED_NULL)).kind != STORED_NUMBER for c in NUMBER_COLUMNS})
    return out


def describe() -> list[tuple[str, str]]:
    """(field, condition) of every row rule, for the documentation."""
    return [(f, c) for f, c, _ in ROW_RULES]


def inventory_raw(raw: str) -> str:
    """SQL: the raw layer of a node inventory with a blank ``gpu_type``/``gpu_count`` taken
    from its known ``instance_type`` (table ``instance_map``: instance_type, d_gpu_type,
    d_gpu_count, built by the engine from the GPU catalog)."""
    blank_type = f"nullif({_trim('r.r_gpu_type')}, '') IS NULL"
    blank_count = f"(r.p_gpu_count IS NULL OR isnan(r.p_gpu_count)) AND nullif({_trim('r.r_gpu_count')}, '') IS NULL"
    return (
        f"SELECT r.* REPLACE (CASE WHEN {blank_type} THEN coalesce(im.d_gpu_type, r.r_gpu_type) ELSE r.r_gpu_type END AS r_gpu_type, "
        f"CASE WHEN {blank_count} THEN im.d_gpu_count ELSE r.p_gpu_count END AS p_gpu_count) "
        f"FROM ({raw}) r LEFT JOIN instance_map im ON im.instance_type = {_trim('r.r_instance_type')}"
    )
