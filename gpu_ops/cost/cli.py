"""`gpu-ops cost attribution | budgets | roi`: the cost core over files, no Dagster.

Without ``--usage`` the sources, prices, budgets, grouping and idle mode come from the
configuration file (``--config``, else ``$GPU_OPS_CONFIG``, else the bundled demo).
Nothing here may import Dagster or torch: the command must start fast (a test checks).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import pandas as pd

    from gpu_ops.config import Budget, GpuOpsConfig, PriceTable

FORMATS = click.Choice(["table", "csv", "json"])


# --------------------------------------------------------------------------- inputs


def _read_yaml(path: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise click.BadParameter(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{path}: not valid YAML: {exc}") from None


def _errors(path: str, prefix: str, exc: Any, data: Any) -> str:
    from gpu_ops.config import describe_errors

    return "\n".join(describe_errors(exc, data, path, prefix))


def load_prices(path: str) -> "PriceTable":
    from pydantic import ValidationError

    from gpu_ops.config import PriceTable

    data = _read_yaml(path)
    try:
        return PriceTable.model_validate(data)
    except ValidationError as exc:
        raise click.ClickException(_errors(path, "", exc, data)) from None


def load_budgets(path: str) -> "list[Budget]":
    from pydantic import TypeAdapter, ValidationError

    from gpu_ops.config import Budget

    data = _read_yaml(path)
    if isinstance(data, dict) and "budgets" in data:
        data = data["budgets"]
    try:
        return TypeAdapter(list[Budget]).validate_python(data or [])
    except ValidationError as exc:
        raise click.ClickException(_errors(path, "budgets", exc, data)) from None


def _config(path: str | None) -> "GpuOpsConfig":
    from gpu_ops.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _date(value: str | None) -> dt.date:
    if not value:
        return dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)", param_hint="--date") from None


def _as_of(value: str | None, day: dt.date) -> "pd.Timestamp":
    import pandas as pd

    from gpu_ops.cost.attribution import utc
    from gpu_ops.cost.pipeline import default_as_of

    if not value:
        return default_as_of(day)
    try:
        return utc(pd.Timestamp(value))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a time (ISO 8601, UTC when no offset)", param_hint="--as-of") from None


class Inputs:
    """What a command works on: explicit files and prices first, the configuration otherwise."""

    def __init__(self, usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, idle: str | None, by: str | None):
        from gpu_ops.cost.pipeline import SourceSet
        from gpu_ops.cost.pricing import PriceMatrix

        # Paths given on the command line resolve against the working directory (paths in
        # the configuration file against its folder).
        inventory = str(Path(inventory).expanduser().resolve()) if inventory else None
        cfg = _config(config_path) if (config_path or not usage or not prices) else None
        table = load_prices(prices) if prices else cfg.prices  # type: ignore[union-attr]
        self.prices = PriceMatrix.from_table(table)
        if usage:
            self.sources = SourceSet(usage_files=list(usage), inventory_files=[inventory] if inventory else [], base_dir=Path.cwd())
        else:
            self.sources = SourceSet.from_config(cfg)  # type: ignore[arg-type]
            if inventory:
                self.sources.inventory_files, self.sources.inventory_karpenter = [inventory], False
        self.config = cfg
        self.idle = idle or (cfg.usage.idle if cfg else "row")
        self.group_by = [k.strip() for k in by.split(",") if k.strip()] if by else (list(cfg.usage.group_by) if cfg else ["team", "project"])
        from gpu_ops.config import check_group_by

        try:
            self.group_by = check_group_by(self.group_by)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--by") from None

    def data_range(self) -> tuple[Any, Any] | None:
        """(first start, last end) of the usage in the file and ledger sources, or None."""
        import pandas as pd

        from gpu_ops.cost.usage import read_ledger, read_usage_files

        frames = []
        if self.sources.usage_files:
            frames.append(read_usage_files(self.sources.usage_files, self.sources.base_dir, row_numbers=False))
        if self.sources.ledger and self.store() is not None:
            frames.append(read_ledger(self.store()))
        starts = [pd.to_datetime(f["start"], utc=True, errors="coerce") for f in frames if "start" in f]
        ends = [pd.to_datetime(f["end"], utc=True, errors="coerce") for f in frames if "end" in f]
        first = min((s.min() for s in starts if s.notna().any()), default=None)
        last = max((e.max() for e in ends if e.notna().any()), default=first)
        return (first, last) if first is not None else None

    def store(self) -> Any:
        if not (self.sources.ledger or self.sources.kubernetes or self.sources.inventory_karpenter):
            return None
        from gpu_ops.storage.tables import TableStore

        return TableStore.from_config(self.config)  # type: ignore[union-attr]

    def priced(self, window_start: Any, window_end: Any, as_of: Any, columns: list[str] | None = None, keep: list[str] | None = None, drop_empty: bool = True) -> Any:
        """Priced usage of the window, read as the daily asset reads it (``keep``: only
        sums by those columns are needed)."""
        from gpu_ops.cost.pipeline import load_raw, price_window
        from gpu_ops.cost.usage import UsageSourceError
        from gpu_ops.cost.window import ReadStats, Window

        stats = ReadStats()
        try:
            # The same bounded read as the daily asset: what is priced is what it prices.
            raw, inventory = load_raw(self.sources, self.store(), columns, window=Window(window_start, window_end), stats=stats)
            if stats.files_beyond_lookback:
                click.echo(f"warning: {stats.lookback_warning()}", err=True)
        except (UsageSourceError, ValueError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from None
        return price_window(raw, inventory, self.prices, window_start, window_end, as_of, dedupe=self.sources.count > 1, keep_columns=keep, drop_empty=drop_empty)


def _report_quarantine(q: "pd.DataFrame", path: str | None) -> None:
    """Say what was set aside (stderr); exit 1 when a file or pattern gave no rows at all.

    Called last, after the table was printed: the good files are priced either way, but a
    missing or unreadable file must not pass for a cheap day in a script (exit status).
    """
    import pandas as pd

    from gpu_ops.cost.usage import file_problems

    if q.empty:
        return
    if path:
        q.to_csv(path, index=False)
    files = file_problems(q)
    rows = q[q["field"] != files["field"].iloc[0]] if len(files) else q
    if len(rows):
        first = rows.iloc[0]
        where = f"{first['location']} row {first['row']}"
        if str(first["location"]).lower().endswith(".csv") and not pd.isna(first["row"]):
            where += f" (line {int(first['row']) + 1}, after the header)"  # rows count data rows from 1
        click.echo(f"quarantined {len(rows)} row(s){f' (written to {path})' if path else ''}; first: {where}: {first['reason']}", err=True)
    if len(files):
        for f in files.itertuples(index=False):
            click.echo(f"Error: {f.location}: {f.reason}", err=True)
        raise click.exceptions.Exit(1)


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
        from gpu_ops.formatting import column_formatter

        formatters = {c: f for c in df.columns if (f := column_formatter(str(c)))}  # money to the cent, hours to 3 decimals
        with pd.option_context("display.float_format", "{:,.2f}".format):
            click.echo(df.to_string(index=False, max_rows=None, max_cols=None, line_width=None, formatters=formatters, na_rep="n/a") if len(df) else "(no rows)")


# --------------------------------------------------------------------------- commands

_common = [
    click.option("--usage", multiple=True, help="Usage CSV/Parquet file or glob (repeatable); default: the config's sources."),
    click.option("--prices", type=click.Path(dir_okay=False), help="Prices YAML; default: the config's."),
    click.option("--inventory", type=click.Path(dir_okay=False), help="Node inventory CSV/Parquet, for idle cost."),
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpu_ops YAML (default: $GPU_OPS_CONFIG, then the bundled demo)."),
    click.option("--date", "date_", help="UTC day, YYYY-MM-DD (default: yesterday)."),
    click.option("--as-of", "as_of", help="Clip open intervals here (default: the end of the day, or now)."),
    click.option("--format", "fmt", type=FORMATS, default="table", show_default=True),
    click.option("--quarantine", "quarantine_path", type=click.Path(dir_okay=False), help="Write quarantined rows (with reasons) to this CSV."),
]


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
    from gpu_ops.cost.columns import needed_columns
    from gpu_ops.cost.attribution import attribute, day_window
    from gpu_ops.cost.pipeline import attribution_columns

    inputs = Inputs(usage, prices, inventory, config_path, idle, by)
    day = _date(date_)
    ws, we = day_window(day)
    cols = needed_columns(inputs.group_by, inputs.sources.has_inventory, inputs.sources.count > 1)
    keep = attribution_columns(inputs.group_by, inputs.sources.has_inventory)
    # Only sums are printed, so out-of-day rows may stay in with zero hours (no copy).
    priced = inputs.priced(ws, we, _as_of(as_of, day), cols, keep, drop_empty=False)
    result = attribute(priced.rows, inputs.group_by, inputs.idle)
    t = result.totals
    fleet = f", fleet ${t['fleet_cost_usd']:,.2f} (idle ${t['idle_cost_usd']:,.2f})" if t.get("fleet_cost_usd") is not None else ""
    _emit(result.table, fmt, f"GPU cost {day} (as of {priced.as_of.isoformat()}): ${result.table['cost_usd'].sum():,.2f}, {t['gpu_hours']:,.2f} GPU-hours{fleet}")
    _report_quarantine(priced.quarantine, quarantine_path)
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
    """Spend, forecast and thresholds of each budget for the period containing --date."""
    from gpu_ops.cost.attribution import day_window
    from gpu_ops.cost.budgets import earliest_period_start, evaluate_budgets

    inputs = Inputs(usage, prices, inventory, config_path, None, None)
    items = load_budgets(budgets_path) if budgets_path else list(inputs.config.budgets if inputs.config else [])
    if not items:
        raise click.ClickException("no budgets: give --budgets FILE or a config with a budgets section")
    day = _date(date_)
    as_of_ts = _as_of(as_of, day)
    first = earliest_period_start(items, day)
    priced = inputs.priced(day_window(first)[0], day_window(day)[1], as_of_ts)
    table = evaluate_budgets(items, priced.rows, day, as_of_ts, inputs.idle)
    _emit(table, fmt, f"Budgets on {day} (as of {as_of_ts.isoformat()})")
    _report_quarantine(priced.quarantine, quarantine_path)


@cost.command()
@common
def roi(usage: tuple[str, ...], prices: str | None, inventory: str | None, config_path: str | None, date_: str | None, as_of: str | None, fmt: str, quarantine_path: str | None) -> None:
    """Measured savings, waste and recommendations for one UTC day."""
    from gpu_ops.cost.attribution import day_window
    from gpu_ops.cost.roi import roi_report

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


if __name__ == "__main__":  # python -m gpu_ops.cost.cli
    cost(sys.argv[1:])
