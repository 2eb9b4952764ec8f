"""Real servers for the observability tests, started on 127.0.0.1: Debian's Prometheus and
`gpu-ops exporter` as a subprocess."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from gpu_ops_tests.conftest import REPO, skip_or_fail
from gpu_ops_tests.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Exporter:
    """`gpu-ops exporter` in its own process, on a fixed port (so a restart keeps the scrape target)."""

    def __init__(self, config: Path, port: int, log: Path, args: tuple[str, ...] = ()):
        self.config, self.port, self.log, self.args = config, port, log, args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "gpu_ops.cli", "exporter", "--host", "127.0.0.1", "--port", str(self.port), "--config", str(self.config), "--cache-seconds", "0", "--history-seconds", "0", *self.args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))  # noqa: SIM115

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(self.url, timeout=30).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(up, timeout=60, every=0.2), self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never says a word
    (a database host whose process hangs, a black-holing proxy): yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@contextlib.contextmanager
def prometheus(folder: Path, targets: list[str], rule_files: list[Path]) -> Iterator[str]:
    """Debian's prometheus scraping ``targets`` every second, evaluating ``rule_files`` every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        skip_or_fail("the prometheus binary is not installed (apt-get install -y prometheus)")
    assert binary is not None
    port = free_port()
    rules = "\n".join(f"  - {p}" for p in rule_files)
    (folder / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n{rules}\n"
        "scrape_configs:\n  - job_name: gpu_ops\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    log = open(folder / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-3000:]}")
            try:
                return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(ready, timeout=60, every=0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = at
    answer = httpx.get(f"{url}/api/v1/query", params=params, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def series(url: str, at: float | None = None, instance: str | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The gpu_ops_ series Prometheus holds now (of one scrape target, or of all when they
    agree): (name, labels without job/instance) -> value."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    target = f',instance="{instance}"' if instance else ""
    for r in query(url, f'{{__name__=~"gpu_ops_.+",job="gpu_ops"{target}}}', at):
        labels = {k: v for k, v in r["metric"].items() if k not in ("__name__", "job", "instance")}
        key = (r["metric"]["__name__"], frozenset(labels.items()))
        value = float(r["value"][1])
        assert instance or key[0] == "gpu_ops_exporter_read_seconds" or out.get(key, value) == value, f"targets disagree on {key}"
        out[key] = value
    return out


def up(url: str, instance: str) -> tuple[str, float] | None:
    """(value, timestamp) of the target's newest ``up`` sample."""
    found = query(url, f'up{{job="gpu_ops",instance="{instance}"}}')
    if not found:
        return None
    stamp = query(url, f'timestamp(up{{job="gpu_ops",instance="{instance}"}})')[0]["value"][1]
    return found[0]["value"][1], float(stamp)


def wait_for_scrape_after(url: str, t: float, instances: list[str], timeout: float = 60) -> None:
    """Until Prometheus has a successful scrape of every target that started after ``t``."""
    def scraped() -> bool:
        return all((u := up(url, i)) is not None and u[0] == "1" and u[1] > t for i in instances)

    assert wait_until(scraped, timeout=timeout, every=0.25), [up(url, i) for i in instances]
