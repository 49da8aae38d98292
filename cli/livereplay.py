"""The openb replay through the extender's HTTP endpoints, as kube-scheduler calls them (`simulate --through-extender`).

What runs: the extender's Flask app (its real /filter, /prioritize and
/bind handlers, over the WSGI interface with JSON bodies on the wire), its
`ClusterCache` fed with Node and Pod objects as the watch would feed it,
and `simulator.kubescheduler` scoring the profile of a
KubeSchedulerConfiguration (default: the chart's, manifests/rendered/scheduler.yaml).
openb nodes become Nodes offering `nvidia.com/gpu` and
`nvidia.com/gpu.shared` (enough replicas that the count never binds before
the GPU does; the extender checks the per-GPU share); openb pods become
Pods: whole-GPU pods request `nvidia.com/gpu`, sharing pods one
`nvidia.com/gpu.shared` with their fraction in `gpu.kubeon.io/gpu-share`,
`gpu_spec` a required node affinity on `nvidia.com/gpu.product`.

Which scheduler places which pod is production's: every pod passes the
webhook's own `mutate_pod` under one Automatic packing policy for the
trace's namespace that names the profile's scheduler (kubeon-gpu-scheduler),
with the webhook's default switches. The nodes carry the GPU taint kubeon's
nodes carry (`taints.GPU_TAINT`) and every trace pod tolerates it (they all
run on GPU nodes), so GPU pods and CPU-only pods alike are routed to the
profile (`admission.mutate.routes_cpu_pod`). A pod the webhook leaves on
the default scheduler (`route_cpu_pods=False`, as `webhook
--route-cpu-pods-on-gpu-nodes=false` does) is placed by the cluster's
default-scheduler, with upstream's default profile and no extender, and its
own node-sampling offset (each kube-scheduler process keeps its own
`nextStartNodeIndex`). Both see every binding, as two schedulers on one API
server do.

Arrivals, tie order and metrics are `simulator.replay`'s, from the same
seed: node names carry the per-seed random rank (as the paper's simulator
prefixes them), so the extender's row order is the simulator's tie order.
kube-scheduler's own random ties use a generator seeded from the seed too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from flask.testing import FlaskClient

from extender.app import create_app
from extender.cache import ClusterCache
from extender.service import ExtenderService
from gpupolicy.admission.mutate import DEFAULT_SCHEDULER, mutate_pod
from gpupolicy.catalog import GPU_RESOURCE, PRODUCT_LABEL, SHARED_GPU_RESOURCE
from gpupolicy.cluster import ClusterView, view_from_objects
from gpupolicy.k8s.taints import GPU_TAINT
from gpupolicy.model import GROUP, KIND, VERSION, Mode
from gpupolicy.packing.engine import DEFAULT_STRATEGY
from gpupolicy.packing.kubemodel import GPU_INDEX_ANNOTATION, GPU_SHARE_ANNOTATION, gpu_indices_from_pod
from gpupolicy.packing.nodemodel import MILLI, NodeSpec, PodDemand
from gpupolicy.yamlload import describe_error, safe_load, safe_load_all
from kube.views import StaticView
from simulator.kubescheduler import (
    ClusterScores,
    ExtenderCalls,
    ExtenderSpec,
    Obj,
    Profile,
    ProfileError,
    schedule_one,
)
from simulator.replay import Arrival, ReplayResult, arrival_order, interleave

REPO = Path(__file__).resolve().parent.parent
SHIPPED_SCHEDULER_CONFIG = REPO / "manifests" / "rendered" / "scheduler.yaml"
NAMESPACE = "openb"


def load_scheduler_config(path: str | Path = SHIPPED_SCHEDULER_CONFIG) -> dict[str, Any]:
    """A KubeSchedulerConfiguration: the file itself, or the ConfigMap (`config.yaml`) holding it."""
    p = Path(path)
    try:
        docs = [d for d in safe_load_all(p.read_text()) if isinstance(d, dict)]
        for doc in docs:
            if doc.get("kind") == "KubeSchedulerConfiguration":
                return doc
            data = doc.get("data")
            for text in data.values() if isinstance(data, dict) else ():
                inner = safe_load(text) if isinstance(text, str) else None
                if isinstance(inner, dict) and inner.get("kind") == "KubeSchedulerConfiguration":
                    return inner
    except OSError as exc:
        raise ProfileError(f"{p}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"{p}: {describe_error(exc)}") from exc
    raise ProfileError(f"{p}: no KubeSchedulerConfiguration")


def node_object(spec: NodeSpec, name: str, replicas: int) -> dict[str, Any]:
    """An openb node as a Node: GPUs whole and time-sliced, its product label, and kubeon's GPU taint."""
    alloc = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": "10000"}
    labels = {"kubernetes.io/hostname": name}
    if spec.gpu_count:
        alloc[GPU_RESOURCE] = str(spec.gpu_count)
        alloc[SHARED_GPU_RESOURCE] = str(spec.gpu_count * replicas)
        labels[PRODUCT_LABEL] = spec.model
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": [dict(GPU_TAINT)]} if spec.gpu_count else {},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def routing_view(scheduler_name: str, route_cpu_pods: bool = True) -> ClusterView:
    """What the webhook and the extender know: one Automatic packing policy for the trace's namespace that
    routes its pods to `scheduler_name` (the install's default strategy), nothing else."""
    policy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": "openb-packing"},
              "spec": {"mode": "Automatic", "selector": {"namespaces": [NAMESPACE]},
                       "schedulerName": scheduler_name, "packing": {"strategy": "default"}}}
    view, invalid = view_from_objects([policy], [], default_mode=Mode.RECOMMEND, route_cpu_pods=route_cpu_pods)
    assert not invalid, invalid
    return view


def admitted(pod: dict[str, Any], view: ClusterView) -> dict[str, Any]:
    """The pod as the webhook's /mutate leaves it (its patch applied): schedulerName where it routes."""
    result = mutate_pod(pod, view, NAMESPACE)
    out: dict[str, Any] = result.object
    out["spec"].setdefault("schedulerName", DEFAULT_SCHEDULER)  # the API server's default
    return out


def pod_object(demand: PodDemand, seq: int, view: ClusterView) -> dict[str, Any]:
    """An openb pod as a Pod after admission: whole GPUs, or one time-sliced share with its fraction
    declared; it tolerates the GPU taint (the trace's pods run on GPU nodes); `view` routes it."""
    requests: dict[str, str] = {"cpu": f"{demand.cpu_milli}m", "memory": f"{demand.memory_mib}Mi"}
    annotations: dict[str, str] = {}
    if demand.is_sharing:
        requests[SHARED_GPU_RESOURCE] = "1"
        annotations[GPU_SHARE_ANNOTATION] = str(demand.gpu_milli)
    elif demand.needs_gpu:
        requests[GPU_RESOURCE] = str(demand.num_gpu)
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": requests,
                                                                           "limits": dict(requests)}}],
                            "tolerations": [{"key": GPU_TAINT["key"], "operator": "Exists",
                                             "effect": GPU_TAINT["effect"]}]}
    if demand.allowed_models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PRODUCT_LABEL, "operator": "In", "values": sorted(demand.allowed_models)}]}]}}}
    name = f"{seq:06d}-{demand.name}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{seq}", "annotations": annotations},
           "spec": spec, "status": {"phase": "Pending"}}
    return admitted(pod, view)


class HttpExtender:
    """kube-scheduler's HTTP extender client over the app's WSGI interface (JSON on the wire, Go field names)."""

    def __init__(self, client: FlaskClient, spec: ExtenderSpec) -> None:
        self.client = client
        self.spec = spec
        self.calls = {"filter": 0, "prioritize": 0, "bind": 0}

    def _post(self, verb: str, body: Mapping[str, Any]) -> Any:
        self.calls[verb] += 1
        resp = self.client.post(f"/{verb}", data=json.dumps(body), content_type="application/json")
        if resp.status_code != 200:
            raise RuntimeError(f"/{verb}: HTTP {resp.status_code}: {resp.get_data(as_text=True)[:200]}")
        return json.loads(resp.get_data())

    def filter(self, pod: Obj, names: list[str]) -> tuple[list[str], dict[str, str]]:
        result = self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        if result.get("Error"):
            raise RuntimeError(str(result["Error"]))
        failed = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
        return list(result.get("NodeNames") or []), failed

    def prioritize(self, pod: Obj, names: list[str]) -> dict[str, int]:
        return {str(e["Host"]): int(e["Score"]) for e in self._post(
            "prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})}

    def bind(self, pod: Obj, node: str) -> str:
        meta = pod["metadata"]
        result = self._post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                     "PodUID": meta["uid"], "Node": node})
        return str(result.get("Error") or "")


class ReplayApi:
    """The API the extender's bind writes to: the replay's pods, and the watch that feeds the cache."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.pods: dict[str, dict[str, Any]] = {}

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        pod = self.pods[f"{namespace}/{name}"]
        pod["metadata"]["annotations"].update(annotations)
        self.bound(pod, node)

    def bound(self, pod: dict[str, Any], node: str) -> None:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        self.cache.on_pod("ADDED", pod)  # the watch event of the binding


def replay_through_extender(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodDemand],
    seed: int = 42,
    tune: float = 1.3,
    config: Mapping[str, Any] | None = None,
    strategy: str = DEFAULT_STRATEGY,
    keep_placements: bool = False,
    extra: Sequence[PodDemand] = (),
    route_cpu_pods: bool = True,
) -> ReplayResult:
    """One replay of the live path; the same arrivals and metrics as `simulator.replay.replay`.

    `extra`: pods arriving besides the trace's (bench/robustness.py's
    CPU-only pods), interleaved as `simulator.replay.replay` does.
    `route_cpu_pods`: the webhook's switch (`--route-cpu-pods-on-gpu-nodes`).
    """
    config = config if config is not None else load_scheduler_config()
    profile = Profile.from_config(config)
    if not profile.extenders:
        raise ProfileError("KubeSchedulerConfiguration: no extenders")
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    by_name = sorted(nodes, key=lambda s: s.name)
    tie_rank = rng.permutation(len(by_name))
    capacity_milli = sum(s.gpu_count for s in by_name) * MILLI
    arrivals = interleave(arrival_order(pods, capacity_milli, tune, rng), extra, np.random.default_rng([seed, 2]))
    shares = [p.gpu_milli for p in pods if p.is_sharing]
    replicas = max(2, MILLI // max(1, min(shares))) if shares else 2
    names = [f"r{int(tie_rank[i]):05d}-{s.name}" for i, s in enumerate(by_name)]
    node_objs = sorted((node_object(s, n, replicas) for s, n in zip(by_name, names, strict=True)),
                       key=lambda o: o["metadata"]["name"])

    clock = [0.0]  # one arrival per second of replay time: the typical mix refreshes every 30 arrivals
    cache = ClusterCache(clock=lambda: clock[0])
    api = ReplayApi(cache)
    for obj in node_objs:
        cache.on_node("ADDED", obj)
    scheduler_name = str(((config.get("profiles") or [{}])[0]).get("schedulerName") or DEFAULT_SCHEDULER)
    view = routing_view(scheduler_name, route_cpu_pods)
    weight = next((spec.weight for spec in profile.extenders if spec.prioritize_verb), 0)  # as the chart passes it
    service = ExtenderService(cache, StaticView(view), default_strategy=strategy, binder=api,
                              scheduler_weight=weight)
    client = create_app(service).test_client()
    extenders = [(spec, HttpExtender(client, spec)) for spec in profile.extenders]
    cluster = ClusterScores(node_objs)
    select_rng = np.random.default_rng([seed, 1])
    # the cluster's own scheduler: upstream's default profile, no extenders (unless the config is its own)
    profiles = {DEFAULT_SCHEDULER: (Profile(), []), scheduler_name: (profile, extenders)}
    next_start = dict.fromkeys(profiles, 0)

    capacity = float(capacity_milli) or 1.0
    arrived = allocated = 0
    at100: float | None = None
    bound: list[tuple[dict[str, Any], str] | None] = []  # per arrival: the pod and its node, None if not placed
    waiting: tuple[int, dict[str, Any], str, ExtenderCalls] | None = None  # the bind kube-scheduler has not made

    def finish_bind() -> None:
        """The previous pod's /bind: kube-scheduler binds in a goroutine and schedules the next pod meanwhile
        (schedule_one.go), so the extender hears of the binding after the next pod's /filter and /prioritize."""
        nonlocal allocated, waiting
        if waiting is None:
            return
        at, pod, node, binder = waiting
        waiting = None
        if binder.bind(pod, node):  # refused: kube-scheduler forgets the pod (no retries in the replay)
            cluster.add(pod, node, sign=-1)
            allocated -= arrivals[at].gpu_total_milli
            bound[at] = None

    for seq, demand in enumerate(arrivals):
        clock[0] = float(seq)
        pod = pod_object(demand, seq, view)
        api.pods[f"{NAMESPACE}/{pod['metadata']['name']}"] = pod
        by = str(pod["spec"]["schedulerName"])
        cluster.next_start = next_start[by]
        cycle = schedule_one(cluster, pod, *profiles[by], select_rng)
        next_start[by] = cluster.next_start
        finish_bind()
        node = cycle.node
        arrived += demand.gpu_total_milli
        bound.append(None if node is None else (pod, node))
        if node is not None:
            cluster.add(pod, node)  # kube-scheduler's cache assumes the pod at once
            allocated += demand.gpu_total_milli
            if cycle.bound_by is not None:
                waiting = (seq, pod, node, cycle.bound_by)
            else:
                api.bound(pod, node)
        if at100 is None and arrived >= capacity:
            at100 = 100.0 * allocated / capacity
    finish_bind()
    placements: list[Arrival] = []
    if keep_placements:
        for seq, (demand, held) in enumerate(zip(arrivals, bound, strict=True)):
            original = held[1].split("-", 1)[1] if held else None
            placements.append(Arrival(seq, demand, original, gpu_indices_from_pod(held[0]) if held else ()))
    return ReplayResult(strategy=f"{strategy}+extender", seed=seed, pods=len(arrivals), alloc_pct_at_100=at100,
                        alloc_pct_at_end=100.0 * allocated / capacity, seconds=time.perf_counter() - started,
                        placements=placements)


__all__ = ["DEFAULT_SCHEDULER", "GPU_INDEX_ANNOTATION", "SHIPPED_SCHEDULER_CONFIG", "load_scheduler_config",
           "replay_through_extender"]
