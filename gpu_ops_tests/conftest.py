"""Shared fixtures.

- ``pg_url``: a scratch PostgreSQL database on 127.0.0.1:5432, dropped afterwards. With no
  server the test skips, except under ``CI=true``, where a skip would hide a broken
  environment and is turned into a failure.
- ``karpenter_crds``: the real Karpenter v1 CRD schemas from ``../shared/reference``
  (same rule: skip without them, fail under CI).
- ``cluster`` tests run only when ``KUBECONFIG`` names a reachable cluster.
- ``gpu`` tests run only when torch sees a CUDA device.
- Each module's tests run on one pytest-xdist worker (see ``LONG_GROUPS``).
- Scratch files (``tmp_path``: Dagster instances, SQLite cost stores, demo homes, and
  ``TMPDIR`` for what tests and the processes they start put in ``tempfile`` folders) live on
  a RAM disk (``/dev/shm``) when there is one with room, unless ``--basetemp`` is given:
  Dagster's SQLite event log commits several times per event, and on this machine's disk
  a commit costs about 14× what it costs in RAM. The folder is removed when the session
  ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO.parent / "shared" / "reference" / "karpenter-crds"
PG_ADMIN_URL = os.environ.get("GPU_OPS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# pytest-xdist groups (`make test` runs --dist loadgroup): the tests of one module run on
# one worker, one after another, so that what a module builds once (the hostile corpus, a
# real Prometheus or MLflow server, reference weights) is built on one worker only; the
# demo's two modules (gpu_ops_tests/demo/) are one group, as they read one `gpu-ops demo`
# run. LONG_GROUPS, the longest units of work (measured: benchmarks/suite.py), are handed
# out first, so that none of them starts last and holds the run's end.
DEMO_GROUP = "gpu_ops_tests.demo"
LONG_GROUPS = (
    DEMO_GROUP,
    "gpu_ops_tests.training.test_process_deaths",
    "gpu_ops_tests.examples.test_examples",
    "gpu_ops_tests.hostile.test_corpus",
    "gpu_ops_tests.training.test_gpu_asset",
    "gpu_ops_tests.cost.test_assets",
    "gpu_ops_tests.examples.test_scaffold",
)


RAM_DISK = Path("/dev/shm")
RAM_DISK_ROOM = 8 << 30  # bytes free that the RAM disk must have to be used
_OWN_BASETEMP = pytest.StashKey[str]()
_OWN_TMPDIR = pytest.StashKey[str]()


def _ram_disk() -> Path | None:
    try:
        mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 2}
        room = os.statvfs(RAM_DISK)
    except OSError:
        return None
    usable = mounts.get(str(RAM_DISK)) == "tmpfs" and os.access(RAM_DISK, os.W_OK) and room.f_bavail * room.f_frsize >= RAM_DISK_ROOM
    return RAM_DISK if usable else None


CLOCK_DIR = Path(__file__).resolve().parent / "clock"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clock", default=None, metavar="ISO-TIME",
        help="run with every process's wall clock moved to start at this UTC time (it ticks on): proves tests read no date from the wall clock",
    )


def _travel(config: pytest.Config) -> None:
    """``--clock``: shift the wall clock of this process and, through ``clock/sitecustomize.py``
    on PYTHONPATH, of every Python process it starts (the offset is fixed once, by the
    controller, so that all of them agree)."""
    import datetime as dt

    target = config.getoption("clock")
    if not target or os.environ.get("GPU_OPS_TEST_CLOCK_OFFSET_S"):
        return
    when = dt.datetime.fromisoformat(target)
    when = when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
    import time

    os.environ["GPU_OPS_TEST_CLOCK_OFFSET_S"] = repr(when.timestamp() - time.time())
    os.environ["PYTHONPATH"] = os.pathsep.join([str(CLOCK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_ops_test_clock", CLOCK_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _read_migrations_once() -> None:
    """Each SQLite Dagster instance a test opens (``dg.instance_for_test()``, ephemeral
    instances, ``DagsterInstance.from_config``) checks and stamps its schema revision, and
    alembic builds its revision map again each time by executing Dagster's ~150 migration
    scripts: 0.18 of the 0.3 s of CPU an instance costs, measured. The scripts do not change
    during a run, so each folder's map is built once per test process; the check and the
    stamp still run against each instance's own database."""
    from alembic.script import ScriptDirectory

    built: dict[str, ScriptDirectory] = {}
    build = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]

    def from_config(cls, config):  # noqa: ANN001
        where = config.get_main_option("script_location")
        if where not in built:
            built[where] = build(cls, config)
        return built[where]

    ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _travel(config)
    _read_migrations_once()
    # Before pytest's own tmp_path set-up and before pytest-xdist starts its workers (which
    # get folders under this one); a worker keeps the folder its controller gave it.
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    disk = _ram_disk()
    if disk is not None:
        config.option.basetemp = tempfile.mkdtemp(prefix="gpu_ops_pytest-", dir=disk)
        config.stash[_OWN_BASETEMP] = config.option.basetemp
        # What is not under tmp_path goes there too: `dg.instance_for_test()` and
        # `DagsterInstance.ephemeral()` keep their SQLite storage in a `tempfile` folder, and
        # so do the run workers, code servers and CLIs the tests start (TMPDIR is inherited).
        # Beside the base folder, not in it: pytest empties the base folder when it first
        # hands out a tmp_path.
        scratch = tempfile.mkdtemp(prefix="gpu_ops_tmp-", dir=disk)
        config.stash[_OWN_TMPDIR] = scratch
        os.environ["TMPDIR"] = scratch
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_unconfigure(config: pytest.Config) -> None:
    for key in (_OWN_BASETEMP, _OWN_TMPDIR):
        if key in config.stash:
            shutil.rmtree(config.stash[key], ignore_errors=True)


def skip_or_fail(reason: str) -> None:
    """Skip locally; under CI=true a missing prerequisite is a failure, not a skip."""
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every test gets its own GPU_OPS_HOME and the bundled config unless it sets one.
    monkeypatch.setenv("GPU_OPS_HOME", str(tmp_path_factory.mktemp("gpu_ops_home")))
    monkeypatch.delenv("GPU_OPS_CONFIG", raising=False)


def _pg_admin_engine():
    import sqlalchemy as sa

    return sa.create_engine(PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_server() -> str:
    import sqlalchemy as sa

    try:
        engine = _pg_admin_engine()
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # no server here: skip (or fail under CI)
        skip_or_fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {str(exc).splitlines()[0]}")
    return PG_ADMIN_URL


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh database, dropped (connections terminated) after the test."""
    from gpu_ops.storage.scratch import scratch_database

    with scratch_database(pg_server, prefix="gpu_ops_test") as url:
        yield url


@pytest.fixture(scope="session")
def karpenter_crds() -> dict[str, dict]:
    """``kind -> openAPIV3Schema`` of the real Karpenter v1 CRDs."""
    import yaml

    if not CRD_DIR.is_dir():
        skip_or_fail(f"the Karpenter CRDs are not at {CRD_DIR}")
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schemas[kind] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers (its hook has no order)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kubeconfig = os.environ.get("KUBECONFIG")
    skip_cluster = pytest.mark.skip(reason="needs a live cluster: set KUBECONFIG (see docs/how-to/cluster.md, 'Tests against a cluster')")
    for item in items:
        if "cluster" in item.keywords and not (kubeconfig and Path(kubeconfig).exists()):
            item.add_marker(skip_cluster)
        if item.module is not None:
            # Session-scoped, not module-scoped, fixtures: a worker may run other modules'
            # tests between this one's, which would tear a module-scoped fixture down and
            # build it again (the corpus was built twice).
            name = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(DEMO_GROUP if name.startswith(DEMO_GROUP + ".") else name))
    # pyproject's --no-loadscope-reorder keeps this order (xdist's default puts the groups
    # with the most tests first, which left a long group of few tests for the end).
    first = {name: i for i, name in enumerate(LONG_GROUPS)}
    items.sort(key=lambda item: first.get(_group(item) or "", len(LONG_GROUPS)))


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker is not None and marker.args else None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture
def cuda() -> None:
    if not cuda_available():
        pytest.skip("no CUDA GPU on this machine (CI has none)")
