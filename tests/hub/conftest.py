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

REPO = Path(__file__).resolve().parents[2]
ADMIN = "test-admin-credential"


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    from tests import pgharness

    if not pgharness.available():
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed: scripts/install-test-deps.sh installs it")
        pytest.skip("PostgreSQL binaries not installed (apt-get install postgresql)")
    server = pgharness.PostgresServer.start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/hub.db"
    server = request.getfixturevalue("postgres")
    return str(server.fresh_database("hub_" + uuid.uuid4().hex[:12]))


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
        return run_cli("--db", self.db, *args)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "hub", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def start_hub(db: str, *, tls: bool = False, port: int | None = None) -> HubProcess:
    """`kubeon-gpu hub serve` in a subprocess, waited for until /healthz answers."""
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kubeon-hub-"))
    args = ["serve", "--db", db, "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4"]
    ca_file = None
    if tls:
        from certs.material import generate_ca, issue_serving_cert

        ca = generate_ca("hub-test-ca")
        serving = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
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
def hub_server(db_url: str) -> Iterator[HubProcess]:
    hub = start_hub(db_url)
    yield hub
    hub.stop()
