"""The watch-fed ClusterView (kube/views.py) through the real webhook process and the test API server.

Real: `kubeon-gpu webhook --kubeconfig <api.kubeconfig>` (gunicorn gthread
over TLS with a CA from certs/, one worker) whose Reflectors list and watch
GpuPolicies, Namespaces and Nodes on the test API server
(tests/kubeapi: HTTP, resourceVersions, watch streams, the GpuPolicy CRD
from manifests/); objects are created, patched and deleted through the
official `kubernetes` client; the webhook is asked over HTTPS (POST
/dry-run without policies/namespace/nodes in the body, so it answers from
its watched view, and POST /mutate with kube-apiserver-shaped reviews).
Faked: nothing calls the webhook as an admission webhook here (no webhook
configuration is registered) and the nodes are GFD-labelled objects without
GPUs.
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
from kubernetes import client

from certs.material import generate
from gpupolicy.model import GROUP, PLURAL, VERSION
from tests.kubeapi import ApiServer
from tests.cluster.objects import make_node, make_pod
from tests.loopback import free_port
from tests.webhook.payloads import api_pod, review

REPO = Path(__file__).resolve().parents[2]
GPUPOLICY_CRD = REPO / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
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


class WebhookProcess:
    """`kubeon-gpu webhook` against an API server's kubeconfig; `session` verifies the generated CA."""

    def __init__(self, api: ApiServer, tmp: Path) -> None:
        generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", tmp, ip_addresses=["127.0.0.1"])
        port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log_path = tmp / "webhook.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "webhook", "--cert-dir", str(tmp), "--bind", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--threads", "2", "--kubeconfig", str(api.kubeconfig),
             "--prometheus-url", "http://127.0.0.1:9"],  # configured (never queried by the webhook)
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.base = f"https://127.0.0.1:{port}"
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(tmp / "ca.crt")

    def get(self, path: str) -> int:
        """The status code, or 0 while the server is not answering yet (its worker may still be booting)."""
        try:
            return self.session.get(self.base + path, timeout=5).status_code
        except requests.RequestException:
            if self.proc.poll() is not None:
                pytest.fail("webhook exited:\n" + self.log_path.read_text(errors="replace"))
            return 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.session.post(self.base + path, json=body, timeout=5)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def decisions(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The webhook's dry-run decisions for a pod, from its watched view (nothing else in the body)."""
        return self.post("/dry-run", {"object": pod})["decisions"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, WebhookProcess]]:
    with ApiServer.start(crd_files=[GPUPOLICY_CRD]) as api:
        webhook = WebhookProcess(api, tmp_path_factory.mktemp("views"))
        try:
            eventually(lambda: webhook.get("/readyz") == 200, "/readyz 200")
            yield api, webhook
        finally:
            webhook.stop()


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def custom(api: ApiServer) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api.api_client())


def decoded_patch(resp: dict[str, Any]) -> list[dict[str, Any]]:
    raw = resp["response"].get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def test_readyz_is_503_until_every_cache_synced(tmp_path: Path) -> None:
    """Started before the GpuPolicy CRD exists, the policy list 404s: not ready until the CRD is installed."""
    with ApiServer.start() as api:
        webhook = WebhookProcess(api, tmp_path)
        try:
            eventually(lambda: webhook.get("/healthz") == 200, "/healthz 200")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # namespaces and nodes sync at once, policies cannot
                assert webhook.get("/readyz") == 503
                time.sleep(0.1)
            api.install_crd(GPUPOLICY_CRD)
            eventually(lambda: webhook.get("/readyz") == 200, "/readyz 200 after the CRD is installed")
        finally:
            webhook.stop()


def test_policy_create_update_delete_reach_mutate(watched: tuple[ApiServer, WebhookProcess]) -> None:
    api, webhook = watched
    objects = custom(api)
    body = review(api_pod(), namespace="flow")
    assert webhook.post("/mutate", body)["response"] == {"uid": body["request"]["uid"], "allowed": True}

    objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, policy("flow-share", {
        "mode": "Automatic", "selector": {"namespaces": ["flow"]}, "sharing": {"strategy": "TimeSlicing"}}))
    pod = api_pod()
    patch = eventually(lambda: decoded_patch(webhook.post("/mutate", review(pod, namespace="flow"))),
                       "a patch from the created policy")
    after = jsonpatch.apply_patch(pod, patch)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1", "memory": "16Gi"}
    assert after["metadata"]["annotations"]["gpu.kubeon.io/policy"] == "flow-share"

    objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "flow-share", {"spec": {"mode": "Recommend"}})
    recommended = eventually(
        lambda: (r := webhook.post("/mutate", review(api_pod(), namespace="flow"))["response"]).get("warnings")
        and r, "a Recommend warning after the update")
    assert "patch" not in recommended
    assert recommended["warnings"] == ["kubeon-gpu flow-share (Recommend): would use nvidia.com/gpu.shared"]

    objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "flow-share")
    eventually(lambda: webhook.post("/mutate", review(api_pod(), namespace="flow"))["response"].keys()
               == {"uid", "allowed"}, "a plain answer after the delete")


def test_namespace_selector_follows_namespace_labels(watched: tuple[ApiServer, WebhookProcess]) -> None:
    api, webhook = watched
    core = client.CoreV1Api(api.api_client())
    core.create_namespace({"metadata": {"name": "lab"}})
    custom(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, policy("ml-teams", {
        "mode": "Automatic", "selector": {"namespaceSelector": {"matchLabels": {"team": "ml"}}},
        "sharing": {"strategy": "TimeSlicing"}}))
    probe = make_pod("probe", "lab", gpus=1)
    eventually(lambda: webhook.decisions(make_pod("probe", "elsewhere", gpus=1)) == [], "the policy's sync")
    # The policy is watched (an unlabelled namespace proves nothing alone): a labelled namespace matches it.
    core.create_namespace({"metadata": {"name": "lab-ml", "labels": {"team": "ml"}}})
    eventually(lambda: [d["policy"] for d in webhook.decisions(make_pod("probe", "lab-ml", gpus=1))]
               == ["ml-teams"], "ml-teams for the labelled namespace")
    assert webhook.decisions(probe) == []

    core.patch_namespace("lab", {"metadata": {"labels": {"team": "ml"}}})
    [decision] = eventually(lambda: webhook.decisions(probe), "ml-teams after labelling lab")
    assert (decision["policy"], decision["action"], decision["applied"]) == ("ml-teams", "UseTimeSlicing", True)

    core.patch_namespace("lab", {"metadata": {"labels": {"team": None}}})
    eventually(lambda: webhook.decisions(probe) == [], "no decision after the label is removed")


def test_auto_sizing_uses_the_products_of_watched_nodes(watched: tuple[ApiServer, WebhookProcess]) -> None:
    api, webhook = watched
    core = client.CoreV1Api(api.api_client())
    custom(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, policy("sizing", {
        "mode": "Automatic", "selector": {"namespaces": ["sizing"]},
        "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "8Gi"}}))
    probe = make_pod("probe", "sizing", gpus=1)

    def reason() -> str:
        decisions = webhook.decisions(probe)
        return decisions[0]["reason"] if decisions else ""

    # No nodes: every MIG-capable catalog product is a candidate; the smallest fit is an A100-80GB 1g.10gb.
    assert "1g.10gb on NVIDIA-A100-SXM4-80GB" in eventually(reason, "the sizing policy")
    # A node is known and none offers a slice: the catalog's choice, and the pod stays whole.
    core.create_node(make_node("cpu-0", None, 0))
    eventually(lambda: "no node offers nvidia.com/mig-1g.10gb yet" in reason(), "a known node without slices")
    # Beside the node without GPUs (seen above), the H200's profiles decide.
    core.create_node(make_node("h200-0", "NVIDIA-H200", 8, mig={"1g.18gb": 7}))
    eventually(lambda: "nvidia.com/mig-1g.18gb instead of nvidia.com/gpu: 1g.18gb on NVIDIA-H200" in reason(),
               "sizing on the H200 node's profiles")
    core.delete_node("h200-0")
    eventually(lambda: "no node offers nvidia.com/mig-1g.10gb yet" in reason(), "the catalog again after the delete")
    core.delete_node("cpu-0")
    eventually(lambda: "1g.10gb on NVIDIA-A100-SXM4-80GB" in reason(), "no node known again")


def test_a_node_heartbeat_keeps_the_view_a_label_change_rebuilds_it() -> None:
    """Kubelets rewrite their Node's status every few minutes; only what the view reads (labels,
    allocatable, spec) may rebuild it (the trimmed Node cache's Reflector tells of nothing else), or a
    large cluster rebuilds the view, and empties the webhook's memo, in most admission requests."""
    from kube.views import WatchedView

    with ApiServer.start(crd_files=[GPUPOLICY_CRD]) as api:
        core = client.CoreV1Api(api.api_client())
        core.create_node(make_node("gpu-1"))
        core.create_node(make_node("gpu-2"))
        view = WatchedView(api.api_client(), with_nodes=True).start()
        try:
            eventually(lambda: view.ready() and len(view.current().nodes) == 2, "both nodes in the view")
            before, rebuilds = view.current(), view.rebuilds
            beat = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                               "lastHeartbeatTime": "2026-12-03T10:00:00Z"}]}}
            version = core.patch_node_status("gpu-1", beat).metadata.resource_version
            assert view.nodes is not None
            eventually(lambda: view.nodes.snapshot()["gpu-1"]["metadata"]["resourceVersion"] == version,
                       "the heartbeat in the watch cache (kept trimmed: kube/trim.py)")
            assert "conditions" not in view.nodes.snapshot()["gpu-1"]["status"]
            deadline = time.monotonic() + 0.5  # the cache is written just before the view is told
            while time.monotonic() < deadline:
                assert view.current() is before and view.rebuilds == rebuilds
                time.sleep(0.01)
            core.patch_node("gpu-2", {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
            relabelled = eventually(lambda: next((n for n in view.current().nodes if n.name == "gpu-2"
                                                  and n.labels.get("nvidia.com/mig.config")), None),
                                    "the new label in the view")
            assert relabelled.labels["nvidia.com/mig.config"] == "all-1g.10gb" and view.rebuilds == rebuilds + 1
            core.delete_node("gpu-1")
            eventually(lambda: [n.name for n in view.current().nodes] == ["gpu-2"], "the deleted node gone")
        finally:
            view.stop()
