"""GPU catalog and GpuRequest."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from gpu_ops.domain.compute.catalog import CATALOG, UnknownGpuType, canonical_gpu_type, gpu_share, gpu_spec
from gpu_ops.domain.compute.request import GpuRequest


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("NVIDIA-A100-SXM4-80GB", "a100-80gb"),
        ("nvidia-tesla-t4", "t4"),
        ("NVIDIA A10G", "a10g"),
        ("A100_40GB", "a100"),
        ("H100", "h100"),
        ("NVIDIA-H200", "h200"),
    ],
)
def test_aliases_map_to_canonical_names(alias, canonical):
    assert canonical_gpu_type(alias) == canonical


def test_a10_is_not_a100_and_unknown_names_list_close_matches():
    with pytest.raises(UnknownGpuType) as exc:
        canonical_gpu_type("a10")
    assert exc.value.suggestions and "a100" not in exc.value.suggestions[:1] or "a10g" in exc.value.suggestions
    assert "a10g" in str(exc.value)
    with pytest.raises(UnknownGpuType, match="unknown GPU type 'tpu-v5'"):
        canonical_gpu_type("tpu-v5")


def test_mig_and_timeslice_shares():
    assert gpu_share("a100-80gb", "1g.10gb") == pytest.approx(1 / 7)
    assert gpu_share("a100-80gb", "1g.20gb") == pytest.approx(1 / 4)  # two of eight memory slices
    assert gpu_share("a100-80gb", "3g.40gb") == pytest.approx(1 / 2)
    assert gpu_share("a100-80gb", "7g.80gb") == 1.0
    assert gpu_share("t4", timeslice_replicas=4) == 0.25
    with pytest.raises(ValueError, match="t4 has no MIG profile"):
        gpu_share("t4", "1g.10gb")


def test_every_gpu_has_instance_types_and_karpenter_name():
    for spec in CATALOG.values():
        assert spec.instance_types and spec.karpenter_gpu_name and spec.memory_gib > 0
    assert gpu_spec("a100-80gb").instance_types_for(8) == ["p4de.24xlarge"]
    assert gpu_spec("l4").instance_types_for(4)[0] == "g6.12xlarge"


def test_gpu_request_canonicalises_and_checks_shape():
    req = GpuRequest(gpu_type="NVIDIA-A100-SXM4-80GB", gpus=8, memory="64Gi", labels={"team": "nlp"})
    assert req.gpu_type == "a100-80gb" and req.total_gpus == 8 and req.capacity_types == ["spot", "on-demand"]
    assert req.with_memory_factor(1.5).memory == "96Gi"
    assert req.with_memory_factor(1.5, cap="80Gi").memory == "80Gi"
    assert req.with_capacity("on-demand").capacity_types == ["on-demand"]
    with pytest.raises(ValidationError, match="no a100-80gb instance has 16 GPUs"):
        GpuRequest(gpu_type="a100-80gb", gpus=16)
    with pytest.raises(ValidationError, match="not a valid Kubernetes label value"):
        GpuRequest(gpu_type="t4", labels={"team": "NLP team!"})
    with pytest.raises(ValidationError, match="unknown GPU type"):
        GpuRequest(gpu_type="a10")


@pytest.mark.parametrize("quantity", ["32Gi", "512Mi", "1e9", "500M", "1.5Gi", "100", "2k", "1Ti", "0.5Gi", "1500m"])
def test_memory_quantities_parse_as_kubernetes_does(quantity):
    from kubernetes.utils import parse_quantity

    from gpu_ops.domain.compute.request import parse_memory

    assert parse_memory(quantity) == math.ceil(parse_quantity(quantity))  # whole bytes, rounded up


def test_bad_memory_quantity_is_a_clear_error():
    with pytest.raises(ValidationError, match="'lots' is not a memory quantity"):
        GpuRequest(gpu_type="t4", memory="lots")
