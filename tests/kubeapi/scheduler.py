"""A small kube-scheduler stand-in: filter, call the extender over HTTP, score, bind.

It places pending pods of one schedulerName (the optimizer's second scheduler
by default) the way kube-scheduler's default profile would for the checks
tests rely on: resource fit (cpu, memory, pods, extended resources) against
allocatable minus the requests of pods bound there, NoSchedule/NoExecute
taints against tolerations, `spec.unschedulable`, nodeSelector and required
node affinity. Then it calls configured extenders with the upstream
extender/v1 wire format (capitalised keys, nodeCacheCapable, managedResources,
ignorable, weight), binds through the `binding` subresource and records a
`Scheduled` or `FailedScheduling` Event. It talks to the API server only
through the `kubernetes` client over HTTP.

With a `profile` (simulator.kubescheduler.Profile, e.g. read from the
chart's rendered KubeSchedulerConfiguration) it scores like kube-scheduler
v1.35: node sampling, NodeResourcesFit/BalancedAllocation/TaintToleration/
NodeAffinity, extender weighting, seeded random ties (simulator/kubescheduler.py
says what is and is not emulated). Without one, on purpose: no scoring
plugins of its own (every feasible node scores 0 plus the extenders', ties
go to node-name order, so tests are deterministic). Always: no preemption,
no inter-pod affinity or topology spread, no binding cycle parallelism. An
extender with a `bindVerb` binds the pod instead of the stand-in.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupolicy.quantity import parse_quantity
from simulator.kubescheduler import (
    ClusterScores,
    ExtenderSpec,
    Profile,
    matches_node_selector_terms,
    pod_requests,
    schedule_one,
    tolerates,
)
from tests.cluster.objects import DEFAULT_SCHEDULER

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "default-scheduler"  # what the API server defaults spec.schedulerName to
MAX_EXTENDER_PRIORITY = 10
MAX_NODE_SCORE = 100
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
ALL_SCHEDULERS = None  # pass as scheduler_name to place pods of every schedulerName

Pod = dict[str, Any]
Node = dict[str, Any]


MERGE_PATCH = "application/merge-patch+json"  # the generated client defaults PATCH to JSON Patch


def read_items(response: Any) -> list[dict[str, Any]]:
    """Items of a list call made with `_preload_content=False` (plain wire dicts, no model classes)."""
    return list(json.loads(response.data).get("items") or [])


def record_event(core: client.CoreV1Api, obj: Mapping[str, Any], event_type: str, reason: str, message: str,
                 component: str, *, kind: str = "Pod", api_version: str = "v1") -> None:
    """Record a core/v1 Event about `obj`, best effort (a failure to record is logged, as in kube).

    `kind` and `api_version` are explicit: list items carry neither on the wire.
    """
    meta = obj["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = meta.get("namespace") or "default"
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind,
                           "name": meta["name"], "namespace": meta.get("namespace"),
                           "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message, "type": event_type, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": component}, "reportingComponent": component,
    }
    try:
        core.create_namespaced_event(namespace, body, _preload_content=False)
    except ApiException as exc:
        log.info("event %s for %s not recorded: %s", reason, meta["name"], exc.status)


# ---------------------------------------------------------------- pure predicates

def node_free(node: Mapping[str, Any], bound: Iterable[Mapping[str, Any]]) -> dict[str, Decimal]:
    """Allocatable minus the requests of the pods bound to the node (one pod slot each). Pure."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    free = {name: parse_quantity(value) for name, value in allocatable.items()}
    for pod in bound:
        for name, value in pod_requests(pod).items():
            free[name] = free.get(name, Decimal(0)) - value
        free["pods"] = free.get("pods", Decimal(0)) - 1
    return free


def insufficient_resources(pod: Mapping[str, Any], free: Mapping[str, Decimal]) -> list[str]:
    """Resource names the pod asks for beyond what is free (a missing resource counts as zero). Pure."""
    short = [name for name, value in sorted(pod_requests(pod).items()) if value > 0 and free.get(name, 0) < value]
    if "pods" in free and free["pods"] < 1:
        short.append("pods")
    return short


def untolerated_taint(pod: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate; cordoning counts as a taint. Pure."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return dict(taint)
    return None


def selector_mismatch(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why nodeSelector or required node affinity rules the node out, or None. Pure."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return "node(s) didn't match Pod's node affinity/selector"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not matches_node_selector_terms(required.get("nodeSelectorTerms") or [], node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def filter_node(pod: Mapping[str, Any], node: Mapping[str, Any], bound: Iterable[Mapping[str, Any]]) -> str | None:
    """The reason the node cannot take the pod, worded like kube-scheduler, or None when it fits. Pure."""
    taint = untolerated_taint(pod, node)
    if taint is not None:
        if taint["key"] == UNSCHEDULABLE_TAINT:
            return "node(s) were unschedulable"
        value = f": {taint['value']}" if taint.get("value") else ""
        return f"node(s) had untolerated taint {{{taint['key']}{value}}}"
    mismatch = selector_mismatch(pod, node)
    if mismatch:
        return mismatch
    short = insufficient_resources(pod, node_free(node, bound))
    if short:
        return "Too many pods" if short == ["pods"] else f"Insufficient {short[0]}"
    return None


def summarise_failures(total: int, reasons: Mapping[str, str]) -> str:
    """kube-scheduler's FailedScheduling message: `0/3 nodes are available: 2 Insufficient cpu, ...`. Pure."""
    counts: dict[str, int] = {}
    for reason in reasons.values():
        counts[reason] = counts.get(reason, 0) + 1
    parts = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    return f"0/{total} nodes are available: {parts}." if parts else f"0/{total} nodes are available."


def _creation_key(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = pod.get("metadata") or {}
    priority = (pod.get("spec") or {}).get("priority") or 0
    return (-priority, meta.get("creationTimestamp") or "", meta.get("namespace", ""), meta.get("name", ""))


# ---------------------------------------------------------------- extender wire client

@dataclass(frozen=True)
class ExtenderConfig:
    """One entry of KubeSchedulerConfiguration `extenders[]` (the fields this stand-in honours)."""

    url_prefix: str
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    bind_verb: str | None = None
    weight: int = 1
    node_cache_capable: bool = True
    managed_resources: tuple[str, ...] = ()
    ignorable: bool = False
    http_timeout: float = 5.0
    ca_file: str | None = None  # https: verify the extender's certificate against this CA

    def interested_in(self, pod: Mapping[str, Any]) -> bool:
        """With managedResources set, only pods requesting one of them are sent (upstream IsInterested)."""
        if not self.managed_resources:
            return True
        return any(name in self.managed_resources for name in pod_requests(pod))


class ExtenderError(RuntimeError):
    """The extender failed: transport error, non-200 status or a non-empty `Error`."""


@dataclass
class Extender:
    """HTTP client of one extender, speaking the extender/v1 JSON (Go field names, no json tags)."""

    config: ExtenderConfig
    session: requests.Session = field(default_factory=requests.Session)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (verb, args) for test assertions

    def _post(self, verb: str, args: dict[str, Any]) -> Any:
        self.calls.append((verb, args))
        url = self.config.url_prefix.rstrip("/") + "/" + verb
        try:
            response = self.session.post(url, json=args, timeout=self.config.http_timeout,
                                         verify=self.config.ca_file or True)
        except requests.RequestException as exc:
            raise ExtenderError(f"extender {url}: {exc}") from exc
        if response.status_code != 200:
            raise ExtenderError(f"extender {url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError as exc:
            raise ExtenderError(f"extender {url}: invalid JSON") from exc

    def _args(self, pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if self.config.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
        return {"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": list(nodes)},
                "NodeNames": None}

    def filter(self, pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, str]]:
        """Names that passed (only ones that were sent) and {node: reason} for the rest."""
        result = self._post(self.config.filter_verb or "filter", self._args(pod, nodes))
        if not isinstance(result, dict):
            raise ExtenderError("extender filter: result is not an ExtenderFilterResult object")
        if result.get("Error"):
            raise ExtenderError(str(result["Error"]))
        sent = [n["metadata"]["name"] for n in nodes]
        if self.config.node_cache_capable:
            names = result.get("NodeNames") or []
        else:
            names = [n["metadata"]["name"] for n in ((result.get("Nodes") or {}).get("items") or [])]
        failed = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
        passed = [name for name in sent if name in set(names) and name not in failed]
        for name in sent:
            if name not in passed and name not in failed:
                failed[name] = "node(s) were filtered out by the extender"
        return passed, {k: v for k, v in failed.items() if k in sent}

    def prioritize(self, pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Weighted contributions per node: score (0..10) * weight * (MaxNodeScore / 10)."""
        result = self._post(self.config.prioritize_verb or "prioritize", self._args(pod, nodes))
        if not isinstance(result, list):
            raise ExtenderError("extender prioritize: result is not a HostPriorityList")
        scores: dict[str, int] = {}
        for entry in result:
            score = max(0, min(MAX_EXTENDER_PRIORITY, int(entry.get("Score", 0))))
            scores[str(entry.get("Host"))] = score * self.config.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        return scores

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        """ExtenderBindingArgs to the bindVerb; the extender's `Error` ('' = bound)."""
        meta = pod["metadata"]
        result = self._post(self.config.bind_verb or "bind", {
            "PodName": meta["name"], "PodNamespace": meta.get("namespace", "default"),
            "PodUID": meta.get("uid", ""), "Node": node})
        return str((result or {}).get("Error") or "") if isinstance(result, dict) else "bad ExtenderBindingResult"


class _RawCalls:
    """An `Extender` as the emulation's `ExtenderCalls`: raw 0..10 scores (the emulation weights them)."""

    def __init__(self, extender: Extender, nodes: Mapping[str, dict[str, Any]]) -> None:
        self.extender = extender
        self.nodes = nodes

    def _nodes(self, names: list[str]) -> list[dict[str, Any]]:
        return [self.nodes[n] for n in names]

    def filter(self, pod: Mapping[str, Any], names: list[str]) -> tuple[list[str], dict[str, str]]:
        try:
            return self.extender.filter(pod, self._nodes(names))
        except ExtenderError as exc:
            raise RuntimeError(str(exc)) from exc

    def prioritize(self, pod: Mapping[str, Any], names: list[str]) -> dict[str, int]:
        try:
            weighted = self.extender.prioritize(pod, self._nodes(names))
        except ExtenderError as exc:
            raise RuntimeError(str(exc)) from exc
        scale = self.extender.config.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        return {name: value // scale for name, value in weighted.items()}

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        try:
            return self.extender.bind(pod, node)
        except ExtenderError as exc:
            return str(exc)


def _spec(config: ExtenderConfig) -> ExtenderSpec:
    return ExtenderSpec(url_prefix=config.url_prefix, filter_verb=config.filter_verb or "",
                        prioritize_verb=config.prioritize_verb or "", bind_verb=config.bind_verb or "",
                        weight=config.weight, node_cache_capable=config.node_cache_capable,
                        ignorable=config.ignorable, managed_resources=config.managed_resources)


# ---------------------------------------------------------------- the loop

@dataclass(frozen=True)
class Placement:
    """The outcome for one pod in one pass: bound to `node`, or not with `message`."""

    namespace: str
    name: str
    node: str | None
    message: str
    scores: Mapping[str, int] = field(default_factory=dict)


class Scheduler:
    """Places pending pods of `scheduler_name` (None: every pod) through the API server.

    `schedule_once()` runs one deterministic pass over all pending pods and
    returns what happened; `start()` runs passes in a background thread.
    """

    def __init__(self, api_client: client.ApiClient, *, scheduler_name: str | None = DEFAULT_SCHEDULER,
                 extenders: Sequence[ExtenderConfig] = (), interval: float = 0.05,
                 profile: Profile | None = None, seed: int = 0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.profile = profile
        self.rng = np.random.default_rng(seed)
        self._next_start = 0
        self.scheduler_name = scheduler_name
        self.extenders = [Extender(config) for config in extenders]
        self.interval = interval
        self._last_failure: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- reads
    def _list(self, call: Any) -> list[dict[str, Any]]:
        return read_items(call(_preload_content=False))

    def _responsible_for(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        name = spec.get("schedulerName") or DEFAULT_SCHEDULER_NAME
        return self.scheduler_name is None or name == self.scheduler_name

    # -- one pass
    def schedule_once(self) -> list[Placement]:
        """Schedule every pending pod once, oldest (highest priority) first; bound pods count at once."""
        with self._lock:
            nodes = sorted(self._list(self.core.list_node), key=lambda n: n["metadata"]["name"])
            pods = self._list(self.core.list_pod_for_all_namespaces)
            bound: dict[str, list[Pod]] = {n["metadata"]["name"]: [] for n in nodes}
            for pod in pods:
                node_name = (pod.get("spec") or {}).get("nodeName")
                phase = (pod.get("status") or {}).get("phase")
                if node_name in bound and phase not in ("Succeeded", "Failed"):
                    bound[node_name].append(pod)
            placements = []
            scoring = None
            if self.profile is not None:
                scoring = ClusterScores(nodes)
                scoring.next_start = self._next_start
                for node_name, on_node in bound.items():
                    for running in on_node:
                        scoring.add(running, node_name)
            for pod in sorted(filter(self._responsible_for, pods), key=_creation_key):
                if scoring is not None:
                    placement = self._schedule_scored(pod, nodes, scoring)
                    if placement.node:
                        scoring.add(pod, placement.node)
                    self._next_start = scoring.next_start
                else:
                    placement = self._schedule_pod(pod, nodes, bound)
                placements.append(placement)
                if placement.node:
                    bound[placement.node].append(pod)
            return placements

    def _schedule_pod(self, pod: Pod, nodes: list[Node], bound: dict[str, list[Pod]]) -> Placement:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        failures: dict[str, str] = {}
        feasible: list[Node] = []
        for node in nodes:
            reason = filter_node(pod, node, bound[node["metadata"]["name"]])
            if reason:
                failures[node["metadata"]["name"]] = reason
            else:
                feasible.append(node)
        scores = {n["metadata"]["name"]: 0 for n in feasible}
        for extender in self.extenders:
            if not feasible or not extender.config.interested_in(pod):
                continue
            if extender.config.filter_verb:
                try:
                    passed, failed = extender.filter(pod, feasible)
                except ExtenderError as exc:
                    if extender.config.ignorable:
                        log.info("ignorable extender failed: %s", exc)
                        continue
                    return self._fail(pod, f"extender error: {exc}")
                failures.update(failed)
                feasible = [n for n in feasible if n["metadata"]["name"] in set(passed)]
                scores = {name: scores[name] for name in passed}
            if extender.config.prioritize_verb and feasible:
                try:
                    weighted = extender.prioritize(pod, feasible)
                except ExtenderError as exc:  # upstream ignores prioritize errors
                    log.info("extender prioritize failed, ignored: %s", exc)
                    continue
                for node_name in scores:
                    scores[node_name] += weighted.get(node_name, 0)
        if not feasible:
            return self._fail(pod, summarise_failures(len(nodes), failures))
        best = min(scores, key=lambda node_name: (-scores[node_name], node_name))
        binder = next((e for e in self.extenders if e.config.bind_verb and e.config.interested_in(pod)), None)
        try:
            if binder is not None:
                error = binder.bind(pod, best)
                if error:
                    return Placement(namespace, name, None, f"extender bind failed: {error}", scores)
            else:
                self._bind(pod, best)
        except ApiException as exc:
            return Placement(namespace, name, None, f"binding failed: {exc.status} {exc.reason}", scores)
        self._last_failure.pop((namespace, name), None)
        message = f"Successfully assigned {namespace}/{name} to {best}"
        self._event(pod, "Normal", "Scheduled", message)
        return Placement(namespace, name, best, message, scores)

    def _schedule_scored(self, pod: Pod, nodes: list[Node], scoring: ClusterScores) -> Placement:
        """One kube-scheduler cycle with the profile's scoring (simulator.kubescheduler.schedule_one)."""
        assert self.profile is not None
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        by_name = {n["metadata"]["name"]: n for n in nodes}
        calls = [(_spec(extender.config), _RawCalls(extender, by_name)) for extender in self.extenders]
        cycle = schedule_one(scoring, pod, self.profile, calls, self.rng)
        if cycle.node is None:
            reasons = {k: v for k, v in cycle.failures.items() if k != "*"}
            message = cycle.failures.get("*") if not reasons else summarise_failures(len(nodes), reasons)
            return self._fail(pod, message or "no feasible node")
        try:
            if cycle.bound_by is not None:
                error = cycle.bound_by.bind(pod, cycle.node)
                if error:
                    return Placement(namespace, name, None, f"extender bind failed: {error}", cycle.scores)
            else:
                self._bind(pod, cycle.node)
        except ApiException as exc:
            return Placement(namespace, name, None, f"binding failed: {exc.status} {exc.reason}", cycle.scores)
        self._last_failure.pop((namespace, name), None)
        message = f"Successfully assigned {namespace}/{name} to {cycle.node}"
        self._event(pod, "Normal", "Scheduled", message)
        return Placement(namespace, name, cycle.node, message, cycle.scores)

    def _fail(self, pod: Pod, message: str) -> Placement:
        meta = pod["metadata"]
        key = (meta.get("namespace", "default"), meta["name"])
        if self._last_failure.get(key) != message:  # one event per distinct reason, not one per pass
            self._last_failure[key] = message
            self._event(pod, "Warning", "FailedScheduling", message)
        return Placement(key[0], key[1], None, message)

    # -- writes
    def _bind(self, pod: Pod, node_name: str) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default"),
                             **({"uid": meta["uid"]} if meta.get("uid") else {})},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}
        # _preload_content=False: the generated client cannot deserialise the Status a binding returns
        self.core.create_namespaced_pod_binding(meta["name"], meta.get("namespace", "default"), body,
                                                _preload_content=False)

    def _event(self, pod: Pod, event_type: str, reason: str, message: str) -> None:
        record_event(self.core, pod, event_type, reason, message, self.scheduler_name or DEFAULT_SCHEDULER_NAME)

    # -- background mode
    def start(self) -> Scheduler:
        """Run `schedule_once` every `interval` seconds in a daemon thread until `stop()`."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="test-scheduler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.schedule_once()
            except Exception:  # keep the loop alive across API hiccups; tests see the outcome
                log.exception("scheduler pass failed")
            self._stop.wait(self.interval)

    def request_stop(self) -> None:
        """Ask the thread to end after the pass in flight, without waiting (Cluster stops every loop at once)."""
        self._stop.set()

    def stop(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
