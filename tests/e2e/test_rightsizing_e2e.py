"""End to end: measured GPU memory -> Applied right-sizing proposal -> restart -> pods rewritten to that size.

Real: the test cluster (API server, Deployment/ReplicaSet controllers that
create pods through admission, scheduler and kubelet stand-ins), the
`kubeon-gpu webhook` process registered through the chart's webhook
configurations (its watch delivers the policy status), Prometheus
(/usr/bin/prometheus, tests/promharness) scraping a DCGM-format exporter with
backfilled history, and the controller frame in this process
(`controller.command.build`: lease loop, policy sync, right-sizing reconciler
on the real clock, PrometheusMetricsSource over HTTP).
Faked: the GPUs (the exporter's series are scripted: a 7 GiB peak on an
A100-80GB), the nodes (GFD-labelled objects), the containers.

The story: a Deployment asking `nvidia.com/gpu: 1` runs on a whole GPU; an
Automatic MIG `auto` policy with `rollout: Restart` and `gpuMemory: 30Gi`
(which alone would choose 3g.40gb) is created; the controller measures the
7 GiB peak, writes an Applied proposal with resource nvidia.com/mig-1g.10gb,
then restarts the Deployment by evicting its pod (Eviction API; the Deployment itself is never
written); the replacement pods, created through admission, ask
for nvidia.com/mig-1g.10gb.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client

from controller.command import ControllerProcess, build
from controller.policysync import PolicySync
from controller.rightsizing import RightSizingReconciler
from tests.e2e.conftest import RELEASE_NAMESPACE, Webhook, wait_for_policy
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_deployment, make_pod
from tests.missing import missing
from tests.promharness import DcgmExporter, PrometheusServer, available, gpu_labels

NAMESPACE = "e2e-rightsize"
POLICY = "e2e-rightsize"
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


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": POLICY},
        "spec": {"mode": "Automatic", "selector": {"namespaces": [NAMESPACE]},
                 "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "30Gi",
                             "gpuModels": ["NVIDIA-A100-SXM4-80GB"], "rollout": "Restart", "window": "10m"}},
    }


def status(cluster: Cluster) -> dict[str, Any]:
    obj = client.CustomObjectsApi(cluster.api_client).get_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", POLICY)
    return obj.get("status") or {}


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"].get("limits") or {})


def start_controller(cluster: Cluster, prometheus_url: str) -> ControllerProcess:
    process = build(
        cluster.api_client, namespace=RELEASE_NAMESPACE, identity="e2e-rightsize", prometheus_url=prometheus_url,
        lease_name="kubeon-gpu-optimizer-rightsize-e2e", lease_duration=15, renew_interval=1.0,
        on_lost=lambda reason: None,
        reconcilers=[PolicySync(period_seconds=1.0), RightSizingReconciler(period_seconds=1.0)],
    )
    process.start(watch_policies=False)
    process.run_in_thread()
    return process


def test_measured_peak_becomes_the_pods_mig_slice_after_restart(
    e2e_cluster: Cluster, webhook: Webhook, dcgm: DcgmExporter,
) -> None:
    cluster = e2e_cluster
    cluster.ensure_namespace(NAMESPACE)
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(make_deployment("llm", NAMESPACE, gpus=1)))
    [first] = cluster.wait_for(lambda: cluster.pods(NAMESPACE, "app=llm", ready=True), timeout=20,
                               message="the whole-GPU llm pod Ready")
    assert limits(first).get("nvidia.com/gpu") == "1"
    node = first["spec"]["nodeName"]

    # DCGM history for that pod: 3 GiB most of the time, one 7 GiB peak, 12% utilisation.
    labels = gpu_labels(namespace=NAMESPACE, pod=first["metadata"]["name"], host=node,
                        model="NVIDIA A100-SXM4-80GB")
    peak_at = time.time() - 300
    dcgm.put("DCGM_FI_DEV_FB_USED", labels, lambda t: 7 * GIB_MIB if abs(t - peak_at) < 30 else 3 * GIB_MIB)
    dcgm.put("DCGM_FI_DEV_GPU_UTIL", labels, lambda t: 12.0)
    prometheus = PrometheusServer(dcgm, history=900, step=15, wait_scrape=False)
    controller: ControllerProcess | None = None
    try:
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(policy()))
        probe = make_pod("probe", NAMESPACE, gpus=1)
        wait_for_policy(webhook, POLICY, probe)
        # What the policy alone would do to a GPU pod: gpuMemory 30Gi -> a bigger profile, 3g.40gb,
        # which no node offers here: the pod stays whole, marked with the slice it wanted.
        alone = requests.post(f"{webhook.url}/dry-run", json={"object": probe}, verify=webhook.ca_file,
                              timeout=5).json()
        assert limits(alone["object"]).get("nvidia.com/gpu") == "1", alone
        wanted = alone["object"]["metadata"]["annotations"]["gpu.kubeon.io/wanted-resource"]
        assert wanted == "nvidia.com/mig-3g.40gb", alone

        controller = start_controller(cluster, prometheus.url)

        def applied() -> dict[str, Any] | None:
            return next((p for p in status(cluster).get("proposals", [])
                         if p["target"] == f"Deployment/{NAMESPACE}/llm" and p["state"] == "Applied"), None)

        proposal = cluster.wait_for(applied, timeout=20, message="an Applied right-sizing proposal")
        assert proposal["resource"] == RIGHT_SIZE
        assert proposal["action"] == f"nvidia.com/gpu=1 → {RIGHT_SIZE}"
        assert "peak 7.0 GiB" in proposal["reason"], proposal["reason"]

        deployments = client.AppsV1Api(cluster.api_client)
        before = deployments.read_namespaced_deployment("llm", NAMESPACE).metadata

        def restarted() -> dict[str, Any] | None:
            return (status(cluster).get("restarts") or {}).get(f"Deployment/{NAMESPACE}/llm")

        record = cluster.wait_for(restarted, timeout=20, message="the restart record in the policy status")
        assert record["proposal"] == proposal["id"] and first["metadata"]["uid"] in record["pods"]
        rbac = client.RbacAuthorizationV1Api(cluster.api_client)
        bindings = rbac.list_namespaced_role_binding(NAMESPACE).items
        assert [b.metadata.name for b in bindings] == [], "Restart evicts: no workload write access granted"

        def moved() -> list[dict[str, Any]] | None:
            pods = cluster.pods(NAMESPACE, "app=llm", ready=True)
            if pods and all(p["metadata"]["name"] != first["metadata"]["name"] for p in pods):
                return pods
            return None

        pods = cluster.wait_for(moved, timeout=30, message="the restarted llm pods Ready")
        for pod in pods:
            assert limits(pod).get(RIGHT_SIZE) == "1" and "nvidia.com/gpu" not in limits(pod), limits(pod)
            annotations = pod["metadata"]["annotations"]
            assert annotations["gpu.kubeon.io/policy"] == POLICY
            assert "nvidia.com/gpu" in annotations["gpu.kubeon.io/rewritten-from"]
            assert pod["spec"]["nodeName"] == "a100-mig-0"
        llm = deployments.read_namespaced_deployment("llm", NAMESPACE)
        assert llm.metadata.generation == before.generation, "the restart never writes the Deployment's spec"
        assert llm.metadata.annotations == before.annotations, "nor its annotations"
        assert record["undo"]["to"] == RIGHT_SIZE
    finally:
        if controller is not None:
            controller.stop()
        prometheus.stop()
