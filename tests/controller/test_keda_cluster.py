"""Real KEDA on the loopback cluster: a ScaledObject on Prometheus triggers scales a Deployment
0 -> 1 -> N -> 1 -> 0 through kube-controller-manager's HPA.

Real: kube-apiserver with the KEDA metrics adapter behind `v1beta1.external.metrics.k8s.io`
(aggregation layer), KEDA's operator, kube-controller-manager's HPA controller, Debian's Prometheus
scraping the DCGM exporter shim (tests/promharness), which reports one utilisation series per
running pod of the workload (podload.py). A demand gauge (`queue_depth`) wakes the workload from
zero; GPU utilisation (the product's query shape: average over the workload's GPUs,
`metricType: Value`) sizes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client, config

from controller.autoscale import AutoscaleReconciler
from controller.loop import ReconcileRunner
from controller.policysync import PolicySync
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.scaling.autoscale import POLICY_LABEL, workload_avg_utilization_query
from kube import scale as kscale
from tests.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.objects import make_deployment, make_node
from tests.controller.conftest_scale import scale_context
from tests.promharness import DcgmExporter, PrometheusServer, constant
from tests.promharness.podload import PodGpuLoad

# The chart's setup with keda.enabled=true (its ScaledObject rules) and no optimizer process: the
# product's reconcilers run in the test as the chart's controller ServiceAccount.
CLUSTER = {"keda": True, "kubeon": True, "kubeon_components": (), "kubeon_sets": ("keda.enabled=true",),
           "gpu_operator": False, "controller_manager_args": ("--horizontal-pod-autoscaler-sync-period=1s",)}
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
KEDA_USER = "system:serviceaccount:keda:keda-operator"


def scaled_object(ns: str, prometheus: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "llm", "namespace": ns},
        "spec": {
            "scaleTargetRef": {"name": "llm"}, "minReplicaCount": 0, "maxReplicaCount": 3,
            "pollingInterval": 1, "cooldownPeriod": 3,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleDown": {"stabilizationWindowSeconds": 0}}}},
            "triggers": [
                {"type": "prometheus", "name": "demand", "metricType": "AverageValue",
                 "metadata": {"serverAddress": prometheus, "query": 'sum(queue_depth{service="llm"})',
                              "threshold": "100", "activationThreshold": "0"}},
                {"type": "prometheus", "name": "gpu-utilization", "metricType": "Value",
                 "metadata": {"serverAddress": prometheus, "threshold": "50", "activationThreshold": "20",
                              "query": workload_avg_utilization_query("Deployment", ns, "llm")}},
            ]}}


def replicas(cluster: Cluster, ns: str) -> int:
    return int(cluster.apps.read_namespaced_deployment_scale("llm", ns).spec.replicas or 0)


def condition(obj: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), "")


def scale_writers(cluster: Cluster, ns: str) -> dict[str, list[str]]:
    """Who changed the Deployment's replicas through its scale subresource, and how often."""
    out: dict[str, list[str]] = {}
    for event in cluster.plane.audit_events():
        ref = event.get("objectRef") or {}
        if (ref.get("namespace"), ref.get("resource"), ref.get("subresource")) != (ns, "deployments", "scale"):
            continue
        out.setdefault(event["user"]["username"], []).append(f"{event['verb']} {event['responseStatus']['code']}")
    return out


def test_a_scaled_object_scales_zero_to_n_and_back_through_the_real_hpa(
        kube_cluster: Cluster, namespace: str, dcgm_exporter: DcgmExporter,
        prometheus_factory: Callable[..., PrometheusServer]) -> None:
    cluster, ns = kube_cluster, namespace
    cluster.create_node(make_node("cpu-0", product=None))
    dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))
    prometheus = prometheus_factory()
    load = PodGpuLoad(dcgm_exporter, cluster.pods, ns, "app=llm").start()
    try:
        cluster.apps.create_namespaced_deployment(ns, make_deployment("llm", ns, replicas=0, scheduler_name=None))
        cluster.create(scaled_object(ns, prometheus.url))
        custom = client.CustomObjectsApi(cluster.api)

        def so() -> dict[str, Any]:
            return dict(custom.get_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", "llm"))

        cluster.wait_for(lambda: condition(so(), "Ready") == "True", 30, "ScaledObject Ready")
        hpa = cluster.wait_for(lambda: client.AutoscalingV2Api(cluster.api).list_namespaced_horizontal_pod_autoscaler(
            ns).items, 30, "the HPA KEDA makes")[0]
        assert (hpa.metadata.name, hpa.spec.scale_target_ref.name) == ("keda-hpa-llm", "llm")
        assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (1, 3)
        assert [m.type for m in hpa.spec.metrics] == ["External", "External"]
        cluster.wait_for(lambda: condition(so(), "Active") == "False", 30, "ScaledObject not Active (no demand)")
        assert replicas(cluster, ns) == 0

        dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(5))  # demand: KEDA wakes it
        cluster.wait_for(lambda: replicas(cluster, ns) == 1, 30, "KEDA's activation to 1 replica")
        cluster.wait_for(lambda: condition(so(), "Active") == "True", 10, "ScaledObject Active")

        load.set(90)  # 90% average over a 50% target: the HPA sizes it up to its max
        cluster.wait_for(lambda: replicas(cluster, ns) == 3, 60, "the HPA scaling to 3")
        cluster.wait_for(lambda: len(cluster.pods(ns, "app=llm", ready=True)) == 3, 30, "3 ready pods")
        status = client.AutoscalingV2Api(cluster.api).read_namespaced_horizontal_pod_autoscaler_status(
            "keda-hpa-llm", ns).status
        assert status.desired_replicas == 3
        # the external metrics KEDA serves through the aggregation layer, as the HPA read them
        assert {m.external.metric.name for m in status.current_metrics} == {"s0-prometheus", "s1-prometheus"}

        load.set(5)  # idle, demand still there: the HPA goes back to its floor
        cluster.wait_for(lambda: replicas(cluster, ns) == 1, 60, "the HPA scaling down to 1")
        dcgm_exporter.put("queue_depth", {"service": "llm"}, constant(0))  # no demand: KEDA deactivates
        cluster.wait_for(lambda: replicas(cluster, ns) == 0, 60, "KEDA's deactivation to 0")
        cluster.wait_for(lambda: condition(so(), "Active") == "False", 10, "ScaledObject not Active")
        assert condition(so(), "Ready") == "True"

        writers = scale_writers(cluster, ns)
        assert set(writers) == {HPA_USER, KEDA_USER}, writers
        assert all(w.endswith(" 200") for w in writers[HPA_USER] + writers[KEDA_USER]), writers
        assert len(writers[KEDA_USER]) == 2, "KEDA writes the scale twice: 0 -> 1 and 1 -> 0"
    finally:
        load.stop()


def autoscale_policy(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": "Automatic", "scaleToZero": {
                "namespaces": [ns], "workloadSelector": {"matchLabels": {"tier": "inference"}},
                "autoscale": {"targetUtilizationPercent": 50, "min": 1, "max": 3}}}}


def user_view(cluster: Cluster, ns: str) -> dict[str, Any]:
    """What the user made and sees of the Deployment: replicas, labels, annotations, pod template."""
    obj = cluster.apps.read_namespaced_deployment("llm", ns).to_dict()
    meta = obj["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != "deployment.kubernetes.io/revision"}
    return {"replicas": obj["spec"]["replicas"], "labels": meta.get("labels"), "annotations": annotations,
            "template": obj["spec"]["template"], "selector": obj["spec"]["selector"]}


def test_removing_the_policy_removes_our_scaled_object_and_leaves_the_workload_as_before(
        kube_cluster: Cluster, namespace: str, dcgm_exporter: DcgmExporter,
        prometheus_factory: Callable[..., PrometheusServer]) -> None:
    """The product's ScaledObject on real KEDA: KEDA takes the workload over (its HPA scales it on the
    DCGM series); deleting the policy deletes the ScaledObject, KEDA lets go (HPA gone) and the
    Deployment is what the user had made, replica count included."""
    cluster, ns = kube_cluster, namespace
    cluster.create_node(make_node("cpu-1", product=None))
    prometheus = prometheus_factory()
    load = PodGpuLoad(dcgm_exporter, cluster.pods, ns, "app=llm").start()
    assert cluster.kubeon is not None
    api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
    custom = client.CustomObjectsApi(cluster.api)
    policy = f"{ns}-autoscale"
    try:
        cluster.apps.create_namespaced_deployment(ns, make_deployment(
            "llm", ns, replicas=2, labels={"tier": "inference"}, scheduler_name=None))
        before = user_view(cluster, ns)
        custom.create_cluster_custom_object(*POLICIES, autoscale_policy(policy, ns))
        runner = ReconcileRunner(scale_context(api, cluster.api_client, prometheus.url),
                                 [PolicySync(), ScaleToZeroReconciler(), AutoscaleReconciler()])
        runner.run_all()
        [made] = kscale.list_scaled_objects(cluster.api_client, ns)
        assert made["metadata"]["labels"][POLICY_LABEL] == policy
        hpa = cluster.wait_for(lambda: client.AutoscalingV2Api(cluster.api).list_namespaced_horizontal_pod_autoscaler(
            ns).items, 30, "the HPA KEDA makes for our ScaledObject")[0]
        assert hpa.metadata.owner_references[0].name == made["metadata"]["name"]
        load.set(90)
        cluster.wait_for(lambda: replicas(cluster, ns) == 3, 60, "KEDA's HPA scaling our workload to 3")

        custom.delete_cluster_custom_object(*POLICIES, policy)
        runner.run_all()
        cluster.wait_for(lambda: not kscale.list_scaled_objects(cluster.api_client, ns), 30,
                         "our ScaledObject gone (KEDA's finalizer done)")
        cluster.wait_for(lambda: not client.AutoscalingV2Api(cluster.api).list_namespaced_horizontal_pod_autoscaler(
            ns).items, 30, "KEDA's HPA gone")
        assert made["spec"]["advanced"]["restoreToOriginalReplicaCount"] is True
        cluster.wait_for(lambda: user_view(cluster, ns) == before, 30,
                         f"the Deployment as the user made it: {before}")
        assert user_view(cluster, ns) == before
    finally:
        load.stop()
        api.close()
        if policy in {p["metadata"]["name"] for p in custom.list_cluster_custom_object(*POLICIES)["items"]}:
            custom.delete_cluster_custom_object(*POLICIES, policy)
