"""The public API: an explicit ``__all__`` that type checkers see, cheap to import, and one
exception base class."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys

import dagster as dg
import pytest

import gpu_ops
import gpu_ops.errors as errors
from gpu_ops_tests.conftest import REPO

HEAVY = ("dagster", "torch", "kubetorch", "pandas", "numpy", "sqlalchemy", "httpx", "kubernetes", "fsspec", "duckdb")


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the ``if TYPE_CHECKING:`` re-exports in gpu_ops/__init__.py."""
    tree = ast.parse((REPO / "gpu_ops" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    out = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export as `import X as X` so type checkers export it"
            out[alias.name] = node.module
    return out


def test_all_is_explicit_resolves_and_matches_the_static_re_exports():
    static = _type_checking_imports()
    assert sorted(gpu_ops.__all__) == sorted(static), "the TYPE_CHECKING imports and __all__ disagree"
    assert sorted(gpu_ops._EXPORTS) == sorted(static)
    for name in gpu_ops.__all__:
        value = getattr(gpu_ops, name)
        assert gpu_ops._EXPORTS[name] == static[name]
        assert getattr(importlib.import_module(static[name]), name) is value


def test_internals_are_not_public_and_the_documented_names_are():
    assert not {"LEDGER_COLUMNS", "LEDGER_TABLE", "price_window", "classify_report", "LocalBackend"} & set(gpu_ops.__all__)
    with pytest.raises(AttributeError):
        gpu_ops.LEDGER_COLUMNS  # noqa: B018
    # The manual's Python API pages (one per area): each public name has its ::: directive
    # (test_docs_site.py checks that each renders with its docstring).
    pages = sorted((REPO / "docs" / "reference" / "api").glob("*.md"))
    directives = {m.rsplit(".", 1)[-1] for page in pages for m in re.findall(r"^::: (\S+)", page.read_text(), re.M)}
    for name in ("GpuCompute", "GpuRequest", "Attribution", "gpu_asset", "PreemptionPolicy", "TrainingContext", "gpu_run_tags", "verify_webhook_signature"):
        assert name in gpu_ops.__all__
    assert sorted(set(gpu_ops.__all__) - directives) == []


def test_import_gpu_ops_and_its_errors_import_nothing_heavy():
    code = f"import sys, gpu_ops, gpu_ops.errors; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_every_exception_derives_from_gpu_ops_error():
    assert len(errors.PLAIN_ERRORS) >= 21
    for cls in errors.PLAIN_ERRORS:
        assert issubclass(cls, errors.GpuOpsError) and cls.__module__ == "gpu_ops.errors", cls
        assert not issubclass(cls, dg.Failure), cls
        assert cls.__name__ in errors.__all__
    # Every exception class the package defines is a GpuOpsError, or deliberately not.
    deliberately_not = {"WorkerTerminated"}  # a BaseException: user code's `except Exception` must not swallow SIGTERM
    found = set()
    for info in pkgutil.walk_packages(gpu_ops.__path__, "gpu_ops."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name and not name.startswith("_"):
                found.add(obj)
    strays = sorted(c.__qualname__ for c in found if not issubclass(c, errors.GpuOpsError) and c.__name__ not in deliberately_not)
    assert strays == []
    # One family in one module: every plain error is defined in gpu_ops.errors (and only
    # re-exported where it is raised), every step failure in gpu_ops.dagster.failures.
    assert found >= set(errors.PLAIN_ERRORS)
    homes = {c.__module__ for c in found if c.__name__ not in deliberately_not}
    assert homes == {"gpu_ops.errors", "gpu_ops.dagster.failures"}, homes
    assert {c for c in found if c.__module__ == "gpu_ops.errors"} == {errors.GpuOpsError, *errors.PLAIN_ERRORS}


# Where each plain error was defined before gpu_ops.errors held them all: still importable there.
_RAISED_IN = {
    "gpu_ops.domain.config": ["ConfigError"],
    "gpu_ops.domain.fastyaml": ["YamlFileError"],
    "gpu_ops.domain.paths": ["PathNotUsable"],
    "gpu_ops.cli.validate": ["UnknownCheck"],
    "gpu_ops.flows.bounded_http": ["RemoteError"],
    "gpu_ops.storage.errors": ["StorageError", "StorageUnavailable"],
    "gpu_ops.domain.compute.catalog": ["UnknownGpuType", "UnknownMigProfile"],
    "gpu_ops.flows.compute.karpenter": ["NotManagedError"],
    "gpu_ops.flows.compute.kubetorch_backend": ["ComputeSetupError"],
    "gpu_ops.flows.compute.local": ["LaunchError"],
    "gpu_ops.domain.compute.backend": ["LeaseLost"],
    "gpu_ops.storage.quota": ["QuotaExceeded", "SharedSqliteLeases"],
    "gpu_ops.flows.training.context": ["TrainingPreempted"],
    "gpu_ops.flows.training.worker": ["TrainingFunctionError"],
    "gpu_ops.flows.training.checkpoint": ["CheckpointError"],
    "gpu_ops.domain.training.attempts": ["TransitionError"],
    "gpu_ops.flows.cost.read": ["UsageSourceError"],
    "gpu_ops.flows.cost.billing": ["BillingSourceError"],
    "gpu_ops.flows.cost.utilization": ["UtilizationError"],
}


def test_each_plain_error_is_importable_where_it_is_raised():
    named = [name for names in _RAISED_IN.values() for name in names]
    assert sorted(named) == sorted(c.__name__ for c in errors.PLAIN_ERRORS)
    for module, names in _RAISED_IN.items():
        for name in names:
            assert getattr(importlib.import_module(module), name) is getattr(errors, name), f"{module}.{name}"


def test_step_failures_are_dagster_failures_carrying_metadata():
    from gpu_ops.dagster import failures

    for name in ("GpuOpsFailure", "TrainingFailed", "LaunchRefused", "AlertDeliveryFailed"):
        cls = getattr(failures, name)
        assert issubclass(cls, dg.Failure) and issubclass(cls, errors.GpuOpsError) and cls is getattr(gpu_ops, name)
    exc = failures.TrainingFailed("train: attempt 3 raised ValueError", metadata={"attempts": 3})
    assert exc.metadata["attempts"].value == 3 and exc.allow_retries is False and "attempt 3" in exc.description
