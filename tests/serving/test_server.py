"""The serving stack over real HTTPS: gunicorn (started by serving.server.serve in a
subprocess), TLS material from certs.material, and `requests` verifying the
generated CA against the server's IP SAN.

Real: gunicorn master + gthread workers, TLS, cert rotation on disk, the
prometheus-client multiprocess directory. Faked: the Flask app is a small
test app (tests/serving/app_factory.py) built from the serving helpers.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from cryptography import x509

from certs.material import generate, load_ca
from tests.loopback import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    ca: Path
    cert_dir: Path
    ready_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def get(self, path: str, **kw: object) -> requests.Response:
        return requests.get(self.url + path, verify=str(self.ca), timeout=5, **kw)  # type: ignore[arg-type]

    def post(self, path: str, **kw: object) -> requests.Response:
        return requests.post(self.url + path, verify=str(self.ca), timeout=5, **kw)  # type: ignore[arg-type]

    def served_serial(self) -> int:
        """The serial of the certificate a new, CA-verified connection is served."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def workers_of(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def start_server(tmp: Path, cert_dir: Path, workers: int = 2, extra_env: dict[str, str] | None = None) -> Server:
    ready_file = tmp / "ready"
    ready_file.touch()
    env = {**os.environ, "KUBEON_TEST_READY_FILE": str(ready_file), "PYTHONPATH": str(REPO), **(extra_env or {})}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    for _attempt in range(3):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.serving.app_factory", str(cert_dir), str(port), str(workers)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "ab"))  # noqa: SIM115
        server = Server(proc, port, cert_dir / "ca.crt", cert_dir, ready_file)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if server.get("/healthz").status_code == 200 and len(workers_of(proc.pid)) == workers:
                    return server
            except requests.ConnectionError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise AssertionError("server did not start: " + (tmp / "server.log").read_text()[-2000:])


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture
def certs_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tls"
    generate("kubeon-test", "kubeon-gpu", out, ip_addresses=["127.0.0.1"])
    return out


@pytest.fixture
def server(tmp_path: Path, certs_dir: Path) -> Iterator[Server]:
    s = start_server(tmp_path, certs_dir)
    yield s
    stop_server(s)


def test_probes_answer_over_verified_tls(server: Server) -> None:
    assert server.get("/healthz").json() == {"status": "ok"}
    assert server.get("/readyz").status_code == 200
    server.ready_file.unlink()
    not_ready = server.get("/readyz")
    assert not_ready.status_code == 503 and not_ready.json() == {"status": "not ready"}
    assert server.get("/healthz").status_code == 200


def test_a_client_with_another_ca_is_refused(server: Server, tmp_path: Path) -> None:
    other = tmp_path / "other"
    generate("x", "y", other, ip_addresses=["127.0.0.1"])
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/healthz", verify=str(other / "ca.crt"), timeout=5)


def test_bad_bodies_get_json_errors_without_tracebacks(server: Server) -> None:
    assert server.post("/echo", json={"a": [1]}).json() == {"got": {"a": [1]}}
    malformed = server.post("/echo", data=b'{"a": ', headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"].startswith("malformed JSON")
    assert server.post("/echo", data=b"").status_code == 400
    big = server.post("/echo", data=b"[" + b"1," * 2000 + b"1]")
    assert big.status_code == 413 and "limit" in big.json()["error"]
    chunked = server.post("/echo", data=iter([b"[" + b"1," * 600, b"1," * 600 + b"1]"]))
    assert chunked.status_code == 413
    boom = server.get("/boom")
    assert boom.status_code == 500 and boom.json() == {"error": "internal error"}
    assert "secret" not in boom.text and "Traceback" not in boom.text
    assert server.get("/nope").status_code == 404 and "error" in server.get("/nope").json()
    assert server.get("/echo").status_code == 405 and "error" in server.get("/echo").json()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_10_mb_body_gets_its_413_over_tls(server: Server, chunked: bool) -> None:
    """Issue 15: the 413 went out while the client was still sending, and the connection was reset
    (the client saw an SSL EOF error, never the answer). The body is now drained first."""
    data = b"[" + b"1," * 5_000_000 + b"1]"
    body = iter([data[i:i + 65536] for i in range(0, len(data), 65536)]) if chunked else data
    resp = server.post("/echo", data=body)
    assert resp.status_code == 413 and "limit" in resp.json()["error"]
    assert server.get("/healthz").status_code == 200


def counter(text: str, route: str, status: str) -> float:
    pattern = rf'^kubeon_http_requests_total\{{route="{re.escape(route)}",status="{status}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_aggregate_across_workers(server: Server) -> None:
    pids: set[int] = set()
    sent = 0
    while len(pids) < 2 or sent < 20:  # fresh connections until both workers have served
        pids.add(server.get("/pid").json()["pid"])
        sent += 1
        assert sent < 400, "only one worker ever answered"
    # every worker writes its counts within serving.tally.INTERVAL (0.25 s) of counting them
    deadline = time.monotonic() + 10
    while counter(server.get("/metrics").text, "/pid", "200") < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(3):  # whichever worker answers the scrape, it reports every worker's requests
        text = server.get("/metrics").text
        assert counter(text, "/pid", "200") == sent
        assert "kubeon_http_request_duration_seconds_bucket" in text
        assert 'le="0.001"' in text


def test_rotated_cert_is_served_without_restart(server: Server) -> None:
    before_serial = server.served_serial()
    before_workers = workers_of(server.proc.pid)
    assert len(before_workers) == 2
    _, new = generate("kubeon-test", "kubeon-gpu", server.cert_dir, ip_addresses=["127.0.0.1"],
                      ca=load_ca(server.cert_dir))
    assert new.cert.serial_number != before_serial
    deadline = time.monotonic() + 5
    while server.served_serial() != new.cert.serial_number:
        assert time.monotonic() < deadline, "rotated certificate never served"
        time.sleep(0.05)
    # Every new connection now gets the new cert, from the same processes.
    assert all(server.served_serial() == new.cert.serial_number for _ in range(10))
    assert server.proc.poll() is None
    assert workers_of(server.proc.pid) == before_workers, "no worker was restarted"


def test_kubelet_style_symlink_swap_is_served(tmp_path: Path) -> None:
    """Secret volumes: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/; rotation swaps ..data."""
    base = tmp_path / "secret"
    first, second = base / "..2025_01_01", base / "..2025_02_01"
    ca = generate("kubeon-test", "kubeon-gpu", first, ip_addresses=["127.0.0.1"])[0]
    (base / "..data").symlink_to(first.name)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (base / name).symlink_to(f"..data/{name}")
    s = start_server(tmp_path, base)
    try:
        pid = s.proc.pid
        workers = workers_of(pid)
        _, new = generate("kubeon-test", "kubeon-gpu", second, ip_addresses=["127.0.0.1"], ca=ca)
        (base / "..data_tmp").symlink_to(second.name)
        os.replace(base / "..data_tmp", base / "..data")
        deadline = time.monotonic() + 5
        while s.served_serial() != new.cert.serial_number:
            assert time.monotonic() < deadline, "swapped certificate never served"
            time.sleep(0.05)
        assert s.proc.pid == pid and s.proc.poll() is None
        assert workers_of(pid) == workers
    finally:
        stop_server(s)


def test_half_written_rotation_keeps_serving_the_old_cert(server: Server, tmp_path: Path) -> None:
    before = server.served_serial()
    other = tmp_path / "other"
    generate("kubeon-test", "kubeon-gpu", other, ip_addresses=["127.0.0.1"], ca=load_ca(server.cert_dir))
    (server.cert_dir / "tls.crt").write_bytes((other / "tls.crt").read_bytes())  # key not yet written
    assert server.served_serial() == before
    (server.cert_dir / "tls.key").write_bytes((other / "tls.key").read_bytes())
    deadline = time.monotonic() + 5
    while server.served_serial() == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_no_control_socket_is_opened(tmp_path: Path, certs_dir: Path) -> None:
    """gunicorn (25.1 on) opens a control socket in $XDG_RUNTIME_DIR or ~/.gunicorn by default, through which
    a local process could change the worker count (the extender's state lives in its one process) or stop
    the server; nothing of ours uses it, and under the chart's read-only root it only failed with a warning."""
    home, runtime = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    runtime.mkdir()
    server = start_server(tmp_path, certs_dir, workers=1,
                          extra_env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)})
    try:
        assert server.get("/healthz").status_code == 200
        assert [*home.rglob("*"), *runtime.rglob("*")] == []
    finally:
        stop_server(server)
    assert "Control socket" not in (tmp_path / "server.log").read_text()


def test_metrics_dir_is_removed_on_exit(tmp_path: Path, certs_dir: Path) -> None:
    s = start_server(tmp_path, certs_dir, workers=1)
    multiproc_dir = Path(s.get("/pid").json()["multiproc_dir"])
    assert s.get("/metrics").status_code == 200
    assert any(multiproc_dir.glob("*.db")), "workers write their samples to the shared directory"
    stop_server(s)
    assert s.proc.returncode == 0
    assert not multiproc_dir.exists()


def test_a_worker_s_app_is_built_then_frozen_out_of_full_collections() -> None:
    """What a worker holds after building its app (modules, the app, a static view) lives as long as the
    process: the collector's full collections must not walk it inside a request (serving.server)."""
    import gc

    from flask import Flask

    from serving.server import load_frozen

    try:
        app = load_frozen(lambda: Flask("worker"))
        assert gc.get_freeze_count() > 0
        assert not any(o is app for o in gc.get_objects())  # frozen objects are outside every generation
    finally:
        gc.unfreeze()
