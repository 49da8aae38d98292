"""The GPU autoscaling chain of seed 002 on the loopback cluster, end to end (issue 43).

DCGM utilisation in Prometheus -> KEDA (the ScaledObject our autoscale policy made) -> the HPA of
kube-controller-manager -> pending pods -> Karpenter GPU nodes (KWOK) placed by our extender ->
utilisation drops -> the HPA scales down -> our scale to zero parks the workload -> our capacity
controller removes the empty nodes (Karpenter terminates them) -> a demand signal wakes it -> again.

The cluster: `Cluster(**CHAIN_CLUSTER)`. The controller (policy sync, layout, scale to zero,
autoscale, capacity) runs in this process on its own loop (`ReconcileRunner.run_forever`, every
reconciler each second) as the chart's controller ServiceAccount, so no step waits on anything but
its own configured interval: the HPA's sync period (1 s), KEDA's polling, the policy's `idleFor`,
the capacity policy's `emptyFor`, Karpenter's batching and KWOK's registration delay.

`run_chain` returns the timeline (one sample a second: replicas, pending pods, GPU nodes, GPUs
allocated, cost so far), each step's latency, the scale writes of each actor (kube-apiserver's audit
log) and the final state. The test (tests/controller/test_autoscaling_chain_cluster.py) asserts on
it; `python -m tests.cluster demo autoscaling` prints it.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from controller.autoscale import AutoscaleReconciler
from controller.capacity import CapacityReconciler
from controller.context import ControllerContext, SystemClock
from controller.layout import LayoutReconciler
from controller.loop import ReconcileRunner
from controller.metrics_source import from_url
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.model import Mode
from gpupolicy.scaling.autoscale import MANAGED_BY_LABEL
from tests.cluster.cluster import Cluster
from tests.cluster.karpenter import node_class_ref
from tests.cluster.kubeon import NAMESPACE, RELEASE
from tests.cluster.objects import make_deployment
from tests.promharness import DcgmExporter, PrometheusServer, constant
from tests.promharness.podload import PodGpuLoad

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "gpupolicy" / "capacity" / "data" / "aws-gpu-instances.csv"
CHAIN_CLUSTER: dict[str, Any] = {
    "kubeon": True, "kubeon_components": ("extender", "scheduler"), "kubeon_sets": ("keda.enabled=true",),
    "karpenter": True, "karpenter_instances": CATALOG, "keda": True,
    "controller_manager_args": ("--horizontal-pod-autoscaler-sync-period=1s",
                                "--horizontal-pod-autoscaler-downscale-stabilization=5s"),
}
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_LABEL = "node.kubernetes.io/instance-type"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
USERS = {"hpa": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
         "keda": "system:serviceaccount:keda:keda-operator",
         "kubeon": f"system:serviceaccount:{NAMESPACE}:{RELEASE}"}
IDLE_FOR = "20s"
EMPTY_FOR = "5s"
MAX_REPLICAS = 3
WAIT = 120.0


def policies(ns: str) -> list[dict[str, Any]]:
    """Scale to zero with autoscale, and GPU capacity on Karpenter, both Automatic, for namespace `ns`."""
    scale = {"namespaces": [ns], "workloadSelector": {"matchLabels": {"tier": "inference"}},
             "idleBelowPercent": 5, "idleFor": IDLE_FOR,
             "wake": {"prometheusQuery": 'sum(queue_depth{service="llm"})', "above": 0},
             "autoscale": {"targetUtilizationPercent": 50, "min": 1, "max": MAX_REPLICAS}}
    capacity = {"nodePool": f"{ns}-gpu", "nodeClassRef": node_class_ref(), "gpuModels": ["NVIDIA-A10G"],
                "maxGpus": 8, "consolidation": {"underusedBelowPercent": 10, "for": "10m", "maxDisruptedNodes": 1,
                                                "emptyFor": EMPTY_FOR, "drainTimeout": "1m"}}
    return [
        {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": f"{ns}-autoscale"},
         "spec": {"mode": "Automatic", "scaleToZero": scale}},
        {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": f"{ns}-capacity"},
         "spec": {"mode": "Automatic", "selector": {"namespaces": [ns]}, "capacity": capacity}},
    ]


def prices(catalog: Path = CATALOG) -> dict[str, float]:
    with open(catalog, newline="") as fh:
        return {row["instance_type"]: float(row["price_per_hour"]) for row in csv.DictReader(fh)}


@dataclass
class Sample:
    t: float
    replicas: int
    pending: int
    ready: int
    gpu_nodes: int
    gpus_allocated: int
    cost: float


@dataclass
class Chain:
    """One run: the cluster, the test's namespace, the DCGM shim and Prometheus, our controller."""

    cluster: Cluster
    ns: str
    exporter: DcgmExporter
    prometheus: PrometheusServer
    log: Callable[[str], None] = print
    samples: list[Sample] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.cluster.kubeon is not None
        self.api = config.new_client_from_config(str(self.cluster.kubeon.kubeconfig_of(self.cluster.api_client,
                                                                                        RELEASE)))
        clock = SystemClock()
        ctx = ControllerContext(
            api=self.api, namespace=NAMESPACE, default_mode=Mode.RECOMMEND, prometheus_url=self.prometheus.url,
            metrics=from_url(self.prometheus.url), clock=clock,
            recorder=Recorder(self.api, ControllerMetrics(), clock, "chain"), policies=PolicyStore(),
            is_leader=lambda: True, keda=True)
        # query steps of 2 s (a hole over 6 s is "not known idle"): the DCGM shim is scraped every second
        reconcilers: list[Any] = [PolicySync(), LayoutReconciler(timeout_seconds=300),
                                  ScaleToZeroReconciler(step_seconds=2, max_gap_seconds=6),
                                  AutoscaleReconciler(), CapacityReconciler(step_seconds=5.0)]
        for reconciler in reconcilers:
            reconciler.period_seconds = 1.0
        self.runner = ReconcileRunner(ctx, reconcilers)
        self.ctx = ctx
        self.prices = prices()
        self.load = PodGpuLoad(self.exporter, self.cluster.pods, self.ns, "app=llm")
        self._stop = threading.Event()
        self.began = time.monotonic()

    # -- reading what a user sees
    def replicas(self) -> int:
        return int(self.cluster.apps.read_namespaced_deployment_scale("llm", self.ns).spec.replicas or 0)

    def gpu_nodes(self) -> list[dict[str, Any]]:
        items = client.CoreV1Api(self.cluster.api).list_node(label_selector=f"{POOL_LABEL}={self.ns}-gpu").items
        return [n.to_dict() for n in items]

    def sample(self) -> Sample:
        pods = self.cluster.pods(self.ns, "app=llm")
        nodes = self.gpu_nodes()
        gpus = sum(int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                   for p in pods if p["spec"].get("nodeName") for c in p["spec"]["containers"])
        now = time.monotonic() - self.began
        last = self.samples[-1] if self.samples else None
        hourly = sum(self.prices.get((n["metadata"]["labels"] or {}).get(INSTANCE_LABEL, ""), 0.0) for n in nodes)
        cost = (last.cost + hourly * (now - last.t) / 3600) if last else 0.0
        ready = len(self.cluster.pods(self.ns, "app=llm", ready=True))
        return Sample(round(now, 1), self.replicas(), sum(1 for p in pods if not p["spec"].get("nodeName")), ready,
                      len(nodes), gpus, round(cost, 5))

    def _sampling(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.samples.append(self.sample())
            except Exception:  # the cluster stopping under it
                continue

    # -- steps
    def wait(self, predicate: Callable[[], Any], message: str, timeout: float = WAIT) -> float:
        """Seconds until `predicate` holds (an AssertionError naming `message` after `timeout`)."""
        began = time.monotonic()
        self.cluster.wait_for(predicate, timeout, message)
        return time.monotonic() - began

    def step(self, name: str, predicate: Callable[[], Any], timeout: float = WAIT) -> None:
        try:
            seconds = self.wait(predicate, name, timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.explain()}") from None
        self.steps.append({"name": name, "seconds": round(seconds, 1), "at": round(time.monotonic() - self.began, 1)})
        self.log(f"[{time.monotonic() - self.began:6.1f}s] {name}: {seconds:.1f}s")

    def ready_on_gpu_nodes(self, count: int) -> bool:
        names = {n["metadata"]["name"] for n in self.gpu_nodes()}
        pods = self.cluster.pods(self.ns, "app=llm", ready=True)
        return len(pods) == count and all(p["spec"]["nodeName"] in names for p in pods)

    def scale_up_and_down(self) -> None:
        """Steps 1-3: utilisation up, pods placed on new nodes, utilisation down, parked, nodes gone."""
        self.load.set(90)
        self.step("utilisation rise to first new replica", lambda: self.replicas() > 1)
        self.step("pending to node ready (all replicas placed)",
                  lambda: self.replicas() == MAX_REPLICAS and self.ready_on_gpu_nodes(MAX_REPLICAS))
        self.load.set(0)
        self.step("utilisation drop to HPA scale-down", lambda: self.replicas() == 1)
        self.step("idle to parked at zero", lambda: self.replicas() == 0 and not self.cluster.pods(self.ns, "app=llm"))
        self.step("node empty to node gone", lambda: not self.gpu_nodes())

    def run(self) -> dict[str, Any]:
        sampler = threading.Thread(target=self._sampling, daemon=True)
        loop = threading.Thread(target=self.runner.run_forever, args=(self._stop,), daemon=True)
        self.exporter.put("queue_depth", {"service": "llm"}, constant(0))
        self.load.start()
        try:
            for policy in policies(self.ns):
                self.cluster.custom.create_cluster_custom_object(*POLICIES, policy)
            self.cluster.apps.create_namespaced_deployment(self.ns, make_deployment(
                "llm", self.ns, replicas=1, gpus=1, labels={"tier": "inference"}, tolerations=TOLERATE_GPU))
            loop.start()
            sampler.start()
            self.step("first replica ready on a new GPU node", lambda: self.ready_on_gpu_nodes(1), 180)
            self.scale_up_and_down()
            self.exporter.put("queue_depth", {"service": "llm"}, constant(5))
            self.step("wake to first ready pod", lambda: self.ready_on_gpu_nodes(1) and self.replicas() >= 1)
            self.exporter.put("queue_depth", {"service": "llm"}, constant(0))
            self.scale_up_and_down()
        finally:
            self._stop.set()
            self.runner.wake()
            loop.join(timeout=10)
            sampler.join(timeout=5)
            self.load.stop()
        return {"steps": [{"name": s["name"], "seconds": s["seconds"]} for s in self.steps],
                "final": self.final(), "timeline": [vars(s) for s in self.samples], "writes": self.scale_writes(),
                "step_times": [(s["name"], s["at"]) for s in self.steps]}

    def final(self) -> dict[str, Any]:
        objs = self.cluster.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", self.ns, "scaledobjects")
        return {"replicas": self.replicas(), "gpu_nodes": len(self.gpu_nodes()),
                "cordoned_nodes": sum(1 for n in self.cluster.core.list_node().items if n.spec.unschedulable),
                "scaledobjects": [{"name": o["metadata"]["name"], "policy": (o["metadata"].get("labels") or {}).get(
                    "gpu.kubeon.io/policy"), "managed_by": (o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL)}
                    for o in objs["items"]]}

    def scale_writes(self) -> dict[str, list[dict[str, Any]]]:
        """Each actor's writes to the Deployment's scale subresource (verb, code, seconds into the run)."""
        names = {v: k for k, v in USERS.items()}
        out: dict[str, list[dict[str, Any]]] = {k: [] for k in USERS}
        wall0 = time.time() - (time.monotonic() - self.began)
        for event in self.cluster.plane.audit_events():
            ref = event.get("objectRef") or {}
            if (ref.get("namespace"), ref.get("resource"), ref.get("subresource"), ref.get("name")) != (
                    self.ns, "deployments", "scale", "llm"):
                continue
            who = names.get(event["user"]["username"], event["user"]["username"])
            at = _epoch(event["stageTimestamp"]) - wall0
            out.setdefault(who, []).append({"verb": event["verb"], "code": event["responseStatus"]["code"],
                                            "at": round(at, 1)})
        return out

    def explain(self) -> str:
        """What a user would look at when a step does not come: our policies' status, the ScaledObject."""
        lines = []
        for policy in policies(self.ns):
            name = policy["metadata"]["name"]
            status = self.cluster.custom.get_cluster_custom_object(*POLICIES, name).get("status") or {}
            lines.append(f"GpuPolicy {name}: conditions {status.get('conditions')}")
            lines += [f"  proposal {p.get('target')} {p.get('state')}: {p.get('action')} -- {p.get('reason')}"[:600]
                      for p in status.get("proposals") or []]
            lines.append(f"  parked {status.get('parked')}")
        for obj in self.cluster.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", self.ns,
                                                                     "scaledobjects")["items"]:
            conditions = [(c["type"], c["status"]) for c in obj.get("status", {}).get("conditions", [])]
            lines.append(f"ScaledObject {obj['metadata']['name']}: annotations {obj['metadata'].get('annotations')}"
                         f" conditions {conditions}")
        lines.append(f"replicas {self.replicas()}, pods {[p['metadata']['name'] for p in self.cluster.pods(self.ns)]}")
        return "\n".join(lines)

    def close(self) -> None:
        if self.ctx.cache is not None:
            self.ctx.cache.stop()
        self.api.close()


def _epoch(stamp: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

