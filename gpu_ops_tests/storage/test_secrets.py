"""Secrets stay secret: after a `gpu-ops demo` run on PostgreSQL with a storage
password and every channel secret set through environment variables to unique markers,
no marker is found anywhere the run leaves text behind: the Dagster instance (runs,
event logs, schedules, snapshots, compute logs under DAGSTER_HOME), everything under
the gpu_ops home, the cost tables in the database, and the process's own output.

The run covers the demo's first 5 days (``usage.partitions_end``), not its month, with a
shorter training run and the nlp budget lowered so that two of its thresholds cross by
the fifth day: every stage runs (training with a preemption, daily cost partitions, the
budget sensor and two alerts to every channel) in a fraction of the whole month's time
(``test_demo`` runs that, on SQLite).

The receivers on 127.0.0.1 prove every secret was really used (resolved at the moment of
delivery) while none was stored.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from gpu_ops.domain.alerts.messages import SIGNATURE_HEADER
from gpu_ops.domain.config import ConfigError, parse_config
from gpu_ops_tests.alerts.conftest import Receiver

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "gpu_ops" / "demo"
DEMO_END = "2026-10-05"
NLP_AMOUNT_USD = 5500  # the demo's nlp spends about $3,000 by 10-05: actual-50pct and forecast-120pct cross that day


def _marker(what: str) -> str:
    return f"SECRET{what}{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- the config model


PRICES = {"currency": "USD", "source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"on-demand": 0.53}}}


def storage_config(storage: dict) -> object:
    return parse_config({"storage": storage, "prices": PRICES}, Path("/etc/gpu_ops.yaml"))


def test_a_literal_password_in_the_storage_url_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as err:
        storage_config({"url": "postgresql://gpu_ops:hunter2@db/costs"})
    assert "/etc/gpu_ops.yaml: storage.url: holds a literal password" in str(err.value)
    assert "hunter2" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        storage_config({"url": "postgresql://gpu_ops@db/costs", "password": "hunter2"})
    assert "storage.password: must be {env: NAME}" in str(err.value) and "hunter2" not in str(err.value)


def test_the_password_comes_from_the_environment_and_only_the_reference_is_kept(monkeypatch):
    monkeypatch.setenv("DB_PW", "p@ss/wörd:1")
    inline = storage_config({"url": "postgresql://gpu_ops:{env: DB_PW}@db:5432/costs"}).storage
    field = storage_config({"url": "postgresql://gpu_ops@db:5432/costs", "password": {"env": "DB_PW"}}).storage
    for storage in (inline, field):
        assert storage.url_template() == "postgresql://gpu_ops:{env: DB_PW}@db:5432/costs"
        assert storage.resolved_url() == "postgresql://gpu_ops:p%40ss%2Fw%C3%B6rd%3A1@db:5432/costs"
        assert sa.engine.make_url(storage.resolved_url()).password == "p@ss/wörd:1"
    monkeypatch.delenv("DB_PW")
    with pytest.raises(ConfigError, match="environment variable DB_PW is not set"):
        field.resolved_url()


# --------------------------------------------------------------------------- a full demo run


@pytest.fixture
def secret_role(pg_url):
    """A login role with a password that owns the test database (trust auth ignores the
    password, but gpu_ops handles it exactly as it would a real one)."""
    role = f"gpu_ops_{uuid.uuid4().hex[:8]}"
    database = pg_url.rsplit("/", 1)[1]
    admin = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://", 1), isolation_level="AUTOCOMMIT")
    password = _marker("DB")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        conn.execute(sa.text(f'ALTER DATABASE "{database}" OWNER TO {role}'))
        conn.execute(sa.text(f"ALTER SCHEMA public OWNER TO {role}"))
    try:
        yield role, password, pg_url
    finally:
        from gpu_ops.storage.tables import TableStore

        TableStore.dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role})
            conn.execute(sa.text("ALTER SCHEMA public OWNER TO postgres"))
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f'ALTER DATABASE "{database}" OWNER TO postgres'))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


def demo_config(tmp_path: Path, role: str, pg_url: str, receiver_url: str, smtp_port: int) -> Path:
    cfg = yaml.safe_load((DEMO / "gpu_ops.yaml").read_text())
    host_db = pg_url.split("@", 1)[1]
    cfg["storage"] = {"url": f"postgresql://{role}@{host_db}", "password": {"env": "GPU_OPS_DB_PASSWORD"}}
    cfg["prices"] = str(DEMO / "prices.yaml")
    cfg["usage"]["sources"] = [{"type": "ledger"}, {"type": "file", "path": str(DEMO / "usage" / "*.csv")}]
    cfg["usage"]["inventory"]["path"] = str(DEMO / "inventory.csv")
    cfg["usage"]["partitions_end"] = DEMO_END
    cfg["training"].update(demo_steps=2000, demo_checkpoint_interval_s=0.5)  # killed 2 s after its first checkpoint, as in the demo: 600 steps could end first on a quiet machine
    cfg["channels"] = {
        "log": {"type": "log"},
        "slack": {"type": "slack", "webhook_url": {"env": "SLACK_WEBHOOK_URL"}},
        "oncall": {"type": "pagerduty", "routing_key": {"env": "PD_ROUTING_KEY"}, "events_url": f"{receiver_url}/v2/enqueue"},
        "audit": {
            "type": "webhook",
            "url": {"env": "HOOK_URL"},
            "secret": {"env": "HOOK_SECRET"},
            "headers": {"Authorization": {"env": "HOOK_AUTHORIZATION"}},
        },
        "finance": {
            "type": "email",
            "to": ["finops@example.com"],
            "smtp": {"host": "127.0.0.1", "port": smtp_port, "username": "gpu-ops", "password": {"env": "SMTP_PASSWORD"}, "starttls": "never"},
        },
    }
    for budget in cfg["budgets"]:
        budget["channels"] = list(cfg["channels"])
        if budget["name"] == "nlp-monthly":
            budget["amount_usd"] = NLP_AMOUNT_USD
    cfg["alerts"] = {"delivery_attempts": 2, "delivery_backoff_s": 0.1, "delivery_timeout_s": 5}
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def smtp_with_auth():
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    from gpu_ops.flows.compute.local import free_port

    logins: list[tuple[bytes, bytes]] = []

    class Inbox:
        messages: list[bytes] = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            self.messages.append(envelope.content)
            return "250 OK"

    def authenticate(server, session, envelope, mechanism, auth_data):
        logins.append((auth_data.login, auth_data.password))
        return AuthResult(success=True)

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), authenticator=authenticate, auth_require_tls=False)
    controller.start()
    yield controller.port, inbox, logins
    controller.stop()


def _texts_under(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _database_text(pg_url: str) -> str:
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    parts = []
    with engine.connect() as conn:
        tables = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        for table in tables:
            parts += conn.execute(sa.text(f'SELECT t::text FROM "{table}" t')).scalars().all()
    engine.dispose()
    assert tables, "the demo wrote no table"
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.postgres
def test_no_secret_is_left_anywhere_after_a_demo_run(tmp_path, secret_role, smtp_with_auth):
    role, db_password, pg_url = secret_role
    smtp_port, inbox, logins = smtp_with_auth
    hooks = Receiver().start()
    try:
        _run_and_grep(tmp_path, role, db_password, pg_url, hooks, smtp_port, inbox, logins)
    finally:
        hooks.stop()


def _run_and_grep(tmp_path, role, db_password, pg_url, hooks, smtp_port, inbox, logins) -> None:
    markers = {
        "GPU_OPS_DB_PASSWORD": db_password,
        "SLACK_WEBHOOK_URL": f"{hooks.url}/services/{_marker('SLACK')}",
        "PD_ROUTING_KEY": _marker("PD"),
        "HOOK_URL": f"{hooks.url}/hook/{_marker('HOOKURL')}",
        "HOOK_SECRET": _marker("HOOKSIGN"),
        "HOOK_AUTHORIZATION": f"Bearer {_marker('AUTH')}",
        "SMTP_PASSWORD": _marker("SMTP"),
    }
    # What must never be found: each marker, and the secret part of each URL.
    needles = {name: value.rsplit("/", 1)[-1].removeprefix("Bearer ") for name, value in markers.items()}
    home = tmp_path / "home"
    config = demo_config(tmp_path, role, pg_url, hooks.url, smtp_port)
    env = {**os.environ, **markers, "GPU_OPS_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home")}
    env.pop("GPU_OPS_CONFIG", None)
    out = subprocess.run(
        [sys.executable, "-m", "gpu_ops.cli", "demo", "--config", str(config)], capture_output=True, text=True, env=env, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"5 daily cost partitions (2026-10-01 … {DEMO_END})" in out.stdout and out.stdout.count(" — sent") == 2, out.stdout[-3000:]
    assert "2 attempt(s), 1 preemption(s)" in out.stdout, out.stdout[-3000:]  # the training stage ran through its preemption

    # Every secret was used: the receivers saw them.
    paths = [r.path for r in hooks.requests]
    assert any(needles["SLACK_WEBHOOK_URL"] in p for p in paths), paths
    assert any(needles["HOOK_URL"] in p for p in paths), paths
    assert any(needles["PD_ROUTING_KEY"].encode() in r.body for r in hooks.requests)
    assert any(r.headers.get("Authorization") == markers["HOOK_AUTHORIZATION"] for r in hooks.requests)
    assert any(SIGNATURE_HEADER.lower() in {k.lower() for k in r.headers} for r in hooks.requests)
    assert inbox.messages and logins and logins[0][1] == markers["SMTP_PASSWORD"].encode()

    # ... and none was kept.
    files = _texts_under(home)
    assert any(p.name == "runs.db" for p in files) and any("event" in p.name or p.suffix == ".db" for p in files)
    haystacks = {str(p): data for p, data in files.items()}
    haystacks["demo stdout/stderr"] = (out.stdout + out.stderr).encode()
    haystacks["gpu_ops tables in PostgreSQL"] = _database_text(pg_url).encode()
    found = [(name, where) for name, needle in needles.items() for where, data in haystacks.items() if needle.encode() in data]
    assert found == [], found
    # The configuration itself holds only variable names.
    assert not any(n in config.read_text() for n in needles.values())
