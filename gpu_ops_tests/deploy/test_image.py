"""The user-code Dockerfile agrees with the chart and the package (no Docker engine
here, so the file itself is checked: base image, user, entry point, extras)."""

from __future__ import annotations

import json
import re
import tomllib

from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.deploy.chart import objects, one

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_base_image_is_python_311_slim_for_both_stages() -> None:
    ins = _instructions()
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in ins
    froms = [rest for op, rest in ins if op == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]


def test_runs_as_the_numeric_non_root_user_the_chart_expects() -> None:
    users = [rest for op, rest in _instructions() if op == "USER"]
    assert users == ["10001:10001"]
    pod = one(objects(), "Deployment")["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (10001, 10001)


def test_default_command_is_the_charts_code_server() -> None:
    cmd = json.loads(next(rest for op, rest in _instructions() if op == "CMD"))
    container = one(objects(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    chart_cmd = container["command"] + container["args"]
    # The chart adds only the location name.
    assert cmd == chart_cmd[: chart_cmd.index("--location-name")]
    assert str(container["ports"][0]["containerPort"]) in [rest for op, rest in _instructions() if op == "EXPOSE"]


def test_torch_comes_only_through_the_optional_train_extra() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["train"] == ["torch==2.13.0"]
    assert not any(d.startswith("torch") for d in pyproject["project"]["dependencies"])
    ins = _instructions()
    assert ("ARG", 'EXTRAS=""') in ins
    install = next(rest for op, rest in ins if op == "RUN" and "pip install" in rest)
    assert '".[${EXTRAS}]"' in install and "pip install ." in install
    assert "torch" not in " ".join(rest for op, rest in ins if op == "RUN")


def test_build_context_leaves_out_local_state() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".gpu_ops", "gpu_ops_tests"} <= ignored
    copied = [rest.split()[0] for op, rest in _instructions() if op == "COPY" and not rest.startswith("--from")]
    assert all(src not in ignored for src in copied)
