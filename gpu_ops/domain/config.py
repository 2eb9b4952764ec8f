"""The `GPU_OPS_CONFIG` file: typed models, loading and error reporting.

One YAML file configures storage, prices, usage sources, budgets, channels, compute and
training. Relative paths resolve against the file's folder. Every validation error names
the file and the field path (``budgets[2].thresholds[0].percent: must be > 0``) and all
mistakes are reported together, at definitions load time.

Secrets are written ``{env: NAME}`` and stay references: :class:`SecretRef` resolves at
the moment of use and never renders its value in ``repr``, logs or metadata.

This module is pure (pydantic + PyYAML); it must not import Dagster, torch or kubetorch.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote, urlsplit
from typing import Annotated, Any, Literal, Union


from gpu_ops.domain.memory import collection_deferred
from gpu_ops.domain.compute.catalog import PRICE_CHECK_CURRENCIES, UnknownGpuType, canonical_gpu_type, price_problem
from gpu_ops.domain.fastyaml import YamlFileError, read_yaml_file
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from gpu_ops.domain.cost.columns import DEFAULT_LABEL_KEYS, GROUPING_KEYS, check_group_by
from gpu_ops.domain.compute.request import LabelKey, NamespaceName, ObjectName
from gpu_ops.domain.cost.rules import FIRST_DAY
from gpu_ops.errors import ConfigError
from gpu_ops.domain.paths import PathNotUsable, path_kind

CONFIG_ENV = "GPU_OPS_CONFIG"
HOME_ENV = "GPU_OPS_HOME"
DAGSTER_HOME_ENV = "DAGSTER_HOME"
# The demo's configuration (`gpu-ops demo`, `make run`, `make dev` name it): its usage files,
# budgets and simulated GPU pricing are the demo's, never a default.
DEMO_CONFIG = Path(__file__).parents[1] / "demo" / "gpu_ops.yaml"
# The bundled list prices: reference data, the price table of the plain defaults.
BUNDLED_PRICES = DEMO_CONFIG.parent / "prices.yaml"

_log = logging.getLogger("gpu_ops")

CapacityType = Literal["spot", "on-demand", "reserved"]
SharingMode = Literal["none", "mig", "mps", "timeslice"]


# A finite number above zero (YAML's .inf and .nan are refused: pydantic's PositiveFloat
# takes .inf): a price, multiplier, amount or threshold of .inf never crosses, a timeout or
# interval of .inf never ends.
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# The longest timeout a database driver holds: 2**31 - 1 milliseconds, in whole seconds.
_DRIVER_SECONDS = 2_147_483


def _named_keys(what: str, example: str) -> AfterValidator:
    """A mapping's keys each name a ``what`` (a key '' or ' ' matches nothing)."""

    def check(mapping: dict[str, Any]) -> dict[str, Any]:
        unnamed = [k for k in mapping if not k.strip()]
        if unnamed:
            raise ValueError(f"each key must be a {what}'s name (e.g. {example}), not " + ", ".join(f"{k!r}" for k in unnamed))
        return mapping

    return AfterValidator(check)


def _named(what: str) -> AfterValidator:
    """A text setting that is not blank ('' would mean the working directory, or nothing)."""

    def check(value: str) -> str:
        if not value.strip():
            raise ValueError(f"must name {what} (or leave the setting out)")
        return value

    return AfterValidator(check)


def is_http_url(value: str) -> bool:
    """Whether ``value`` is an http(s) URL with a host (and a port, if any, that is one):
    what every HTTP call of gpu_ops sends to."""
    try:
        parts = urlsplit(value)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # an unclosed [IPv6 host, a port past 65535 or not a number
        return False


def _http_url(value: str) -> str:
    if not is_http_url(value):
        raise ValueError(f"{value!r} is not an http(s) URL (e.g. https://dagster.example.com)")
    return value


def _http_url_unshown(value: Any) -> Any:
    """A URL setting that may hold a token (a Slack webhook's path is one): when written in
    the file, an http(s) URL; the value is never repeated. One from the environment is
    read by `gpu-ops validate` (the channels check) and when a message is sent."""
    text = value.get() if isinstance(value, LiteralSecret) else value if isinstance(value, str) else None
    if text is not None and not is_http_url(text):
        raise ValueError("not an http(s) URL (e.g. https://hooks.example.com/...; the value is not shown: it may hold a token)")
    return value


# What a storage URL may start with: the backends gpu_ops.storage.tables opens (SQLite,
# PostgreSQL), with or without a driver (sqlite+pysqlite://, postgresql+psycopg2://).
_STORAGE_URL = re.compile(r"^(sqlite|postgresql)(\+[a-z0-9_]+)?://")


def storage_backend(url: str) -> str | None:
    """``"sqlite"`` or ``"postgresql"``: the backend a storage URL names, None for any other
    URL. The one rule for the literal setting and for a URL from the environment (the store)."""
    m = _STORAGE_URL.match(url)
    return m.group(1) if m else None
# Karpenter's duration format (consolidateAfter): 30s, 10m, 1h30m, or Never.
KARPENTER_DURATION = r"^(([0-9]+(s|m|h))+|Never)$"


class _Model(BaseModel):
    # Typos are errors: an unknown key is far more often a misspelling than intent.
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- secrets


class SecretRef(_Model):
    """A secret read from the environment when used: ``{env: SLACK_WEBHOOK_URL}``."""

    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

    def get(self) -> str:
        value = os.environ.get(self.env)
        if not value:
            raise ConfigError([f"environment variable {self.env} is not set (it holds a secret)"])
        return value

    def is_set(self) -> bool:
        return bool(os.environ.get(self.env))

    def __repr__(self) -> str:  # never the value
        return f"SecretRef(env={self.env!r})"

    __str__ = __repr__


def _secret_from_literal(value: Any) -> Any:
    # A plain string is allowed for non-sensitive endpoints (a webhook URL in a test
    # config); it is wrapped so that it is still redacted everywhere.
    if isinstance(value, str):
        return {"literal": value}
    return value


class LiteralSecret(_Model):
    literal: str

    def get(self) -> str:
        return self.literal

    def is_set(self) -> bool:
        return bool(self.literal)

    def __repr__(self) -> str:
        return "LiteralSecret(<redacted>)"

    __str__ = __repr__


Secret = Annotated[Union[SecretRef, LiteralSecret], Field(union_mode="left_to_right")]


# --------------------------------------------------------------------------- storage


# ``{env: NAME}`` inside a storage URL: the password (or any part) read from the environment.
_ENV_IN_URL = re.compile(r"\{\s*env:\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}")
_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/?#]*)(?::(?P<password>[^@/?#]*))?@")


def resolve_storage_url(url: str) -> str:
    """Replace each ``{env: NAME}`` in ``url`` by that variable, percent-encoded.

    The template is what configuration, Dagster run config and logs carry; the resolved
    URL (with the password) exists only in memory, where a connection is opened.
    """
    def value(m: re.Match[str]) -> str:
        return quote(SecretRef(env=m.group(1)).get(), safe="")

    return _ENV_IN_URL.sub(value, url)


def _literal_password(url: str) -> bool:
    m = _USERINFO.match(url)
    password = m.group("password") if m else None
    return bool(password) and not _ENV_IN_URL.fullmatch(password or "")


class StorageConfig(_Model):
    """Where the cost tables live.

    ``url``: ``sqlite:///relative/path.db`` (against the config file's folder) or
    ``postgresql://user@host:5432/db``. A password is never written in the file: either
    ``password: {env: NAME}``, or ``{env: NAME}`` in the URL's password place
    (``"postgresql://gpu_ops:{env: GPU_OPS_DB_PASSWORD}@db/costs"``, quoted in YAML), or
    the whole URL from the environment (``url: {env: GPU_OPS_STORAGE_URL}``).
    """

    url: Union[SecretRef, str] = "sqlite:///costs.db"
    password: SecretRef | None = None
    # At most 2,147,483 s (24.8 days) each: the drivers hold them as 32-bit milliseconds
    # (PostgreSQL's statement_timeout, SQLite's busy_timeout) or seconds.
    connect_timeout_s: Annotated[PositiveFinite, Field(le=_DRIVER_SECONDS)] = 10.0
    # PostgreSQL: the server cancels any statement running longer. SQLite: how long a
    # writer waits for another writer's lock on the file.
    statement_timeout_s: Annotated[PositiveFinite, Field(le=_DRIVER_SECONDS)] = 300.0
    # Row-level usage (gpu_usage) as Parquet files under this folder, one per day, with
    # the aggregates in SQL; relative folders resolve against the config file's folder.
    # Every run worker must see the same folder (in Kubernetes, a ReadWriteMany volume).
    # Unset: a SQL table like the rest. See README, "Row-level storage".
    row_level_path: Annotated[str, _named("a folder")] | None = None

    @field_validator("url")
    @classmethod
    def _no_literal_password(cls, url: Any) -> Any:
        if isinstance(url, str) and storage_backend(url) is None:
            raise ValueError("must be sqlite:///<file> or postgresql://<user>@<host>/<database>")
        if isinstance(url, str) and _literal_password(url):
            raise ValueError(
                "holds a literal password, which would end up in Dagster's run storage; write "
                '"postgresql://user:{env: NAME}@host/db" or set storage.password: {env: NAME}'
            )
        return url

    @field_validator("password", mode="before")
    @classmethod
    def _password_is_a_reference(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("must be {env: NAME} (the variable holding the password), never the password itself")
        return value

    @model_validator(mode="after")
    def _one_password(self) -> "StorageConfig":
        if self.password is not None:
            if not isinstance(self.url, str) or not _USERINFO.match(self.url):
                raise ValueError("storage.password needs storage.url written as scheme://user@host/db (a user to go with it)")
            if _USERINFO.match(self.url).group("password") is not None:  # type: ignore[union-attr]
                raise ValueError("storage.password is set and storage.url has a password too; keep one")
        return self

    def url_template(self) -> Union[SecretRef, str]:
        """The URL without any secret value: ``{env: NAME}`` where the password goes."""
        if self.password is None or not isinstance(self.url, str):
            return self.url
        m = _USERINFO.match(self.url)
        assert m is not None
        return f"{m.group('scheme')}{m.group('user')}:{{env: {self.password.env}}}@{self.url[m.end():]}"

    def resolved_url(self) -> str:
        template = self.url_template()
        return template.get() if isinstance(template, SecretRef) else resolve_storage_url(template)


# --------------------------------------------------------------------------- prices


class RegionAdjustment(_Model):
    multiplier: PositiveFinite = 1.0


def _canonical_gpu_key(name: str) -> str:
    return canonical_gpu_type(name)  # UnknownGpuType is a ValueError: reported per key


GpuTypeName = Annotated[str, AfterValidator(_canonical_gpu_key)]


class PriceTable(_Model):
    """Per-GPU-hour prices (never per instance) by canonical gpu type and capacity.

    Each price must be finite and above zero, and is held against the GPU catalog: a
    price above the GPU's usual per-GPU range (a whole-instance price in the per-GPU
    field, the seed designs' 8x error) is refused, naming the per-GPU figure it probably
    meant, unless the GPU's entry says ``deliberate: true``
    (``h100: {on-demand: 98.32, deliberate: true}``). Checked for USD, EUR, GBP and CHF.
    """

    currency: str = "USD"
    source: str
    as_of: dt.date
    gpus: dict[GpuTypeName, Annotated[dict[CapacityType, PositiveFinite], Field(min_length=1)]]
    regions: dict[str, RegionAdjustment] = {}
    # GPUs whose prices are outside the usual range on purpose (from `deliberate: true`
    # in their entry, the documented spelling; a dumped table lists them here).
    deliberate: frozenset[GpuTypeName] = frozenset()
    # Attribute the billed effective cost (usage.billing) per GPU-hour of each node
    # instead of these list prices; list prices still give the on-demand equivalent.
    from_bill: bool = False

    def per_gpu_hour(self, gpu_type: str, capacity_type: str) -> float | None:
        """The list price of a GPU-hour of ``gpu_type`` on ``capacity_type``; None when unpriced."""
        return self.gpus.get(gpu_type, {}).get(capacity_type)  # type: ignore[call-overload]

    @model_validator(mode="before")
    @classmethod
    def _entries(cls, data: Any) -> Any:
        """One name per GPU; ``deliberate: true`` moves from the GPU's entry to :attr:`deliberate`."""
        if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), Mapping):
            return data
        seen: dict[str, str] = {}
        gpus, deliberate = {}, set(data.get("deliberate") or ())  # a dumped table lists them here
        for name, entry in data["gpus"].items():
            if isinstance(entry, Mapping) and "deliberate" in entry:
                flag = entry["deliberate"]
                if not isinstance(flag, bool):
                    raise ValueError(f"gpus.{name}.deliberate: must be true or false, got {flag!r}")
                entry = {k: v for k, v in entry.items() if k != "deliberate"}
                if flag:
                    deliberate.add(name)
            gpus[name] = entry
            try:
                canonical = canonical_gpu_type(name)
            except UnknownGpuType:
                continue  # reported against the key itself
            if canonical in seen:
                raise ValueError(f"gpus: {name!r} and {seen[canonical]!r} both name {canonical!r}")
            seen[canonical] = name
        return {**data, "gpus": gpus, "deliberate": sorted(deliberate)}

    @model_validator(mode="after")
    def _plausible(self) -> "PriceTable":
        """Each price against the catalog's usual per-GPU range (whole-instance prices named)."""
        if self.currency.upper() not in PRICE_CHECK_CURRENCIES:
            return self
        errors = [
            InitErrorDetails(type=PydanticCustomError("implausible_price", "{problem}", {"problem": problem}), loc=("gpus", gpu, capacity), input=price)
            for gpu, prices in self.gpus.items()
            if gpu not in self.deliberate
            for capacity, price in prices.items()
            if (problem := price_problem(gpu, capacity, price))
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


# --------------------------------------------------------------------------- usage


class LedgerSource(_Model):
    type: Literal["ledger"]


class FileSource(_Model):
    type: Literal["file"]
    path: str  # a glob; CSV or Parquet by extension; `{date}` = the partition's UTC day
    # Day files (`{date}`, `day=YYYY-MM-DD/` folders) hold the intervals that start that day:
    # a day also reads this many days before it (an interval crossing midnight); at most ten years.
    lookback_days: int = Field(default=1, ge=0, le=3650)


class KubernetesSource(_Model):
    type: Literal["kubernetes"]
    namespaces: list[NamespaceName] = []  # empty: all namespaces
    # attribution key (team, project, cost_center, experiment_id) -> the pod label that
    # holds it, in place of the default (gpu-ops.io/team, ...)
    label_keys: dict[str, LabelKey] = {}

    @field_validator("label_keys")
    @classmethod
    def _attribution_keys(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = [k for k in v if k not in DEFAULT_LABEL_KEYS]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} is not an attribution key (one of {', '.join(DEFAULT_LABEL_KEYS)})")
        return v


UsageSource = Annotated[Union[LedgerSource, FileSource, KubernetesSource], Field(discriminator="type")]


class InventoryConfig(_Model):
    type: Literal["file", "karpenter"]
    path: str | None = None

    @model_validator(mode="after")
    def _path_for_files(self) -> "InventoryConfig":
        if self.type == "file" and not self.path:
            raise ValueError("path is required when type is file")
        return self


class BasicAuth(_Model):
    username: str
    password: SecretRef


class PrometheusAuth(_Model):
    """``{bearer: {env: NAME}}`` or ``{basic: {username: u, password: {env: NAME}}}``."""

    bearer: SecretRef | None = None
    basic: BasicAuth | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "PrometheusAuth":
        if (self.bearer is None) == (self.basic is None):
            raise ValueError("give exactly one of bearer or basic")
        return self


class UtilizationConfig(_Model):
    """DCGM metrics (dcgm-exporter) read through the Prometheus HTTP API."""

    type: Literal["prometheus"]
    url: str
    auth: PrometheusAuth | None = None
    step: str = "60s"  # range-query step; each point averages the samples of its step
    # How often Prometheus scrapes dcgm-exporter (its ServiceMonitor's interval): a step
    # shorter than this leaves most steps without a sample, so it is refused.
    scrape_interval: str = "15s"
    # A total deadline per query (connect to the answer's last byte), not per read.
    timeout_s: PositiveFinite = 30.0
    # At most this many bytes of one answer, and this many samples in it (the answer is
    # parsed as it streams in: memory follows the samples kept, not the bytes).
    max_response_bytes: PositiveInt = 268_435_456
    max_samples: PositiveInt = 2_000_000
    # Extra label matchers for every query, e.g. '{cluster="prod"}' -> 'cluster="prod"'.
    selector: str = ""

    @field_validator("step", "scrape_interval")
    @classmethod
    def _step(cls, value: str) -> str:
        if parse_duration(value).total_seconds() < 1:
            raise ValueError("must be at least 1s")
        return value

    @model_validator(mode="after")
    def _step_covers_a_scrape(self) -> "UtilizationConfig":
        if parse_duration(self.step) < parse_duration(self.scrape_interval):
            raise ValueError(
                f"step {self.step} is shorter than scrape_interval {self.scrape_interval}: most steps would hold no sample "
                f"and read as missing metrics; use a step of at least {self.scrape_interval}"
            )
        return self

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, url: str) -> str:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/]*@", url):
            raise ValueError("holds credentials; use auth: {basic: ...} or {bearer: {env: NAME}}")
        return url


class CurrencyRate(_Model):
    """An explicit, dated conversion of bill amounts into the prices' currency."""

    rate: PositiveFinite  # units of prices.currency for one unit of the bill's currency
    as_of: dt.date  # the day the rate was taken (shown with every converted figure)
    source: str = ""  # e.g. "ECB reference rate"


class BillingConfig(_Model):
    """The cloud bill: AWS CUR 2.0 export (Parquet or CSV files, a glob)."""

    type: Literal["aws_cur"]
    path: str
    tolerance_percent: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 2.0
    # Bill lines in another currency than prices.currency are converted only by a rate
    # given here (ISO 4217 code -> rate); without one they are quarantined, never summed.
    currency_rates: dict[str, CurrencyRate] = {}
    # Rows per batch when a CUR file is read (Parquet; CSV is read in blocks of
    # batch_rows × 64 bytes, at least 1 MiB): the memory of the one indexed read per file
    # follows this, not the size of the file.
    batch_rows: int = Field(default=16_384, gt=0)
    # Where the per-day index of each CUR file is kept (default: <GPU_OPS_HOME>/cur_index).
    index_path: str | None = None

    @field_validator("currency_rates")
    @classmethod
    def _codes(cls, rates: dict[str, CurrencyRate]) -> dict[str, CurrencyRate]:
        for code in rates:
            if not re.fullmatch(r"[A-Z]{3}", code):
                raise ValueError(f"{code!r} is not an ISO 4217 currency code (three capital letters, e.g. EUR)")
        return rates


class UsageConfig(_Model):
    sources: list[UsageSource] = [LedgerSource(type="ledger")]
    inventory: InventoryConfig | None = None
    utilization: UtilizationConfig | None = None
    billing: BillingConfig | None = None
    # How idle fleet cost is reported: an explicit __idle__ row, or shared by weight.
    idle: Literal["row", "share"] = "row"
    group_by: list[str] = ["team", "project"]
    # Deprecated, no effect (accepted so that existing files still load): every read goes
    # through the one DuckDB engine (gpu_ops.flows.cost.engine); there are no batches to size.
    batch_rows: int = Field(default=262_144, gt=0)
    engine: Literal["auto", "duckdb", "arrow"] = "auto"
    # First day of the daily cost partitions (UTC); the bundled demo's data starts here.
    partitions_start: dt.date = dt.date(2026, 10, 1)
    # Last day of the daily cost partitions (UTC); None (default): yesterday, growing each
    # day. A fixed data set (the bundled demo's October) ends here, so that the partitions
    # and their fill cover the days that have data (the Plots tab's axis still reaches
    # yesterday in Dagster 1.13.27: gpu_ops_tests/cost/test_plot_days.py).
    partitions_end: dt.date | None = None
    # Raw collector rows (gpu_usage_collected) that ended this many days ago are deleted;
    # the daily gpu_usage partitions are the durable record. None (default) keeps them all.
    collected_retention_days: int | None = Field(default=None, ge=1)
    # A backfill runs gpu_usage and gpu_cost_attribution for up to this many days per run
    # (each source read once per run); None: the whole range in one run.
    backfill_days_per_run: int | None = Field(default=7, ge=1)

    @field_validator("group_by")
    @classmethod
    def _known_keys(cls, keys: list[str]) -> list[str]:
        return check_group_by(keys)

    @model_validator(mode="after")
    def _partitions_in_order(self) -> "UsageConfig":
        if self.partitions_start < FIRST_DAY:
            raise ValueError(f"partitions_start: must be {FIRST_DAY} or later (the first day whose times can be held)")
        if self.partitions_end is not None and self.partitions_end < self.partitions_start:
            raise ValueError(f"partitions_end ({self.partitions_end}) is before partitions_start ({self.partitions_start})")
        return self

    def last_partition(self, today: dt.date) -> dt.date:
        """The last daily cost partition on ``today`` (UTC): yesterday, or ``partitions_end``."""
        yesterday = today - dt.timedelta(days=1)
        return yesterday if self.partitions_end is None else min(self.partitions_end, yesterday)


# --------------------------------------------------------------------------- budgets

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")


@lru_cache(maxsize=256)  # every budget's forecast_min_history, mostly the same few values
def parse_duration(value: str | int | float) -> dt.timedelta:
    """``90s``, ``60m``, ``2h``, ``1d``; a bare number is seconds."""
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif m := _DURATION.match(value):
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. 90s, 60m, 2h, 1d)")
    try:
        return dt.timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # past 999,999,999 days, or not a number
        raise ValueError(f"{value!r} is longer than a duration can be (use e.g. 90s, 60m, 2h, 1d)") from None


def _duration(value: str) -> str:
    parse_duration(value)
    return value


# A duration setting (90s, 60m, 2h, 1d), kept as written.
Duration = Annotated[str, AfterValidator(_duration)]


class BudgetScope(_Model):
    team: str | None = None
    project: str | None = None
    namespace: str | None = None
    cost_center: str | None = None
    labels: Annotated[dict[str, str], _named_keys("label", "{tier: gold}")] = Field(default_factory=dict)  # a factory: a {} default is deep-copied per budget

    @field_validator("labels", mode="before")
    @classmethod
    def _label_values_as_read(cls, labels: Any) -> Any:
        # YAML's unquoted true / 8 / 0.5: the text a label's value reads as (rules.label_value).
        if not isinstance(labels, Mapping):
            return labels
        return {k: json.dumps(v) if isinstance(v, (bool, int, float)) and math.isfinite(v) else v for k, v in labels.items()}

    def as_filters(self) -> dict[str, str]:
        """Grouping-key filters, labels as ``label:<name>``; empty means everything."""
        fields = self.__dict__  # not getattr: a key that is no field (experiment_id) would raise and be caught
        out = {k: v for k in GROUPING_KEYS if (v := fields.get(k)) is not None}
        out.update({f"label:{k}": v for k, v in self.labels.items()})
        return out


class Threshold(_Model):
    percent: PositiveFinite | None = None
    absolute_usd: PositiveFinite | None = None
    severity: Literal["info", "warning", "critical"] | None = None
    basis: Literal["actual", "forecast"] = "actual"

    @model_validator(mode="after")
    def _exactly_one_amount(self) -> "Threshold":
        if (self.percent is None) == (self.absolute_usd is None):
            raise ValueError("give exactly one of percent or absolute_usd")
        return self

    def amount_usd(self, budget_amount: float) -> float:
        if self.absolute_usd is not None:
            return self.absolute_usd
        assert self.percent is not None  # exactly one of the two (_exactly_one_amount)
        return budget_amount * self.percent / 100.0

    def key(self) -> str:
        """Stable identifier used in alert state and run keys: ``actual-80pct``."""
        amount = f"{self.percent:g}pct" if self.percent is not None else f"{self.absolute_usd:g}usd"
        return f"{self.basis}-{amount}"

    def effective_severity(self, budget_amount: float) -> str:
        if self.severity:
            return self.severity
        return "critical" if self.amount_usd(budget_amount) >= budget_amount else "warning"


class Enforcement(_Model):
    action: Literal["alert", "throttle", "block"] = "alert"
    grace_period: Duration = "0s"
    max_gpus: int | None = Field(default=None, ge=0)  # throttle: the NodePool's GPU limit
    spot_only: bool = False  # throttle: restrict the scope's pool to spot capacity
    zero_pool_limit: bool = False  # block: also set the pool's GPU limit to 0
    threshold_percent: PositiveFinite = 100.0  # enforce once spend crosses this share

    @model_validator(mode="after")
    def _throttle_needs_a_limit(self) -> "Enforcement":
        if self.action == "throttle" and self.max_gpus is None and not self.spot_only:
            raise ValueError("throttle needs max_gpus or spot_only: true")
        return self

    @property
    def grace(self) -> dt.timedelta:
        return parse_duration(self.grace_period)


class Budget(_Model):
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")]
    scope: BudgetScope = BudgetScope()
    period: Literal["monthly", "weekly", "daily"] = "monthly"
    # monthly: day of month 1-28; weekly: ISO weekday 1 (Monday) to 7; daily: ignored.
    reset_day: int = Field(default=1, ge=1, le=28)
    amount_usd: PositiveFinite
    thresholds: list[Threshold] = [Threshold(percent=80), Threshold(percent=100)]
    channels: list[str] = Field(default_factory=list)
    enforcement: Enforcement = Enforcement()
    notify_resolve: bool = True
    # No forecast until this much of the period has data (one hour says nothing).
    forecast_min_history: Duration = "3d"

    @model_validator(mode="after")
    def _weekly_reset_day(self) -> "Budget":
        if self.period == "weekly" and self.reset_day > 7:
            raise ValueError("reset_day for a weekly budget is an ISO weekday, 1 (Monday) to 7")
        return self


# --------------------------------------------------------------------------- channels


# A secret that is a URL: http(s) when written in the file (see _http_url_unshown).
UrlSecret = Annotated[Secret, AfterValidator(_http_url_unshown)]


class _ChannelModel(_Model):
    def secrets(self) -> dict[str, tuple[Secret, bool]]:
        """Every secret the channel reads, by field: (the secret, whether it is a URL)."""
        return {}


class SlackChannel(_ChannelModel):
    type: Literal["slack"]
    webhook_url: UrlSecret

    _wrap = field_validator("webhook_url", mode="before")(_secret_from_literal)

    def secrets(self) -> dict[str, tuple[Secret, bool]]:
        return {"webhook_url": (self.webhook_url, True)}


class PagerDutyChannel(_ChannelModel):
    type: Literal["pagerduty"]
    routing_key: Annotated[Secret, Field()]
    events_url: Annotated[str, AfterValidator(_http_url_unshown)] = "https://events.pagerduty.com/v2/enqueue"

    _wrap = field_validator("routing_key", mode="before")(_secret_from_literal)

    def secrets(self) -> dict[str, tuple[Secret, bool]]:
        return {"routing_key": (self.routing_key, False)}


class WebhookChannel(_ChannelModel):
    type: Literal["webhook"]
    url: UrlSecret
    secret: Annotated[Secret, Field()] | None = None
    # Extra request headers; a value may be {env: NAME} (e.g. Authorization: {env: HOOK_TOKEN}).
    headers: dict[str, Annotated[Secret, Field()]] = {}

    _wrap = field_validator("url", "secret", mode="before")(_secret_from_literal)

    @field_validator("headers", mode="before")
    @classmethod
    def _wrap_headers(cls, headers: Any) -> Any:
        return {k: _secret_from_literal(v) for k, v in headers.items()} if isinstance(headers, Mapping) else headers

    def secrets(self) -> dict[str, tuple[Secret, bool]]:
        out: dict[str, tuple[Secret, bool]] = {"url": (self.url, True), **{f"headers.{k}": (v, False) for k, v in self.headers.items()}}
        if self.secret is not None:
            out["secret"] = (self.secret, False)
        return out


class SmtpSettings(_Model):
    host: str = "localhost"
    port: PositiveInt = 25
    username: str | None = None
    password: Annotated[Secret, Field()] | None = None
    starttls: Literal["auto", "always", "never"] = "auto"
    timeout_s: PositiveFinite = 10.0
    ca_file: str | None = None  # CA bundle that signs the server's STARTTLS certificate

    _wrap = field_validator("password", mode="before")(_secret_from_literal)


class EmailChannel(_ChannelModel):
    type: Literal["email"]
    to: Annotated[list[str], Field(min_length=1)]
    sender: str = "gpu-ops@localhost"
    smtp: SmtpSettings = SmtpSettings()

    @field_validator("to")
    @classmethod
    def _addresses(cls, to: list[str]) -> list[str]:
        for addr in to:
            if not re.match(r"^[^@\s]+@[^@\s]+$", addr):
                raise ValueError(f"{addr!r} is not an e-mail address")
        return to

    def secrets(self) -> dict[str, tuple[Secret, bool]]:
        return {} if self.smtp.password is None else {"smtp.password": (self.smtp.password, False)}


class LogChannel(_ChannelModel):
    type: Literal["log"]


Channel = Annotated[
    Union[SlackChannel, PagerDutyChannel, WebhookChannel, EmailChannel, LogChannel],
    Field(discriminator="type"),
]


class AnomalyConfig(_Model):
    """Spend anomalies (``gpu_spend_anomalies``): each day's spend of a team, project and
    training asset against its trailing ``window_days`` (gpu_ops.flows.cost.anomaly)."""

    window_days: PositiveInt = 28
    # The same weekday's points the baseline needs; with fewer, all days of the window,
    # the band widened by fallback_widen; with fewer than min_points, no score.
    min_weekday_points: PositiveInt = 3
    min_points: PositiveInt = 4
    fallback_widen: PositiveFinite = 2.0
    # The band's floor: this fraction of the baseline (a flat series has no spread).
    relative_floor: PositiveFinite = 0.1
    # A day is anomalous from check_score (the asset check warns) when it is also at least
    # min_excess_usd over its baseline; from alert_score it goes to the budgets' channels.
    min_excess_usd: float = Field(default=25.0, ge=0)
    check_score: PositiveFinite = 3.5
    alert_score: PositiveFinite | None = 6.0


class AlertsConfig(_Model):
    # Links in notifications point here (the Dagster UI's base URL).
    dagster_url: Annotated[str, AfterValidator(_http_url)] = "http://localhost:3000"
    evaluation_interval_s: PositiveInt = 300
    # Delivery: tries per channel inside one attempt of the alert op (backoff doubles
    # from delivery_backoff_s), then the op's RetryPolicy retries the channels that
    # still failed, run_retries times, run_retry_delay_s apart (doubling).
    delivery_attempts: PositiveInt = 4
    delivery_backoff_s: PositiveFinite = 1.0
    # A total deadline per request (connect to the answer's last byte), not per read.
    delivery_timeout_s: PositiveFinite = 10.0
    # At most this much of a receiver's answer body is read (a 2xx body not at all).
    delivery_max_response_bytes: PositiveInt = 65_536
    run_retries: int = Field(default=3, ge=0)
    run_retry_delay_s: PositiveFinite = 60.0
    # Redelivery: an alert whose run failed stays pending; budget_alert_sensor requests
    # it again this often (a fresh run key, the same idempotency keys, delivered channels
    # skipped) until every channel delivered or max_pending_s has passed since its first
    # request; then it is dead-lettered (never silently dropped).
    redelivery_interval_s: PositiveInt = 300
    max_pending_s: PositiveInt = 259_200
    # At most this many alert runs (first requests and redeliveries) per sensor tick; the
    # rest wait in the sensor's cursor, oldest first, and go out on the next ticks (30 s
    # apart). Enforcement runs are never held back.
    max_runs_per_tick: PositiveInt = 500
    top_spenders: int = Field(default=5, ge=0)
    intraday: bool = True
    """Budgets within the hour: budget_alert_sensor's view of the current period adds what
    the newest ``gpu_budget_status`` partition has not counted yet (attempts settled in the
    usage ledger since its ``as_of``, and running attempts at their price), and evaluates on
    the tick after an attempt settles. ``false``: the daily partitions only."""
    anomalies: AnomalyConfig = AnomalyConfig()
    """Spend anomalies past ``alert_score`` are sent through the channels of every budget
    whose scope covers them (``alert_score: null``: only the asset check reports them)."""
    launch_forecast: Literal["estimate", "p90", "off"] = "estimate"
    """The forecast gate (see "Know the cost before the launch"): a ``gpu_asset`` launch whose
    estimate would carry a budget that blocks or throttles past its enforcement line is
    refused. ``estimate``: the median run's cost; ``p90``: the 90th percentile's (more
    cautious); ``off``: no forecast gate."""


# --------------------------------------------------------------------------- compute/training


class KarpenterConfig(_Model):
    manage_nodepools: bool = True
    manage_ec2nodeclass: bool = False
    node_class: str = "gpu-ops"  # EC2NodeClass name the NodePools reference
    node_role: str | None = None  # IAM role for a managed EC2NodeClass
    cluster_name: str | None = None  # for discovery tags in a managed EC2NodeClass
    consolidate_after: Annotated[str, Field(pattern=KARPENTER_DURATION)] = "10m"
    gpu_limit: PositiveInt = 64  # default nvidia.com/gpu limit of a generated pool
    # team: pools shared by a team (budget enforcement patches them); run: a pool per
    # run, deleted by its cleanup or the orphan sensor.
    pool_scope: Literal["team", "run"] = "team"


class KubetorchConfig(_Model):
    launch_timeout_s: PositiveInt = 900
    inactivity_ttl: Duration = "30m"
    image: str | None = None
    # The training pods' ServiceAccount (the chart creates gpu-ops-training-worker: `get`
    # on its node and pod, for preemption notices). None: Kubetorch's default.
    service_account: str | None = None


class QuotasConfig(_Model):
    """GPUs, not steps: at most this many GPUs held at once per team and per NodePool."""

    team: Annotated[dict[str, PositiveInt], _named_keys("team", "{nlp: 8}")] = {}
    pool: Annotated[dict[str, PositiveInt], _named_keys("NodePool", "{gpu-ops-nlp-h100-spot: 16}")] = {}


class AdmissionConfig(_Model):
    # A launch over quota waits (backoff_s, x1.5 each time, up to backoff_max_s) this
    # long, then fails; a lease not renewed for lease_ttl_s is reclaimed.
    wait_timeout_s: PositiveFinite = 3600.0
    lease_ttl_s: PositiveFinite = 60.0
    backoff_s: PositiveFinite = 2.0
    backoff_max_s: PositiveFinite = 30.0


class ComputeConfig(_Model):
    backend: Literal["local", "kubetorch"] = "local"
    namespace: NamespaceName = "default"
    priority_class: ObjectName | None = None
    cleanup: Literal["always", "on_exception", "never"] = "always"
    # Local backend: a standby worker (interpreter, warm imports, CUDA ready) takes over a retry.
    standby: bool = True
    # ... and exits when no attempt claimed it this long after its own attempt ended (or with the run).
    standby_idle_s: PositiveFinite = 600.0
    karpenter: KarpenterConfig = KarpenterConfig()
    kubetorch: KubetorchConfig = KubetorchConfig()
    orphan_grace: Duration = "1h"
    quotas: QuotasConfig = QuotasConfig()
    admission: AdmissionConfig = AdmissionConfig()


class TrainingConfig(_Model):
    # A folder or any fsspec URL (s3://, gs://, a PVC path); relative folders resolve
    # against GPU_OPS_HOME.
    checkpoint_url: Annotated[str, _named("a folder or URL")] = "checkpoints"
    keep_last: PositiveInt = 3
    # The demo asset train_demo_model: steps (7-20 ms each on two CPU cores, 20-60 s in
    # all), its fixed checkpoint interval, and the base backoff before a retry (tests
    # shrink all three).
    demo_steps: PositiveInt = 3000
    demo_checkpoint_interval_s: PositiveFinite = 3.0
    retry_backoff_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    # The ledger records and prices the hardware that ran: a CPU run is CPU, not a GPU.
    # A demo on a machine without a GPU may opt in to price CPU attempts as the
    # declared GPUs in the asset's metadata (said there); the ledger stays as run.
    simulate_gpu_pricing: bool = False
    # Telemetry of an attempt (its OpenTelemetry span, its MLflow record) is queued with its
    # bill and sent after it: one export (connect, send, read) ends at this deadline, and
    # the attempt waits for it at most this long; what was not sent is retried by the
    # orphaned-attempts sensor and `gpu-ops validate --settle-orphans`.
    telemetry_deadline_s: PositiveFinite = 1.0


# --------------------------------------------------------------------------- the file


class GpuOpsConfig(_Model):
    """The validated configuration file (``GPU_OPS_CONFIG``), as :func:`load_config`
    returns it: one field per section of the file (see the Configuration file page)."""

    storage: StorageConfig = StorageConfig()
    prices: PriceTable
    usage: UsageConfig = UsageConfig()
    budgets: list[Budget] = []
    channels: dict[str, Channel] = {}
    alerts: AlertsConfig = AlertsConfig()
    compute: ComputeConfig = ComputeConfig()
    training: TrainingConfig = TrainingConfig()
    # Not part of the file: where it was read from, for resolving relative paths.
    source_path: Path | None = Field(default=None, exclude=True)

    @property
    def base_dir(self) -> Path:
        return self.source_path.parent if self.source_path else Path.cwd()

    def resolve_path(self, path: str) -> Path:
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else self.base_dir / p

    def checkpoint_root(self, override: str | None = None) -> str:
        """The checkpoint URL (``training.checkpoint_url``, or ``override``: an asset's own).
        A relative folder resolves like a relative SQLite file: against
        :func:`relative_anchor` (the config file's folder; the demo's home for the demo's file)."""
        url = override or self.training.checkpoint_url
        if "://" in url:
            return url
        p = Path(url).expanduser()
        return str(p) if p.is_absolute() else str((relative_anchor(self.source_path) / p).resolve())

    def budget(self, name: str) -> Budget:
        for b in self.budgets:
            if b.name == name:
                return b
        raise KeyError(f"no budget named {name!r} (have: {', '.join(b.name for b in self.budgets) or 'none'})")


def gpu_ops_home() -> Path:
    """Where gpu_ops keeps what no configuration file places: the plain defaults' tables and
    checkpoints, standby records, CUR indexes. ``$GPU_OPS_HOME``; else ``$DAGSTER_HOME/gpu_ops``,
    beside the Dagster instance; else the user's data folder (``$XDG_DATA_HOME/gpu_ops``,
    ``~/.local/share/gpu_ops``; ``~/Library/Application Support/gpu_ops`` on macOS,
    ``%LOCALAPPDATA%\\gpu_ops`` on Windows). Never the working directory."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve()
    if os.environ.get(DAGSTER_HOME_ENV):
        return (Path(os.environ[DAGSTER_HOME_ENV]).expanduser() / "gpu_ops").resolve()
    return _user_data_dir().resolve()


def _user_data_dir() -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "gpu_ops"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "gpu_ops"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share") / "gpu_ops"


def demo_home() -> Path:
    """Where the demo configuration (:data:`DEMO_CONFIG`) keeps its tables, checkpoints and
    Dagster instance: ``$GPU_OPS_HOME``, else ``./.gpu_ops`` (in the repository root, where
    `make run` and `make dev` run; the repository's dagster.yaml keeps its instance there)."""
    return Path(os.environ.get(HOME_ENV) or Path.cwd() / ".gpu_ops").resolve()


def relative_anchor(source: Path | None) -> Path:
    """The folder a relative SQLite file or checkpoint folder of the configuration read from
    ``source`` resolves against: the file's folder; :func:`demo_home` for the demo's file (its
    own folder is the installed package); :func:`gpu_ops_home` without a file."""
    if source is None:
        return gpu_ops_home()
    return demo_home() if source.resolve() == DEMO_CONFIG.resolve() else source.parent


# --------------------------------------------------------------------------- loading


# Pydantic error types and how they read in a config error.
_FIXED_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "finite_number": "must be a finite number (not .inf or .nan)",
    "union_tag_not_found": "needs a 'type'",
}
_BOUND_SYMBOLS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _bound_message(sym: str, ctx: Mapping[str, Any]) -> str:
    bound = ctx[next(k for k in ("gt", "ge", "lt", "le") if k in ctx)]
    if isinstance(bound, (int, float)) and float(bound).is_integer():
        return f"must be {sym} {int(bound):,}"  # every digit: 2,147,483 (not 2.14748e+06)
    return f"must be {sym} {bound:g}" if isinstance(bound, float) else f"must be {sym} {bound}"


def _friendly(err: Mapping[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind in _FIXED_MESSAGES:
        return _FIXED_MESSAGES[kind]
    if kind in _BOUND_SYMBOLS:
        return _bound_message(_BOUND_SYMBOLS[kind], ctx)
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, got {err.get('input')!r}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "union_tag_invalid":
        return f"unknown type {ctx.get('tag')!r}: expected one of {ctx.get('expected_tags')}"
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    """Render a pydantic location as ``budgets[2].thresholds[0].percent``.

    Pydantic inserts the discriminator tag (``slack``) into locations of tagged unions
    and class names into others; walking the input data tells the real keys from those.
    """
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list):
            out += f"[{part}]"
            node = node[part] if part < len(node) else None
            continue
        if isinstance(node, Mapping) and part in node:
            out += f".{part}" if out else str(part)
            node = node[part]
            continue
        if part == "[key]":
            continue  # pydantic's marker for "the key itself was invalid"
        if isinstance(node, Mapping) and (node.get("type") == part or part in ("function-after", "literal", "SecretRef", "LiteralSecret")):
            continue  # a union tag, not a key
        if isinstance(node, Mapping) or node is None:
            out += f".{part}" if out else str(part)
            node = None
    return out or "(top level)"


def _read_yaml(path: Path, problems: list[str]) -> Any:
    try:
        return read_yaml_file(path)  # yaml.safe_load's answer, from libyaml's events (fastyaml)
    except YamlFileError as exc:
        problems.append(str(exc))
        return None


def describe_errors(exc: ValidationError, data: Any, label: str, prefix: str = "") -> list[str]:
    """One ``file: field.path: what is wrong`` line per error (the CLI's files use it too)."""
    lines = []
    for err in exc.errors():
        path = _field_path(tuple(err["loc"]), data)
        full = f"{prefix}{'' if path.startswith('[') else '.'}{path}" if prefix and path != "(top level)" else (prefix or path)
        lines.append(f"{label}: {full}: {_friendly(err)}")
    return lines


def _validate_section(model: Any, data: Any, label: str, prefix: str, problems: list[str]) -> Any:
    try:
        return model.model_validate(data) if hasattr(model, "model_validate") else model(data)
    except ValidationError as exc:
        problems.extend(describe_errors(exc, data, label, prefix))
        return None


def _share_repeated_parts(budgets: Any) -> Any:
    """A fleet's budgets repeat the same thresholds and enforcement thousands of times:
    each distinct one is validated once and its (frozen, immutable) model shared, which
    halves the validation of 10,000 budgets. A part that does not validate is left as it
    was, so the full validation reports it with its place in the file."""
    if not isinstance(budgets, list):
        return budgets
    cache: dict[Any, Any] = {}
    out = []
    for b in budgets:
        if isinstance(b, Mapping):
            b = dict(b)
            if isinstance(b.get("thresholds"), list):
                b["thresholds"] = [_validated_once(Threshold, t, cache) for t in b["thresholds"]]
            if "enforcement" in b:
                b["enforcement"] = _validated_once(Enforcement, b["enforcement"], cache)
        out.append(b)
    return out


def _validated_once(model: type[_Model], raw: Any, cache: dict[Any, Any]) -> Any:
    """Parts are the same when their keys and value *objects* are: the YAML loader builds
    each distinct scalar once, so a fleet's repeated ``{percent: 80}`` share their values,
    while ``1``, ``1.0`` and ``true`` (or any two objects) never meet. The cache keeps the
    first part of each key alive, so the ids stay theirs while it is used."""
    if not isinstance(raw, dict):
        return raw
    key = (model, tuple(raw), tuple(map(id, raw.values())))
    hit = cache.get(key)
    if hit is None:
        try:
            hit = cache[key] = (model.model_validate(raw), raw)
        except ValidationError:
            hit = cache[key] = (raw, raw)  # left for the full validation to report in place
    return hit[0]


def _load_prices(data: Mapping[str, Any], label: str, base: Path, problems: list[str]) -> tuple[Any, str, str]:
    """prices: a path to a YAML file (its own errors name that file) or inline.

    Returns the validated table (None when it has problems) and the label and prefix its errors use."""
    prices = data.get("prices")
    prices_label, prices_prefix = label, "prices"
    if isinstance(prices, str):
        prices_path = Path(os.path.expanduser(prices))
        prices_path = prices_path if prices_path.is_absolute() else base / prices_path
        prices_label, prices_prefix = str(prices_path), ""
        prices = _read_yaml(prices_path, problems)
        if prices is None and not problems:
            problems.append(f"{prices_path}: is empty")
    elif prices is None:
        problems.append(f"{label}: prices: is required (a path to a prices file, or the table inline)")
    price_table = None
    if prices is not None:
        price_table = _validate_section(PriceTable, prices, prices_label, prices_prefix, problems)
    return price_table, prices_label, prices_prefix


def _read_section_files(data: dict[str, Any], base: Path, problems: list[str]) -> None:
    """budgets and channels may also live in a file of their own: read them in place."""
    for section in ("budgets", "channels"):
        if isinstance(data.get(section), str):
            p = base / data[section]
            loaded = _read_yaml(p, problems)
            if isinstance(loaded, Mapping) and section in loaded:
                loaded = loaded[section]
            data[section] = loaded if loaded is not None else ([] if section == "budgets" else {})


def repeated_budget_names(budgets: Sequence[Budget], label: str) -> dict[int, str]:
    """Budget index -> a problem line, for each budget whose name an earlier one has (a
    budget's alert state and its rows are kept by name)."""
    first_index: dict[str, int] = {}
    return {
        i: f"{label}: budgets[{i}].name: {b.name!r} is used by another budget (budgets[{first_index[b.name]}])"
        for i, b in enumerate(budgets)
        if first_index.setdefault(b.name, i) != i
    }


def _check_budgets(cfg: GpuOpsConfig, label: str, problems: list[str]) -> None:
    """Budget names are unique and every channel a budget names is defined (in the budgets' order)."""
    repeated = repeated_budget_names(cfg.budgets, label)
    for i, b in enumerate(cfg.budgets):
        if i in repeated:
            problems.append(repeated[i])
        for j, ch in enumerate(b.channels):
            if ch not in cfg.channels:
                known = ", ".join(sorted(cfg.channels)) or "none defined"
                problems.append(f"{label}: budgets[{i}].channels[{j}]: no channel named {ch!r} (channels: {known})")


def _check_sources(cfg: GpuOpsConfig, label: str, base: Path, problems: list[str]) -> None:
    """A usage file named without wildcards must exist."""
    for i, src in enumerate(cfg.usage.sources):
        if not isinstance(src, FileSource) or any(c in src.path for c in "*?[{"):
            continue
        try:
            missing = path_kind(base / src.path) == "missing"
        except PathNotUsable as exc:
            problems.append(f"{label}: usage.sources[{i}].path: {base / src.path}: {exc}")
            continue
        if missing:
            problems.append(f"{label}: usage.sources[{i}].path: {base / src.path} does not exist")


def _check_from_bill(cfg: GpuOpsConfig, price_table: Any, prices_label: str, prices_prefix: str, problems: list[str]) -> None:
    """Prices taken from the bill need the bill and the inventory it pays for."""
    if price_table is not None and price_table.from_bill and (cfg.usage.billing is None or cfg.usage.inventory is None):
        problems.append(f"{prices_label}: {prices_prefix + '.' if prices_prefix else ''}from_bill: needs usage.billing (the bill) and usage.inventory (the nodes it pays for)")


def _anchor_storage_paths(cfg: GpuOpsConfig, source: Path | None) -> GpuOpsConfig:
    """A relative SQLite URL is anchored at :func:`relative_anchor` (the config file's folder);
    the row-level path is resolved like every other path."""
    url = cfg.storage.url
    if isinstance(url, str) and url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        rel = url[len("sqlite:///") :]
        if rel and rel != ":memory:":
            anchor = relative_anchor(source)
            cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"url": f"sqlite:///{(anchor / rel).resolve()}"})})
    if cfg.storage.row_level_path:
        cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"row_level_path": str(cfg.resolve_path(cfg.storage.row_level_path))})})
    return cfg


def parse_config(data: Any, source: Path | None) -> GpuOpsConfig:
    """Validate a parsed mapping; ``source`` names the file in errors and anchors paths."""
    label = str(source) if source else "<config>"
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ConfigError([f"{label}: the file must be a mapping of sections, got {type(data).__name__}"])
    data = dict(data)
    base = source.parent if source else Path.cwd()

    price_table, prices_label, prices_prefix = _load_prices(data, label, base, problems)
    _read_section_files(data, base, problems)

    # The rest is validated with a stand-in price table so that its problems are
    # reported together with the prices' own.
    rest = {k: v for k, v in data.items() if k != "prices"}
    if "budgets" in rest:
        rest["budgets"] = _share_repeated_parts(rest["budgets"])
    stand_in = {"source": "-", "as_of": "2000-01-01", "gpus": {}}
    cfg = _validate_section(GpuOpsConfig, {**rest, "prices": stand_in}, label, "", problems)

    if cfg is not None:
        _check_budgets(cfg, label, problems)
        _check_sources(cfg, label, base, problems)
        _check_from_bill(cfg, price_table, prices_label, prices_prefix, problems)

    if problems:
        raise ConfigError(problems)
    assert cfg is not None and price_table is not None
    cfg = cfg.model_copy(update={"prices": price_table, "source_path": source})
    return _anchor_storage_paths(cfg, source)


def load_config(path: str | os.PathLike[str] | None = None) -> GpuOpsConfig:
    """Load ``path``, else ``$GPU_OPS_CONFIG``, else the plain defaults (:func:`default_config`)."""
    named = path or os.environ.get(CONFIG_ENV)
    if not named:
        return default_config()
    chosen = Path(named).expanduser().resolve()
    try:
        stamp = chosen.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError([f"{chosen}: cannot be read: {exc.strerror or exc}"]) from None
    # The demo's file anchors its storage at demo_home() ($GPU_OPS_HOME or ./.gpu_ops): part of the key.
    return _load_cached(chosen, stamp, demo_home() if chosen == DEMO_CONFIG.resolve() else None)


@lru_cache(maxsize=16)
def _load_cached(path: Path, _stamp: int, _anchor: Path | None) -> GpuOpsConfig:
    problems: list[str] = []
    with collection_deferred():  # ~10 acyclic objects per budget: no collection midway
        data = _read_yaml(path, problems)
        if problems:
            raise ConfigError(problems)
        return parse_config(data if data is not None else {}, path)


def default_config() -> GpuOpsConfig:
    """The configuration when none is named: every section's defaults, the bundled list
    prices, and storage under :func:`gpu_ops_home` (``costs.db``, ``checkpoints/``). No usage
    files, budgets or simulated GPU pricing: those are the demo's (:data:`DEMO_CONFIG`). Said
    once per process (a warning on the ``gpu_ops`` logger), with where its tables are."""
    return _default_cached(gpu_ops_home(), BUNDLED_PRICES.stat().st_mtime_ns)


@lru_cache(maxsize=16)
def _default_cached(home: Path, _stamp: int) -> GpuOpsConfig:
    storage = f"sqlite:///{home / 'costs.db'}"
    config = parse_config({"storage": {"url": storage}, "prices": str(BUNDLED_PRICES), "training": {"checkpoint_url": str(home / "checkpoints")}}, None)
    _log.warning(
        f"gpu_ops: no configuration named ({CONFIG_ENV} is unset): the plain defaults, with the cost tables in {storage} "
        f"and checkpoints under {home / 'checkpoints'}; name a file in {CONFIG_ENV} to choose storage, prices and budgets"
    )
    return config
