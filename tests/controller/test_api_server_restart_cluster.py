"""kube-apiserver killed and started again under the running optimizer (a control-plane upgrade, a crash):
every watch is cut; the components must re-establish them and lose nothing written after the restart,
and the controller's Lease must not be left behind.

Real: the whole control plane (tests/cluster) and the optimizer as the chart renders it (webhook,
extender, the second kube-scheduler, controller), each as its chart ServiceAccount; the kill is a
SIGTERM to kube-apiserver (grace 0.1 s, then SIGKILL), which starts again on the same port and etcd.
While it is down, etcd is compacted to its current revision (through its HTTP gateway), so a watch
resumed from a resourceVersion seen before is answered 410 Gone and must list again. Faked: the GPUs (the
GPU Operator shim). The controller's full resync is 300 s here, so a policy made
after the restart gets its status within the test's wait only through the controller's GpuPolicy watch;
its Lease lasts 60 s (renewed every second), longer than any restart, so losing it would be a bug and
not the restart's length (a replica whose Lease expires exits, by design, and its Deployment restarts it).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from typing import Any

from kubernetes import client

from kube.leases import get_lease
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node, make_pod

CLUSTER = {
    "kubeon": True,
    "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",),
    "kubeon_args": {"controller": ["--resync-seconds=300", "--lease-duration-seconds=60", "--renew-seconds=1"]},
}
A100 = "NVIDIA-A100-SXM4-80GB"
LEASE = "kubeon-gpu-optimizer"
COMPONENTS = ("webhook", "extender", "kubeon-gpu-scheduler", "controller")


def policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"selector": {"namespaces": [namespace]}, **spec}}


def compact_etcd(c: Cluster) -> int:
    """Compact etcd at its current revision (every older resourceVersion is gone); that revision."""
    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{c.plane.ports['etcd']}{path}", method="POST",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.loads(answer.read()))

    revision = int(post("/v3/kv/range", {"key": base64.b64encode(b"/registry").decode()})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def ready_condition(c: Cluster, name: str) -> dict[str, Any] | None:
    """The controller's Ready condition on a policy, once it has written the policy's status."""
    obj = client.CustomObjectsApi(c.api_client).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1",
                                                                         "gpupolicies", name)
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return next((x for x in status.get("conditions") or [] if x["type"] == "Ready"), None)


def routed(c: Cluster, namespace: str) -> bool:
    """A server-side dry run of a user's GPU pod comes back routed to the second scheduler (the webhook's
    policy view has the packing policy)."""
    probe = make_pod("probe", namespace, gpus=1, scheduler_name=None)
    done = c.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe), check=False)
    return done.returncode == 0 and json.loads(done.stdout)["spec"].get("schedulerName") == "kubeon-gpu-scheduler"


def test_the_optimizer_carries_on_across_a_kube_apiserver_restart(kube_cluster: Cluster, namespace: str) -> None:
    c = kube_cluster
    lease = c.wait_for(lambda: get_lease(c.api_client, "kubeon-gpu", LEASE), timeout=60, message="the Lease")
    holder, transitions = lease.holder, lease.transitions
    c.create(policy(f"{namespace}-guard", namespace, {"mode": "Automatic", "guardrail": {"maxGpusPerPod": 8}}))
    c.wait_for(lambda: ready_condition(c, f"{namespace}-guard"), timeout=60, message="status before the restart")

    c.plane.children.stop_one(c.plane.children.get("kube-apiserver"), grace=0.1)
    compact_etcd(c)
    c.plane.start_apiserver()
    restarted_at = time.time()

    # Written right after the restart: each reaches its component only through a watch made again.
    node = f"{namespace}-after"[-50:]
    c.create(make_node(node, A100, 8, labels={"kubeon-test/group": namespace}))
    c.create(policy(f"{namespace}-pack", namespace, {
        "mode": "Automatic", "schedulerName": "kubeon-gpu-scheduler", "packing": {"strategy": "default"}}))

    ready = c.wait_for(lambda: ready_condition(c, f"{namespace}-pack"), timeout=60,
                       message="the controller's status on a policy made after the restart (its watch)")
    assert ready["status"] == "True", ready
    c.wait_for(lambda: routed(c, namespace), timeout=60,
               message="the webhook routing by a policy made after the restart")
    pod = make_pod("w0", namespace, gpus=1, scheduler_name=None)
    pod["spec"]["nodeSelector"] = {"kubeon-test/group": namespace}
    c.create(pod)
    bound = c.wait_for(lambda: next((p for p in c.pods(namespace, bound=True) if p["metadata"]["name"] == "w0"), None),
                       timeout=60, message="w0 bound through the extender on a node made after the restart")
    assert bound["spec"]["nodeName"] == node and bound["spec"]["schedulerName"] == "kubeon-gpu-scheduler"

    renewed = c.wait_for(lambda: (found := get_lease(c.api_client, "kubeon-gpu", LEASE)) and found.renew_time
                         and found.renew_time > restarted_at + 1 and found, timeout=30,
                         message="the Lease renewed after the restart")
    assert (renewed.holder, renewed.transitions) == (holder, transitions), "the same leader, never a takeover"
    for name in COMPONENTS:
        child = c.plane.children.get(name)
        assert child.alive(), f"{name} exited across the restart:\n{child.tail()}"
    log = c.plane.children.get("controller").log.read_text()
    assert "leadership lost" not in log and "Traceback" not in log, log[-3000:]
