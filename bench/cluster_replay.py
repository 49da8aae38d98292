"""The openb replay on the real loopback control plane (tests/cluster): placement, throughput, the extender's share.

    python bench/cluster_replay.py [--nodes CSV] [--pods CSV] [--seed 42] [--limit N] [--scale K]
                                   [--arms stock,kubeon,simulate,fgd] [--placements FILE] [--max-arrivals N]

What runs, per cluster arm (each on a fresh cluster: etcd, kube-apiserver, kube-controller-manager,
the default kube-scheduler and KWOK, all real, v1.35.4):
- the nodes: one KWOK node per row of the openb node list (K copies with `--scale K`, names suffixed
  `-c1`...), with what GPU Feature Discovery and the device plugin publish (the product, GPU count and
  memory labels; `nvidia.com/gpu` and `nvidia.com/gpu.shared` in capacity, `nvidia.com/gpu.replicas`
  shares per GPU, as `simulate --through-extender` converts them) and kubeon's GPU taint. Node names
  carry the seed's random rank (`r00042-openb-node-0001`), the simulator's tie order, as in
  cli/livereplay.py.
- the pods: the seed's arrivals (simulator.replay.arrival_order: the trace's pods shuffled, then
  resampled), converted as the simulator's live replay converts them (whole GPUs as `nvidia.com/gpu`,
  sharing pods as one `nvidia.com/gpu.shared` with their fraction in `gpu.kubeon.io/gpu-share`, the
  GPU taint tolerated), each created with a POST to kube-apiserver (as kubectl sends it), in arrival
  order, until the arrived GPU demand reaches 100% of capacity (openb's metric); nothing departs.
  One create at a time by default, so the order is the referees' (`--threads N`: N at once, for
  throughput; the order then changes from run to run, and so does the packing).
- `stock`: kube-scheduler's default profile places them; no extender, our webhook not registered.
- `kubeon`: the chart as installed (tests/cluster `Cluster(kubeon=True)`: webhook, extender,
  controller, the chart's second scheduler with the rendered KubeSchedulerConfiguration), one
  Automatic packing GpuPolicy for the trace's namespace, pods created without a schedulerName: our
  webhook routes them to kubeon-gpu-scheduler, which calls our extender.
Then the run waits until the schedulers are idle (no pod in their active or backoff queues, no bind
for --quiet seconds) and reads every pod back from the API server.

Reference arms (no cluster): `simulate` (the packing engine alone, `kubeon-gpu simulate`'s replay) and
`fgd` (our FGD strategy in the simulator), on the same nodes, pods and seed.

Output: one JSON line per arm with `simulate`'s fields (`alloc_pct_at_100`: GPU demand bound, % of
capacity, once arrived demand reaches 100%) and, for the cluster arms:
- `bound_per_s`: pods bound per second, from the first create to the last bind (the scheduler's own
  count of scheduled pods, polled);
- `gpu_overcommit_pct`: GPU demand bound beyond the GPUs of its node, % of capacity (the stock
  scheduler counts `nvidia.com/gpu` and `nvidia.com/gpu.shared` replicas apart, so it may bind more
  GPU work to a node than the node has GPUs; a lower bound, per node, not per GPU);
- `sched_*`: kube-scheduler's own metrics (scheduler_scheduling_attempt_duration_seconds,
  scheduler_scheduling_algorithm_duration_seconds, scheduler_framework_extension_point_duration_seconds
  per extension point), and `extender_share`: the part of a scheduling attempt outside kube-scheduler's
  own plugins (the algorithm less its in-tree extension points: /filter and /prioritize over HTTP, the
  extender's /bind in the binding cycle), from those metrics;
- `load_avg`: the 1-minute load average at the start and the end of the arm (the machine is shared).
`--placements FILE` writes the kubeon arm's placements in `simulate --placements`'s format, read back
from the cluster: each pod's spec.nodeName (without the rank prefix) and the GPU indexes the extender
recorded (gpu.kubeon.io/gpu-index).

Bad arguments: one line naming the flag on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from cli.simulate import write_placements  # noqa: E402
from gpupolicy.catalog import GPU_RESOURCE, PRODUCT_LABEL, SHARED_GPU_RESOURCE  # noqa: E402
from gpupolicy.k8s.taints import GPU_TAINT  # noqa: E402
from gpupolicy.packing.engine import DEFAULT_STRATEGY  # noqa: E402
from gpupolicy.packing.kubemodel import GPU_INDEX_ANNOTATION, GPU_SHARE_ANNOTATION  # noqa: E402
from gpupolicy.packing.nodemodel import MILLI, NodeSpec, PodDemand  # noqa: E402
from simulator.replay import Arrival, ReplayResult, arrival_order, replay  # noqa: E402
from simulator.trace import TraceError, load_nodes, load_pods  # noqa: E402
from tests.cluster.cluster import Cluster  # noqa: E402
from tests.cluster.objects import OPENB_NODES_CSV, OPENB_PRODUCTS, make_node  # noqa: E402

PODS_CSV = OPENB_NODES_CSV.parent / "openb_pod_list_default.csv"
ARMS = ("stock", "kubeon", "simulate", "fgd")
CLUSTER_ARMS = ("stock", "kubeon")
NAMESPACE = "openb"
KUBEON_SCHEDULER = "kubeon-gpu-scheduler"
IMAGE = "registry.k8s.io/pause:3.10"
TUNE = 1.3  # the paper's: arrivals are drawn up to 1.3x capacity, the replay stops at 1.0x
# kube-scheduler's own extension points; what the algorithm spends outside them is the extenders' HTTP calls
IN_TREE_POINTS = ("PreFilter", "Filter", "PostFilter", "PreScore", "Score")
BIND_POINTS = ("Reserve", "Permit", "PreBind", "Bind", "PostBind")


# ---------------------------------------------------------------- the trace, as the simulator orders it

@dataclass
class Trace:
    """Nodes (sorted by name, as the simulator sorts them), their cluster names, and the arrivals until
    the arrived GPU demand first reaches 100% of capacity (all of them if it never does)."""

    nodes: list[NodeSpec]
    names: list[str]
    arrivals: list[PodDemand]
    pods: list[PodDemand]
    capacity_milli: int
    replicas: int
    seed: int

    @property
    def original(self) -> dict[str, str]:
        return {n: s.name for n, s in zip(self.names, self.nodes, strict=True)}


def scaled(nodes: Sequence[NodeSpec], scale: int) -> list[NodeSpec]:
    """`scale` copies of the node list: the first keeps the names, copy k is suffixed `-c<k>`."""
    out = list(nodes)
    for k in range(1, scale):
        out += [NodeSpec(name=f"{n.name}-c{k}", cpu_milli=n.cpu_milli, memory_mib=n.memory_mib,
                         gpu_count=n.gpu_count, model=n.model) for n in nodes]
    return out


def build_trace(nodes: Sequence[NodeSpec], pods: Sequence[PodDemand], seed: int,
                max_arrivals: int | None = None) -> Trace:
    """The simulator's arrivals for `seed` (simulator.replay.replay draws the same, in the same order), cut at
    the first point where arrived GPU demand reaches 100% of capacity (or at `max_arrivals`)."""
    rng = np.random.default_rng(seed)
    by_name = sorted(nodes, key=lambda s: s.name)
    tie_rank = rng.permutation(len(by_name))
    capacity = sum(s.gpu_count for s in by_name) * MILLI
    arrivals = arrival_order(pods, capacity, TUNE, rng)
    arrived, cut = 0, len(arrivals)
    for i, pod in enumerate(arrivals):
        arrived += pod.gpu_total_milli
        if arrived >= capacity:
            cut = i + 1
            break
    if max_arrivals is not None:
        cut = min(cut, max_arrivals)
    width = max(5, len(str(len(by_name))))
    names = [f"r{int(tie_rank[i]):0{width}d}-{s.name}" for i, s in enumerate(by_name)]
    shares = [p.gpu_milli for p in pods if p.is_sharing]
    replicas = max(2, MILLI // max(1, min(shares))) if shares else 2  # cli/livereplay.py's conversion
    return Trace(by_name, names, arrivals[:cut], list(pods), capacity, replicas, seed)


# ---------------------------------------------------------------- the objects

def node_object(spec: NodeSpec, name: str, replicas: int) -> dict[str, Any]:
    """An openb node as GFD and the device plugin would publish it: whole GPUs and `replicas` time-sliced
    shares of each (the simulator's conversion), the product label, kubeon's GPU taint."""
    cpu, memory = f"{spec.cpu_milli}m", f"{spec.memory_mib}Mi"
    if not spec.gpu_count:
        return make_node(name, None, 0, cpu=cpu, memory=memory, labels={"openb.io/model": spec.model or "cpu"})
    product, gpu_memory = OPENB_PRODUCTS.get(spec.model, (f"OPENB-{spec.model}", 0))
    node = make_node(name, product, spec.gpu_count, cpu=cpu, memory=memory, gpu_memory_mib=gpu_memory or None,
                     labels={"openb.io/model": spec.model, "nvidia.com/gpu.replicas": str(replicas),
                             "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     taints=[dict(GPU_TAINT)])
    for key in ("capacity", "allocatable"):
        node["status"][key][SHARED_GPU_RESOURCE] = str(spec.gpu_count * replicas)
    return node


def pod_name(seq: int, demand: PodDemand) -> str:
    return f"{seq:06d}-{demand.name}".lower()


def pod_object(demand: PodDemand, seq: int) -> dict[str, Any]:
    """An openb pod as its author writes it (no schedulerName: the webhook routes it, or the default
    scheduler takes it): whole GPUs, or one time-sliced share with its fraction declared; it tolerates
    the GPU taint (the trace's pods run on GPU nodes); a gpu_spec is a required affinity on the product."""
    requests = {"cpu": f"{demand.cpu_milli}m", "memory": f"{demand.memory_mib}Mi"}
    annotations: dict[str, str] = {}
    if demand.is_sharing:
        requests[SHARED_GPU_RESOURCE] = "1"
        annotations[GPU_SHARE_ANNOTATION] = str(demand.gpu_milli)
    elif demand.needs_gpu:
        requests[GPU_RESOURCE] = str(demand.num_gpu)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": IMAGE,
                        "resources": {"requests": requests, "limits": dict(requests)}}],
        "tolerations": [{"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}],
    }
    if demand.allowed_models:
        products = sorted(OPENB_PRODUCTS.get(m, (f"OPENB-{m}", 0))[0] for m in demand.allowed_models)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PRODUCT_LABEL, "operator": "In", "values": products}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(seq, demand), "namespace": NAMESPACE,
                         "labels": {"app": "openb"}, "annotations": annotations}, "spec": spec}


def packing_policy() -> dict[str, Any]:
    """One Automatic packing policy for the trace's namespace, naming the chart's scheduler."""
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "openb-packing"},
            "spec": {"mode": "Automatic", "selector": {"namespaces": [NAMESPACE]},
                     "schedulerName": KUBEON_SCHEDULER, "packing": {"strategy": "default"}}}


# ---------------------------------------------------------------- metrics

def scrape(url: str) -> str:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=10, context=context if url.startswith("https") else None) as resp:
        return str(resp.read().decode())


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, metric: str, /) -> list[tuple[dict[str, str], float]]:
    """Every sample of `metric` (a counter, a gauge, or a histogram's `_sum`/`_count`): (labels, value)."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == metric:
            out.append((dict(_LABEL.findall(match.group(2) or "")), float(match.group(3))))
    return out


def total(text: str, metric: str, /, **labels: str) -> float:
    """The sum of `metric`'s samples whose labels include `labels`."""
    return sum(v for got, v in samples(text, metric) if all(got.get(k) == w for k, w in labels.items()))


def scheduler_summary(text: str, profile: str) -> dict[str, Any]:
    """Mean seconds per scheduled attempt and per algorithm run, in-tree extension points, the extenders' rest."""
    def mean(name: str, **labels: str) -> float:
        count = total(text, f"{name}_count", **labels)
        return total(text, f"{name}_sum", **labels) / count if count else 0.0

    def point_sum(point: str) -> float:
        return total(text, "scheduler_framework_extension_point_duration_seconds_sum", extension_point=point,
                     profile=profile)

    attempts = total(text, "scheduler_scheduling_attempt_duration_seconds_count", profile=profile)
    attempt_s = total(text, "scheduler_scheduling_attempt_duration_seconds_sum", profile=profile)
    algorithm_runs = total(text, "scheduler_scheduling_algorithm_duration_seconds_count")
    algorithm_s = total(text, "scheduler_scheduling_algorithm_duration_seconds_sum")
    in_tree = sum(point_sum(p) for p in IN_TREE_POINTS)
    binding = sum(point_sum(p) for p in BIND_POINTS)
    return {
        "sched_attempts": int(attempts),
        "sched_scheduled": int(total(text, "scheduler_schedule_attempts_total", profile=profile, result="scheduled")),
        "sched_unschedulable": int(total(text, "scheduler_schedule_attempts_total", profile=profile,
                                         result="unschedulable")),
        "sched_errors": int(total(text, "scheduler_schedule_attempts_total", profile=profile, result="error")),
        # pods bound on a later attempt than their first (a retry after our extender or a filter turned them away)
        "sched_bound_on_retry": int(total(text, "scheduler_pod_scheduling_attempts_count")
                                    - total(text, "scheduler_pod_scheduling_attempts_bucket", le="1")),
        "sched_queued_at_end": int(sum(total(text, "scheduler_pending_pods", queue=q) for q in ("active", "backoff"))),
        "sched_unschedulable_at_end": int(total(text, "scheduler_pending_pods", queue="unschedulable")),
        "sched_attempt_ms": round(1000 * attempt_s / attempts, 3) if attempts else None,
        "sched_algorithm_ms": round(1000 * algorithm_s / algorithm_runs, 3) if algorithm_runs else None,
        "sched_in_tree_ms": round(1000 * in_tree / algorithm_runs, 3) if algorithm_runs else None,
        "sched_bind_points_ms": round(1000 * binding / attempts, 3) if attempts else None,
        "sched_algorithm_s": round(algorithm_s, 3),
        "sched_in_tree_s": round(in_tree, 3),
        "sched_attempt_s": round(attempt_s, 3),
    }


def extender_summary(text: str) -> dict[str, Any]:
    """The extender's own handler times per verb (mean ms, count)."""
    out: dict[str, Any] = {}
    for verb in ("filter", "prioritize", "bind"):
        count = total(text, "kubeon_extender_http_request_duration_seconds_count", route=f"/{verb}")
        seconds = total(text, "kubeon_extender_http_request_duration_seconds_sum", route=f"/{verb}")
        out[f"extender_{verb}_calls"] = int(count)
        out[f"extender_{verb}_ms"] = round(1000 * seconds / count, 3) if count else None
    return out


# ---------------------------------------------------------------- one cluster arm

def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def core_api(kubeconfig: Path, pool: int) -> client.CoreV1Api:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.CoreV1Api(client.ApiClient(configuration))


def drained(response: Any) -> None:
    """Read a `_preload_content=False` answer to its end and give its connection back to the pool: kept unread,
    each answer holds its socket (50,000 creates whose answers were collected ran out of file descriptors)."""
    response.drain_conn()
    response.release_conn()


def in_parallel(work: Callable[[Any], Any], items: Iterable[Any], threads: int) -> list[Any]:
    """`work` over `items`, `threads` at a time, submitted in order; the first error is raised."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, items))


@dataclass
class ArmRun:
    """What one cluster arm measured: the JSON line, and every pod as read back."""

    line: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)


class ApiOnlyCluster(Cluster):
    """etcd, kube-apiserver and the schedulers (and the optimizer) without kube-controller-manager and KWOK
    (`ControlPlane.start(api_only=True)`): for thousands of nodes, whose KWOK leases (one renewal per node
    every 10 s) and the node-lifecycle controller watching them would take this machine's 2 cores from what is
    measured. Bound pods stay Pending with their nodeName, which is all kube-scheduler and the extender read."""

    def start(self) -> Cluster:
        try:
            self.plane.start(api_only=True)
            self.api = config.new_client_from_config(str(self.kubeconfig))
            self.plane.start_scheduler("kube-scheduler", self.plane.scheduler_config("kube-scheduler"))
            if self.kubeon:
                self.kubeon.start(self.api)
        except BaseException:
            self.stop()
            raise
        return self

    def create_node(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The node, then its taints as given: kube-apiserver's TaintNodesByCondition admission adds
        `node.kubernetes.io/not-ready` to every new node, which the node-lifecycle controller (not run here)
        removes once the node reports Ready."""
        created = super().create_node(body)
        wanted = list((body.get("spec") or {}).get("taints") or [])
        if [t["key"] for t in (created.get("spec") or {}).get("taints") or []] != [t["key"] for t in wanted]:
            created = json.loads(self.core.patch_node(body["metadata"]["name"], {"spec": {"taints": wanted or None}},
                                                      _preload_content=False).data)
        return created

    def ensure_namespace(self, name: str, labels: Any = None, timeout: float = 30.0) -> str:
        """The namespace and its default ServiceAccount, made here: no controller makes it."""
        for create in (lambda: self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}}),
                       lambda: self.core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})):
            try:
                create()
            except ApiException as error:
                if error.status != 409:
                    raise
        return name


class ClusterArm:
    """One arm on a fresh loopback cluster: `run()` creates the nodes and the pods, waits, reads back."""

    def __init__(self, arm: str, trace: Trace, *, threads: int = 1, quiet: float = 15.0,
                 timeout: float = 3600.0, keep_state: bool = False, cluster: Cluster | None = None,
                 api_only: bool = False, log: Callable[[str], None] = lambda s: None,
                 sets: tuple[str, ...] = ()) -> None:
        """`cluster`: a started cluster to replay on (kubeon's, for the kubeon arm; the arm leaves it running);
        else the arm starts its own (`api_only`: an `ApiOnlyCluster`; `sets`: the chart's helm values for
        the kubeon arm) and stops it."""
        self.arm, self.trace, self.threads, self.log = arm, trace, threads, log
        self.quiet, self.timeout = quiet, timeout
        self.kubeon = arm == "kubeon"
        self.own = cluster is None
        kind = ApiOnlyCluster if api_only else Cluster
        self.cluster = cluster or kind(kubeon=self.kubeon, gpu_operator=False, keep_state=keep_state,
                                       kubeon_sets=sets if self.kubeon else ())
        self.scheduler = KUBEON_SCHEDULER if self.kubeon else "default-scheduler"

    def run(self) -> ArmRun:
        load_start = load_avg()
        try:
            if self.own:
                self.cluster.start()
            self.core = core_api(self.cluster.kubeconfig, self.threads * 2)
            self._prepare()
            first_create, last_bind, created_s = self._replay()
            pods = self._read_back()
            metrics = self._metrics()
        finally:
            if self.own:
                self.cluster.stop()
                if self.cluster.keep_state:
                    self.log(f"{self.arm}: state and logs kept in {self.cluster.root}")
        line = self._line(pods, first_create, last_bind, created_s, metrics)
        line["load_avg"] = [load_start, load_avg()]
        return ArmRun(line, pods)

    # -- setup
    def _prepare(self) -> None:
        c = self.cluster
        c.ensure_namespace(NAMESPACE)
        if self.kubeon:
            c.create(packing_policy())
            c.wait_for(self._webhook_routes, timeout=60, message="the webhook routing the trace's GPU pods")
        began = time.monotonic()
        objects = [node_object(s, n, self.trace.replicas) for s, n in zip(self.trace.nodes, self.trace.names,
                                                                           strict=True)]
        in_parallel(c.create_node, objects, self.threads * 2)
        self.log(f"{self.arm}: {len(objects)} nodes created in {time.monotonic() - began:.1f} s")
        self._wait_untainted(objects)
        port = c.plane.ports[self._scheduler_process()]
        c.wait_for(lambda: total(scrape(f"https://127.0.0.1:{port}/metrics"), "scheduler_cache_size",
                                 type="nodes") >= len(objects), timeout=300, message="the scheduler's node cache")
        if self.kubeon:
            c.wait_for(self._extender_knows_nodes, timeout=300, message="the extender's node model")

    def _wait_untainted(self, objects: list[dict[str, Any]], timeout: float = 600.0) -> None:
        """Until every node carries only its own taints: kube-apiserver taints each new node
        `node.kubernetes.io/not-ready` (TaintNodesByCondition), and the node-lifecycle controller lifts it
        once KWOK reports the node Ready, some seconds later for a thousand nodes; pods created before
        then would see part of the cluster (found: the first pods of a replay went to the few nodes
        already free of it, and a quarter of the pods were placed on a retry, out of order)."""
        own = {o["metadata"]["name"]: sorted(t["key"] for t in (o.get("spec") or {}).get("taints") or [])
               for o in objects}
        deadline = time.monotonic() + timeout
        while True:
            items = json.loads(self.core.list_node(_preload_content=False).data)["items"]
            extra = [n["metadata"]["name"] for n in items if n["metadata"]["name"] in own and sorted(
                t["key"] for t in (n.get("spec") or {}).get("taints") or []) != own[n["metadata"]["name"]]]
            if not extra:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(extra)} nodes still carry taints they were not given, e.g. {extra[0]}")
            time.sleep(1.0)

    def _scheduler_process(self) -> str:
        return KUBEON_SCHEDULER if self.kubeon else "kube-scheduler"

    def _webhook_routes(self) -> bool:
        probe = pod_object(PodDemand(name="probe", cpu_milli=100, memory_mib=100, num_gpu=1, gpu_milli=1000), 0)
        answer = self.core.create_namespaced_pod(NAMESPACE, probe, dry_run="All", _preload_content=False)
        return bool(json.loads(answer.data)["spec"].get("schedulerName") == KUBEON_SCHEDULER)

    def _extender_knows_nodes(self) -> bool:
        """A /filter of a small CPU pod over every node name: no node answered as unknown."""
        from extender.answers import REASONS, UNKNOWN

        assert self.cluster.kubeon is not None
        pod = pod_object(PodDemand(name="probe", cpu_milli=1, memory_mib=1), 0)
        pod["metadata"]["uid"] = "probe"
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": self.trace.names}).encode()
        request = urllib.request.Request(f"{self.cluster.kubeon.extender_url}/filter", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer = json.loads(resp.read())
        failed = {**(answer.get("FailedNodes") or {}), **(answer.get("FailedAndUnresolvableNodes") or {})}
        return not answer.get("Error") and REASONS[UNKNOWN] not in failed.values()

    # -- the replay
    def _replay(self) -> tuple[float, float, float]:
        """Create the pods in arrival order; wait until the scheduler is idle. Returns (first create, last bind
        (monotonic), seconds the creates took)."""
        port = self.cluster.plane.ports[self._scheduler_process()]
        url = f"https://127.0.0.1:{port}/metrics"
        watcher = SchedulerWatch(url, self.scheduler)
        watcher.start()
        bodies = [pod_object(d, i) for i, d in enumerate(self.trace.arrivals)]
        first = time.monotonic()

        def create(body: dict[str, Any]) -> None:
            self.core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)

        try:
            in_parallel(create, bodies, self.threads)
            created_s = time.monotonic() - first
            self.log(f"{self.arm}: {len(bodies)} pods created in {created_s:.1f} s")
            watcher.wait_idle(self.quiet, self.timeout, self.log)
        finally:
            watcher.stop()
        return first, watcher.last_change, created_s

    def _read_back(self) -> dict[str, dict[str, Any]]:
        response = self.core.list_namespaced_pod(NAMESPACE, _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(response.data)["items"]}

    def _metrics(self) -> dict[str, Any]:
        port = self.cluster.plane.ports[self._scheduler_process()]
        out = scheduler_summary(scrape(f"https://127.0.0.1:{port}/metrics"), self.scheduler)
        if self.kubeon:
            assert self.cluster.kubeon is not None
            out.update(extender_summary(scrape(f"{self.cluster.kubeon.extender_url}/metrics")))
        return out

    # -- the line
    def _line(self, pods: dict[str, dict[str, Any]], first_create: float, last_bind: float, created_s: float,
              metrics: dict[str, Any]) -> dict[str, Any]:
        placed = placements(self.trace, pods)
        bound = sum(1 for p in placed if p.node is not None)
        allocated = sum(p.pod.gpu_total_milli for p in placed if p.node is not None)
        capacity = float(self.trace.capacity_milli) or 1.0
        reached = sum(p.gpu_total_milli for p in self.trace.arrivals) >= capacity
        at100 = round(100.0 * allocated / capacity, 4) if reached else None
        elapsed = max(1e-9, last_bind - first_create)
        line: dict[str, Any] = {
            "arm": self.arm, "strategy": self.arm, "seed": self.trace.seed, "pods": len(self.trace.arrivals),
            "nodes": len(self.trace.nodes), "alloc_pct_at_100": at100,
            "alloc_pct_at_end": round(100.0 * allocated / capacity, 4),
            "unallocated_pct_at_100": None if at100 is None else round(100.0 - at100, 4),
            "gpu_overcommit_pct": round(100.0 * overcommitted_milli(self.trace, placed) / capacity, 4),
            "bound": bound, "pending": len(placed) - bound,
            "bound_per_s": round(bound / elapsed, 2), "seconds": round(elapsed, 3),
            "create_s": round(created_s, 3), "create_per_s": round(len(self.trace.arrivals) / max(created_s, 1e-9), 2),
        }
        line.update(metrics)
        attempt, algorithm, in_tree = (metrics.get("sched_attempt_s"), metrics.get("sched_algorithm_s"),
                                       metrics.get("sched_in_tree_s"))
        if self.kubeon and attempt:
            # the algorithm less the in-tree points: the extenders' /filter and /prioritize; the attempt less
            # the algorithm and the in-tree bind points: the extender's /bind (the binding cycle)
            line["extender_share"] = round((algorithm - in_tree) / attempt, 4)
            line["extender_filter_prioritize_ms"] = round(1000 * (algorithm - in_tree) / metrics["sched_attempts"], 3)
        return line


class SchedulerWatch:
    """Polls kube-scheduler's /metrics: pods scheduled (and when the count last moved), its queues."""

    def __init__(self, url: str, profile: str, interval: float = 0.25) -> None:
        self.url, self.profile, self.interval = url, profile, interval
        self.scheduled = 0.0
        self.queued = 0.0
        self.last_change = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-watch", daemon=True)

    def start(self) -> None:
        self._poll()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        text = scrape(self.url)
        scheduled = total(text, "scheduler_schedule_attempts_total", profile=self.profile, result="scheduled")
        queued = sum(total(text, "scheduler_pending_pods", queue=q) for q in ("active", "backoff"))
        now = time.monotonic()
        if scheduled != self.scheduled:
            self.scheduled, self.last_change = scheduled, now
        self.queued = queued

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except OSError:
                continue

    def wait_idle(self, quiet: float, timeout: float, log: Callable[[str], None]) -> None:
        """Until no pod was scheduled for `quiet` seconds. The queues need not be empty: a pod our extender
        turned away is tried again on every cluster event (upstream puts `Extender` in its unschedulable
        plugins, which no queueing hint covers: kubernetes#122019), and KWOK's node status reports are
        such events, so those pods cycle through the backoff queue (10 s at most) for as long as the cluster
        runs; `quiet` above the longest backoff gives each of them at least one more try."""
        deadline = time.monotonic() + timeout
        reported = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now - self.last_change >= quiet:
                return
            if now - reported > 30:
                log(f"  scheduled {self.scheduled:.0f}, queued {self.queued:.0f}")
                reported = now
            time.sleep(0.25)
        raise TimeoutError(f"the scheduler was still busy after {timeout:.0f} s")


def placements(trace: Trace, pods: dict[str, dict[str, Any]]) -> list[Arrival]:
    """Each arrival's node (original name, None when not bound) and recorded GPU indexes, read back."""
    original = trace.original
    out = []
    for seq, demand in enumerate(trace.arrivals):
        pod = pods.get(pod_name(seq, demand)) or {}
        node = (pod.get("spec") or {}).get("nodeName")
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_INDEX_ANNOTATION, "")
        gpus = tuple(int(g) for g in text.split(",") if g.strip()) if node else ()
        out.append(Arrival(seq, demand, original.get(node) if node else None, gpus))
    return out


def overcommitted_milli(trace: Trace, placed: Sequence[Arrival]) -> int:
    """GPU milli bound beyond each node's GPUs, summed over nodes."""
    gpus = {s.name: s.gpu_count * MILLI for s in trace.nodes}
    used: dict[str, int] = defaultdict(int)
    for p in placed:
        if p.node is not None:
            used[p.node] += p.pod.gpu_total_milli
    return sum(max(0, u - gpus[n]) for n, u in used.items())


def unschedulable_messages(pods: dict[str, dict[str, Any]]) -> list[str]:
    """The real scheduler's PodScheduled=False messages of pods left pending."""
    out = []
    for pod in pods.values():
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                out.append(str(cond.get("message") or ""))
    return out


# ---------------------------------------------------------------- the reference arms and main

def reference(strategy: str, trace: Trace) -> dict[str, Any]:
    """The simulator on the same nodes, pods and seed (its own arrivals are the trace's)."""
    result = replay(trace.nodes, trace.pods, strategy, trace.seed, TUNE)
    return {"arm": "simulate" if strategy == DEFAULT_STRATEGY else strategy, **result.summary(),
            "load_avg": [load_avg()]}


def write_cluster_placements(path: str, trace: Trace, run: ArmRun) -> None:
    placed = placements(trace, run.pods)
    result = ReplayResult(strategy="kubeon", seed=trace.seed, pods=len(placed), alloc_pct_at_100=None,
                          alloc_pct_at_end=0.0, seconds=0.0, placements=placed)
    write_placements(path, result)


def parse_arms(text: str) -> list[str]:
    arms = [a for a in text.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}" if unknown
                         else "--arms: name at least one arm")
    return arms


def positive(flag: str, value: int | None) -> str | None:
    return None if value is None or value > 0 else f"{flag} must be a positive integer, got {value}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default=str(OPENB_NODES_CSV), help="openb node list (default: vendor/openb's)")
    parser.add_argument("--pods", default=str(PODS_CSV), help="openb pod list (default: the default trace)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, help="the first N pods of the pod list (CI)")
    parser.add_argument("--scale", type=int, default=1, help="K copies of the node list (throughput at 5,000 nodes)")
    parser.add_argument("--max-arrivals", type=int, help="stop creating after N arrivals (throughput runs)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--placements", metavar="FILE", help="write the kubeon arm's placements (simulate's CSV)")
    parser.add_argument("--threads", type=int, default=1,
                        help="concurrent creates (default 1: the trace's order, as the referees take it)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a helm value of the chart for the kubeon arm (repeatable), e.g. "
                             "scheduler.percentageOfNodesToScore=100")
    parser.add_argument("--quiet", type=float, default=15.0, help="seconds without a bind that end an arm")
    parser.add_argument("--keep-state", action="store_true", help="keep each cluster's folder (logs) and print it")
    parser.add_argument("--plane", choices=("full", "api"), default=None,
                        help="full: KWOK nodes and kube-controller-manager (default at --scale 1); api: etcd, "
                             "kube-apiserver and the schedulers alone (default above --scale 1)")
    args = parser.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for flag, value in (("--limit", args.limit), ("--scale", args.scale), ("--max-arrivals", args.max_arrivals),
                        ("--threads", args.threads)):
        problem = positive(flag, value)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    if args.seed < 0:
        print(f"error: --seed must be a non-negative integer, got {args.seed}", file=sys.stderr)
        return 2
    if args.placements and "kubeon" not in arms:
        print("error: --placements needs the kubeon arm in --arms", file=sys.stderr)
        return 2
    try:
        nodes = scaled(load_nodes(args.nodes), args.scale)
        pods = load_pods(args.pods)[:args.limit]
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trace = build_trace(nodes, pods, args.seed, args.max_arrivals)

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    log(f"{len(trace.nodes)} nodes, {len(trace.arrivals)} arrivals (seed {args.seed}), load {load_avg()}")
    for arm in arms:
        if arm in CLUSTER_ARMS:
            api_only = (args.plane or ("full" if args.scale == 1 else "api")) == "api"
            run = ClusterArm(arm, trace, threads=args.threads, quiet=args.quiet, keep_state=args.keep_state,
                             api_only=api_only, log=log, sets=tuple(args.sets)).run()
            run.line["plane"] = "api" if api_only else "full"
            print(json.dumps(run.line), flush=True)
            if arm == "kubeon" and args.placements:
                write_cluster_placements(args.placements, trace, run)
        else:
            print(json.dumps(reference(DEFAULT_STRATEGY if arm == "simulate" else "fgd", trace)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
