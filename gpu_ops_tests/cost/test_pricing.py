"""The light prices reading of `gpu-ops cost attribution` (no pydantic) against the
PriceTable model: it never accepts what the model refuses, and what it accepts it reads
as the model does. Every prices file of the repository, and hand-made variants."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from gpu_ops.domain.config import PriceTable
from gpu_ops.flows.cost.pricing import PriceMatrix, plain_price_matrix
from gpu_ops_tests.conftest import REPO

# latin1.yaml is no YAML text at all (not UTF-8): the corpus case prices-not-utf8 checks its error.
FILES = sorted(
    [
        *(p for p in (REPO / "gpu_ops_tests" / "hostile" / "prices").glob("*.yaml") if p.name != "latin1.yaml"),
        REPO / "gpu_ops_tests" / "hostile" / "prices.yaml", REPO / "examples" / "data" / "prices.yaml", REPO / "gpu_ops" / "demo" / "prices.yaml",
    ]
)
BASE = {"currency": "USD", "source": "t", "as_of": dt.date(2026, 10, 1), "gpus": {"a100-80gb": {"on-demand": 4.0, "spot": 1.5}, "L4": {"on-demand": 0.8}}}
VARIANTS = [
    BASE,
    {**BASE, "regions": {"eu": {"multiplier": 1.1}, "us": {}}},
    {**BASE, "gpus": {"NVIDIA-A100-SXM4-80GB": {"on-demand": 4}}},
    {**BASE, "gpus": {"a100-80gb": {"on-demand": 4.0}, "NVIDIA-A100-SXM4-80GB": {"spot": 1.0}}},  # two names for one GPU
    {**BASE, "gpus": {"h100": {"on-demand": 98.32, "deliberate": True}}},
    {**BASE, "gpus": {"h100": {"on-demand": 98.32, "deliberate": False}}},
    {**BASE, "gpus": {"h100": {"on-demand": 98.32}}},
    {**BASE, "gpus": {"h100": {"on-demand": True}}},
    {**BASE, "gpus": {"h100": {"on-demand": "3.5"}}},
    {**BASE, "gpus": {"h100": {}}},
    {**BASE, "gpus": {"nope-gpu": {"on-demand": 1.0}}},
    {**BASE, "gpus": {"h100": {"od": 1.0}}},
    {**BASE, "gpus": {"h100": {"on-demand": math.inf}}},
    {**BASE, "regions": {"eu": {"multiplier": 0}}},
    {**BASE, "regions": {"eu": None}},
    {**BASE, "as_of": "2026-10-01"},
    {**BASE, "as_of": dt.datetime(2026, 10, 1)},
    {**BASE, "currency": "JPY", "gpus": {"h100": {"on-demand": 9000.0}}},
    {**BASE, "extra": 1},
    {k: v for k, v in BASE.items() if k != "source"},
    {**BASE, "from_bill": True},
]


def _model(data):
    try:
        return PriceMatrix.from_table(PriceTable.model_validate(data))
    except ValidationError:
        return None


def _same(a: PriceMatrix, b: PriceMatrix) -> bool:
    return a.gpu_types == b.gpu_types and np.array_equal(a.matrix, b.matrix, equal_nan=True) and a.regions == b.regions and (a.currency, a.source) == (b.currency, b.source)


@pytest.mark.parametrize("data", [yaml.safe_load(p.read_text()) for p in FILES] + VARIANTS, ids=[p.name for p in FILES] + [f"variant{i}" for i in range(len(VARIANTS))])
def test_the_light_reading_agrees_with_the_model(data):
    light, model = plain_price_matrix(data), _model(data)
    if light is not None:
        assert model is not None, "the light reading accepted what the model refuses"
        assert _same(light, model)


def test_the_plain_files_are_read_light():
    """The files users write (and the demo's) do not need the model."""
    for p in (REPO / "examples" / "data" / "prices.yaml", REPO / "gpu_ops" / "demo" / "prices.yaml", REPO / "gpu_ops_tests" / "hostile" / "prices.yaml"):
        assert plain_price_matrix(yaml.safe_load(p.read_text())) is not None, p
    assert plain_price_matrix(VARIANTS[1]) is not None and plain_price_matrix(VARIANTS[4]) is not None
