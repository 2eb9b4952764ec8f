"""Truthful usage: the ledger records and prices the hardware the worker really had.

Real worker subprocesses through real Dagster materializations; the CPU run is forced
with ``CUDA_VISIBLE_DEVICES=""`` so it is a CPU run on any machine. Mapping of device
names to catalog names and the mismatch message are pure functions, tested directly;
the real NVML/torch path runs where a GPU is lent (``gpu`` marker).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from gpu_ops.flows.training import hardware
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute, Lifecycle
from gpu_ops.dagster.training.asset import gpu_asset
from gpu_ops_tests.training import workloads
from gpu_ops_tests.training.test_gpu_asset import PRICES, ledger_rows, messages, metadata

DECLARED = GpuRequest(gpu_type="a100-80gb", gpus=8, memory="4Gi", capacity="spot", labels=Attribution(team="nlp", project="tests"))


def _config(folder: Path, simulate: bool) -> Path:
    path = folder / "gpu_ops.yaml"
    path.write_text(
        f"storage: {{url: 'sqlite:///ledger.db'}}\nprices: {PRICES}\n"
        f"training: {{checkpoint_url: ckpts, simulate_gpu_pricing: {str(simulate).lower()}}}\n"
    )
    return path


def _run_on_cpu(config: Path, name: str) -> tuple[dg.DagsterInstance, Any]:
    asset = gpu_asset(
        workloads.counting, name=name, request=DECLARED, params={"steps": 5, "step_s": 0.0},
        policy={"checkpoint_interval": 60}, env={"CUDA_VISIBLE_DEVICES": ""}, config_path=str(config),
    )
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([asset], instance=instance, resources={"gpu_compute": GpuCompute(lifecycle=Lifecycle(grace_period_s=5))})
    assert result.success
    return instance, result


def test_a_cpu_run_is_recorded_as_cpu_and_the_mismatch_is_flagged(tmp_path: Path) -> None:
    config = _config(tmp_path, simulate=False)
    instance, result = _run_on_cpu(config, "declared_a100")
    row = ledger_rows(config).iloc[0]
    assert (row["gpu_type"], row["gpu_count"], row["hardware_source"]) == ("cpu", 0, "worker")
    assert (row["declared_gpu_type"], row["declared_gpu_count"]) == ("a100-80gb", 8)
    md = metadata(result, "declared_a100")
    assert md["declared_gpu"] == "8x a100-80gb" and md["actual_gpu"] == "cpu"
    assert "no GPU" in md["hardware_warning"]
    assert md["gpu_hours"] == 0.0 and md["cost_usd"] == 0.0  # not priced as eight A100s
    assert md["pricing"].startswith("as run")
    logs = messages(instance, result.run_id)
    assert any("declared 8x a100-80gb but the worker had no GPU" in m for m in logs)
    assert any(m.startswith("worker rank 0 runs on cpu") for m in logs)


def test_simulated_pricing_is_opt_in_and_labelled(tmp_path: Path) -> None:
    config = _config(tmp_path, simulate=True)
    instance, result = _run_on_cpu(config, "demo_like")
    md = metadata(result, "demo_like")
    assert md["pricing"].startswith("simulated: 1 CPU attempt(s) priced as the declared 8x a100-80gb")
    # Said one way: simulated, everywhere (no "not priced as a GPU" beside a simulated cost),
    # and not as a warning (the configuration asked for it).
    assert "simulated" in md["hardware_warning"] and "not priced as a GPU" not in md["hardware_warning"]
    records = [r for r in instance.all_logs(result.run_id) if r.user_message]
    assert not any("not priced as a GPU" in r.user_message for r in records)
    said = [r for r in records if r.user_message.startswith("attempt 1: declared")]
    assert len(said) == 1 and said[0].level == logging.INFO, [(r.level, r.user_message) for r in said]
    ledger = next(r.user_message for r in records if r.user_message.startswith("ledger: attempt 1"))
    assert "ran on CPU" in ledger and "simulated" in ledger and "0x cpu" not in ledger, ledger
    row = ledger_rows(config).iloc[0]
    assert (row["gpu_type"], row["gpu_count"]) == ("cpu", 0)  # the ledger stays as run
    seconds = (row["end"] - row["start"]).total_seconds()
    # a100-80gb spot in the demo prices, to the cent (a sub-cent run is $0.00) and GPU-hours to 3 decimals
    assert md["cost_usd"] == pytest.approx(round(8 * seconds / 3600 * 1.79, 2), abs=0.0101) and md["cost_usd"] == round(md["cost_usd"], 2)
    assert md["gpu_hours"] == pytest.approx(round(8 * seconds / 3600, 3), abs=0.0011)


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 79.6, ("h100", True)),
        ("NVIDIA H100 PCIe", 79.6, ("h100", True)),
        ("NVIDIA H200", 139.8, ("h200", True)),
        ("NVIDIA A100-SXM4-80GB", 79.2, ("a100-80gb", True)),
        ("NVIDIA A100-PCIE-40GB", 39.4, ("a100", True)),
        ("NVIDIA A100 80GB PCIe", 79.2, ("a100-80gb", True)),
        ("Tesla T4", 14.7, ("t4", True)),
        ("NVIDIA A10G", 22.0, ("a10g", True)),
        ("NVIDIA A10", 22.0, ("nvidia-a10", False)),  # never an A100
        ("NVIDIA GeForce RTX 4090", 23.6, ("nvidia-geforce-rtx-4090", False)),
    ],
)
def test_device_names_map_to_catalog_names(name: str, memory: float, expected: tuple[str, bool]) -> None:
    assert hardware.catalog_name(name, memory) == expected


def test_mig_devices_and_several_ranks() -> None:
    mig = hardware.from_devices(["NVIDIA A100-SXM4-80GB MIG 1g.10gb"], ["MIG-1"], 9.5)
    assert (mig.gpu_type, mig.gpu_count, mig.mig_profile, mig.describe()) == ("a100-80gb", 1, "1g.10gb", "1x a100-80gb MIG 1g.10gb")
    assert hardware.mismatch("a100-80gb", 1, "1g.10gb", mig) is None
    # Two ranks on one machine see the same two GPUs; two pods see their own.
    same = [hardware.from_devices(["NVIDIA H100 80GB HBM3"] * 2, ["GPU-a", "GPU-b"]) for _ in range(2)]
    assert hardware.combine(same).gpu_count == 2
    pods = [hardware.from_devices(["NVIDIA H100 80GB HBM3"], [f"GPU-{r}"]) for r in range(4)]
    assert hardware.combine(pods).describe() == "4x h100"
    assert hardware.combine([hardware.cpu("no-driver")]).is_cpu
    assert hardware.combine([]) is None


def test_a_declared_type_that_differs_from_what_ran_is_a_warning() -> None:
    h100 = hardware.from_devices(["NVIDIA H100 80GB HBM3"], ["GPU-a"])
    message = hardware.mismatch("t4", 1, None, h100)
    assert message is not None and "declared 1x t4 but the worker had 1x h100 (NVIDIA H100 80GB HBM3)" in message
    assert hardware.mismatch("h100", 1, None, h100) is None
    assert "2x h100" in hardware.mismatch("h100", 1, None, hardware.from_devices(["NVIDIA H100 80GB HBM3"] * 2))
    unknown = hardware.from_devices(["NVIDIA GeForce RTX 4090"])
    assert "not in the GPU catalog" in hardware.mismatch("l4", 1, None, unknown)
    cpu = hardware.Hardware(hardware.CPU, 0, source="no-driver")
    assert hardware.mismatch("t4", 1, None, cpu) == "declared 1x t4 but the worker had no GPU: recorded as CPU, not priced as a GPU"
    simulated = hardware.mismatch("t4", 1, None, cpu, simulated=True)
    assert simulated is not None and "not priced as a GPU" not in simulated and "prices it as the declared 1x t4 (simulated" in simulated


def test_detect_honours_an_empty_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hw = hardware.detect()
    assert hw.is_cpu and hw.source == "cuda-visible-devices"


@pytest.mark.gpu
def test_detect_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch, cuda: None) -> None:
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hw = hardware.detect()
    assert hw.gpu_count == torch.cuda.device_count() and hw.source == "nvml"
    assert hw.gpu_type == hardware.catalog_name(torch.cuda.get_device_name(0), hw.memory_gib)[0]


def test_a_completed_attempts_summary_carries_the_hardware() -> None:
    """Kubetorch: the workers' output lines may not reach the parent; the summary does."""
    from gpu_ops.domain.compute.backend import WorkerExit, WorkerReport
    from gpu_ops.dagster.training.asset import _reported_hardware, _used_hardware

    h100 = hardware.from_devices(["NVIDIA H100 80GB HBM3"], ["GPU-a"])
    report = WorkerReport(exit=WorkerExit.COMPLETED, value={"value": 1, "summary": {"hardware": h100.as_dict()}})
    found = _reported_hardware(report)
    assert found == h100
    used = _used_hardware(DECLARED, found, used_gpus=True)
    assert (used.gpu_type, used.gpu_count, used.source) == ("h100", 1, "worker")
    assert _reported_hardware(WorkerReport(exit=WorkerExit.SIGKILL)) is None
    declared = _used_hardware(DECLARED, None, used_gpus=True)  # killed before it reported
    assert (declared.gpu_type, declared.gpu_count, declared.source) == ("a100-80gb", 8, "declared")
    assert _used_hardware(DECLARED, None, used_gpus=False).gpu_count == 0
