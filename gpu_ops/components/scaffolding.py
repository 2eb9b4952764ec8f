"""What ``dg scaffold defs`` writes besides a component's ``defs.yaml``, so that a fresh
project loads and launches with no edits:

- one gpu_ops configuration for the whole project, ``<project root>/gpu_ops.yaml``
  (usage from the training ledger, the bundled prices, one budget alerting to the log),
  which every scaffolded component names with ``{{ context.project_root }}/gpu_ops.yaml``:
  the training ledger and the cost tables share one storage;
- the ``gpu_compute`` resource the training components need, once, as
  ``<defs folder>/gpu_compute.py`` (dg's documented ``@dg.definitions`` resources file),
  reading the same configuration; skipped when a file in the defs folder already
  provides ``gpu_compute``;
- one Dagster instance for the project, so that `dg launch` and `dg dev` show the same
  runs (without ``DAGSTER_HOME`` each makes a temporary one and removes it on exit):
  ``<project root>/.env`` names ``DAGSTER_HOME=<project root>/.gpu_ops/dagster_home``
  (absolute: Dagster refuses a relative one; both commands read the ``.env`` of the
  folder they run in, `dg dev` the project root's), and that folder gets a
  ``dagster.yaml`` with telemetry off unless it has one; when ``.env`` already names a
  ``DAGSTER_HOME``, that one is kept (its folder only created if missing).

Nothing here is imported when a code location loads: only by the scaffolders.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from dagster.components import ScaffoldRequest

from gpu_ops.domain.config import BUNDLED_PRICES

CONFIG_NAME = "gpu_ops.yaml"
# The project's Dagster instance (beside the cost tables and checkpoints of its gpu_ops.yaml).
INSTANCE_DIR = Path(".gpu_ops") / "dagster_home"
INSTANCE_SETTINGS = """\
# The Dagster instance of this project: `dg launch` and `dg dev` both use it, because the
# project's .env names this folder as DAGSTER_HOME (written by gpu_ops's `dg scaffold defs`).
# Telemetry off: no banner about it. Add storage, run queue or concurrency settings here.
telemetry:
  enabled: false
"""
# What a scaffolded defs.yaml says for config_file: the project's one configuration.
CONFIG_REF = "{{ context.project_root }}/" + CONFIG_NAME

CONFIG_TEMPLATE = """\
# gpu_ops configuration for this project (the GPU_OPS_CONFIG format; see the gpu_ops docs,
# reference/config). Written by `dg scaffold defs gpu_ops.components.*`; every gpu_ops
# component of the project and the gpu_compute resource read it, so the training ledger and
# the cost tables share one storage. Relative paths resolve against this file's folder.
storage: {url: "sqlite:///.gpu_ops/costs.db"}     # or postgresql://user@host/db with password: {env: NAME}
usage:
  sources:
    - {type: ledger}                       # GPU usage recorded by gpu_ops training runs
    # - {type: file, path: "exports/*.parquet"}
    # - {type: kubernetes, namespaces: [ml]}
  # The daily cost partitions start the day before this project was scaffolded (its ledger
  # has no earlier usage), so the per-day plots cover days that can have data; set the
  # first day of your data here when the sources include older files.
  partitions_start: "@PARTITIONS_START@"
budgets:
  - name: ml-monthly
    scope: {team: ml-platform}
    period: monthly
    amount_usd: 1000
    thresholds: [{percent: 80}, {percent: 100, severity: critical}]
    channels: [log]
channels:
  log: {type: log}
compute:
  backend: local                           # kubetorch on a cluster (see the docs, how-to/cluster)
training:
  checkpoint_url: .gpu_ops/checkpoints   # a folder, s3://, gs:// or a PVC mount
  # simulate_gpu_pricing: true           # on a CPU-only machine: price attempts as the declared GPUs (metadata only)
"""

RESOURCE_TEMPLATE = '''\
"""The `gpu_compute` resource that gpu_ops's training components need: where GPU work
runs (local subprocess workers with `compute.backend: local`, Kubetorch pods with
`kubetorch`). Written once by `dg scaffold defs gpu_ops.components.GpuTrainingComponent`;
it reads the project's gpu_ops.yaml, the configuration the components name."""

from pathlib import Path

import dagster as dg

from gpu_ops import GpuCompute

CONFIG = {config}


@dg.definitions
def gpu_compute() -> dg.Definitions:
    return dg.Definitions(resources={{"gpu_compute": GpuCompute(config_path=str(CONFIG))}})
'''

# A resource key `gpu_compute` given in Python: "gpu_compute": ... or gpu_compute=...
_PROVIDES = re.compile(r"""["']gpu_compute["']\s*:|\bgpu_compute\s*=\s*GpuCompute""")


def project_root(request: ScaffoldRequest) -> Path:
    """The dg project's root (where ``pyproject.toml`` is); the component's folder outside one."""
    return (request.project_root or request.target_path).resolve()


def ensure_project_instance(request: ScaffoldRequest) -> Path | None:
    """The project's ``DAGSTER_HOME``: the one ``<project root>/.env`` names, else
    ``<project root>/.gpu_ops/dagster_home``, named there and given a ``dagster.yaml``
    (telemetry off) unless it has one; the folder exists afterwards. None outside a dg project."""
    from dotenv import dotenv_values  # Dagster's own reader of .env files (python-dotenv)

    if request.project_root is None:
        return None
    root = project_root(request)
    env = root / ".env"
    named = dotenv_values(env).get("DAGSTER_HOME") if env.exists() else None
    if named:  # the project's own choice
        home = Path(named).expanduser()
        home.mkdir(parents=True, exist_ok=True)
        return home
    home = root / INSTANCE_DIR
    text = env.read_text() if env.exists() else ""
    line = f"# One Dagster instance for `dg launch` and `dg dev` (an absolute path: move the project, change it)\nDAGSTER_HOME={home}\n"
    env.write_text(text + ("\n" if text and not text.endswith("\n") else "") + line)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(INSTANCE_SETTINGS)
    return home


def ensure_project_config(request: ScaffoldRequest, today: dt.date | None = None) -> Path:
    """``<project root>/gpu_ops.yaml``, written with the bundled prices unless it exists, and
    the project's Dagster instance (:func:`ensure_project_instance`). Its partitions start
    the day before ``today`` (the UTC date when scaffolded, unless given)."""
    ensure_project_instance(request)
    path = project_root(request) / CONFIG_NAME
    if not path.exists():
        prices = BUNDLED_PRICES.read_text()
        start = (today or dt.datetime.now(dt.timezone.utc).date()) - dt.timedelta(days=1)
        config = CONFIG_TEMPLATE.replace("@PARTITIONS_START@", start.isoformat())
        path.write_text(config + "prices:\n" + "".join(f"  {line}\n" if line.strip() else "\n" for line in prices.splitlines()))
    return path


def config_ref(request: ScaffoldRequest) -> str:
    """What ``config_file`` says: the project's configuration through dg's template, or
    the file beside the component outside a dg project."""
    return CONFIG_REF if request.project_root else CONFIG_NAME


def defs_folder(target: Path) -> Path:
    """The nearest enclosing ``defs`` folder of a scaffolded component (else its parent)."""
    for parent in target.resolve().parents:
        if parent.name == "defs":
            return parent
    return target.resolve().parent


def ensure_gpu_compute_resource(request: ScaffoldRequest) -> Path | None:
    """Write ``<defs folder>/gpu_compute.py`` unless some Python file there already
    provides the ``gpu_compute`` resource; returns the file written, or None."""
    folder = defs_folder(request.target_path)
    for py in folder.rglob("*.py"):
        try:
            if _PROVIDES.search(py.read_text(errors="replace")):
                return None
        except OSError:
            continue
    target = folder / "gpu_compute.py"
    if target.exists():
        return None
    config = ensure_project_config(request)
    try:  # relative, so that the project can move: the project root is parents[n] of this file
        n = len(folder.relative_to(project_root(request)).parts)
        expr = f'Path(__file__).resolve().parents[{n}] / "{CONFIG_NAME}"'
    except ValueError:
        expr = f"Path({str(config)!r})"
    target.write_text(RESOURCE_TEMPLATE.format(config=expr))
    return target
