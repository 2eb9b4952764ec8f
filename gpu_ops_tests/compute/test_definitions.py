"""The compute flow's Dagster objects, and the import rule (no torch/kubetorch on load)."""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg

from gpu_ops.dagster.compute.definitions import ORPHAN_SENSOR, build_defs
from gpu_ops.dagster.compute.admission import BudgetGate, GpuAdmission
from gpu_ops.dagster.compute.resource import GpuCompute, KubetorchGpuCompute
from gpu_ops.domain.config import parse_config


def test_build_defs_configures_the_resource_and_sensor(tmp_path) -> None:
    cfg = parse_config(
        {
            "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"h100": {"spot": 4.3}}},
            "compute": {
                "backend": "kubetorch", "namespace": "ml", "cleanup": "on_exception", "priority_class": "gpu-training", "orphan_grace": "2h",
                "kubetorch": {"launch_timeout_s": 1200, "inactivity_ttl": "1h", "image": "ghcr.io/acme/train:1"},
                "karpenter": {"pool_scope": "run", "gpu_limit": 16, "consolidate_after": "5m"},
            },
        },
        tmp_path / "gpu_ops.yaml",
    )
    defs = build_defs(cfg)
    compute = defs.resources["gpu_compute"]
    # One class per backend, its settings nested (GpuCompute is the abstract base).
    assert isinstance(compute, KubetorchGpuCompute) and isinstance(compute, GpuCompute)
    assert (compute.backend, compute.namespace, compute.lifecycle.cleanup, compute.kubetorch.priority_class) == ("kubetorch", "ml", "on_exception", "gpu-training")
    assert (compute.kubetorch.launch_timeout_s, compute.kubetorch.inactivity_ttl, compute.kubetorch.image) == (1200, "1h", "ghcr.io/acme/train:1")
    assert (compute.karpenter.pool_scope, compute.karpenter.gpu_limit, compute.karpenter.consolidate_after) == ("run", 16, "5m")
    assert compute.config_path == str(tmp_path / "gpu_ops.yaml")
    # The quota admission and the budget gate are injected resources reading the same file.
    assert isinstance(compute.admission, GpuAdmission) and compute.admission.config_path == compute.config_path
    assert isinstance(compute.budget_gate, BudgetGate) and compute.budget_gate.config_path == compute.config_path
    (sensor,) = defs.sensors
    assert sensor.name == ORPHAN_SENSOR and sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert "2h" in sensor.description


def test_loading_the_code_location_and_compute_modules_imports_no_torch_or_kubetorch() -> None:
    code = (
        "import sys, json; import gpu_ops.definitions, gpu_ops.dagster.compute.resource, gpu_ops.flows.compute.karpenter, "
        "gpu_ops.flows.compute.kubetorch_backend, gpu_ops.flows.compute.orphans, gpu_ops.cli.checks.compute, gpu_ops.cli.compute, "
        "gpu_ops.flows.compute.local; print(json.dumps(sorted(m for m in ('torch', 'kubetorch') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
