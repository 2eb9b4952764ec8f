"""`gpu-ops cost attribution | budgets | roi`: the cost core over files, no Dagster.

Without ``--usage`` the sources, prices, budgets, grouping and idle mode come from the
configuration file (``--config``, else ``$GPU_OPS_CONFIG``, else the plain defaults).
Nothing here may import Dagster or torch: the command must start fast (a test checks).
`cost attribution` over files (``--usage``, ``--prices``, ``--inventory``) loads neither
pandas nor pydantic: the engine and :mod:`gpu_ops.flows.cost.allocate` work in DuckDB and the
table is printed from plain Python. A configuration file (``--config``, or no
``--usage``/``--prices``) is read by its pydantic model; the ledger and Kubernetes sources
are read through pandas.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import click

from gpu_ops.flows.cost.read import UsageSourceError

if TYPE_CHECKING:
    import pandas as pd

    from gpu_ops.domain.config import Budget, GpuOpsConfig, PriceTable
    from gpu_ops.flows.cost.allocate import Groups
    from gpu_ops.flows.cost.engine import UsageInput
    from gpu_ops.flows.cost.pricing import PriceMatrix

FORMATS = click.Choice(["table", "csv", "json"])


# --------------------------------------------------------------------------- inputs


def _read_yaml(path: str) -> Any:
    from gpu_ops.domain.fastyaml import YamlFileError, read_yaml_file

    try:
        return read_yaml_file(path)
    except YamlFileError as exc:
        raise click.ClickException(str(exc)) from None


def _errors(path: str, prefix: str, exc: Any, data: Any) -> str:
    from gpu_ops.domain.config import describe_errors

    return "\n".join(describe_errors(exc, data, path, prefix))


def load_price_matrix(path: str) -> "PriceMatrix":
    """The prices of a file; its plain, valid form read without pydantic (the model judges
    and words everything else)."""
    from gpu_ops.flows.cost.pricing import PriceMatrix, plain_price_matrix

    light = plain_price_matrix(_read_yaml(path))
    return light if light is not None else PriceMatrix.from_table(load_prices(path))


def load_prices(path: str) -> "PriceTable":
    from pydantic import ValidationError

    from gpu_ops.domain.config import PriceTable

    data = _read_yaml(path)
    try:
        return PriceTable.model_validate(data)
    except ValidationError as exc:
        raise click.ClickException(_errors(path, "", exc, data)) from None


def load_budgets(path: str) -> "list[Budget]":
    from pydantic import TypeAdapter, ValidationError

    from gpu_ops.domain.config import Budget, repeated_budget_names

    data = _read_yaml(path)
    if isinstance(data, dict) and "budgets" in data:
        data = data["budgets"]
    try:
        budgets = TypeAdapter(list[Budget]).validate_python(data or [])
    except ValidationError as exc:
        raise click.ClickException(_errors(path, "budgets", exc, data)) from None
    if problems := repeated_budget_names(budgets, path):
        raise click.ClickException("\n".join(problems.values()))
    return budgets


def _config(path: str | None) -> "GpuOpsConfig":
    from gpu_ops.domain.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _date(value: str | None) -> dt.date:
    if not value:
        return dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)
    from gpu_ops.domain.cost.rules import FIRST_DAY, LAST_DAY

    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)", param_hint="--date") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise click.BadParameter(f"{value!r} is outside the days whose times can be held ({FIRST_DAY} to {LAST_DAY})", param_hint="--date")
    return day


def _as_of_utc(value: str | None, day: dt.date) -> dt.datetime:
    """``--as-of`` (UTC when no offset), or the end of ``day``, or now while it runs."""
    utc = dt.timezone.utc
    if not value:
        end = dt.datetime(day.year, day.month, day.day, tzinfo=utc) + dt.timedelta(days=1)
        return min(end, dt.datetime.now(utc))
    from gpu_ops.domain.cost.rules import FIRST_DAY, LAST_DAY

    try:
        t = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a time (ISO 8601, UTC when no offset)", param_hint="--as-of") from None
    try:
        t = t.replace(tzinfo=utc) if t.tzinfo is None else t.astimezone(utc)
    except OverflowError:  # an offset that takes it before year 1 or past 9999
        t = dt.datetime.min.replace(tzinfo=utc)
    if not FIRST_DAY <= t.date() <= LAST_DAY:  # the days --date takes: every time in them can be held
        raise click.BadParameter(f"{value!r} is outside the days whose times can be held ({FIRST_DAY} to {LAST_DAY})", param_hint="--as-of")
    return t


def _as_of(value: str | None, day: dt.date) -> "pd.Timestamp":
    import pandas as pd

    return pd.Timestamp(_as_of_utc(value, day))


def _us(t: dt.datetime) -> int:
    from gpu_ops.flows.cost.window import epoch_ns

    return epoch_ns(t) // 1000


class Inputs:
    """What a command works on: explicit files and prices first, the configuration otherwise."""

    def __init__(self, usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, idle: str | None, by: str | None):
        from gpu_ops.domain.cost.columns import GROUPING_KEYS, check_group_by
        from gpu_ops.flows.cost.pricing import PriceMatrix
        from gpu_ops.domain.cost.sources import SourceSet

        # Paths given on the command line resolve against the working directory (paths in
        # the configuration file against its folder).
        inventory = str(Path(inventory).expanduser().resolve()) if inventory else None
        cfg = _config(config_path) if (config_path or not usage or not prices) else None
        self.prices = load_price_matrix(prices) if prices else PriceMatrix.from_table(cfg.prices)  # type: ignore[union-attr]
        if usage:
            self.sources = SourceSet(usage_files=list(usage), inventory_files=[inventory] if inventory else [], base_dir=Path.cwd())
        else:
            self.sources = SourceSet.from_config(cfg)  # type: ignore[arg-type]
            if inventory:
                self.sources.inventory_files, self.sources.inventory_karpenter = [inventory], False
        self.config = cfg
        # The configured sources are what the cost tables hold, from their first day on;
        # files named on the command line are read whole.
        self.tables_start: dt.date | None = cfg.usage.partitions_start if cfg is not None and not usage else None
        self.idle = idle or (cfg.usage.idle if cfg else "row")
        self.group_by = [k.strip() for k in by.split(",") if k.strip()] if by is not None else (list(cfg.usage.group_by) if cfg else ["team", "project"])
        try:
            if not self.group_by:
                raise ValueError(f"no grouping key in {by!r}: give one or more of {', '.join(GROUPING_KEYS)} or label:<name>, separated by commas")
            self.group_by = check_group_by(self.group_by)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--by") from None

    def data_range(self) -> tuple[dt.datetime, dt.datetime] | None:
        """(first start, last end) of the usage in the file and ledger sources, or None:
        the times as the rule book reads them, through the one reader and the engine (of
        the files, only their time columns)."""
        from gpu_ops.flows.cost.engine import UsageEngine, UsageInput
        from gpu_ops.flows.cost.read import read_files
        from gpu_ops.domain.cost.rules import ALL_COLUMNS

        usage = UsageInput()
        if self.sources.usage_files:
            usage.files = [f.narrowed(("start", "end")) for f in read_files(self.sources.usage_files, self.sources.base_dir, ALL_COLUMNS).files]
        if self.sources.ledger and self.store() is not None:
            from gpu_ops.flows.cost.usage import read_ledger

            usage.frames.append(read_ledger(self.store()))
        engine = UsageEngine(self.prices)
        try:
            usage.add_to(engine)
            span = engine.time_span()
        finally:
            engine.close()
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return None if span is None else (epoch + dt.timedelta(microseconds=span[0]), epoch + dt.timedelta(microseconds=span[1]))

    def store(self) -> Any:
        if not (self.sources.ledger or self.sources.kubernetes or self.sources.inventory_karpenter):
            return None
        from gpu_ops.storage.tables import TableStore

        return TableStore.from_config(self.config)  # type: ignore[union-attr]

    def engine_input(self, window: Any) -> "tuple[UsageInput, UsageInput | None]":
        """(usage, inventory) of ``window`` as the engine takes them: files read as Arrow
        (the same bounded read as the daily asset), the ledger and Kubernetes tables as
        frames (pandas, only then); the inventory as the daily asset reads it. Every column
        the rule book judges is read, whatever the grouping: the asset's quarantine."""
        from gpu_ops.flows.cost.engine import UsageInput
        from gpu_ops.flows.cost.read import read_files
        from gpu_ops.domain.cost.rules import ALL_COLUMNS
        from gpu_ops.flows.cost.window import ReadStats

        src, stats = self.sources, ReadStats()
        if src.ledger or src.kubernetes or src.inventory_karpenter:
            from gpu_ops.flows.cost.pipeline import load_raw

            usage, inventory = load_raw(src, self.store(), ALL_COLUMNS, window=window, stats=stats)
        else:
            from gpu_ops.flows.cost.inventory import load_inventory

            got = read_files(src.usage_files, src.base_dir, ALL_COLUMNS, window, stats, lookback_days=src.lookback_days)
            usage, inventory = UsageInput(got.files, problems=got.problems), load_inventory(src)
        if stats.files_beyond_lookback:
            click.echo(f"warning: {stats.lookback_warning()}", err=True)
        return usage, inventory

    def priced(self, window_start: Any, window_end: Any, as_of: Any) -> Any:
        """Priced usage of the window (pandas, for budgets and ROI), read as the daily asset
        reads it and as :meth:`engine_input` does: every column the rule book judges."""
        from gpu_ops.flows.cost.pipeline import load_raw, price_window
        from gpu_ops.domain.cost.rules import ALL_COLUMNS
        from gpu_ops.flows.cost.window import ReadStats, Window

        stats = ReadStats()
        try:
            # The same bounded read as the daily asset: what is priced is what it prices.
            raw, inventory = load_raw(self.sources, self.store(), ALL_COLUMNS, window=Window(window_start, window_end), stats=stats)
            if stats.files_beyond_lookback:
                click.echo(f"warning: {stats.lookback_warning()}", err=True)
        except (UsageSourceError, ValueError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from None
        return price_window(raw, inventory, self.prices, window_start, window_end, as_of)


def _report_quarantine(q: "pd.DataFrame", path: str | None) -> None:
    """:func:`_report_rows` of a pandas quarantine (budgets, ROI)."""
    import numpy as np

    records = q.to_dict("records")
    for col in ("start", "end"):
        ns = q[col].array.asi8 if len(q) else np.array([], np.int64)
        for r, v in zip(records, ns):
            r[f"{col}_us"] = None if v == np.iinfo(np.int64).min else int(v) // 1000
    for r in records:
        r["row"] = None if r["row"] is None or r["row"] != r["row"] or str(r["row"]) == "<NA>" else int(r["row"])
    _report_rows(records, path)


def _report_rows(records: list[dict[str, Any]], path: str | None, total: int | None = None) -> None:
    """Say what was set aside (stderr) and write it to ``path`` (a CSV with its header even
    when empty); exit 1 when a file or pattern gave no rows at all. ``total``: how many
    records there are when ``records`` holds only the first ones (and every file problem).

    Called last, after the table was printed: the good files are priced either way, but a
    missing or unreadable file must not pass for a cheap day in a script (exit status).
    """
    from gpu_ops.domain.cost.rules import FILE_FIELD

    if path:  # written every run, the header alone when nothing was set aside: never an earlier run's rows
        _write_quarantine(records, path)
    if not records:
        return
    files = [r for r in records if r["field"] == FILE_FIELD]
    rows = [r for r in records if r["field"] != FILE_FIELD]
    if rows:
        first = rows[0]
        where = f"{first['location']} row {'<NA>' if first['row'] is None else first['row']}"
        if str(first["location"]).lower().endswith(".csv") and first["row"] is not None:
            where += f" (line {int(first['row']) + 1}, after the header)"  # rows count data rows from 1
        n = len(rows) if total is None else total - len(files)
        click.echo(f"quarantined {n} row(s){f' (written to {path})' if path else ''}; first: {where}: {first['reason']}", err=True)
    if files:
        for f in files:
            click.echo(f"Error: {f['location']}: {f['reason']}", err=True)
        raise click.exceptions.Exit(1)


QUARANTINE_CSV = ("source", "location", "row", "field", "reason", "record", "start", "end")


def _times(values: list[int | None]) -> list[str]:
    """UTC microseconds as pandas writes a time column: ``2026-10-01 22:00:00+00:00``, with
    as many decimals as the column needs (none, 3 or 6), "" when missing."""
    present = [v for v in values if v is not None]
    digits = 0 if all(v % 10**6 == 0 for v in present) else 3 if all(v % 1000 == 0 for v in present) else 6
    epoch = dt.datetime(1970, 1, 1)
    out = []
    for v in values:
        if v is None:
            out.append("")
            continue
        t = epoch + dt.timedelta(microseconds=v)
        frac = f".{t.microsecond:06d}"[: digits + 1] if digits else ""
        out.append(t.strftime("%Y-%m-%d %H:%M:%S") + frac + "+00:00")
    return out


def _write_quarantine(records: list[dict[str, Any]], path: str) -> None:
    import csv

    starts, ends = _times([r["start_us"] for r in records]), _times([r["end_us"] for r in records])
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(QUARANTINE_CSV)
            for r, s0, e0 in zip(records, starts, ends):
                w.writerow([r["source"], r["location"], "" if r["row"] is None else r["row"], r["field"], r["reason"], r["record"], s0, e0])
    except OSError as exc:
        raise click.ClickException(f"--quarantine {path}: cannot be written: {exc.strerror or exc}") from None


def _emit_groups(groups: "Groups", fmt: str, title: str) -> None:
    """An attribution printed from plain Python, as :func:`_emit` prints a frame."""
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(groups.columns)
        w.writerows([["" if v is None else repr(v) if isinstance(v, float) else v for v in r] for r in groups.rows])
        click.echo(buf.getvalue(), nl=False)
    elif fmt == "json":  # as pandas' to_json writes it: ten decimals, NaN as null
        rows = [{c: round(v, 10) if isinstance(v, float) else v for c, v in zip(groups.columns, r)} for r in groups.rows]
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False, separators=(",", ":")))
    else:
        click.echo(title)
        click.echo(_text_table(groups.columns, groups.rows) if groups.rows else "(no rows)")


def _text_table(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """Columns right-aligned to their widest cell, one space apart (pandas' ``to_string``),
    money to the cent and hours to three decimals (:func:`gpu_ops.domain.formatting.column_formatter`)."""
    from gpu_ops.domain.formatting import MISSING, column_formatter

    cells = []
    for i, c in enumerate(columns):
        fmt = column_formatter(c)
        cells.append([c, *(MISSING if v is None else fmt(v) if fmt else str(v) for v in (r[i] for r in rows))])
    widths = [max(len(x) for x in col) for col in cells]
    return "\n".join(" ".join(col[j].rjust(w) for col, w in zip(cells, widths)) for j in range(len(rows) + 1))


def _emit(df: "pd.DataFrame", fmt: str, title: str = "") -> None:
    import pandas as pd

    if fmt == "csv":
        out = df.copy()
        for c in out.columns:
            if out[c].map(lambda v: isinstance(v, (list, dict))).any():
                out[c] = out[c].map(json.dumps)
        click.echo(out.to_csv(index=False), nl=False)
    elif fmt == "json":
        out = df.copy()
        for c in out.columns:  # dates as 2026-10-01, times as ISO 8601 with offset
            if out[c].map(lambda v: isinstance(v, (dt.date, pd.Timestamp))).any():
                out[c] = out[c].map(lambda v: v.isoformat() if isinstance(v, (dt.date, pd.Timestamp)) else v)
        click.echo(out.to_json(orient="records", indent=2, force_ascii=False))
    else:
        if title:
            click.echo(title)
        from gpu_ops.domain.formatting import column_formatter

        formatters = {c: f for c in df.columns if (f := column_formatter(str(c)))}  # money to the cent, hours to 3 decimals
        with pd.option_context("display.float_format", "{:,.2f}".format):
            click.echo(df.to_string(index=False, max_rows=None, max_cols=None, line_width=None, formatters=formatters, na_rep="n/a") if len(df) else "(no rows)")


# --------------------------------------------------------------------------- commands

_common = [
    click.option("--usage", multiple=True, help="Usage CSV/Parquet file or glob (repeatable); default: the config's sources."),
    click.option("--prices", type=click.Path(dir_okay=False), help="Prices YAML; default: the config's."),
    click.option("--inventory", type=click.Path(dir_okay=False), help="Node inventory CSV/Parquet, for idle cost."),
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpu_ops YAML (default: $GPU_OPS_CONFIG, then the plain defaults)."),
    click.option("--date", "date_", help="UTC day, YYYY-MM-DD (default: yesterday)."),
    click.option("--as-of", "as_of", help="Clip open intervals here (default: the end of the day, or now)."),
    click.option("--format", "fmt", type=FORMATS, default="table", show_default=True),
    click.option(
        "--quarantine", "quarantine_path", type=click.Path(dir_okay=False), callback=lambda ctx, param, value: _writable(value),
        help="Write quarantined rows (with reasons) to this CSV (its header alone when none).",
    ),
]


def _writable(path: str | None) -> str | None:
    """``--quarantine``'s file, checked before any work: its folder exists and can be written."""
    import os

    if path is None:
        return None
    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        raise click.BadParameter(f"{path}: there is no folder {folder} to write it in", param_hint="--quarantine")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"{path}: the folder {folder} cannot be written", param_hint="--quarantine")
    return path


def common(fn: Any) -> Any:
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


@click.group()
def cost() -> None:
    """GPU cost attribution, budgets and ROI over usage files."""


@cost.command()
@common
@click.option("--by", help="Grouping keys, e.g. team,project or team,label:tier (default: the config's usage.group_by).")
@click.option("--idle", type=click.Choice(["row", "share"]), help="Idle fleet cost as an __idle__ row or shared by weight.")
# Deprecated (no effect): every read goes through the one DuckDB engine; kept so that scripts keep working.
@click.option("--batch-rows", type=click.IntRange(min=1), hidden=True, help="Deprecated, no effect.")
@click.option("--engine", type=click.Choice(["auto", "duckdb", "arrow"]), hidden=True, help="Deprecated, no effect.")
def attribution(usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, date_: str | None, as_of: str | None, fmt: str, quarantine_path: str | None, by: str | None, idle: str | None, batch_rows: int | None, engine: str | None) -> None:
    """Cost per group for one UTC day."""
    from gpu_ops.flows.cost.allocate import Span, attribution_of
    from gpu_ops.domain.cost.columns import attribution_columns
    from gpu_ops.flows.cost.engine import QUARANTINE_ROWS
    from gpu_ops.flows.cost.window import Window

    inputs = Inputs(usage, prices, inventory, config_path, idle, by)
    day = _date(date_)
    window, as_of_t = Window.of_utc_days(day), _as_of_utc(as_of, day)
    keep = attribution_columns(inputs.group_by, inputs.sources.has_inventory)
    try:
        raw, inv = inputs.engine_input(window)
    except (UsageSourceError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    span = Span(_us(window.start), _us(window.end), _us(as_of_t))
    # Without --quarantine only the first row's reason is said: the others' are not built.
    groups, quarantine = attribution_of(raw, inv, inputs.prices, span, inputs.group_by, inputs.idle, keep, first_quarantined=None if quarantine_path else 1)
    t = groups.totals
    fleet = f", fleet ${t['fleet_cost_usd']:,.2f} (idle ${t['idle_cost_usd']:,.2f})" if t.get("fleet_cost_usd") is not None else ""
    _emit_groups(groups, fmt, f"GPU cost {day} (as of {as_of_t.isoformat()}): ${t['attributed_cost_usd']:,.2f}, {t['gpu_hours']:,.2f} GPU-hours{fleet}")
    counted = (quarantine.schema.metadata or {}).get(QUARANTINE_ROWS.encode())
    _report_rows(quarantine.to_pylist(), quarantine_path, None if counted is None else int(counted))
    if not date_ and not t["gpu_hours"]:
        _say_where_data_is(inputs, day)


def _say_where_data_is(inputs: Inputs, day: dt.date) -> None:
    """An empty default day (yesterday) usually means the data is elsewhere: say where."""
    found = inputs.data_range()
    if found is None:
        click.echo(f"no usage on {day} (the default --date is yesterday, UTC), and none in any usage source", err=True)
        return
    first, last = (ts.date().isoformat() for ts in found)
    click.echo(f"no usage on {day} (the default --date is yesterday, UTC); usage found from {first} to {last}: try --date {last}", err=True)


@cost.command()
@common
@click.option("--budgets", "budgets_path", type=click.Path(dir_okay=False), help="Budgets YAML (a list, or a mapping with 'budgets'); default: the config's.")
def budgets(usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, date_: str | None, as_of: str | None, fmt: str, quarantine_path: str | None, budgets_path: str | None) -> None:
    """Spend, forecast and thresholds of each budget for the period containing --date.

    With the configuration's sources, spend counts from usage.partitions_start, as
    gpu_budget_status does; files given with --usage are read over the whole period.
    """
    from gpu_ops.flows.cost.attribution import day_window
    from gpu_ops.flows.cost.budgets import earliest_period_start, evaluate_budgets

    inputs = Inputs(usage, prices, inventory, config_path, None, None)
    items = load_budgets(budgets_path) if budgets_path else list(inputs.config.budgets if inputs.config else [])
    if not items:
        raise click.ClickException("no budgets: give --budgets FILE or a config with a budgets section")
    day = _date(date_)
    as_of_ts = _as_of(as_of, day)
    # With the configured sources, spend counts from the first day the cost tables hold
    # (usage.partitions_start), as gpu_budget_status and the budget sensor count it; a day
    # before the tables is read from the sources whole.
    first, start = earliest_period_start(items, day), inputs.tables_start
    if start is not None and start <= day:
        first = max(first, start)
    else:
        start = None
    priced = inputs.priced(day_window(first)[0], day_window(day)[1], as_of_ts)
    table = evaluate_budgets(items, priced.rows, day, as_of_ts, inputs.idle, expected_from=start)
    _emit(table, fmt, f"Budgets on {day} (as of {as_of_ts.isoformat()})")
    _report_quarantine(priced.quarantine, quarantine_path)


@cost.command()
@common
def roi(usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, date_: str | None, as_of: str | None, fmt: str, quarantine_path: str | None) -> None:
    """Measured savings, waste and recommendations for one UTC day."""
    from gpu_ops.flows.cost.attribution import day_window
    from gpu_ops.flows.cost.roi import roi_report

    inputs = Inputs(usage, prices, inventory, config_path, None, None)
    day = _date(date_)
    ws, we = day_window(day)
    priced = inputs.priced(ws, we, _as_of(as_of, day))
    report = roi_report(priced.rows)
    if fmt == "table":
        _emit(report.drop(columns="recommendations"), fmt, f"GPU ROI {day}")
        recs = [r for rs in report["recommendations"] for r in rs]
        if recs:
            click.echo("\nRecommendations:")
            for r in sorted(recs, key=lambda r: -r["impact_usd"]):
                click.echo(f"  ${r['impact_usd']:>10,.2f}  [{r['kind']}] {r['detail']}")
    else:
        _emit(report, fmt)
    _report_quarantine(priced.quarantine, quarantine_path)


if __name__ == "__main__":  # python -m gpu_ops.cli.cost
    cost(sys.argv[1:])
