"""Step 4 of a capacity pass: which GPU nodes to give back, and starting their drains.

Read top-down: `consolidate` reads the rows, plans, and starts each
disruption; each function calls only those below it, down to the first
drain step (controller/capacity/drain.py, which evicts).

Every GPU node is a row of the packing engine's state (pods bound as the
extender counts them); only nodes of the pool with a NodeClaim are
candidates. `plan_disruptions` (gpupolicy/capacity/disruption/) gets the
inputs the benchmark's `kubeon` passes, from live objects: each node's
highest DCGM utilisation over the policy's `for`, prices from the provider,
when each node became empty and when its pods last changed, when each pod was
bound (pod ages), eviction counts (eviction_counts.py), the instance types a
replacement may launch, and the blocked rows: do-not-disrupt on the node or a
pod, a drain or replacement under way or recently undone, a MIG re-layout, a
claim being deleted, a node launched for pods still pending or as a
replacement not yet done (replacement.py). An empty node that a pending GPU
pod fits is awaited, not empty (the planner's `pending`). A node holding a pod whose
PodDisruptionBudget allows no disruption (gpupolicy/capacity/budgets.py) is
held out of the plan by `plan_around`, and shown where the plan would have
disrupted it ("not a candidate this pass: pdb <ns>/<name> prevents pod
evictions"); nothing is written to it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from dataclasses import replace as replaced
from typing import Any

from controller.capacity import replacement
from controller.capacity.drain import step
from controller.capacity.state import HOURS_PER_MONTH, Pass, Seen, annotations_of, is_gpu_node, live, meta, pod_key
from controller.capacity.state import timestamp as _timestamp
from controller.capacity.usage import Usage
from gpupolicy.capacity import drain
from gpupolicy.capacity.disruption import (
    EMPTY,
    UNDERUSED,
    ConsolidationRules,
    Disruption,
    DisruptionInputs,
    plan_around,
    plan_disruptions,
)
from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION
from gpupolicy.capacity.nodepool import allowed_types
from gpupolicy.capacity.provider import CapacityNode
from gpupolicy.model import CapacitySpec, Condition, ConsolidationSpec, GpuPolicy, Mode, Proposal
from gpupolicy.model import ProposalState as State
from gpupolicy.modes import disruption_mode
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, memoised
from gpupolicy.packing.kubestate import same_objects
from gpupolicy.packing.nodemodel import PodDemand
from gpupolicy.proposals import TargetRef, make_proposal

log = logging.getLogger(__name__)


def consolidate(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, used: Usage,
                empty: EmptyTracker, node_pods: NodePodsMemo, evictions: Mapping[str, int], proposals: list[Proposal],
                conditions: list[Condition]) -> list[Disruption]:
    """Plan the policy's disruptions and start those the mode allows; returns the plan. `evictions`: pod
    key -> how often it was evicted already (eviction_counts.py)."""
    conditions.extend(_usage_conditions(p, used))
    rows = _rows(p, policy, spec, used, empty, node_pods, evictions)
    plan, kept = plan_around(lambda blocked: plan_disruptions(replaced(rows.inputs, blocked=blocked)),
                             rows.inputs.blocked, rows.held)
    for disruption in plan:
        steady = rows.inputs.now - max((rows.inputs.changed_at.get(n, 0.0) for n in disruption.nodes),
                                       default=0.0)
        _disrupt(p, policy, spec, mode, rows, disruption, proposals, steady)
    for row, (kept_from, why) in sorted(kept.items()):
        _hold(p, policy, mode, str(rows.gpu_nodes[row]["metadata"]["name"]), rows.claims, kept_from, why, proposals)
    proposals.extend(_undone(p, policy, rows.cooldown))
    conditions.append(Condition(type="Consolidation", status="True", reason="Planned",
                                message=f"{len(plan)} disruption(s) planned, "
                                        f"{rows.inputs.in_progress} drain(s) under way"))
    return plan


def _usage_conditions(p: Pass, used: Usage) -> list[Condition]:
    """Condition UsageAware=False when utilisation is not known: no Prometheus, or its query failed."""
    if not p.ctx.prometheus_configured:
        return [Condition(type="UsageAware", status="False", reason="PrometheusNotConfigured",
                          message="usage-aware consolidation needs --prometheus-url (GPU utilisation "
                                  "from DCGM); empty nodes and nodes whose pods fit elsewhere are "
                                  "still consolidated in the policy's mode")]
    if used.error:
        return [Condition(type="UsageAware", status="False", reason="MetricsUnavailable",
                          message=f"GPU utilisation could not be read ({used.error}); no node is "
                                  "a usage-aware candidate this pass")]
    return []


@dataclass(frozen=True)
class Rows:
    """The GPU nodes as the core's rows: its inputs, the rows a PodDisruptionBudget holds (row -> why), and
    what starting a disruption needs (the Node objects in row order, the pool's NodeClaims by node)."""

    inputs: DisruptionInputs
    held: dict[int, str]
    gpu_nodes: list[dict[str, Any]]
    claims: dict[str, CapacityNode]
    cooldown: float  # an undone drain keeps its node out this long


def _rows(p: Pass, policy: GpuPolicy, spec: CapacitySpec, used: Usage, empty: EmptyTracker, node_pods: NodePodsMemo,
          evictions: Mapping[str, int]) -> Rows:
    """The core's inputs from the objects the pass read (module docstring: what blocks a row)."""
    ctx, seen = p.ctx, p.seen
    now = ctx.clock.now()
    claims = {c.node: c for c in seen.pool_claims(spec.node_pool) if c.node is not None}
    gpu_nodes = [n for n in seen.nodes if is_gpu_node(n)]
    unreadable: dict[str, str] = {}
    # a node of an unreadable pod: not a target; DRA nodes with their devices
    state = p.states.state(gpu_nodes, seen.pods, unreadable, seen.slices)  # kept between passes
    for what, problem in unreadable.items():
        log.warning("consolidation of %s: %s left out: %s", policy.name, what, problem)
    gpu_nodes = [n for n in gpu_nodes if str(n["metadata"]["name"]) in state.index]  # rows, in state order
    pods_on: dict[int, list[tuple[str, PodDemand]]] = {}
    blocked: set[int] = set()
    empty_since: dict[int, float] = {}
    changed_at: dict[int, float] = {}  # the core lets a busy node settle (settle_seconds)
    ages: dict[str, float] = {}  # pod key -> bound at (the core's min_pod_age_seconds)
    prices: list[float] = []
    waiting = [pod for pod in seen.pods if not (pod.get("spec") or {}).get("nodeName") and live(pod)]
    pending = {pod_key(pod) for pod in waiting}
    cooldown = max(4 * spec.consolidation.drain_seconds, 3600.0)
    replacing = replacement.replacing_claims(p)  # new nodes waiting for the drain they are for
    held: dict[int, str] = {}  # a PodDisruptionBudget allowing no disruption keeps its pods' node out (below)
    for row, node in enumerate(gpu_nodes):
        name = str(node["metadata"]["name"])
        claim = claims.get(name)
        prices.append(claim.price_per_hour if claim is not None else 0.0)  # what the provider reports
        on_node = seen.by_node.get(name, [])
        pods = node_pods.read(name, on_node)  # kept while the node holds the same pod objects
        if pods.unreadable:
            blocked.add(row)
        else:
            pods_on[row] = list(pods.demands)
        if pods.newest_bound <= now:
            ages.update(pods.bound_at)
        else:  # a stamp ahead of this clock reads as now
            ages.update((key, min(at, now)) for key, at in pods.bound_at.items())
        if _blocked(node, claim, replacing, pending, pods.do_not_disrupt, now, cooldown):
            blocked.add(row)
        empty_since[row] = empty.empty_since(name, node, seen, bool(pods.members), now)
        if (changed := empty.changed_at(name, pods.members, pods.latest, now)) is not None:
            changed_at[row] = changed
        if pods.members and row not in blocked and (why := p.held_by_budget(on_node)):
            held[row] = why
    in_progress = sum(1 for n in seen.nodes if replacement.disrupting(n))
    # what a replacement may launch; none with node groups: a replacement follows its new nodes by claim name,
    # which a group's desired size has not (consolidation there removes nodes whose pods fit elsewhere)
    catalog = [] if seen.groups is not None else p.launchable(allowed_types(spec, {t.name: t.model
                                                                                   for t in p.instances}))
    # `held`: as Karpenter, a PodDisruptionBudget keeps its pods' node out of this pass; the plan says so where
    # it would have disrupted the node (gpupolicy/capacity/budgets.py)
    usage_by_row = {i: used.by_node.get(str(n["metadata"]["name"])) for i, n in enumerate(gpu_nodes)}
    inputs = DisruptionInputs(state, pods_on, prices, core_rules(spec.consolidation), now, usage_percent=usage_by_row,
                              blocked=frozenset(blocked), empty_since=empty_since, in_progress=in_progress,
                              evictions=evictions, changed_at=changed_at, instance_types=catalog, started_at=ages,
                              pending=gpu_demands(waiting))
    return Rows(inputs, held, gpu_nodes, claims, cooldown)


def gpu_demands(pods: list[dict[str, Any]]) -> list[PodDemand]:
    """What the pending GPU pods ask for (an unreadable one is left out: it waits on its own error). CPU-only
    pods are left out: most cannot go to a GPU node (its taint), and one that waits would keep every empty
    GPU node."""
    out = []
    for pod in pods:
        try:
            demand = demand_from_pod(pod)
        except ObjectError:
            continue
        if demand.needs_gpu or demand.mig or demand.shared:
            out.append(demand)
    return out


def _blocked(node: Mapping[str, Any], claim: CapacityNode | None, replacing: Set[str], pending: Set[str],
             pod_says_no: bool, now: float, cooldown: float) -> bool:
    """The node is no candidate: no claim of the pool, one being deleted, or one whose node group is at its min
    size; a drain, replacement or re-layout under way; do-not-disrupt on it or a pod (`pod_says_no`); a drain
    undone within `cooldown`; launched for pods pending."""
    notes = annotations_of(node)
    undone = drain.read_undone(notes)
    launched_for = set(claim.launched_for) if claim else set()
    return bool(claim is None or claim.deleting or not claim.removable or drain.DRAINING_ANNOTATION in notes
                or replacement.REPLACING_ANNOTATION in notes or claim.claim in replacing
                or RELAYOUT_ANNOTATION in notes or drain.do_not_disrupt(notes)
                or pod_says_no
                or (undone is not None and now - float(undone["at"]) < cooldown)
                or launched_for & pending)


def core_rules(spec: ConsolidationSpec) -> ConsolidationRules:
    """The policy's consolidation block as the core's rules; what the policy leaves unset is the core's."""
    rules = ConsolidationRules(spec.underused_below_percent, spec.window_seconds, spec.max_disrupted_nodes,
                               spec.empty_seconds)
    if spec.min_pod_age_seconds is not None:
        rules = replaced(rules, min_pod_age_seconds=spec.min_pod_age_seconds)
    if spec.max_evictions_per_pod is not None:
        rules = replaced(rules, max_evictions_per_pod=spec.max_evictions_per_pod)
    return rules


def started_at(pod: Mapping[str, Any], now: float) -> float | None:
    """When the pod was bound to its node (its PodScheduled condition), else started, else created; a stamp
    ahead of this clock reads as now. The benchmark's `bound_at`."""
    stamp = pod_facts(pod).bound_at
    return None if stamp is None else min(stamp, now)


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What consolidation reads of one pod version (`pod_facts`)."""

    key: str  # namespace/name
    member: str  # the uid (else the key): the node's set of pods (`EmptyTracker.changed_at`)
    live: bool  # not terminating, not finished
    movable: bool  # a drain evicts it (gpupolicy/capacity/drain.drainable)
    demand: PodDemand | None  # None: unreadable (its node is no candidate)
    bound_at: float | None  # PodScheduled, else startTime, else creation (not clamped to a clock)
    arrived: float | None  # startTime, else creation: when it came to the node
    finishes: tuple[float | None, ...]  # its containers' finishedAt
    do_not_disrupt: bool


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The pod's facts, remembered per pod version (`kubemodel.memoised`): the rows read every pod of every
    GPU node, each a dozen lookups, and between two passes few pods change. With layout's `_reading` and
    the node specs kept too, a capacity pass at 5,000 nodes / 50,000 pods (500 replaced between passes)
    took 1.08 s of CPU instead of 1.83 (`python bench/controller_pass.py --churn 500`)."""
    return memoised("consolidation-facts", _read_facts, pod)


def _read_facts(pod: Mapping[str, Any]) -> PodFacts:
    status = pod.get("status") or {}
    m = meta(pod)
    try:
        demand: PodDemand | None = demand_from_pod(pod)
    except ObjectError:
        demand = None
    scheduled = next((c.get("lastTransitionTime") for c in status.get("conditions") or []
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
    bound_at = next((stamp for text in (scheduled, status.get("startTime"), m.get("creationTimestamp"))
                     if (stamp := _timestamp(text)) is not None), None)
    key = pod_key(pod)
    return PodFacts(
        key=key, member=str(m.get("uid") or key), live=live(pod), movable=drain.drainable(pod), demand=demand,
        bound_at=bound_at, arrived=_timestamp(status.get("startTime") or m.get("creationTimestamp")),
        finishes=tuple(_timestamp(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                       for c in status.get("containerStatuses") or []),
        do_not_disrupt=drain.do_not_disrupt(annotations_of(pod)) is not None)


@dataclass(frozen=True, slots=True)
class NodePods:
    """What consolidation reads of the pods on one node (`NodePodsMemo.read`). Counted: the movable ones (live,
    and a drain evicts them)."""

    objects: tuple[Mapping[str, Any], ...]  # the pod objects read (identity: a kept object is unchanged)
    members: frozenset[str]  # the movable pods' uids (`EmptyTracker.changed_at`)
    demands: tuple[tuple[str, PodDemand], ...]  # (key, demand) of the movable pods
    unreadable: bool  # a movable pod's demand could not be read: the node is no candidate
    bound_at: dict[str, float]  # key -> when each movable pod was bound (read-only)
    newest_bound: float  # the latest of `bound_at` (-inf: none)
    latest: float | None  # the newest arrival of a movable pod, or finish of any pod on the node
    do_not_disrupt: bool  # a live pod says do-not-disrupt


def read_node_pods(on_node: Sequence[Mapping[str, Any]]) -> NodePods:
    facts = [pod_facts(pod) for pod in on_node]
    bound = [f for f in facts if f.live]
    movable = [f for f in bound if f.movable]
    bound_at = {f.key: f.bound_at for f in movable if f.bound_at is not None}
    marks = [m for m in [f.arrived for f in movable] + [stamp for f in facts for stamp in f.finishes] if m is not None]
    return NodePods(objects=tuple(on_node), members=frozenset(f.member for f in movable),
                    demands=tuple((f.key, f.demand) for f in movable if f.demand is not None),
                    unreadable=any(f.demand is None for f in movable), bound_at=bound_at,
                    newest_bound=max(bound_at.values(), default=-math.inf), latest=max(marks, default=None),
                    do_not_disrupt=any(f.do_not_disrupt for f in bound))


class NodePodsMemo:
    """Each GPU node's `NodePods`, between passes (one owner: the capacity reconciler). Why: a pass reads
    every pod of every GPU node, and between two passes few change; a node whose pods are the same objects
    (a watch cache replaces an object that changes, kube/reflector.py) is read from here without looking at
    its pods. Listed in docs/designs/caches.md."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodePods] = {}

    def read(self, name: str, on_node: Sequence[Mapping[str, Any]]) -> NodePods:
        kept = self._nodes.get(name)
        if kept is not None and same_objects(kept.objects, on_node):
            return kept
        self._nodes[name] = fresh = read_node_pods(on_node)
        return fresh

    def keep(self, names: Set[str]) -> None:
        """Forget the nodes not in `names` (gone from the cluster)."""
        for name in [n for n in self._nodes if n not in names]:
            del self._nodes[name]


def _disrupt(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, rows: Rows, disruption: Disruption,
             proposals: list[Proposal], steady: float) -> None:
    """Show the disruption and start it as the mode allows. `steady`: seconds since a pod last came to or
    left its nodes; a replacement (new nodes, then every pod moved) waits until that is `for`, so a node
    that just received pods is not replaced at once (the core would; docs/designs/capacity.md)."""
    ctx, claims = p.ctx, rows.claims
    method_mode = disruption_mode(mode, disruption.method == UNDERUSED, ctx.prometheus_configured)
    names = [str(rows.gpu_nodes[n]["metadata"]["name"]) for n in disruption.nodes]
    action = _action(disruption)
    reason, blocked, adds = disruption.explanation, "", 0
    if disruption.launches:
        adds = sum(t.gpus for t in disruption.launches)
        reason = (f"{reason}; launches {', '.join(t.name for t in disruption.launches)} ({adds} GPU(s)) first, "
                  "drains once they are up")
        blocked = replacement.why_not(p, spec, p.seen.by_node.get(names[0], []), disruption)
        if not blocked and steady < spec.consolidation.window_seconds:
            blocked = (f"waiting: its pods changed {steady:.0f}s ago, a replacement waits until they have not for "
                       f"{spec.consolidation.for_}")
        reason = f"{reason}; {blocked}" if blocked else reason
    states = [p.decide(policy, method_mode, f"Node/{name}", action) for name in names]
    apply = all(s.apply for s in states) and ctx.is_leader() and not blocked
    for name, state in zip(names, states, strict=True):
        shown = State.APPLIED if apply else (State.APPROVED if state.apply else state.state)
        freed = (claims[name].gpus if name in claims else 0) - adds
        proposals.append(make_proposal(policy.name, f"Node/{name}", action, reason, freed * HOURS_PER_MONTH, shown))
    if not apply:
        return
    if disruption.launches:
        [name] = names
        plan_id = make_proposal(policy.name, f"Node/{name}", action, "", 0.0).id
        moving = [key for key, row in disruption.moves.items() if row >= len(rows.gpu_nodes)]
        replacement.start(p, policy, spec, name, plan_id, disruption, moving, reason)
        ctx.recorder.applied(TargetRef("Node", "", name, api_version="v1"), policy,
                             f"Capacity: {action}", {}, reason, action_label="capacity")
        return
    now = ctx.clock.now()
    for name in names:
        node = next(n for n in rows.gpu_nodes if n["metadata"]["name"] == name)
        _start_drain(p, policy, spec, node, claims[name], action, disruption.explanation, now)


def _start_drain(p: Pass, policy: GpuPolicy, spec: CapacitySpec, node: Mapping[str, Any], claim: CapacityNode,
                 action: str, why: str, now: float) -> None:
    """Record the drain on the node (cordoning it), then take its first step at once (drain.py: evictions)."""
    ctx, name = p.ctx, str(node["metadata"]["name"])
    plan_id = make_proposal(policy.name, f"Node/{name}", action, "", 0.0).id
    record = drain.Record(plan=plan_id, policy=policy.name, claim=claim.claim, started=now,
                          deadline=now + spec.consolidation.drain_seconds,
                          was_unschedulable=bool((node.get("spec") or {}).get("unschedulable")))
    ctx.patch_node(name, drain.start_patch(record))
    p.checkpoint("cordoned")
    ctx.recorder.applied(TargetRef("Node", "", name, api_version="v1"), policy,
                         f"Capacity: {action}", {}, why, action_label="capacity")
    step(p, name, record, annotations_of(node), p.seen.by_node.get(name, []), policy)


def _hold(p: Pass, policy: GpuPolicy, mode: Mode, name: str, claims: Mapping[str, CapacityNode],
          disruption: Disruption, why: str, proposals: list[Proposal]) -> None:
    """Show a node the plan would have disrupted but a PodDisruptionBudget holds: not a candidate this pass,
    nothing written (no cordon, no eviction, no launch); the next pass looks again."""
    action = _action(disruption)
    method_mode = disruption_mode(mode, disruption.method == UNDERUSED, p.ctx.prometheus_configured)
    state = p.decide(policy, method_mode, f"Node/{name}", action)
    shown = State.APPROVED if state.apply else state.state
    freed = (claims[name].gpus if name in claims else 0) - sum(t.gpus for t in disruption.launches)
    reason = f"{disruption.explanation}; not a candidate this pass: {why}"
    proposals.append(make_proposal(policy.name, f"Node/{name}", action, reason[:500], freed * HOURS_PER_MONTH,
                                   shown))


def _action(disruption: Disruption) -> str:
    if disruption.launches:
        return f"replace ({disruption.method})"
    return f"drain and delete ({disruption.method})" if disruption.method != EMPTY else "delete (empty)"


def _undone(p: Pass, policy: GpuPolicy, cooldown: float) -> list[Proposal]:
    """Drains of this policy undone within `cooldown`: they stay visible while they cool down."""
    now, shown = p.ctx.clock.now(), []
    for node in p.seen.nodes:
        undone = drain.read_undone(annotations_of(node))
        if undone is not None and undone.get("policy") == policy.name and now - float(undone["at"]) < cooldown:
            shown.append(make_proposal(policy.name, f"Node/{node['metadata']['name']}",
                                       "drain undone", str(undone.get("message", ""))[:500], 0.0))
    return shown


@dataclass
class EmptyTracker:
    """When each node last became empty, and when its pods last changed, as far as the objects and this
    process can tell."""

    first_seen_empty: dict[str, float] = field(default_factory=dict)
    was_busy: set[str] = field(default_factory=set)
    members: dict[str, frozenset[str]] = field(default_factory=dict)
    changed: dict[str, float] = field(default_factory=dict)

    def changed_at(self, name: str, members: frozenset[str], latest: float | None, now: float) -> float | None:
        """When a pod last came to or left the node: `latest` (the newest start, else creation, of the pods
        counted, `members`, and the last finish of any pod bound to it: `NodePods`), and when this process saw
        the set of pods change (a deleted pod leaves no trace)."""
        if name in self.members and self.members[name] != members:
            self.changed[name] = now
        self.members[name] = members
        known = [m for m in (latest, self.changed.get(name)) if m is not None]
        return min(max(known), now) if known else None  # a stamp ahead of this clock (skew) is now

    def empty_since(self, name: str, node: Mapping[str, Any], seen: Seen, busy: bool, now: float) -> float:
        """The latest of the node's creation, its last pod's finish and, when this process saw it
        busy before (pods deleted leave no trace), when it first saw it empty."""
        if busy:
            self.first_seen_empty.pop(name, None)
            self.was_busy.add(name)
            return now
        marks = [_timestamp(meta(node).get("creationTimestamp")), *_finishes(name, seen)]
        first = self.first_seen_empty.setdefault(name, now)
        known = [m for m in marks if m is not None] + ([first] if name in self.was_busy else [])
        return max(known) if known else first


def _finishes(name: str, seen: Seen) -> list[float | None]:
    """When the containers of the pods on node `name` finished (finished pods stay bound until deleted)."""
    return [stamp for pod in seen.by_node.get(name, []) for stamp in pod_facts(pod).finishes]
