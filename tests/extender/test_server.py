"""`kubeon-gpu extender` as a process: gunicorn, watches of the real kube-apiserver, the wire over real HTTP.

Real: the extender as the chart renders it (tests/cluster: `python -m cli.main
extender` with the chart's args, serving.server's gunicorn, its Reflectors
authenticated as the chart's ServiceAccount), the GpuPolicy CRD, KWOK nodes,
and HTTP from `requests`. Faked: nothing (the test plays kube-scheduler; the
chart's second scheduler is not run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node
from tests.extender.payloads import args, policy, wire_pod
from tests.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
CLUSTER = {"kubeon": True, "kubeon_components": ("extender",)}
EXPECTED_FILTER = {
    "Nodes": None, "NodeNames": ["a100-0"],
    "FailedNodes": {"ghost": "kubeon-gpu: node not known to the optimizer"},
    "FailedAndUnresolvableNodes": {"h100-0": "kubeon-gpu: node cordoned or draining"}, "Error": ""}


@pytest.fixture(scope="module")
def base(kube_cluster: Cluster) -> str:
    """The extender's URL, once its watches hold the nodes and the policy created here."""
    assert kube_cluster.kubeon is not None
    for node in (make_node("a100-0", "NVIDIA-A100-SXM4-80GB", 8),
                 make_node("h100-0", "NVIDIA-H100-80GB-HBM3", 8, labels={"gpu.kubeon.io/draining": "true"})):
        kube_cluster.create_node(node)
    kube_cluster.create(policy("pack", {"packing": {"strategy": "bestfit"}}))
    url = kube_cluster.kubeon.extender_url
    pod = wire_pod("p", gpus=1)

    def synced() -> bool:
        resp = requests.post(f"{url}/filter", json=args(pod, ["a100-0", "h100-0", "ghost"]), timeout=5)
        return bool(resp.json() == EXPECTED_FILTER) and requests.post(
            f"{url}/prioritize", json=args(pod, ["a100-0"]), timeout=5).json() == [{"Host": "a100-0", "Score": 10}]

    kube_cluster.wait_for(synced, timeout=60, message="the extender's watches to hold the nodes and the policy")
    return url


def test_filter_and_prioritize_through_gunicorn(base: str) -> None:
    session = requests.Session()
    pod = wire_pod("p", gpus=1)
    resp = session.post(f"{base}/filter", json=args(pod, ["a100-0", "h100-0", "ghost"]), timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "application/json"
    assert resp.json() == EXPECTED_FILTER
    resp = session.post(f"{base}/prioritize", json=args(pod, ["a100-0"]), timeout=5)
    assert resp.json() == [{"Host": "a100-0", "Score": 10}]
    assert float(resp.headers["X-Kubeon-Handler-Seconds"]) < 1.0
    metrics = session.get(f"{base}/metrics", timeout=5).text
    assert 'kubeon_extender_decisions_total{outcome="placed",strategy="bestfit",verb="prioritize"}' in metrics
    assert session.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}


def test_the_learned_mix_is_in_the_metrics_gunicorn_serves(base: str) -> None:
    """Under gunicorn, /metrics sums the workers' multiprocess files: what is read from the live process
    at scrape (the mix, how many GPU pods it learned) must be there too, with the values /debug/mix shows."""
    requests.post(f"{base}/filter", json=args(wire_pod("learned", gpus=2), ["a100-0"]), timeout=5)
    debug = requests.get(f"{base}/debug/mix", timeout=5).json()
    assert debug["gpu_pods_learned"] >= 1 and debug["types"]
    metrics = requests.get(f"{base}/metrics", timeout=5).text
    learned = [line for line in metrics.splitlines() if line.startswith("kubeon_extender_mix_gpu_pods")]
    assert learned == [f"kubeon_extender_mix_gpu_pods {float(debug['gpu_pods_learned'])}"], learned
    weights = [line for line in metrics.splitlines() if line.startswith("kubeon_extender_mix_weight{")]
    assert len(weights) == len(debug["types"]), metrics


def test_bad_input_through_gunicorn_is_never_a_500(base: str) -> None:
    resp = requests.post(f"{base}/filter", data=b"{", headers={"Content-Type": "application/json"}, timeout=5)
    assert resp.status_code == 400 and "malformed JSON" in resp.json()["error"]
    resp = requests.post(f"{base}/filter", json={"NodeNames": ["a100-0"]}, timeout=5)
    assert resp.status_code == 200 and resp.json()["Error"] == "Pod: missing"
    resp = requests.post(f"{base}/prioritize", json={"Pod": wire_pod("p"), "NodeNames": 3}, timeout=5)
    assert resp.status_code == 400 and "NodeNames" in resp.json()["error"]
    resp = requests.get(f"{base}/filter", timeout=5)
    assert resp.status_code == 405


def _no_cluster_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, "HOME": str(home), "PYTHONUNBUFFERED": "1"}


def test_refuses_to_start_without_a_cluster_config(tmp_path: Path) -> None:
    """No kubeconfig, not in a cluster: one clear line and exit 2, not an extender that knows no node."""
    done = subprocess.run([sys.executable, "-m", "cli.main", "extender", "--port", str(free_port()),
                           "--bind", "127.0.0.1"], cwd=REPO, env=_no_cluster_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kubeon-gpu extender: cannot load Kubernetes configuration")
    assert "--standalone" in lines[0] and "Traceback" not in done.stderr


def test_standalone_starts_without_a_cluster(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "extender.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "extender", "--port", str(port),
                                 "--bind", "127.0.0.1", "--standalone"], cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT, env=_no_cluster_env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
