"""The optimizer installed as the chart renders it, on the real control plane (tests/cluster).

Real: etcd, kube-apiserver (calling our webhook through the chart's webhook configurations),
kube-controller-manager, the default kube-scheduler and the chart's second kube-scheduler (calling
our extender through the chart's KubeSchedulerConfiguration), KWOK running the nodes, our webhook,
extender and controller each authenticated as its chart ServiceAccount. Stand-in: the GPU Operator
(tests/cluster/gpu_operator.py), for GPUs we do not have.
"""

from __future__ import annotations

import json
from typing import Any

import requests

from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node, make_pod

# An install with prometheus.url set (nothing listens there; the webhook never queries it): sharing
# policies in Automatic may act, as the install guide says.
CLUSTER = {"kubeon": True, "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)}
A100 = "NVIDIA-A100-SXM4-80GB"


def policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"selector": {"namespaces": [namespace]}, **spec}}


def pod_yaml(name: str, namespace: str, gpus: int = 1, memory: str | None = None) -> str:
    pod = make_pod(name, namespace, gpus=gpus)
    if memory:
        pod["metadata"].setdefault("annotations", {})["gpu.kubeon.io/gpu-memory"] = memory
    return json.dumps(pod)


def extender_count(cluster: Cluster, verb: str) -> float:
    assert cluster.kubeon is not None
    text = requests.get(f"{cluster.kubeon.extender_url}/metrics", timeout=5).text
    prefix = f'kubeon_extender_http_requests_total{{route="/{verb}",status="200"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


def bound_node(cluster: Cluster, namespace: str, name: str, timeout: float = 30.0) -> str:
    pod = cluster.wait_for(lambda: next((p for p in cluster.pods(namespace, bound=True)
                                         if p["metadata"]["name"] == name), None),
                           timeout=timeout, message=f"{namespace}/{name} bound")
    return str(pod["spec"]["nodeName"])


def test_kubectl_reports_the_real_server_version(kube_cluster: Cluster) -> None:
    version = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.35.4"


def test_gpu_pod_created_with_kubectl_is_packed_by_the_real_second_scheduler(kube_cluster: Cluster,
                                                                            namespace: str) -> None:
    c = kube_cluster
    fuller, fresh = f"{namespace}-fuller"[-50:], f"{namespace}-fresh"[-50:]
    for node in (fuller, fresh):
        c.create(make_node(node, A100, 8, labels={"kubeon-test/group": namespace}))
    c.wait_nodes_settled(fuller, fresh)  # a fresh node still tainted not-ready would lose by default
    load = make_pod("load", namespace, gpus=5, cpu="48", memory="512Gi")  # the default plugins prefer the other node
    load["spec"]["nodeName"] = fuller
    c.create(load)
    c.create(policy(f"{namespace}-pack", namespace, {
        "mode": "Automatic", "schedulerName": "kubeon-gpu-scheduler", "packing": {"strategy": "default"}}))
    wait_for_webhook_routing(c, namespace)
    before = {verb: extender_count(c, verb) for verb in ("filter", "prioritize")}
    pod = make_pod("w0", namespace, gpus=1, scheduler_name=None)  # as a user writes it
    pod["spec"]["nodeSelector"] = {"kubeon-test/group": namespace}
    c.kubectl("create", "-f", "-", input=json.dumps(pod))
    stored = c.core.read_namespaced_pod("w0", namespace)
    assert stored.spec.scheduler_name == "kubeon-gpu-scheduler"  # routed by our webhook at admission
    assert bound_node(c, namespace, "w0") == fuller  # the extender's packing preference, not spreading
    assert all(extender_count(c, verb) > count for verb, count in before.items()), "placed via the extender"
    [event] = [e for e in c.events(namespace, "Scheduled") if e["involvedObject"]["name"] == "w0"]
    assert event["reportingComponent"] == "kubeon-gpu-scheduler"


def test_the_default_scheduler_alone_spreads_the_same_pod(kube_cluster: Cluster, namespace: str) -> None:
    """The control: kube-scheduler's default profile puts the pod on the emptier node, so the test above
    fails if the extender's score is not what decides."""
    c = kube_cluster
    fuller, fresh = f"{namespace}-fuller"[-50:], f"{namespace}-fresh"[-50:]
    for node in (fuller, fresh):
        c.create(make_node(node, A100, 8, labels={"kubeon-test/group": namespace}))
    c.wait_nodes_settled(fuller, fresh)  # a fresh node still tainted not-ready would lose by default
    load = make_pod("load", namespace, gpus=5, cpu="48", memory="512Gi")
    load["spec"]["nodeName"] = fuller
    c.create(load)
    pod = make_pod("w0", namespace, gpus=1, scheduler_name=None)
    pod["metadata"]["labels"] = {"gpu.kubeon.io/skip": "true"}  # the chart's objectSelector: not ours
    pod["spec"]["nodeSelector"] = {"kubeon-test/group": namespace}
    c.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert c.core.read_namespaced_pod("w0", namespace).spec.scheduler_name == "default-scheduler"
    assert bound_node(c, namespace, "w0") == fresh


def test_mig_sharing_policy_rewrites_the_pod_through_the_real_api_server(kube_cluster: Cluster,
                                                                        namespace: str) -> None:
    c = kube_cluster
    node = f"{namespace}-mig"[-50:]
    c.create(make_node(node, A100, 8, mig={"1g.10gb": 7}, gpu_taint=True,
                       labels={"kubeon-test/group": namespace}))
    c.create(policy(f"{namespace}-share", namespace, {
        "mode": "Automatic", "schedulerName": "kubeon-gpu-scheduler",
        "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "8Gi"}}))
    wait_for_webhook_policy(c, f"{namespace}-share", namespace)
    pod = make_pod("infer", namespace, gpus=1, scheduler_name=None)
    pod["spec"]["nodeSelector"] = {"kubeon-test/group": namespace}
    c.kubectl("create", "-f", "-", input=json.dumps(pod))
    stored = c.core.read_namespaced_pod("infer", namespace)
    limits = stored.spec.containers[0].resources.limits
    assert limits.get("nvidia.com/mig-1g.10gb") == "1" and "nvidia.com/gpu" not in limits
    assert any(t.key == "nvidia.com/mig-1g.10gb" for t in stored.spec.tolerations or [])
    assert stored.spec.scheduler_name == "kubeon-gpu-scheduler"
    assert bound_node(c, namespace, "infer") == node


def wait_for_webhook_routing(c: Cluster, namespace: str, timeout: float = 30.0) -> None:
    """The webhook's watch has seen the packing policy: a server-side dry-run of a GPU pod is routed."""
    probe = make_pod("probe", namespace, gpus=1, scheduler_name=None)

    def routed() -> bool:
        done = c.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe))
        return bool(json.loads(done.stdout)["spec"]["schedulerName"] == "kubeon-gpu-scheduler")
    c.wait_for(routed, timeout=timeout, message="webhook routing GPU pods")


def wait_for_webhook_policy(c: Cluster, name: str, namespace: str, timeout: float = 30.0) -> None:
    """The webhook's watch has seen the policy: a server-side dry-run of a GPU pod is rewritten."""
    probe = make_pod("probe", namespace, gpus=1, scheduler_name=None)

    def rewritten() -> bool:
        done = c.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe))
        limits = json.loads(done.stdout)["spec"]["containers"][0]["resources"].get("limits") or {}
        return "nvidia.com/gpu" not in limits
    c.wait_for(rewritten, timeout=timeout, message=f"webhook serving GpuPolicy {name}")


def test_gpupolicies_print_the_crd_columns(kube_cluster: Cluster, namespace: str) -> None:
    c = kube_cluster
    c.create(policy(f"{namespace}-cols", namespace, {"mode": "Recommend", "guardrail": {"maxGpusPerPod": 2}}))
    header = c.kubectl("get", "gpupolicies").stdout.splitlines()[0].split()
    assert header[:3] == ["NAME", "KIND", "MODE"]
    row = c.wait_for(lambda: next((line.split() for line in c.kubectl("get", "gpupolicies").stdout.splitlines()
                                   if line.startswith(f"{namespace}-cols")), None), message="policy row")
    assert row[1:3] == ["guardrail", "Recommend"]


def test_crd_quantity_rule_is_enforced_by_the_api_server(kube_cluster: Cluster, namespace: str) -> None:
    bad = policy(f"{namespace}-bad", namespace, {"sharing": {"strategy": "MIG", "gpuMemory": "-8Gi"}})
    done = kube_cluster.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert done.returncode != 0 and "spec.sharing.gpuMemory" in done.stderr, done.stderr


def test_controller_holds_the_lease_as_its_service_account(kube_cluster: Cluster) -> None:
    """It takes the Lease as the identity it was given and says so on /metrics."""
    lease = kube_cluster.wait_for(lambda: _lease(kube_cluster), message="controller lease")
    assert lease["spec"]["holderIdentity"] == "kubeon-test-controller"
    assert kube_cluster.kubeon is not None
    metrics = f"http://127.0.0.1:{kube_cluster.kubeon.ports['controller']}/metrics"
    kube_cluster.wait_for(lambda: "kubeon_gpu_leader 1.0" in requests.get(metrics, timeout=5).text,
                          message="kubeon_gpu_leader 1.0 on /metrics")


def _lease(c: Cluster) -> dict[str, Any] | None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    try:
        response = client.CoordinationV1Api(c.api_client).read_namespaced_lease(
            "kubeon-gpu-optimizer", "kubeon-gpu", _preload_content=False)
    except ApiException:
        return None
    lease = dict(json.loads(response.data))
    return lease if lease["spec"].get("holderIdentity") else None
