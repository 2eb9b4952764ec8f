"""Tables the alerts flow reads and writes, through TableStore. No Dagster.

- reads ``gpu_budget_status`` (newest partition) and ``gpu_cost_attribution`` (top
  spenders), both written by the cost assets;
- writes ``gpu_alert_deliveries``: one row per channel per delivery attempt of the alert
  op. A ``delivered`` row is written right after the channel accepted the alert, so a
  retried op (or a re-executed run) skips that channel and sends only what failed;
- writes ``gpu_alert_dead_letters``: one row per alert the sensor stopped requesting
  after ``alerts.max_pending_s`` (what was and was not delivered, and why).
"""

from __future__ import annotations

import datetime as dt

import pandas as pd
import sqlalchemy as sa

from gpu_ops.flows.alerts.channels import DeliveryResult
from gpu_ops.domain.alerts.model import Alert
from gpu_ops.domain.alerts.redelivery import DeadLetter
from gpu_ops.domain.alerts.state import STATUS_COLUMNS, STATUS_TABLE, StatusTable
from gpu_ops.flows.cost.attribution import key_column
from gpu_ops.storage.tables import PARTITION_COLUMN, TableStore

ATTRIBUTION_TABLE = "gpu_cost_attribution"
DELIVERIES_TABLE = "gpu_alert_deliveries"
DEAD_LETTERS_TABLE = "gpu_alert_dead_letters"


def latest_status_partition(store: TableStore) -> str | None:
    if not store.has_table(STATUS_TABLE):
        return None
    with store.engine.connect() as conn:
        return conn.execute(sa.text(f'SELECT MAX("{PARTITION_COLUMN}") FROM "{STATUS_TABLE}"')).scalar()


_REQUIRED = {"budget", "period_start", "period_end", "amount_usd", "spend_usd", "percent_used"}


def read_latest_status(store: TableStore) -> tuple[str | None, StatusTable]:
    """The newest partition's rows: each budget's most recent view of its period.

    Reads only the contract's columns as plain tuples: going through a DataFrame (and
    decoding the JSON ``thresholds_crossed`` of every row) would be most of a tick's time
    with 10,000 budgets.
    """
    partition = latest_status_partition(store)
    if partition is None:
        return None, StatusTable([])
    with store.engine.connect() as conn:
        table = sa.Table(STATUS_TABLE, sa.MetaData(), autoload_with=conn)
        missing = _REQUIRED - set(table.c.keys())
        if missing:
            raise ValueError(f"table {STATUS_TABLE} lacks the columns {sorted(missing)} of the budget status contract")
        # Plain SQL text: the driver's values as they are (ISO strings or dates), without
        # SQLAlchemy's per-value type processing (a third of the read at 100,000 rows).
        cols = ", ".join(f'"{c}"' if c in table.c else f'NULL AS "{c}"' for c in STATUS_COLUMNS)
        result = conn.execute(sa.text(f'SELECT {cols} FROM "{STATUS_TABLE}" WHERE "{PARTITION_COLUMN}" = :p'), {"p": partition})
        rows = list(result.cursor.fetchall()) if result.cursor is not None else []
    return partition, StatusTable(rows)


def top_spenders(store: TableStore, alert: Alert, limit: int) -> list[tuple[str, float]]:
    """Largest spenders inside the budget's scope this period, by the grouping keys the
    scope does not fix (a team budget lists its projects)."""
    if limit <= 0 or not store.has_table(ATTRIBUTION_TABLE):
        return []
    start = dt.date.fromisoformat(alert.period_start)
    last = dt.date.fromisoformat(alert.period_end) - dt.timedelta(days=1)
    if alert.partition_key:
        last = min(last, dt.date.fromisoformat(alert.partition_key[:10]))
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range((last - start).days + 1)]
    df = store.read(ATTRIBUTION_TABLE, partition_keys=days)
    if df.empty or "cost_usd" not in df.columns:
        return []
    for key, value in alert.scope.items():
        column = key_column(key)
        if column not in df.columns:
            return []  # the attribution is not grouped by this scope key: cannot filter
        df = df[df[column].astype(str) == value]
    fixed = {key_column(k) for k in alert.scope}
    keys = [k for k in ("team", "project", "namespace", "cost_center", "experiment_id") if k in df.columns and k not in fixed]
    keys += [c for c in df.columns if c.startswith("label_") and c not in fixed]
    if not keys or df.empty:
        return []
    df = df[~df[keys[0]].astype(str).str.startswith("__")]  # not the __idle__ row
    sums = df.groupby(keys, dropna=False)["cost_usd"].sum().sort_values(ascending=False).head(limit)
    out = []
    for idx, cost in sums.items():
        idx = idx if isinstance(idx, tuple) else (idx,)
        out.append((", ".join(f"{k}={v}" for k, v in zip(keys, idx)), float(cost)))
    return out


def delivered_channels(store: TableStore, idempotency_key: str) -> set[str]:
    df = store.read(DELIVERIES_TABLE, where={"idempotency_key": idempotency_key, "status": "delivered"}, missing_ok=True)
    return set(df["channel"]) if not df.empty else set()


def record_delivery(store: TableStore, alert: Alert, result: DeliveryResult, *, run_id: str | None, at: dt.datetime | None = None) -> None:
    at = at or dt.datetime.now(dt.timezone.utc)
    row = pd.DataFrame(
        {
            "idempotency_key": [alert.idempotency_key],
            "run_key": [alert.run_key],
            "budget": [alert.budget],
            "period_start": [alert.period_start],
            "threshold": [alert.threshold],
            "kind": [alert.kind],
            "channel": [result.channel],
            "channel_type": [result.channel_type],
            "status": ["delivered" if result.ok else "failed"],
            "attempts": [int(result.attempts)],
            "detail": [result.detail],
            "run_id": [run_id or ""],
            "at": [pd.Timestamp(at)],
        }
    )
    store.append(DELIVERIES_TABLE, row)


def dead_letter_row(d: DeadLetter, alert: Alert | None, delivered: set[str], *, now: dt.datetime, last_run_id: str | None) -> dict[str, object]:
    """One ``gpu_alert_dead_letters`` row; ``alert`` is None when no run of it exists."""
    return {
        "alert": d.key,
        "budget": alert.budget if alert else d.key.split("/", 1)[0],
        "kind": alert.kind if alert else "",
        "threshold": alert.threshold if alert else "",
        "period_start": alert.period_start if alert else "",
        "idempotency_key": alert.idempotency_key if alert else "",
        "delivered": ", ".join(sorted(delivered)),
        "undelivered": ", ".join(c for c in alert.channels if c not in delivered) if alert else "",
        "requests": d.pending.n,
        "pending_since": dt.datetime.fromtimestamp(d.pending.first, dt.timezone.utc).isoformat(timespec="seconds"),
        "dead_lettered_at": now.astimezone(dt.timezone.utc).isoformat(timespec="seconds"),
        "reason": d.reason,
        "last_run_id": last_run_id or "",
    }


def record_dead_letters(store: TableStore, rows: list[dict[str, object]]) -> None:
    """Append the rows not recorded yet (a tick evaluated twice records once)."""
    if not rows:
        return
    known = store.read(DEAD_LETTERS_TABLE, missing_ok=True)
    seen = set(known["alert"]) if not known.empty else set()
    new = [r for r in rows if r["alert"] not in seen]
    if new:
        store.append(DEAD_LETTERS_TABLE, pd.DataFrame(new))


def recent_dead_letters(store: TableStore, *, since: dt.datetime) -> list[dict[str, object]]:
    df = store.read(DEAD_LETTERS_TABLE, missing_ok=True)
    if df.empty:
        return []
    df = df[df["dead_lettered_at"].astype(str) >= since.astimezone(dt.timezone.utc).isoformat(timespec="seconds")]
    return df.to_dict("records")
