"""kube-scheduler's filter, score and select steps for one profile, vectorised over nodes. No I/O.

What a live extender competes with: `kubeon-gpu simulate --through-extender` scores with this
module (held against the real kube-scheduler by tests/packing/test_kubescheduler_model.py),
from the profile in the chart's rendered KubeSchedulerConfiguration
(`Profile.from_config`). Upstream: kubernetes v1.35 (pkg/scheduler), read
for each rule below:
- Filters: NodeUnschedulable, NodeResourcesFit (requests of every resource
  plus one pod slot against allocatable minus the requests of pods there),
  TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector and
  required terms).
- Node sampling (schedule_one.go numFeasibleNodesToFind,
  findNodesThatPassFilters): below 100 nodes all; else
  `percentageOfNodesToScore` percent (0/unset: max(5, 50 - N/125)), at least
  100, searched in node order from where the last search stopped.
- Scores, each 0..100 times its plugin weight (defaults TaintToleration 3,
  NodeAffinity 2, NodeResourcesFit 1, NodeResourcesBalancedAllocation 1):
  NodeResourcesFit LeastAllocated `(alloc - req) * 100 / alloc`,
  MostAllocated `min(req, alloc) * 100 / alloc`, RequestedToCapacityRatio
  (the shape's broken line over utilisation, scores 0..10 scaled to 100),
  weighted by resource with integer division, over resources the node has
  (extended resources only when the pod asks for them), cpu and memory
  counted with non-zero defaults (100m, 200 MiB per container without a
  request). BalancedAllocation `(1 - std of the requested fractions) * 100`
  with the pod's real requests, skipped for pods requesting none of its
  resources. TaintToleration counts intolerable PreferNoSchedule taints,
  NodeAffinity sums matching preferred-term weights; both normalised to
  0..100 (DefaultNormalizeScore, taints reversed).
- Extenders (extender.go): filter keeps the names returned; prioritize adds
  `score * weight * 10`; managedResources decides who is asked; ignorable
  extenders' errors are skipped. With one feasible node, no scoring at all.
- selectHost: the highest total, ties broken uniformly at random (seeded).
Not modelled: PodTopologySpread and InterPodAffinity (pods here have no
spread constraints, owners or affinity terms, where upstream skips them),
ImageLocality (no images), VolumeBinding, preemption.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gpupolicy.k8s.quantity import parse_quantity
from gpupolicy.k8s.taints import tolerates

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENTAGE = 5
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY = 200 * 1024 * 1024
DEFAULT_WEIGHTS = {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1,
                   "NodeResourcesBalancedAllocation": 1}
SCORED = tuple(DEFAULT_WEIGHTS)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Obj = Mapping[str, Any]


class ProfileError(ValueError):
    """A KubeSchedulerConfiguration this emulation cannot read; the message names the field."""


def _map(value: Any, path: str) -> Mapping[str, Any]:
    """A mapping field (absent or null: empty); ProfileError naming `path` for anything else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ProfileError(f"{path}: not a mapping")
    return value


def _maps(value: Any, path: str) -> list[Mapping[str, Any]]:
    """A list-of-mappings field (absent or null: empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProfileError(f"{path}: not a list")
    return [_map(item, f"{path}[{index}]") or {} for index, item in enumerate(value)]


def _int(value: Any, path: str, default: int) -> int:
    """An integer field (absent, null or 0: `default`, as upstream defaults them)."""
    if value is None or value == 0:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{path}: {value!r} is not an integer")
    return value


def _str(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProfileError(f"{path}: {value!r} is not a string")
    return value


def _weighted(entries: Any, path: str) -> tuple[tuple[str, int], ...]:
    """`resources: [{name, weight}]` of a scoring plugin's args."""
    return tuple((_str(r.get("name"), f"{path}[{i}].name"), _int(r.get("weight"), f"{path}[{i}].weight", 1))
                 for i, r in enumerate(_maps(entries, path)))


@dataclass(frozen=True)
class ExtenderSpec:
    """One `extenders[]` entry (camelCase fields of KubeSchedulerConfiguration)."""

    url_prefix: str = ""
    filter_verb: str = ""
    prioritize_verb: str = ""
    bind_verb: str = ""
    weight: int = 1
    node_cache_capable: bool = False
    ignorable: bool = False
    managed_resources: tuple[str, ...] = ()

    def interested_in(self, requests: Mapping[str, Decimal]) -> bool:
        """upstream IsInterested: no managedResources = every pod; else pods requesting one of them."""
        return not self.managed_resources or any(r in requests for r in self.managed_resources)

    @classmethod
    def from_config(cls, entry: Mapping[str, Any], path: str = "extenders[0]") -> ExtenderSpec:
        managed = tuple(_str(m.get("name"), f"{path}.managedResources[{i}].name")
                        for i, m in enumerate(_maps(entry.get("managedResources"), f"{path}.managedResources")))
        flags = {}
        for name in ("nodeCacheCapable", "ignorable"):
            value = entry.get(name)
            if value is not None and not isinstance(value, bool):
                raise ProfileError(f"{path}.{name}: {value!r} is not true or false")
            flags[name] = bool(value)
        return cls(url_prefix=_str(entry.get("urlPrefix"), f"{path}.urlPrefix"),
                   filter_verb=_str(entry.get("filterVerb"), f"{path}.filterVerb"),
                   prioritize_verb=_str(entry.get("prioritizeVerb"), f"{path}.prioritizeVerb"),
                   bind_verb=_str(entry.get("bindVerb"), f"{path}.bindVerb"),
                   weight=_int(entry.get("weight"), f"{path}.weight", 1), node_cache_capable=flags["nodeCacheCapable"],
                   ignorable=flags["ignorable"], managed_resources=managed)


@dataclass(frozen=True)
class Profile:
    """The scoring part of one scheduler profile."""

    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    fit_strategy: str = "LeastAllocated"
    fit_resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
    shape: tuple[tuple[int, int], ...] = ()  # RequestedToCapacityRatio (utilization 0..100, score 0..10)
    balanced_resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
    percentage_of_nodes_to_score: int = 0
    extenders: tuple[ExtenderSpec, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], scheduler_name: str | None = None) -> Profile:
        """The profile `scheduler_name` (default: the first) of a KubeSchedulerConfiguration dict; ProfileError
        naming the field of anything of the wrong type."""
        profiles = _maps(config.get("profiles"), "profiles") or [{}]
        found = next(((i, p) for i, p in enumerate(profiles)
                      if scheduler_name is None or p.get("schedulerName") == scheduler_name), None)
        if found is None:
            raise ProfileError(f"profiles: no schedulerName {scheduler_name!r}")
        index, chosen = found
        at = f"profiles[{index}]"
        weights = dict(DEFAULT_WEIGHTS)
        score = _map(_map(chosen.get("plugins"), f"{at}.plugins").get("score"), f"{at}.plugins.score")
        for i, plugin in enumerate(_maps(score.get("disabled"), f"{at}.plugins.score.disabled")):
            name = _str(plugin.get("name"), f"{at}.plugins.score.disabled[{i}].name")
            if name == "*":
                weights = {}
            else:
                weights.pop(name, None)
        for i, plugin in enumerate(_maps(score.get("enabled"), f"{at}.plugins.score.enabled")):
            name = _str(plugin.get("name"), f"{at}.plugins.score.enabled[{i}].name")
            if name not in SCORED:
                raise ProfileError(f"plugins.score.enabled: {name} is not emulated (choose from {', '.join(SCORED)})")
            weights[name] = _int(plugin.get("weight"), f"{at}.plugins.score.enabled[{i}].weight",
                                 DEFAULT_WEIGHTS.get(name, 1))
        fit_strategy = "LeastAllocated"
        fit_resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
        shape: tuple[tuple[int, int], ...] = ()
        balanced: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
        for i, entry in enumerate(_maps(chosen.get("pluginConfig"), f"{at}.pluginConfig")):
            where = f"{at}.pluginConfig[{i}].args"
            args = _map(entry.get("args"), where)
            if entry.get("name") == "NodeResourcesFit":
                strategy = _map(args.get("scoringStrategy"), f"{where}.scoringStrategy")
                fit_strategy = _str(strategy.get("type"), f"{where}.scoringStrategy.type") or fit_strategy
                if fit_strategy not in ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"):
                    raise ProfileError(f"NodeResourcesFit.scoringStrategy.type: unknown {fit_strategy!r}")
                if strategy.get("resources"):
                    fit_resources = _weighted(strategy["resources"], f"{where}.scoringStrategy.resources")
                ratio_at = f"{where}.scoringStrategy.requestedToCapacityRatio"
                ratio = _map(strategy.get("requestedToCapacityRatio"), ratio_at)
                points = _maps(ratio.get("shape"), f"{ratio_at}.shape")
                shape = tuple((_int(p.get("utilization"), f"{ratio_at}.shape[{j}].utilization", 0),
                               _int(p.get("score"), f"{ratio_at}.shape[{j}].score", 0)) for j, p in enumerate(points))
            elif entry.get("name") == "NodeResourcesBalancedAllocation" and args.get("resources"):
                balanced = _weighted(args["resources"], f"{where}.resources")
        if fit_strategy == "RequestedToCapacityRatio" and not shape:
            raise ProfileError("NodeResourcesFit.scoringStrategy.requestedToCapacityRatio.shape: required")
        percentage = chosen.get("percentageOfNodesToScore", config.get("percentageOfNodesToScore"))
        extenders = tuple(ExtenderSpec.from_config(e, f"extenders[{i}]")
                          for i, e in enumerate(_maps(config.get("extenders"), "extenders")))
        return cls(weights, fit_strategy, fit_resources, shape, balanced,
                   _int(percentage, f"{at}.percentageOfNodesToScore", 0), extenders)


def num_nodes_to_find(percentage: int, total: int) -> int:
    """upstream numFeasibleNodesToFind."""
    if total < MIN_FEASIBLE_NODES:
        return total
    if percentage <= 0:
        percentage = max(MIN_FEASIBLE_PERCENTAGE, 50 - total // 125)
    return max(MIN_FEASIBLE_NODES, total * min(percentage, 100) // 100)


# ---------------------------------------------------------------- pod and node reading

def pod_requests(pod: Obj, *, nonzero: bool = False) -> dict[str, Decimal]:
    """Effective requests (sum of containers, at least each init container, plus overhead).

    A limit without a request counts as the request. `nonzero`: cpu and
    memory of a container without a request count as 100m and 200 MiB.
    """
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {k: parse_quantity(v) for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items()}
        if nonzero:
            merged.setdefault("cpu", Decimal(DEFAULT_MILLI_CPU) / 1000)
            merged.setdefault("memory", Decimal(DEFAULT_MEMORY))
        for k, v in merged.items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            total[k] = max(total.get(k, Decimal(0)), parse_quantity(v))
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, Decimal(0)) + parse_quantity(v)
    return total


def _units(resource: str, value: Decimal) -> int:
    """Upstream's integer units: milli-CPU for cpu, whole units (bytes, counts) for the rest."""
    return int(value * 1000) if resource == "cpu" else int(value)


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if operator == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {operator!r}")


def matches_node_selector_terms(terms: Sequence[Mapping[str, Any]], node: Mapping[str, Any]) -> bool:
    """nodeSelectorTerms are ORed, the requirements of one term ANDed; an empty term matches nothing. Pure."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
    for term in terms:
        expressions = term.get("matchExpressions") or []
        field_expressions = term.get("matchFields") or []
        if not expressions and not field_expressions:
            continue
        if all(_expression_matches(e, labels) for e in expressions) and all(
            _expression_matches(e, fields) for e in field_expressions
        ):
            return True
    return False


def term_matches(term: Obj, node: Obj) -> bool:
    """One node selector term (preferred node affinity terms are scored one by one)."""
    return matches_node_selector_terms([term], node)


def static_filter(pod: Obj, node: Obj) -> str | None:
    """NodeUnschedulable, NodeAffinity (selector + required terms), TaintToleration: the failing reason."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not tolerates(
            tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        return "node(s) were unschedulable"
    labels = (node.get("metadata") or {}).get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return "node(s) didn't match Pod's node affinity/selector"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    if required and not matches_node_selector_terms(required.get("nodeSelectorTerms") or [], node):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    return None


def _static_scores(pod: Obj, node: Obj) -> tuple[int, int]:
    """(intolerable PreferNoSchedule taints, sum of matching preferred node-affinity weights)."""
    spec = pod.get("spec") or {}
    tolerations = [t for t in spec.get("tolerations") or [] if not t.get("effect") or t.get("effect") ==
                   "PreferNoSchedule"]
    taints = sum(1 for t in (node.get("spec") or {}).get("taints") or []
                 if t.get("effect") == "PreferNoSchedule" and not tolerates(tolerations, t))
    preferred = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    affinity = sum(int(p.get("weight") or 0) for p in preferred if term_matches(p.get("preference") or {}, node))
    return taints, affinity


def _signature(pod: Obj) -> str:
    spec = pod.get("spec") or {}
    return json.dumps([spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")], sort_keys=True)


# ---------------------------------------------------------------- the cluster as arrays

class ClusterScores:
    """Nodes (in the scheduler's node order) with allocatable and requested per resource, as arrays.

    `add(pod, node)` counts a bound pod; `filter`/`score` answer for one pod.
    Static per-pod-shape answers (taints, affinity) are cached by the pod's
    selector, affinity and tolerations.
    """

    def __init__(self, nodes: Sequence[Obj]) -> None:
        self.nodes = list(nodes)
        self.names = [str(n["metadata"]["name"]) for n in self.nodes]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.resources: list[str] = ["cpu", "memory", "pods"]
        for node in self.nodes:
            for r in ((node.get("status") or {}).get("allocatable") or {}):
                if r not in self.resources:
                    self.resources.append(r)
        self._ri = {r: i for i, r in enumerate(self.resources)}
        n, r = len(self.nodes), len(self.resources)
        self.alloc = np.zeros((r, n), dtype=np.int64)
        for j, node in enumerate(self.nodes):
            for name, value in ((node.get("status") or {}).get("allocatable") or {}).items():
                self.alloc[self._ri[name], j] = _units(name, parse_quantity(value))
        self.requested = np.zeros((r, n), dtype=np.int64)
        self.nonzero = np.zeros((2, n), dtype=np.int64)  # cpu, memory with non-zero defaults
        self.next_start = 0
        self._static: dict[str, tuple[BoolArray, IntArray, IntArray]] = {}

    def _row(self, resource: str) -> int:
        if resource not in self._ri:  # a resource no node has: allocatable 0 everywhere
            self._ri[resource] = len(self.resources)
            self.resources.append(resource)
            self.alloc = np.vstack([self.alloc, np.zeros((1, len(self.nodes)), dtype=np.int64)])
            self.requested = np.vstack([self.requested, np.zeros((1, len(self.nodes)), dtype=np.int64)])
        return self._ri[resource]

    def add(self, pod: Obj, node: str, sign: int = 1) -> None:
        j = self.index[node]
        for name, value in pod_requests(pod).items():
            self.requested[self._row(name), j] += sign * _units(name, value)
        self.requested[self._ri["pods"], j] += sign
        nz = pod_requests(pod, nonzero=True)
        self.nonzero[0, j] += sign * _units("cpu", nz.get("cpu", Decimal(0)))
        self.nonzero[1, j] += sign * _units("memory", nz.get("memory", Decimal(0)))

    def _static_for(self, pod: Obj) -> tuple[BoolArray, IntArray, IntArray]:
        key = _signature(pod)
        cached = self._static.get(key)
        if cached is None:
            ok = np.array([static_filter(pod, n) is None for n in self.nodes], dtype=bool)
            pairs = [_static_scores(pod, n) for n in self.nodes]
            taints = np.array([p[0] for p in pairs], dtype=np.int64)
            affinity = np.array([p[1] for p in pairs], dtype=np.int64)
            cached = (ok, taints, affinity)
            self._static[key] = cached
        return cached

    def feasible(self, pod: Obj) -> BoolArray:
        """Every filter plugin, over all nodes."""
        ok = self._static_for(pod)[0].copy()
        for name, value in pod_requests(pod).items():
            need = _units(name, value)
            if need > 0:
                i = self._row(name)
                ok &= self.alloc[i] - self.requested[i] >= need
        i = self._ri["pods"]
        ok &= self.alloc[i] - self.requested[i] >= 1
        return ok

    def sample(self, feasible: BoolArray, percentage: int) -> IntArray:
        """Node sampling: the first `num_nodes_to_find` feasible nodes from `next_start`, which then moves."""
        n = len(self.nodes)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        want = num_nodes_to_find(percentage, n)
        order = (np.arange(n) + self.next_start) % n
        hits = np.flatnonzero(feasible[order])
        if hits.size > want:
            taken = order[hits[:want]]
            processed = int(hits[want - 1]) + 1
        else:
            taken = order[hits]
            processed = n
        self.next_start = (self.next_start + processed) % n
        return taken.astype(np.int64)

    def score(self, pod: Obj, nodes: IntArray, profile: Profile) -> IntArray:
        """The plugins' weighted sum for `nodes` (upstream integer arithmetic)."""
        total = np.zeros(len(nodes), dtype=np.int64)
        w = profile.weights
        if w.get("NodeResourcesFit"):
            total += w["NodeResourcesFit"] * self._fit_score(pod, nodes, profile)
        if w.get("NodeResourcesBalancedAllocation"):
            total += w["NodeResourcesBalancedAllocation"] * self._balanced_score(pod, nodes, profile)
        _, taints, affinity = self._static_for(pod)
        if w.get("TaintToleration"):
            t = taints[nodes]
            top = int(t.max()) if t.size else 0
            norm = np.full(len(nodes), MAX_NODE_SCORE) if top == 0 else MAX_NODE_SCORE - t * MAX_NODE_SCORE // top
            total += w["TaintToleration"] * norm
        if w.get("NodeAffinity"):
            a = affinity[nodes]
            top = int(a.max()) if a.size else 0
            total += w["NodeAffinity"] * (a * MAX_NODE_SCORE // top if top else np.zeros(len(nodes), dtype=np.int64))
        return total

    def _alloc_req(self, pod: Obj, nodes: IntArray, resource: str, nonzero: bool) -> tuple[IntArray, IntArray]:
        requests = pod_requests(pod, nonzero=nonzero)
        pod_req = _units(resource, requests.get(resource, Decimal(0)))
        if resource not in ("cpu", "memory") and pod_req == 0:
            zero = np.zeros(len(nodes), dtype=np.int64)
            return zero, zero
        i = self._row(resource)
        if nonzero and resource in ("cpu", "memory"):
            base = self.nonzero[0 if resource == "cpu" else 1, nodes]
        else:
            base = self.requested[i, nodes]
        return self.alloc[i, nodes], base + pod_req

    def _fit_score(self, pod: Obj, nodes: IntArray, profile: Profile) -> IntArray:
        score = np.zeros(len(nodes), dtype=np.int64)
        weights = np.zeros(len(nodes), dtype=np.int64)
        for resource, weight in profile.fit_resources:
            alloc, req = self._alloc_req(pod, nodes, resource, nonzero=True)
            has = alloc > 0
            safe = np.where(has, alloc, 1)
            if profile.fit_strategy == "LeastAllocated":
                s = np.where(req > alloc, 0, (alloc - req) * MAX_NODE_SCORE // safe)
            elif profile.fit_strategy == "MostAllocated":
                s = np.minimum(req, alloc) * MAX_NODE_SCORE // safe
            else:
                s = _broken_line(np.minimum(req, alloc) * MAX_NODE_SCORE // safe, profile.shape)
            score += np.where(has, s * weight, 0)
            weights += np.where(has, weight, 0)
        out: IntArray = np.where(weights > 0, score // np.maximum(weights, 1), 0)
        return out

    def _balanced_score(self, pod: Obj, nodes: IntArray, profile: Profile) -> IntArray:
        requests = pod_requests(pod)
        if all(_units(r, requests.get(r, Decimal(0))) == 0 for r, _ in profile.balanced_resources):
            return np.zeros(len(nodes), dtype=np.int64)  # best-effort pod: upstream skips the plugin
        fractions = []
        present = []
        for resource, _ in profile.balanced_resources:
            alloc, req = self._alloc_req(pod, nodes, resource, nonzero=False)
            has = alloc > 0
            fractions.append(np.where(has, np.minimum(req / np.where(has, alloc, 1), 1.0), 0.0))
            present.append(has)
        f = np.array(fractions)
        p = np.array(present)
        count = p.sum(axis=0)
        mean = np.where(count > 0, (f * p).sum(axis=0) / np.maximum(count, 1), 0.0)
        var = np.where(count > 0, (((f - mean) ** 2) * p).sum(axis=0) / np.maximum(count, 1), 0.0)
        std = np.where(count == 2, np.abs(np.where(p, f, 0).sum(axis=0) - 2 * np.where(p, f, 0).min(axis=0)) / 2,
                       np.sqrt(var))
        std = np.where(count < 2, 0.0, std)
        out: IntArray = ((1 - std) * MAX_NODE_SCORE).astype(np.int64)
        return out


def _broken_line(utilization: IntArray, shape: Sequence[tuple[int, int]]) -> IntArray:
    """RequestedToCapacityRatio: the shape's scores (0..10) scaled to 0..100, linear between points."""
    xs = np.array([u for u, _ in shape], dtype=np.float64)
    ys = np.array([s * MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY for _, s in shape], dtype=np.float64)
    out: IntArray = np.interp(utilization, xs, ys).astype(np.int64)
    return out


# ---------------------------------------------------------------- one scheduling cycle

class ExtenderCalls(Protocol):
    """What the scheduling cycle needs from one extender (HTTP in practice); errors raise RuntimeError."""

    def filter(self, pod: Obj, names: list[str]) -> tuple[list[str], dict[str, str]]: ...

    def prioritize(self, pod: Obj, names: list[str]) -> dict[str, int]: ...

    def bind(self, pod: Obj, node: str) -> str: ...


@dataclass
class Cycle:
    """The outcome of one pod's cycle: the node (None: unschedulable), totals per scored node, and why not."""

    node: str | None
    scores: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    bound_by: ExtenderCalls | None = None  # the extender whose bindVerb binds it


def schedule_one(cluster: ClusterScores, pod: Obj, profile: Profile,
                 extenders: Sequence[tuple[ExtenderSpec, ExtenderCalls]], rng: np.random.Generator,
                 on_error: Callable[[str], None] | None = None) -> Cycle:
    """Filter (with sampling), extender filter, score, extender prioritize, selectHost; does not bind."""
    feasible = cluster.feasible(pod)
    picked = cluster.sample(feasible, profile.percentage_of_nodes_to_score)
    names = [cluster.names[i] for i in picked.tolist()]
    failures: dict[str, str] = {}
    requests = pod_requests(pod)
    asked = [(spec, calls) for spec, calls in extenders if spec.interested_in(requests)]
    for spec, calls in asked:
        if not names or not spec.filter_verb:
            continue
        try:
            passed, failed = calls.filter(pod, names)
        except RuntimeError as exc:
            if spec.ignorable:
                if on_error:
                    on_error(str(exc))
                continue
            return Cycle(None, {}, {"*": f"extender error: {exc}"})
        failures.update(failed)
        keep = set(passed)
        names = [n for n in names if n in keep]
    if not names:
        return Cycle(None, {}, failures or {"*": "no feasible node"})
    binder = next((calls for spec, calls in asked if spec.bind_verb), None)
    if len(names) == 1:
        return Cycle(names[0], {names[0]: 0}, failures, binder)
    rows = np.array([cluster.index[n] for n in names], dtype=np.int64)
    totals = cluster.score(pod, rows, profile)
    listed = np.zeros(len(names), dtype=bool)  # scored by some extender: gets a random tie-break value
    for spec, calls in asked:
        if not spec.prioritize_verb:
            continue
        try:
            got = calls.prioritize(pod, names)
        except RuntimeError as exc:  # upstream ignores prioritize errors
            if on_error:
                on_error(str(exc))
            continue
        scale = spec.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        totals = totals + np.array([max(0, min(MAX_EXTENDER_PRIORITY, got.get(n, 0))) * scale for n in names],
                                   dtype=np.int64)
        listed |= np.array([n in got for n in names], dtype=bool)
    best = np.flatnonzero(totals == totals.max())
    if best.size > 1 and listed[best].any():
        # upstream (prioritizeNodes, nodeScoreHeap): ties go by a Randomizer that only hosts some
        # extender listed get; the others keep 0 and lose exact ties to them
        best = best[listed[best]]
    choice = int(best[int(rng.integers(best.size))]) if best.size > 1 else int(best[0])
    return Cycle(names[choice], dict(zip(names, totals.tolist(), strict=True)), failures, binder)
