"""The watch-fed ClusterView (kube/views.py) through the real webhook process and the real kube-apiserver.

Real: the webhook as the chart renders it (tests/cluster: gunicorn gthread over
TLS with a CA from certs/, its Reflectors listing and watching GpuPolicies,
Namespaces and Nodes as the chart's webhook ServiceAccount), kube-apiserver
with the GpuPolicy CRD from manifests/ (its CEL rules enforced), objects
created, patched and deleted through the official `kubernetes` client; the
webhook is asked over HTTPS (POST /dry-run without policies/namespace/nodes in
the body, so it answers from its watched view, and POST /mutate with
kube-apiserver-shaped reviews). Faked: the nodes are GFD-labelled objects
without GPUs. The readiness test starts its own cluster and webhook process:
it needs a cluster without the CRD.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch
import pytest
import requests
import yaml
from kubernetes import client

from certs.material import generate
from gpupolicy.model import GROUP, PLURAL, VERSION
from kube.config import load_api_client
from tests.cluster.cluster import Cluster
from tests.cluster.fixtures import start_cluster
from tests.cluster.kubeon import CRDS, RELEASE, apply_objects
from tests.cluster.objects import make_node, make_pod
from tests.loopback import free_port
from tests.webhook.payloads import api_pod, review

REPO = Path(__file__).resolve().parents[2]
# the webhook with --prometheus-url (configured, never queried by the webhook): sharing policies may act
CLUSTER = {"kubeon": True, "kubeon_components": ("webhook",), "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)}
T = TypeVar("T")


def eventually(probe: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll until `probe` returns something truthy (watch events arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Webhook:
    """A running webhook's HTTPS base and a session verifying its CA."""

    def __init__(self, base: str, ca: Path) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(ca)

    def get(self, path: str) -> int:
        """The status code, or 0 while the server is not answering yet (its worker may still be booting)."""
        try:
            return self.session.get(self.base + path, timeout=5).status_code
        except requests.RequestException:
            return 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.session.post(self.base + path, json=body, timeout=5)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def decisions(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The webhook's dry-run decisions for a pod, from its watched view (nothing else in the body)."""
        return list(self.post("/dry-run", {"object": pod})["decisions"])


class WebhookProcess(Webhook):
    """`kubeon-gpu webhook` against a kubeconfig, started here."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", tmp, ip_addresses=["127.0.0.1"])
        port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log_path = tmp / "webhook.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "webhook", "--cert-dir", str(tmp), "--bind", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--threads", "2", "--kubeconfig", str(kubeconfig),
             "--prometheus-url", "http://127.0.0.1:9"],  # configured (never queried by the webhook)
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        super().__init__(f"https://127.0.0.1:{port}", tmp / "ca.crt")

    def get(self, path: str) -> int:
        status = super().get(path)
        if not status and self.proc.poll() is not None:
            pytest.fail("webhook exited:\n" + self.log_path.read_text(errors="replace"))
        return status

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def webhook(kube_cluster: Cluster) -> Webhook:
    """The chart's webhook of the module's cluster, ready (every cache synced)."""
    assert kube_cluster.kubeon is not None
    hook = Webhook(kube_cluster.kubeon.webhook_url, kube_cluster.kubeon.tls / "ca.crt")
    eventually(lambda: hook.get("/readyz") == 200, "/readyz 200")
    return hook


@pytest.fixture
def policies(kube_cluster: Cluster) -> Iterator[client.CustomObjectsApi]:
    """The admin's GpuPolicy client; the test's policies are deleted after it."""
    objects = kube_cluster.custom
    before = {o["metadata"]["name"] for o in objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]}
    yield objects
    for item in objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        if item["metadata"]["name"] not in before:
            objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, item["metadata"]["name"])


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def decoded_patch(resp: dict[str, Any]) -> list[dict[str, Any]]:
    raw = resp["response"].get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def settled(core: client.CoreV1Api, name: str) -> None:
    """Wait for what the control plane writes on a new node: the node lifecycle controller lifts the
    not-ready taint admission put on it (a spec change the view reads) and copies kubernetes.io/os and
    /arch to their beta.kubernetes.io labels (reconcileNodeLabels, a label change the view reads), the TTL
    controller annotates it."""
    def done(node: client.V1Node) -> bool:
        labels = node.metadata.labels or {}
        return (not node.spec.taints and "node.alpha.kubernetes.io/ttl" in (node.metadata.annotations or {})
                and all(f"beta.{key}" in labels for key in ("kubernetes.io/os", "kubernetes.io/arch") if key in labels))
    eventually(lambda: done(core.read_node(name)), f"{name} settled")


def test_readyz_is_503_until_every_cache_synced(tmp_path: Path) -> None:
    """Started before the GpuPolicy CRD exists, the policy list 404s: not ready until the CRD is installed."""
    cluster = start_cluster(gpu_operator=False)
    try:
        webhook = WebhookProcess(cluster.kubeconfig, tmp_path)
        try:
            eventually(lambda: webhook.get("/healthz") == 200, "/healthz 200")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # namespaces and nodes sync at once, policies cannot
                assert webhook.get("/readyz") == 503
                time.sleep(0.1)
            apply_objects(cluster.api_client, [yaml.safe_load(p.read_text()) for p in CRDS])
            eventually(lambda: webhook.get("/readyz") == 200, "/readyz 200 after the CRD is installed")
        finally:
            webhook.stop()
    finally:
        cluster.stop()


def test_policy_create_update_delete_reach_mutate(webhook: Webhook, policies: client.CustomObjectsApi,
                                                  namespace: str) -> None:
    body = review(api_pod(), namespace=namespace)
    assert webhook.post("/mutate", body)["response"] == {"uid": body["request"]["uid"], "allowed": True}

    name = f"{namespace}-share"
    policies.create_cluster_custom_object(GROUP, VERSION, PLURAL, policy(name, {
        "mode": "Automatic", "selector": {"namespaces": [namespace]}, "sharing": {"strategy": "TimeSlicing"}}))
    pod = api_pod()
    patch = eventually(lambda: decoded_patch(webhook.post("/mutate", review(pod, namespace=namespace))),
                       "a patch from the created policy")
    after = jsonpatch.apply_patch(pod, patch)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1", "memory": "16Gi"}
    assert after["metadata"]["annotations"]["gpu.kubeon.io/policy"] == name

    policies.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"mode": "Recommend"}})
    recommended = eventually(
        lambda: (r := webhook.post("/mutate", review(api_pod(), namespace=namespace))["response"]).get("warnings")
        and r, "a Recommend warning after the update")
    assert "patch" not in recommended
    assert recommended["warnings"] == [f"kubeon-gpu {name} (Recommend): would use nvidia.com/gpu.shared"]

    policies.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    eventually(lambda: webhook.post("/mutate", review(api_pod(), namespace=namespace))["response"].keys()
               == {"uid", "allowed"}, "a plain answer after the delete")


def test_namespace_selector_follows_namespace_labels(kube_cluster: Cluster, webhook: Webhook,
                                                     policies: client.CustomObjectsApi, namespace: str) -> None:
    core = kube_cluster.core
    lab, lab_ml, team = f"{namespace}-lab", f"{namespace}-lab-ml", namespace[-40:]
    core.create_namespace({"metadata": {"name": lab}})
    try:
        policies.create_cluster_custom_object(GROUP, VERSION, PLURAL, policy(f"{namespace}-ml-teams", {
            "mode": "Automatic", "selector": {"namespaceSelector": {"matchLabels": {"team": team}}},
            "sharing": {"strategy": "TimeSlicing"}}))
        probe = make_pod("probe", lab, gpus=1)
        eventually(lambda: webhook.decisions(make_pod("probe", "elsewhere", gpus=1)) == [], "the policy's sync")
        # The policy is watched (an unlabelled namespace proves nothing alone): a labelled namespace matches it.
        core.create_namespace({"metadata": {"name": lab_ml, "labels": {"team": team}}})
        eventually(lambda: [d["policy"] for d in webhook.decisions(make_pod("probe", lab_ml, gpus=1))]
                   == [f"{namespace}-ml-teams"], "ml-teams for the labelled namespace")
        assert webhook.decisions(probe) == []

        core.patch_namespace(lab, {"metadata": {"labels": {"team": team}}})
        [decision] = eventually(lambda: webhook.decisions(probe), "ml-teams after labelling lab")
        assert (decision["policy"], decision["action"], decision["applied"]) == (
            f"{namespace}-ml-teams", "UseTimeSlicing", True)

        core.patch_namespace(lab, {"metadata": {"labels": {"team": None}}})
        eventually(lambda: webhook.decisions(probe) == [], "no decision after the label is removed")
    finally:
        for name in (lab, lab_ml):
            kube_cluster.delete_namespace(name)


def test_auto_sizing_uses_the_products_of_watched_nodes(kube_cluster: Cluster, webhook: Webhook,
                                                        policies: client.CustomObjectsApi, namespace: str) -> None:
    core = kube_cluster.core
    assert not core.list_node().items, "this test reads a cluster without nodes first"
    policies.create_cluster_custom_object(GROUP, VERSION, PLURAL, policy(f"{namespace}-sizing", {
        "mode": "Automatic", "selector": {"namespaces": [namespace]},
        "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "8Gi"}}))
    probe = make_pod("probe", namespace, gpus=1)

    def reason() -> str:
        decisions = webhook.decisions(probe)
        return decisions[0]["reason"] if decisions else ""

    cpu, h200 = f"{namespace}-cpu-0", f"{namespace}-h200-0"
    try:
        # No nodes: every MIG-capable catalog product is a candidate; the smallest fit is an A100-80GB 1g.10gb.
        assert "1g.10gb on NVIDIA-A100-SXM4-80GB" in eventually(reason, "the sizing policy")
        # A node is known and none offers a slice: the catalog's choice, and the pod stays whole.
        kube_cluster.create_node(make_node(cpu, None, 0))
        eventually(lambda: "no node offers nvidia.com/mig-1g.10gb yet" in reason(), "a known node without slices")
        # Beside the node without GPUs (seen above), the H200's profiles decide.
        kube_cluster.create_node(make_node(h200, "NVIDIA-H200", 8, mig={"1g.18gb": 7}))
        eventually(lambda: "nvidia.com/mig-1g.18gb instead of nvidia.com/gpu: 1g.18gb on NVIDIA-H200" in reason(),
                   "sizing on the H200 node's profiles")
        core.delete_node(h200)
        eventually(lambda: "no node offers nvidia.com/mig-1g.10gb yet" in reason(),
                   "the catalog again after the delete")
        core.delete_node(cpu)
        eventually(lambda: "1g.10gb on NVIDIA-A100-SXM4-80GB" in reason(), "no node known again")
    finally:
        for name in (cpu, h200):
            if any(n.metadata.name == name for n in core.list_node().items):
                core.delete_node(name)


def test_a_node_heartbeat_keeps_the_view_a_label_change_rebuilds_it(kube_cluster: Cluster, namespace: str) -> None:
    """Kubelets rewrite their Node's status every few minutes; only what the view reads (labels,
    allocatable, spec) may rebuild it (the trimmed Node cache's Reflector tells of nothing else), or a
    large cluster rebuilds the view, and empties the webhook's memo, in most admission requests."""
    from kube.views import WatchedView

    assert kube_cluster.kubeon is not None
    core = kube_cluster.core
    one, two = f"{namespace}-gpu-1", f"{namespace}-gpu-2"
    for name in (one, two):  # not KWOK's: nothing but this test and the control plane writes them
        core.create_node(make_node(name))
    api = load_api_client(str(kube_cluster.kubeon.kubeconfig_of(kube_cluster.api_client, f"{RELEASE}-webhook")))
    view = WatchedView(api, with_nodes=True).start()
    try:
        for name in (one, two):
            settled(core, name)
        eventually(lambda: view.ready() and {n.name for n in view.current().nodes} == {one, two}
                   and view.nodes is not None and not any(view.nodes.snapshot()[n]["spec"].get("taints")
                                                          for n in (one, two)), "both settled nodes in the view")
        before, rebuilds = view.current(), view.rebuilds
        beat = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "lastHeartbeatTime": "2026-12-03T10:00:00Z"}]}}
        version = core.patch_node_status(one, beat).metadata.resource_version
        assert view.nodes is not None
        eventually(lambda: view.nodes.snapshot()[one]["metadata"]["resourceVersion"] == version,
                   "the heartbeat in the watch cache (kept trimmed: kube/trim.py)")
        assert "conditions" not in view.nodes.snapshot()[one]["status"]
        deadline = time.monotonic() + 0.5  # the cache is written just before the view is told
        while time.monotonic() < deadline:
            assert view.current() is before and view.rebuilds == rebuilds
            time.sleep(0.01)
        core.patch_node(two, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
        relabelled = eventually(lambda: next((n for n in view.current().nodes if n.name == two
                                              and n.labels.get("nvidia.com/mig.config")), None),
                                "the new label in the view")
        assert relabelled.labels["nvidia.com/mig.config"] == "all-1g.10gb" and view.rebuilds == rebuilds + 1
        core.delete_node(one)
        eventually(lambda: [n.name for n in view.current().nodes] == [two], "the deleted node gone")
    finally:
        view.stop()
        api.close()
        for name in (one, two):
            if any(n.metadata.name == name for n in core.list_node().items):
                core.delete_node(name)
