"""Fixtures for the hub: a database on SQLite or on a real PostgreSQL, a `kubeon-gpu hub serve` process,
and an HTTP client that checks every response against hub/openapi.yaml.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from hub import contract
from tests.loopback import free_port, wait_for
from tests.missing import missing

REPO = Path(__file__).resolve().parents[2]
ADMIN = "test-admin-credential"


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    from tests import pgharness

    if not pgharness.available():
        missing("PostgreSQL is not installed: scripts/install-test-deps.sh installs it")
    server = pgharness.PostgresServer.start()
    yield server
    server.stop()


def _database(request: pytest.FixtureRequest, directory: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{directory}/hub.db"
    server = request.getfixturevalue("postgres")
    return str(server.fresh_database("hub_" + uuid.uuid4().hex[:12]))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database."""
    return _database(request, tmp_path)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One `kubeon-gpu hub serve` per module and database: tests that share it use their own clusters."""
    hub = start_hub(_database(request, tmp_path_factory.mktemp("hub")))
    yield hub
    hub.stop()


def check_response(method: str, path: str, response: requests.Response) -> None:
    """Fail unless the response's status and body are what hub/openapi.yaml says for this call."""
    doc = contract.document()
    for template, item in doc["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in item:
            operation = item[method.lower()]
            break
    else:
        raise AssertionError(f"{method} {path} is not in hub/openapi.yaml")
    answers = operation["responses"]
    status = str(response.status_code)
    assert status in answers, f"{method} {path} answered {status}, not listed in the contract"
    answer = answers[status]
    if "$ref" in answer:
        answer = doc["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
    content = answer.get("content")
    if not content:
        assert not response.content, f"{method} {path} {status} must have no body"
        return
    if "application/json" not in content:  # /metrics: Prometheus' text format
        kind = next(iter(content))
        assert response.headers["Content-Type"].startswith(kind), response.headers["Content-Type"]
        return
    schema = content["application/json"]["schema"]
    assert response.headers["Content-Type"].startswith("application/json")
    errors = list(contract.validator_for(schema).iter_errors(response.json()))
    assert not errors, f"{method} {path} {status}: {errors[0].message}"


@dataclass
class HubClient:
    """requests against a hub, every answer checked against the contract."""

    base: str
    verify: Any = True
    calls: list[tuple[str, str, int]] = field(default_factory=list)

    def request(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = requests.request(method, self.base + path, headers=headers, verify=self.verify, timeout=10,
                                    **kwargs)
        check_response(method, requests.utils.urlparse(self.base + path).path, response)
        self.calls.append((method, path, response.status_code))
        return response

    def admin(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.request(method, "/api/v1/admin" + path, token=ADMIN, **kwargs)


@dataclass
class HubProcess:
    url: str
    db: str
    process: subprocess.Popen[bytes]
    log: Path
    ca_file: str | None = None

    def client(self) -> HubClient:
        return HubClient(self.url, verify=self.ca_file or True)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`kubeon-gpu hub --db DB ARGS`, run in this process (the real entry point; a subprocess per
        call would cost a second of imports each, see test_cli_in_a_subprocess for the real one)."""
        return cli_in_process("--db", self.db, *args)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    import contextlib
    import io

    from cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["hub", *args])
        except SystemExit as exc:  # argparse refusals
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(["kubeon-gpu", "hub", *args], code, out.getvalue(), err.getvalue())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "hub", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def start_hub(db: str, *, tls: bool = False, port: int | None = None,
              dns_names: tuple[str, ...] = ("localhost",), extra: tuple[str, ...] = ()) -> HubProcess:
    """`kubeon-gpu hub serve` in a subprocess, waited for until /healthz answers (with tls, a
    certificate for `dns_names` and 127.0.0.1 from a fresh CA, `ca_file`); `extra`: more serve flags."""
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kubeon-hub-"))
    args = ["serve", "--db", db, "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4", *extra]
    ca_file = None
    if tls:
        from certs.material import generate_ca, issue_serving_cert

        ca = generate_ca("hub-test-ca")
        serving = issue_serving_cert(ca, list(dns_names), ["127.0.0.1"])
        (workdir / "ca.crt").write_bytes(ca.cert_pem())
        (workdir / "tls.crt").write_bytes(serving.cert_pem())
        (workdir / "tls.key").write_bytes(serving.key_pem())
        args += ["--cert", str(workdir / "tls.crt"), "--key", str(workdir / "tls.key")]
        ca_file = str(workdir / "ca.crt")
    log = workdir / "hub.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBEON_HUB_ADMIN_TOKEN": ADMIN}
    process = subprocess.Popen([sys.executable, "-m", "cli.main", "hub", *args], cwd=REPO, env=env,
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)
    scheme = "https" if tls else "http"
    hub = HubProcess(f"{scheme}://127.0.0.1:{port}", db, process, log, ca_file)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"hub exited: {log.read_text()}")
        try:
            return requests.get(hub.url + "/healthz", verify=ca_file or True, timeout=1).ok
        except requests.RequestException:
            return False

    wait_for(up, timeout=60, what="the hub to answer /healthz")
    return hub


@pytest.fixture
def hub_server(shared_hub: HubProcess) -> HubProcess:
    return shared_hub


@pytest.fixture
def cluster() -> str:
    """A cluster name no other test on the shared hub uses."""
    return "c-" + uuid.uuid4().hex[:10]


def summary_report(time: float, *, gpus: int = 8, allocated: int = 5, idle: int | None = 2, pending: int = 1,
                   cost: float = 11.34, saving: float = 0.0, report_id: str | None = None) -> dict[str, Any]:
    """A `ClusterSummary` as the controller sends it (gpupolicy/capacity/summary.py), with the given figures."""
    return {"version": 1, "id": report_id or uuid.uuid4().hex, "time": time, "gpuNodes": 2, "gpus": gpus,
            "allocatedGpus": allocated, "idleGpus": idle, "pendingGpuPods": pending,
            "byModel": [{"model": "NVIDIA-A10G", "layout": "whole GPUs", "nodes": 2, "gpus": gpus,
                         "allocated": allocated}],
            "costPerHour": cost, "unpricedNodes": 0, "pricePerGpuHour": round(cost / max(gpus, 1), 4),
            "savings": {"actionsApplied": 1 if saving else 0, "gpuHoursPerMonth": 0.0, "perHour": saving}}
