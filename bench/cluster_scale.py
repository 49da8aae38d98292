"""The optimizer in a large cluster: N KWOK GPU nodes and M pods on the real control plane, then churn.

    python bench/cluster_scale.py [--nodes 1000] [--pods 10000] [--minutes 3] [--churn-per-s 5]
                                  [--scheduled-share 0.1] [--gpu-fill 0.8] [--threads 8] [--no-karpenter] [--keep-state]

What runs (tests/cluster, all real, v1.35.4): etcd, kube-apiserver, kube-controller-manager, the default
kube-scheduler, KWOK, Karpenter with its KWOK provider; the optimizer as the chart renders it (webhook,
extender, the chart's second scheduler, controller), each as its chart ServiceAccount, with a GpuPolicy
of every kind in Automatic for the bench's namespace (packing; time-slicing sharing; scale to zero;
capacity on a Karpenter NodePool). The GPU Operator's stand-in is off (its loop lists every node and
pod twice a second: it would be the largest reader measured); nodes carry what GFD and the device
plugin publish from the start.

1. N nodes in the openb node list's mix (scaled copies, bench/cluster_replay.py's objects), created
   through kube-apiserver; M pods: GPU pods of the default trace's shapes until they ask for `--gpu-fill`
   of the GPUs, then small CPU pods (the per-node agents a GPU cluster runs) up to M. A
   `--scheduled-share` of the GPU pods are created without a node (our webhook routes them to our
   scheduler, which calls our extender), the rest bound directly (spec.nodeName, first fit), as a
   cluster that was already running holds them.
2. Start-up ends when the controller's caches have listed (its first passes ran); then churn for
   `--minutes`: `--churn-per-s` times a second one pod is deleted and one of the same shape created
   (bound directly to the deleted one's node, or through the schedulers for the scheduled share).

Measured during the churn, for our processes (process trees, /proc) and, as the yardstick,
kube-controller-manager and kube-scheduler (kube-apiserver's audit log: every request, at Metadata
level, the optimizer's by ServiceAccount, the two by user agent):
- RSS peak (whole run) and steady (median during churn), CPU seconds per minute;
- API requests per minute by verb and resource; LISTs of pods or nodes after start-up; watches
  (re)started during the churn;
- the controller's pass time (its kubeon_gpu_reconcile_duration_seconds histogram over the churn,
  p50/p99 from the buckets: upper bounds), against each reconciler's period, and the CPU the pass's
  thread used (kubeon_gpu_reconcile_cpu_seconds): on a machine the cluster itself loads, the wall time
  is mostly waiting;
- the extender's request time during the churn (its own histogram, /filter and /prioritize, p99 from
  the buckets: an upper bound), as kube-scheduler's calls met it, the CPU of the thread answering
  (kubeon_extender_http_request_cpu_seconds), and how its node model was kept
  (kubeon_extender_model_rebuilds_total: new states, a node joined or left; kubeon_extender_model_rows_total:
  rows recomputed inside a request or settled between requests, copied or occupied in a new state);
- nothing lost: pods created through the schedulers and not bound at the end, and why;
- the floor under every time above, on this machine during the churn: how late a process that only
  sleeps 10 ms at a time wakes (`wake_delay`, its own process; `--wake-probe SECONDS` runs it alone), and
  how long 1 ms of its CPU takes on the wall clock (`wake_delay.work_wall`): a request using that much
  CPU cannot answer faster here;
- the extender's client time beside its two limits', in the same churn (`answer_probe`, its own process;
  `--answer-probe SPEC` runs it alone): kube-scheduler's side of a /filter call (the pod, the NodeNames
  kube-scheduler sends at this size: numFeasibleNodesToFind of the rendered profile, a window that moves
  on from call to call, over one keep-alive connection), `--probe-per-s` calls a second to each of three
  servers in turn: the extender; bench/echo.py (`bare`: the extender's gunicorn settings, a WSGI callable
  that parses the same body and answers the extender's bytes: what ours takes beyond it is ours to win
  back in our stack); bench/floor/main.go (`floor`: Go's net/http, kube-scheduler's own stack, parsing
  the body and answering the same bytes, built here with the local Go toolchain: what it takes on this
  machine in this churn, no extender design beats).

The last line is one JSON object: {"nodes", "pods", "minutes", "ours": {"rss_mib_peak",
"rss_mib_steady", "cpu_s_per_min", "requests_per_min", "lists_after_start"}, "kube_controller_manager":
{"requests_per_min"}, "kube_scheduler": {"requests_per_min"}, "controller_pass_p99_s",
"extender_p99_ms"} and more fields (per component, per verb; `answer_probe`: client p50/p99/max of ours
and of the two limits, ms). Bad arguments: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes.client.rest import ApiException  # noqa: E402

from bench.cluster_replay import (  # noqa: E402
    NAMESPACE,
    build_trace,
    core_api,
    drained,
    in_parallel,
    node_object,
    pod_object,
    samples,
    scaled,
    scrape,
    total,
)
from bench.extender_load import post, start_echo, wait_ready  # noqa: E402
from cli.livereplay import load_scheduler_config  # noqa: E402
from gpupolicy.packing.nodemodel import PodDemand  # noqa: E402
from serving.metrics import LATENCY_BUCKETS  # noqa: E402
from simulator.kubescheduler import Profile, num_nodes_to_find  # noqa: E402
from simulator.trace import load_nodes, load_pods  # noqa: E402
from tests.cluster.cluster import Cluster  # noqa: E402
from tests.cluster.karpenter import node_class_ref  # noqa: E402
from tests.cluster.kubeon import NAMESPACE as OURS_NS  # noqa: E402
from tests.cluster.kubeon import RELEASE  # noqa: E402
from tests.cluster.objects import OPENB_NODES_CSV  # noqa: E402
from tests.loopback import free_port  # noqa: E402

PODS_CSV = OPENB_NODES_CSV.parent / "openb_pod_list_default.csv"
SA = f"system:serviceaccount:{OURS_NS}:"
PROC = Path(os.environ.get("KUBEON_PROC", "/proc"))  # the kernel's process table (Linux procfs)
# every request at Metadata level but the lease renewals (KWOK's, one per node every 10 s: the largest
# share of the log, and no component measured here makes them but for its own leader lease)
AUDIT = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
         "rules": [{"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
                   {"level": "Metadata"}]}
PASS_BUCKETS_METRIC = "kubeon_gpu_reconcile_duration_seconds_bucket"
PASS_CPU_BUCKETS_METRIC = "kubeon_gpu_reconcile_cpu_seconds_bucket"  # the pass thread's own CPU
EXTENDER_BUCKETS_METRIC = "kubeon_extender_http_request_duration_seconds_bucket"
EXTENDER_CPU_BUCKETS_METRIC = "kubeon_extender_http_request_cpu_seconds_bucket"  # the answering thread's CPU
LOCK_WAIT_BUCKETS_METRIC = "kubeon_extender_model_lock_wait_seconds_bucket"  # waiting for the node model
EXTENDER_LAST_BOUND = LATENCY_BUCKETS[-1]
PERIODS = {"capacity": 10.0, "layout": 20.0, "scale-to-zero": 30.0, "autoscale": 60.0, "rightsizing": 300.0,
           "policies": 60.0, "extender-health": 30.0}


def policies(namespace: str, karpenter: bool) -> list[dict[str, Any]]:
    """One GpuPolicy of each kind, Automatic, for the bench's namespace."""
    def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": f"scale-{name}"},
                "spec": {"mode": "Automatic", **spec}}
    selector = {"selector": {"namespaces": [namespace]}}
    packing = {"schedulerName": "kubeon-gpu-scheduler", "packing": {"strategy": "default"}}
    made = [policy("packing", {**selector, **packing}),
            policy("sharing", {**selector, "sharing": {"strategy": "TimeSlicing"}}),
            policy("idle", {"scaleToZero": {"namespaces": [namespace], "idleFor": "30m", "idleBelowPercent": 5}})]
    if karpenter:
        made.append(policy("capacity", {**selector, "capacity": {
            "nodePool": "scale-gpu", "nodeClassRef": node_class_ref(), "gpuModels": ["NVIDIA-A100-SXM4-80GB"],
            "maxGpus": 64}}))
    return made


# ---------------------------------------------------------------- process figures (/proc)

def tree(pid: int) -> list[int]:
    """`pid` and its descendants (gunicorn's workers)."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in (PROC / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def cpu_seconds(pid: int) -> float:
    import os
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in tree(pid):
        try:
            fields = (PROC / str(p) / "stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


class Sampler(threading.Thread):
    """RSS of each process every `interval` seconds, with the time."""

    def __init__(self, pids: dict[str, int], interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.rss: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for name, pid in self.pids.items():
                self.rss[name].append((now, rss_mib(pid)))
            self.stop.wait(self.interval)


# ---------------------------------------------------------------- the audit log

def actor(event: dict[str, Any]) -> str | None:
    """Which measured component sent a request: kube-controller-manager and the kube-schedulers (the
    default one and the chart's second) by user agent, our processes by ServiceAccount."""
    agent = event.get("userAgent", "")
    for name in ("kube-controller-manager", "kube-scheduler"):
        if agent.startswith(name):
            return name
    user = (event.get("user") or {}).get("username", "")
    return user[len(SA):] if user.startswith(SA) else None


def audit_counts(events: Iterable[dict[str, Any]], since: float, until: float) -> dict[str, Counter[str]]:
    """Requests per actor and `verb resource` whose request arrived in [since, until) (unix seconds)."""
    from datetime import datetime
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    seen: set[str] = set()
    for e in events:
        who = actor(e)
        if who is None or e.get("auditID") in seen:
            continue
        seen.add(e.get("auditID", ""))
        at = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if since <= at < until:
            ref = e.get("objectRef") or {}
            counts[who][f"{e.get('verb')} {ref.get('resource', e.get('requestURI', '?').split('?')[0])}"] += 1
    return counts


def read_audit(path: Path) -> list[dict[str, Any]]:
    events = []
    with path.open() as lines:
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                break
    return events


# ---------------------------------------------------------------- histograms

def buckets(text: str, metric: str, keep: Callable[[dict[str, str]], bool]) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for labels, value in samples(text, metric):
        if keep(labels):
            out[float(labels["le"])] += value
    return dict(out)


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The q-quantile's bucket bound of the observations between two scrapes (an upper bound)."""
    diff = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    total = diff[-1][1] if diff else 0.0
    if total <= 0:
        return None
    return next(le for le, count in diff if count >= q * total)


def pass_means(before: str, after: str, reconciler: str) -> dict[str, Any]:
    """A reconciler's passes during the churn: how many, their mean wall time and mean CPU (the histograms'
    sums: exact, where the buckets only bound the quantiles)."""
    def delta(metric: str) -> float:
        return total(after, metric, reconciler=reconciler) - total(before, metric, reconciler=reconciler)
    count = delta("kubeon_gpu_reconcile_cpu_seconds_count")
    if not count:
        return {"passes": 0}
    return {"passes": int(count),
            "wall_mean_s": round(delta("kubeon_gpu_reconcile_duration_seconds_sum") / count, 3),
            "cpu_mean_s": round(delta("kubeon_gpu_reconcile_cpu_seconds_sum") / count, 3)}


def extender_means(ext0: str, ext1: str, waits: tuple[dict[float, float], dict[float, float]]) -> dict[str, Any]:
    """How many /filter and /prioritize answers the churn saw, and where their time went on average: the
    wall clock, the answering thread's CPU, the wait for the node model's lock (wall - CPU - lock: the
    interpreter and the machine); the lock wait's p99 bucket bound."""
    def delta(metric: str) -> float:
        return sum(total(ext1, metric, route=r) - total(ext0, metric, route=r) for r in ("/filter", "/prioritize"))

    def waited(metric: str) -> float:
        return total(ext1, metric) - total(ext0, metric)
    count = delta("kubeon_extender_http_request_cpu_seconds_count")
    if not count:
        return {"count": 0}
    return {"count": int(count),
            "wall_mean_ms": _ms(delta("kubeon_extender_http_request_duration_seconds_sum") / count),
            "cpu_mean_ms": _ms(delta("kubeon_extender_http_request_cpu_seconds_sum") / count),
            "lock_wait_mean_ms": _ms(waited("kubeon_extender_model_lock_wait_seconds_sum")
                                     / max(1.0, waited("kubeon_extender_model_lock_wait_seconds_count"))),
            "lock_wait_p99_ms": _ms(quantile(*waits, 0.99))}


def _ms(seconds: float | None) -> float | str | None:
    """Milliseconds; beyond the last finite bucket, the bound as text (">1000"): JSON has no Infinity."""
    if seconds is None:
        return None
    return f">{1000 * EXTENDER_LAST_BOUND:.0f}" if seconds == float("inf") else round(1000 * seconds, 1)


# ---------------------------------------------------------------- the run

class Workload:
    """The nodes and pods of a run (`--nodes`, `--pods`, `--gpu-fill`, `--scheduled-share`, `--seed`); also
    bench/controller_pass.py's, which runs the controller's passes on them without a cluster."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        nodes = load_nodes(str(OPENB_NODES_CSV))
        copies = max(1, -(-args.nodes // len(nodes)))
        self.trace = build_trace(scaled(nodes, copies)[:args.nodes], load_pods(str(PODS_CSV)), args.seed)
        self.rng = random.Random(args.seed)
        self.live: dict[str, tuple[str | None, Any]] = {}  # pod name -> (node or None, demand)
        self.seq = 0

    def node_objects(self) -> list[dict[str, Any]]:
        return [node_object(spec, name, self.trace.replicas)
                for spec, name in zip(self.trace.nodes, self.trace.names, strict=True)]

    def place(self) -> list[tuple[dict[str, Any], str | None]]:
        """M pods: GPU pods of the trace's shapes in the seed's arrival order, each given room by first fit
        (GPUs, CPU, memory) until their GPU demand reaches `--gpu-fill` of the GPUs (a pod that fits nowhere
        is passed over); then, up to M, small CPU pods (100m, 128Mi: the per-node agents a GPU cluster runs,
        exporters, log shippers, the GPU Operator's own) bound round robin. The `--scheduled-share` of the
        GPU pods are created without their node (the schedulers find the room kept for them), the rest bound."""
        rooms = {name: [spec.gpu_count * 1000, spec.cpu_milli, spec.memory_mib]
                 for name, spec in zip(self.trace.names, self.trace.nodes, strict=True)}
        open_nodes = [name for name, room in rooms.items() if room[0] > 0]
        target = self.args.gpu_fill * sum(room[0] for room in rooms.values())
        out: list[tuple[dict[str, Any], str | None]] = []
        used = 0
        for demand in self.trace.arrivals + self.trace.pods:
            if len(out) == self.args.pods or used >= target:
                break
            if not demand.needs_gpu:
                continue
            need = (demand.gpu_total_milli, demand.cpu_milli, demand.memory_mib)
            node = next((n for n in open_nodes if all(r >= x for r, x in zip(rooms[n], need, strict=True))), None)
            if node is None:
                continue
            rooms[node] = [r - x for r, x in zip(rooms[node], need, strict=True)]
            if rooms[node][0] <= 0:
                open_nodes.remove(node)
            used += need[0]
            out.append(self.pod(demand, None if self.rng.random() < self.args.scheduled_share else node))
        agent = PodDemand(name="agent", cpu_milli=100, memory_mib=128)
        for i in range(self.args.pods - len(out)):
            out.append(self.pod(agent, self.trace.names[i % len(self.trace.names)]))
        return out

    def pod(self, demand: Any, node: str | None) -> tuple[dict[str, Any], str | None]:
        self.seq += 1
        obj = pod_object(demand, self.seq)
        if node:
            obj["spec"]["nodeName"] = node
        self.live[obj["metadata"]["name"]] = (node, demand)
        return obj, node



class ScaleRun(Workload):
    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        super().__init__(args)
        self.log = log
        self.cluster = Cluster(kubeon=True, karpenter=args.karpenter, gpu_operator=False,
                               kubeon_sets=("prometheus.url=http://127.0.0.1:9",), keep_state=args.keep_state)
        self.cluster.plane.audit_policy = AUDIT

    def run(self) -> dict[str, Any]:
        a = self.args
        with self.cluster:
            core = core_api(self.cluster.kubeconfig, a.threads * 2)
            self.log(f"cluster up; creating {len(self.trace.names)} nodes")
            in_parallel(self.cluster.create_node, self.node_objects(), a.threads)
            self.cluster.ensure_namespace(NAMESPACE)
            for obj in policies(NAMESPACE, a.karpenter):
                self.cluster.create(obj)
            pods = self.place()
            self.log(f"creating {len(pods)} pods ({sum(1 for _, n in pods if n is None)} through the schedulers)")
            in_parallel(lambda pair: drained(core.create_namespaced_pod(NAMESPACE, pair[0], _preload_content=False)),
                        pods, a.threads)
            kubeon = self.cluster.kubeon
            assert kubeon is not None
            children = self.cluster.plane.children
            pids = {name: children.get(name).popen.pid for name in ("controller", "webhook", "extender")}
            pids |= {name: children.get(name).popen.pid for name in ("kube-controller-manager", "kube-scheduler")}
            sampler = Sampler(pids)
            sampler.start()
            controller_metrics = f"http://127.0.0.1:{kubeon.ports['controller']}/metrics"
            self.settle(controller_metrics)
            self.log(f"start-up done; churn {a.churn_per_s}/s for {a.minutes} min")
            started, mono0 = time.time(), time.monotonic()
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            pass0, ext0 = scrape(controller_metrics), scrape(f"{kubeon.extender_url}/metrics")
            with self.bare_server(kubeon.extender_url) as spec:
                probe = subprocess.Popen([sys.executable, __file__, "--wake-probe", str(a.minutes * 60)],
                                         stdout=subprocess.PIPE, text=True)
                answers = subprocess.Popen([sys.executable, __file__, "--answer-probe", str(spec)],
                                           stdout=subprocess.PIPE, text=True)
                errors = self.churn(core, a.minutes * 60)
                wake = json.loads(probe.communicate(timeout=120)[0])
                answered = json.loads(answers.communicate(timeout=120)[0])
            ended, mono1 = time.time(), time.monotonic()
            cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            pass1, ext1 = scrape(controller_metrics), scrape(f"{kubeon.extender_url}/metrics")
            sampler.stop.set()
            sampler.join()
            unbound = self.unbound(core)
            events = read_audit(self.cluster.plane.audit_log)
            return {**self.summary(events, started, ended, mono0, mono1, cpu0, cpu1, sampler, pass0, pass1, ext0,
                                   ext1, unbound, errors), "wake_delay": wake, "answer_probe": answered}

    def filter_bodies(self, count: int = 200) -> list[dict[str, Any]]:
        """`count` /filter ExtenderArgs as kube-scheduler sends them here: a GPU pod of the trace's shapes and
        numFeasibleNodesToFind GPU node names (the rendered profile's percentage), the window moving on from
        call to call as upstream's nextStartNodeIndex does."""
        gpu_nodes = [n for n, spec in zip(self.trace.names, self.trace.nodes, strict=True) if spec.gpu_count]
        percentage = Profile.from_config(load_scheduler_config()).percentage_of_nodes_to_score
        size = min(len(gpu_nodes), num_nodes_to_find(percentage, len(self.trace.names)))
        demands = [d for d in self.trace.pods if d.needs_gpu]
        out = []
        for i in range(count):
            pod = pod_object(demands[i % len(demands)], 10_000_000 + i)
            pod["metadata"]["uid"] = f"answer-probe-{i}"
            start = (i * size) % len(gpu_nodes)
            names = (gpu_nodes + gpu_nodes)[start:start + size]
            out.append({"Pod": pod, "Nodes": None, "NodeNames": names})
        return out

    @contextlib.contextmanager
    def bare_server(self, extender_url: str) -> Iterator[Path]:
        """The limits beside the extender (the module doc), answering its median /filter answer to the
        probe's bodies; yields the answer probe's spec file (the three ports, the bodies, the time, the rate)."""
        bodies = self.filter_bodies()
        port = int(extender_url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        got = sorted((post(conn, "/filter", body)[4] for body in bodies[:21]), key=len)
        conn.close()
        answer = got[len(got) // 2]
        bare_port = free_port()
        bare, log = start_echo(bare_port, {"/filter": answer})  # writes the answer to its folder's `filter`
        floor_port = free_port()
        with open(log.parent / "floor.log", "wb") as sink:
            floor = subprocess.Popen([str(floor_server()), "-port", str(floor_port), "-answer",
                                      str(log.parent / "filter")], stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_ready(bare, log, bare_port)
            wait_ready(floor, log.parent / "floor.log", floor_port)
            spec = log.parent / "answer-probe.json"
            spec.write_text(json.dumps({"ours": port, "bare": bare_port, "floor": floor_port,
                                        "seconds": self.args.minutes * 60, "per_s": self.args.probe_per_s,
                                        "bodies": bodies}))
            yield spec
        finally:
            for proc in (bare, floor):
                proc.terminate()
                proc.wait(timeout=15)
            shutil.rmtree(log.parent, ignore_errors=True)

    def settle(self, controller_metrics: str, timeout: float = 900.0) -> None:
        """Until every reconciler of the controller has run a pass (its caches listed) and the schedulers
        have taken the pods created without a node."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = scrape(controller_metrics)
            ran = {labels["reconciler"] for labels, v in samples(text, "kubeon_gpu_reconcile_duration_seconds_count")
                   if v > 0}
            if {"capacity", "layout"} <= ran:
                return
            time.sleep(2)
        raise TimeoutError("the controller ran no capacity and layout pass within the start-up timeout")

    def churn(self, core: Any, seconds: float) -> int:
        """Delete one pod and create one of its shape, `churn_per_s` times a second. Returns API errors."""
        errors, end = 0, time.monotonic() + seconds
        interval = 1.0 / self.args.churn_per_s
        next_at = time.monotonic()
        while time.monotonic() < end:
            name = self.rng.choice(list(self.live))
            node, demand = self.live.pop(name)
            obj, _ = self.pod(demand, node)
            try:
                drained(core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0, _preload_content=False))
                drained(core.create_namespaced_pod(NAMESPACE, obj, _preload_content=False))
            except ApiException:
                errors += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        return errors

    def unbound(self, core: Any) -> dict[str, int]:
        """Pods without a node at the end, by the reason of their PodScheduled condition."""
        listed = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
        reasons: Counter[str] = Counter()
        for p in listed:
            if not (p.get("spec") or {}).get("nodeName"):
                cond = next((c for c in (p.get("status") or {}).get("conditions") or []
                             if c.get("type") == "PodScheduled"), {})
                reasons[cond.get("reason") or "not yet tried"] += 1
        return dict(reasons)

    def summary(self, events: list[dict[str, Any]], started: float, ended: float, mono0: float, mono1: float,
                cpu0: dict[str, float], cpu1: dict[str, float], sampler: Sampler, pass0: str, pass1: str,
                ext0: str, ext1: str, unbound: dict[str, int], errors: int) -> dict[str, Any]:
        minutes = (ended - started) / 60
        during = audit_counts(events, started, ended)
        after_start = audit_counts(events, started, float("inf"))

        def per_min(who: str) -> float:
            return round(sum(during.get(who, Counter()).values()) / minutes, 1)

        def rss(name: str) -> tuple[float, float]:
            points = sampler.rss[name]
            steady = [v for t, v in points if mono0 <= t <= mono1] or [v for _, v in points]
            return round(max(v for _, v in points), 1), round(statistics.median(steady), 1)

        def lists(who: str) -> int:
            return sum(n for key, n in after_start.get(who, Counter()).items()
                       if key in ("list pods", "list nodes"))

        components = {}
        for name, who in (("controller", RELEASE), ("webhook", f"{RELEASE}-webhook"),
                          ("extender", f"{RELEASE}-extender"), ("kube-controller-manager", "kube-controller-manager"),
                          ("kube-scheduler", "kube-scheduler")):
            peak, steady = rss(name)
            components[name] = {"rss_mib_peak": peak, "rss_mib_steady": steady,
                                "cpu_s_per_min": round((cpu1[name] - cpu0[name]) / minutes, 2),
                                "requests_per_min": per_min(who), "lists_after_start": lists(who),
                                "watches_started": sum(n for k, n in during.get(who, Counter()).items()
                                                       if k.startswith("watch ")),
                                "by_verb": dict(during.get(who, Counter()).most_common(12))}
        passes = {}
        for reconciler, period in PERIODS.items():
            def keep(labels: dict[str, str], r: str = reconciler) -> bool:
                return labels.get("reconciler") == r
            wall = buckets(pass0, PASS_BUCKETS_METRIC, keep), buckets(pass1, PASS_BUCKETS_METRIC, keep)
            cpu = buckets(pass0, PASS_CPU_BUCKETS_METRIC, keep), buckets(pass1, PASS_CPU_BUCKETS_METRIC, keep)
            p99 = quantile(*wall, 0.99)
            if p99 is not None:
                passes[reconciler] = {"p50_s": quantile(*wall, 0.5), "p99_s": p99, "period_s": period,
                                      "cpu_p50_s": quantile(*cpu, 0.5), "cpu_p99_s": quantile(*cpu, 0.99),
                                      **pass_means(pass0, pass1, reconciler)}

        def scheduling(labels: dict[str, str]) -> bool:
            return labels.get("route") in ("/filter", "/prioritize")
        ext_p99 = quantile(buckets(ext0, EXTENDER_BUCKETS_METRIC, scheduling),
                           buckets(ext1, EXTENDER_BUCKETS_METRIC, scheduling), 0.99)
        ext_cpu = buckets(ext0, EXTENDER_CPU_BUCKETS_METRIC, scheduling), buckets(ext1, EXTENDER_CPU_BUCKETS_METRIC,
                                                                                   scheduling)
        waits = (buckets(ext0, LOCK_WAIT_BUCKETS_METRIC, lambda _labels: True),
                 buckets(ext1, LOCK_WAIT_BUCKETS_METRIC, lambda _labels: True))
        model = {"rebuilds": total(ext1, "kubeon_extender_model_rebuilds_total")
                 - total(ext0, "kubeon_extender_model_rebuilds_total"),
                 **{f"rows_{how}": total(ext1, "kubeon_extender_model_rows_total", how=how)
                    - total(ext0, "kubeon_extender_model_rows_total", how=how)
                    for how in ("recomputed", "settled", "copied", "occupied")}}
        ours = components["controller"]
        return {"nodes": len(self.trace.names), "pods": self.args.pods, "minutes": round(minutes, 2),
                "churn_per_s": self.args.churn_per_s,
                "ours": {k: ours[k] for k in ("rss_mib_peak", "rss_mib_steady", "cpu_s_per_min", "requests_per_min",
                                              "lists_after_start")},
                "kube_controller_manager": {"requests_per_min": per_min("kube-controller-manager")},
                "kube_scheduler": {"requests_per_min": per_min("kube-scheduler")},
                "controller_pass_p99_s": max((p["p99_s"] for p in passes.values()), default=None),
                "extender_p99_ms": _ms(ext_p99), "extender_cpu_p50_ms": _ms(quantile(*ext_cpu, 0.5)),
                "extender_cpu_p99_ms": _ms(quantile(*ext_cpu, 0.99)), "extender_model": model,
                "extender_requests": extender_means(ext0, ext1, waits),
                "passes": passes, "components": components, "unbound_at_end": unbound, "churn_errors": errors}


def wake_probe(seconds: float, interval: float = 0.01, work: float = 0.001, every: int = 5,
               long_work_s: float = 0.25, long_every: float = 10.0) -> dict[str, Any]:
    """How late a process that does nothing else wakes on this machine: sleeps of `interval` for `seconds`,
    each one's overshoot. The floor under any answer timed here (a request that waits for the CPU waits
    at least this); run as its own process beside the churn (`--wake-probe`). Every `every`-th wake it
    also spins until its thread used `work` seconds of CPU (1 ms: about one /filter or /prioritize at
    1,000-5,000 nodes), timing the wall clock that took (`work_wall`): what the machine makes of a
    request's CPU, however the request is written. Every `long_every` seconds it spins `long_work_s` of CPU
    at once, a controller pass's kind of work (`long_work`: wall clock over CPU, p50 / max): how much longer
    than its CPU a pass takes here, however the pass is written."""
    late: list[float] = []
    spun: list[float] = []
    stretch: list[float] = []
    end = time.monotonic() + seconds
    next_long = time.monotonic() + long_every
    while time.monotonic() < end:
        if time.monotonic() >= next_long:  # a pass's kind of work: long, CPU-bound, no sleep in it
            stretch.append(_spin(long_work_s) / long_work_s)
            next_long = time.monotonic() + long_every
        started = time.perf_counter()
        time.sleep(interval)
        woke = time.perf_counter()
        late.append(woke - started - interval)
        if len(late) % every == 0:
            _spin(work)
            spun.append(time.perf_counter() - woke)
    return {**spread(late), "samples": len(late), "work_cpu_ms": 1000 * work, "work_wall": spread(spun),
            "long_work": {"work_cpu_s": long_work_s, "samples": len(stretch),
                          "wall_over_cpu_p50": round(statistics.median(stretch), 2) if stretch else None,
                          "wall_over_cpu_max": round(max(stretch), 2) if stretch else None}}


PROBED = ("ours", "bare", "floor")  # the extender and its two limits (the module doc)


def answer_probe(spec_file: Path) -> dict[str, Any]:
    """kube-scheduler's side of a /filter call, to the extender and to its limits in turn (the module doc):
    `per_s` calls a second to each for `seconds`, one keep-alive connection to each, the bodies in turn. Each
    call's wall time from the request's first byte to the answer's last, as kube-scheduler's HTTP client
    times it; the same client, bodies and machine for all three, so the differences are the servers'."""
    spec = json.loads(spec_file.read_text())
    bodies = spec["bodies"]
    conns = {who: http.client.HTTPConnection("127.0.0.1", spec[who], timeout=30) for who in PROBED}
    times: dict[str, list[float]] = {who: [] for who in PROBED}
    interval = 1.0 / (len(PROBED) * spec["per_s"])
    end = time.monotonic() + spec["seconds"]
    next_at, i = time.monotonic(), 0
    while time.monotonic() < end:
        who = PROBED[i % len(PROBED)]
        times[who].append(post(conns[who], "/filter", bodies[(i // len(PROBED)) % len(bodies)])[1])
        i += 1
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    got = {who: spread(times[who]) for who in PROBED}
    return {"route": "/filter", "names": len(bodies[0]["NodeNames"]), "per_s": spec["per_s"],
            "samples": min(len(v) for v in times.values()), **got,
            **{f"p99_over_{who}": round(got["ours"]["p99_ms"] / got[who]["p99_ms"], 2) if got[who]["p99_ms"] else None
               for who in PROBED[1:]}}


def floor_server() -> Path:
    """bench/floor/main.go built with the local Go toolchain (GOTOOLCHAIN=local, the standard library only),
    cached outside the checkout by its source's and the toolchain's hash."""
    source = ROOT / "bench" / "floor" / "main.go"
    version = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(source.read_bytes() + version.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubeon-gpu"
    binary = cache / f"floor-server-{key}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        subprocess.run(["go", "build", "-o", str(partial), str(source)], cwd=source.parent, check=True,
                       env={**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}, timeout=600)
        partial.rename(binary)
    return binary


def _spin(work: float) -> float:
    """Use `work` seconds of this thread's CPU; the wall-clock seconds that took."""
    started, cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu < work:
        pass
    return time.perf_counter() - started


def spread(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (seconds) in milliseconds."""
    values = sorted(values) or [0.0]
    return {"p50_ms": round(1000 * values[len(values) // 2], 2),
            "p99_ms": round(1000 * values[int(0.99 * (len(values) - 1))], 2), "max_ms": round(1000 * values[-1], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--churn-per-s", type=float, default=5.0)
    parser.add_argument("--scheduled-share", type=float, default=0.1,
                        help="share of the pods created without a node (the schedulers place them)")
    parser.add_argument("--gpu-fill", type=float, default=0.8,
                        help="GPU pods until their demand reaches this share of the GPUs (default 0.8)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=8, help="concurrent creates")
    parser.add_argument("--no-karpenter", dest="karpenter", action="store_false",
                        help="no Karpenter and no capacity policy")
    parser.add_argument("--keep-state", action="store_true", help="keep the cluster's folder (logs, audit)")
    parser.add_argument("--probe-per-s", type=float, default=4.0,
                        help="the answer probe's /filter calls a second to the extender, as many to each limit")
    parser.add_argument("--answer-probe", type=Path, metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--wake-probe", type=float, metavar="SECONDS",
                        help="only measure how late a sleeping process wakes here for SECONDS (the run starts one)")
    args = parser.parse_args(argv)
    if args.wake_probe is not None:
        if args.wake_probe <= 0:
            print(f"error: --wake-probe must be positive, got {args.wake_probe}", file=sys.stderr)
            return 2
        print(json.dumps(wake_probe(args.wake_probe)), flush=True)
        return 0
    if args.answer_probe is not None:
        print(json.dumps(answer_probe(args.answer_probe)), flush=True)
        return 0
    for flag, value in (("--nodes", args.nodes), ("--pods", args.pods), ("--minutes", args.minutes),
                        ("--churn-per-s", args.churn_per_s), ("--threads", args.threads),
                        ("--probe-per-s", args.probe_per_s)):
        if value <= 0:
            print(f"error: {flag} must be positive, got {value}", file=sys.stderr)
            return 2
    if not 0 < args.gpu_fill <= 1:
        print(f"error: --gpu-fill must be in (0, 1], got {args.gpu_fill}", file=sys.stderr)
        return 2
    if not 0 <= args.scheduled_share <= 1:
        print(f"error: --scheduled-share must be between 0 and 1, got {args.scheduled_share}", file=sys.stderr)
        return 2

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    print(json.dumps(ScaleRun(args, log).run()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
