"""End to end: measured GPU memory -> Applied right-sizing proposal -> restart -> pods rewritten to that size.

Real: kube-apiserver v1.35; kube-controller-manager's Deployment and ReplicaSet controllers
creating pods through admission; the default kube-scheduler; KWOK running the pods; the
`kubeon-gpu webhook` process behind the chart's webhook configurations (its watch delivers the
policy status); the controller frame in this process (`controller.command.build`, right-sizing
every second), authenticated as the chart's controller ServiceAccount, reading a real Prometheus
(/usr/bin/prometheus, tests/promharness) scraping a DCGM-format exporter with backfilled history.
Faked: the GPUs (the exporter's series are scripted: a 7 GiB peak on an A100-80GB; KWOK nodes
labelled as GFD labels A100s), the containers.

The story: a Deployment asking `nvidia.com/gpu: 1` runs on a whole GPU; an Automatic MIG `auto`
policy with `rollout: Restart` and `gpuMemory: 30Gi` (which alone would choose 3g.40gb) is created;
the controller measures the 7 GiB peak, writes an Applied proposal with resource
nvidia.com/mig-1g.10gb, then restarts the Deployment by evicting its pod (the real Eviction API;
the Deployment itself is never written); the replacement pods, created by kube-controller-manager
through admission, ask for nvidia.com/mig-1g.10gb and land on the MIG node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from controller.command import ControllerProcess, build
from controller.policysync import PolicySync
from controller.rightsizing import RightSizingReconciler
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.objects import make_deployment, make_pod
from tests.e2e.conftest import RELEASE_NAMESPACE, group_nodes, in_group, wait_for_policy, webhook_dry_run
from tests.missing import missing
from tests.promharness import DcgmExporter, PrometheusServer, available, gpu_labels

# The webhook as an install with prometheus.url (Automatic sharing may act; it never queries it);
# the controller starts in the test, once Prometheus is up, pointed at it.
CLUSTER = {"kubeon": True, "kubeon_components": ("webhook",),
           "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)}
RIGHT_SIZE = "nvidia.com/mig-1g.10gb"
GIB_MIB = 1024.0


@pytest.fixture(scope="module")
def dcgm() -> Iterator[DcgmExporter]:
    reason = available()
    if reason:
        missing(reason)
    exporter = DcgmExporter()
    yield exporter
    exporter.stop()


def policy(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
        "spec": {"mode": "Automatic", "selector": {"namespaces": [namespace]},
                 "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "30Gi",
                             "gpuModels": ["NVIDIA-A100-SXM4-80GB"], "rollout": "Restart", "window": "10m"}},
    }


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(cluster.api_client).get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return obj.get("status") or {}


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"].get("limits") or {})


def start_controller(cluster: Cluster, prometheus_url: str) -> ControllerProcess:
    """The controller frame (`controller.command.build`: lease loop, policy sync, right-sizing on the
    real clock, PrometheusMetricsSource over HTTP) in this process, authenticated as the chart's
    controller ServiceAccount, so the chart's RBAC is what it may do (the Eviction API included).

    In process rather than `kubeon-gpu controller`: the right-sizing reconciler's period is 300 s
    and the restart waits one whole period after Applied by design (docs/designs/controller.md,
    "Applying"); no flag shortens it, so here both periods are 1 s.
    """
    assert cluster.kubeon is not None
    api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
    process = build(
        api, namespace=RELEASE_NAMESPACE, identity="e2e-rightsize", prometheus_url=prometheus_url,
        lease_duration=15, renew_interval=1.0, on_lost=lambda reason: None,
        reconcilers=[PolicySync(period_seconds=1.0), RightSizingReconciler(period_seconds=1.0)],
    )
    process.start(watch_policies=False)
    process.run_in_thread()
    return process


def test_measured_peak_becomes_the_pods_mig_slice_after_restart(
    kube_cluster: Cluster, namespace: str, dcgm: DcgmExporter,
) -> None:
    cluster, name = kube_cluster, f"{namespace}-rightsize"
    mig_node, whole_node = group_nodes(cluster, namespace)
    llm = make_deployment("llm", namespace, gpus=1, scheduler_name=None, node_selector=in_group(namespace))
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(llm))
    [first] = cluster.wait_for(lambda: cluster.pods(namespace, "app=llm", ready=True), timeout=60,
                               message="the whole-GPU llm pod Ready")
    assert limits(first).get("nvidia.com/gpu") == "1"
    assert first["spec"]["nodeName"] == whole_node

    # DCGM history for that pod: 3 GiB most of the time, one 7 GiB peak, 12% utilisation.
    labels = gpu_labels(namespace=namespace, pod=first["metadata"]["name"], host=whole_node,
                        model="NVIDIA A100-SXM4-80GB")
    peak_at = time.time() - 300
    dcgm.put("DCGM_FI_DEV_FB_USED", labels, lambda t: 7 * GIB_MIB if abs(t - peak_at) < 30 else 3 * GIB_MIB)
    dcgm.put("DCGM_FI_DEV_GPU_UTIL", labels, lambda t: 12.0)
    prometheus = PrometheusServer(dcgm, history=900, step=15, wait_scrape=False)
    controller: ControllerProcess | None = None
    try:
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(policy(name, namespace)))
        probe = make_pod("probe", namespace, gpus=1, scheduler_name=None, node_selector=in_group(namespace))
        wait_for_policy(cluster, name, probe)
        # What the policy alone would do to a GPU pod: gpuMemory 30Gi -> a bigger profile, 3g.40gb,
        # which no node offers here: the pod stays whole, marked with the slice it wanted.
        alone = webhook_dry_run(cluster, probe)
        assert limits(alone["object"]).get("nvidia.com/gpu") == "1", alone
        wanted = alone["object"]["metadata"]["annotations"]["gpu.kubeon.io/wanted-resource"]
        assert wanted == "nvidia.com/mig-3g.40gb", alone

        controller = start_controller(cluster, prometheus.url)
        target = f"Deployment/{namespace}/llm"

        def applied() -> dict[str, Any] | None:
            return next((p for p in status(cluster, name).get("proposals", [])
                         if p["target"] == target and p["state"] == "Applied"), None)

        proposal = cluster.wait_for(applied, timeout=60, message="an Applied right-sizing proposal")
        assert proposal["resource"] == RIGHT_SIZE
        assert proposal["action"] == f"nvidia.com/gpu=1 → {RIGHT_SIZE}"
        assert "peak 7.0 GiB" in proposal["reason"], proposal["reason"]

        deployments = client.AppsV1Api(cluster.api_client)
        before = deployments.read_namespaced_deployment("llm", namespace).metadata

        def restarted() -> dict[str, Any] | None:
            return (status(cluster, name).get("restarts") or {}).get(target)

        record = cluster.wait_for(restarted, timeout=60, message="the restart record in the policy status")
        assert record["proposal"] == proposal["id"] and first["metadata"]["uid"] in record["pods"]
        rbac = client.RbacAuthorizationV1Api(cluster.api_client)
        bindings = rbac.list_namespaced_role_binding(namespace).items
        assert [b.metadata.name for b in bindings] == [], "Restart evicts: no workload write access granted"

        def moved() -> list[dict[str, Any]] | None:
            pods = cluster.pods(namespace, "app=llm", ready=True)
            if pods and all(p["metadata"]["name"] != first["metadata"]["name"] for p in pods):
                return pods
            return None

        pods = cluster.wait_for(moved, timeout=60, message="the restarted llm pods Ready")
        for pod in pods:
            assert limits(pod).get(RIGHT_SIZE) == "1" and "nvidia.com/gpu" not in limits(pod), limits(pod)
            annotations = pod["metadata"]["annotations"]
            assert annotations["gpu.kubeon.io/policy"] == name
            assert "nvidia.com/gpu" in annotations["gpu.kubeon.io/rewritten-from"]
            assert pod["spec"]["nodeName"] == mig_node
        llm_now = deployments.read_namespaced_deployment("llm", namespace)
        assert llm_now.metadata.generation == before.generation, "the restart never writes the Deployment's spec"
        assert llm_now.metadata.annotations == before.annotations, "nor its annotations"
        assert record["undo"]["to"] == RIGHT_SIZE
    finally:
        if controller is not None:
            controller.stop()
        prometheus.stop()
