"""The real webhook server: `kubeon-gpu webhook` (gunicorn gthread, TLS) in a subprocess.

Real: the CLI command, serving's gunicorn launcher, TLS with a CA and serving
cert from certs/ (SAN 127.0.0.1), `requests` verifying that CA, keep-alive
connections, prometheus metrics over HTTP. Faked: no Kubernetes API (the
server runs with --policies FILE, a static view); reviews are shaped as
kube-apiserver sends them (tests/webhook/payloads.py).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonpatch
import pytest
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs.material import generate
from tests.loopback import free_port
from tests.webhook.payloads import POLICIES, api_pod, policy_review, review


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("webhook")
    generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", tmp, ip_addresses=["127.0.0.1"])
    policies = tmp / "policies.yaml"
    policies.write_text(yaml.safe_dump_all(POLICIES), encoding="utf-8")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "webhook", "--cert-dir", str(tmp), "--bind", "127.0.0.1",
         "--port", str(port), "--workers", "2", "--threads", "2", "--policies", str(policies),
         "--prometheus-url", "http://127.0.0.1:9"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[2])
    base = f"https://127.0.0.1:{port}"
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override verify
    session.verify = str(tmp / "ca.crt")
    deadline = time.monotonic() + 30
    while True:
        try:
            if session.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("webhook did not start:\n" + (tmp / "server.log").read_text(errors="replace"))
        time.sleep(0.1)
    yield base, session, tmp
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_tls_is_verified_against_the_generated_ca(server) -> None:
    base, _, _ = server
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(base + "/healthz", timeout=5)  # system CAs do not know ours


def test_mutate_over_https(server) -> None:
    base, session, _ = server
    pod = api_pod(annotations={"gpu.kubeon.io/gpu-memory": "30Gi"})  # no nodes: H200 1g.35gb fits
    body = review(pod)
    resp = session.post(base + "/mutate", json=body, timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("application/json")
    answer = resp.json()["response"]
    assert answer["uid"] == body["request"]["uid"] and answer["patchType"] == "JSONPatch"
    after = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    assert "nvidia.com/mig-1g.35gb" in after["spec"]["containers"][0]["resources"]["limits"]
    again = session.post(base + "/mutate", json=review(after), timeout=5).json()["response"]
    assert "patch" not in again


def test_validate_over_https(server) -> None:
    base, session, _ = server
    denied = session.post(base + "/validate", json=review(api_pod("4"), namespace="training"), timeout=5)
    assert denied.json()["response"]["allowed"] is False
    bad = dict(POLICIES[0], spec={**POLICIES[0]["spec"], "mode": "Sometimes"})
    answer = session.post(base + "/validate", json=policy_review(bad), timeout=5).json()["response"]
    assert answer["allowed"] is False and "spec.mode" in answer["status"]["message"]


def test_dry_run_probes_and_metrics_over_https(server) -> None:
    base, session, _ = server
    answer = session.post(base + "/dry-run", json={"object": api_pod() | {"metadata": {
        "name": "p", "namespace": "inference"}}}, timeout=5).json()
    assert answer["decisions"][0]["policy"] == "share-inference"
    assert session.get(base + "/readyz", timeout=5).status_code == 200
    for _ in range(4):  # reach both workers: the scrape must sum them
        session.post(base + "/mutate", json=review(api_pod()), timeout=5)
    text = session.get(base + "/metrics", timeout=5).text
    assert "kubeon_webhook_decisions_total" in text and 'policy="share-inference"' in text
    assert "kubeon_webhook_http_request_duration_seconds_bucket" in text


@pytest.mark.parametrize("raw", [b"{", b"null", b'{"kind":"AdmissionReview"}', b"\x00\xff" * 10, b""],
                         ids=["truncated", "null", "no-request", "binary", "empty"])
def test_bad_bodies_are_400_json_over_https(server, raw: bytes) -> None:
    base, session, _ = server
    resp = session.post(base + "/mutate", data=raw, headers={"Content-Type": "application/json"}, timeout=5)
    assert resp.status_code == 400 and "error" in resp.json()
    assert "Traceback" not in resp.text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["/mutate", "/validate", "/dry-run"]), st.binary(max_size=200))
def test_random_bodies_never_5xx_over_https(server, path: str, raw: bytes) -> None:
    base, session, _ = server
    resp = session.post(base + path, data=raw, timeout=5)
    assert resp.status_code < 500
