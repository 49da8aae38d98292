"""GPU capacity through Karpenter: the NodePool, NodeClaims for shared GPUs, usage-aware consolidation (issue 19).

One pass (every 10 s, as Karpenter's disruption loop), capacity policies
highest priority first, under `--capacity-provider karpenter` (any other
provider: nothing is done and the policies say NotImplemented,
gpupolicy/modes.py):

1. Drains in flight (node annotation `gpu.kubeon.io/draining`) move one step
   each (gpupolicy/capacity/drain.py): evict through the Eviction API, delete
   the NodeClaim once empty, or undo past the deadline. They are carried on
   whatever the policies say now, so no node stays cordoned.
2. The NodePool is kept in the declared shape by server-side apply
   (gpupolicy/capacity/nodepool.py; a field another manager owns is a 409,
   reported as condition NodePool=False, never forced).
3. Provisioning: pending pods on `nvidia.com/gpu.shared` / `nvidia.com/mig-*`
   that nothing can serve, counting launching NodeClaims
   (gpupolicy/capacity/demand.py), are planned onto new nodes by
   `plan_launches`; each launch is a NodeClaim booting the sharing layout.
   Whole-GPU pods are Karpenter's own: it provisions them from the NodePool.
4. Consolidation: `plan_disruptions` on every GPU node (the packing engine
   re-places the pods of candidates first) with each node's DCGM utilisation
   over `consolidation.for`; do-not-disrupt on node or pod, drains under way
   or recently undone, and nodes pending pods wait for are blocked.
Mode gating (gpupolicy/proposals.py): every write is a proposal first
(target `NodePool/<pool>` for the pool and launches, `Node/<name>` for a
disruption); Recommend writes nothing; Approve applies the targets listed in
spec.approvals; Automatic applies. A usage-aware disruption needs Prometheus
(gpupolicy/modes.disruption_mode); request-based ones keep the policy's mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib.resources import files
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller import crashpoints
from controller.capacity_usage import node_usage
from controller.context import ControllerContext
from controller.crashpoints import Checkpoint
from controller.metrics_source import MetricsError
from gpupolicy.capacity import drain, relayout
from gpupolicy.capacity.consolidation import (
    EMPTY,
    UNDERUSED,
    ConsolidationRules,
    Disruption,
    plan_disruptions,
    replace_pods,
)
from gpupolicy.capacity.demand import (
    LaunchDemand,
    boot_labels,
    claim_as_node,
    group_by_resource,
    is_shared_resource,
    launch_demand,
)
from gpupolicy.capacity.instances import InstanceType, load_instances
from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION, read_demand, read_nodes
from gpupolicy.capacity.layout import plan_layout as plan_nodes
from gpupolicy.capacity.nodepool import (
    POLICY_LABEL,
    allowed_types,
    claim_name,
    desired_nodepool,
)
from gpupolicy.capacity.provider import IMPLEMENTED, CapacityNode, CapacityProvider, NewNode
from gpupolicy.capacity.provisioning import Launch, plan_launches
from gpupolicy.catalog import DEFAULT_CATALOG, MIG_CONFIG_LABEL
from gpupolicy.matching import selector_matches
from gpupolicy.model import (
    API_VERSION,
    KIND,
    CapacitySpec,
    Condition,
    GpuPolicy,
    Mode,
    PolicyKind,
    Proposal,
    SharingStrategy,
)
from gpupolicy.model import ProposalState as State
from gpupolicy.modes import disruption_mode, effective_mode
from gpupolicy.packing.engine import get_strategy
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, state_from_kubernetes
from gpupolicy.packing.nodemodel import NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.typicalmix import TypicalMix
from gpupolicy.proposals import TargetRef, decide_state, make_proposal
from kube import calls
from kube import karpenter as kk
from kube import layout as kl
from kube.events import ObjectRef

log = logging.getLogger(__name__)

SOURCE = "capacity"
# The instance catalog (gpupolicy/capacity/instances.py CSV); KUBEON_GPU_INSTANCE_TYPES names another file.
DEFAULT_INSTANCES = files("gpupolicy.capacity") / "data" / "aws-gpu-instances.csv"
INSTANCES_ENV = "KUBEON_GPU_INSTANCE_TYPES"
HOURS_PER_MONTH = 730.0
CHECKPOINTS = ("cordoned", "evicted", "deleted", "launched")
# Crash injection for process tests (controller/crashpoints.py).
CRASH_ENV = "KUBEON_GPU_CAPACITY_CRASH_AT"


def crash_checkpoint_from_env(environ: Mapping[str, str] | None = None) -> Checkpoint | None:
    """The `KUBEON_GPU_CAPACITY_CRASH_AT` hook, or None when unset or naming no checkpoint (production: inert)."""
    return crashpoints.from_env(CRASH_ENV, CHECKPOINTS, environ)


def _timestamp(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _live(pod: Mapping[str, Any]) -> bool:
    return not _meta(pod).get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


@dataclass
class _Seen:
    """What one pass read."""

    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    claims: list[CapacityNode]
    by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for pod in self.pods:
            name = (pod.get("spec") or {}).get("nodeName")
            if name:
                self.by_node.setdefault(str(name), []).append(pod)


class CapacityReconciler:
    """Reconciler `capacity` in controller/loop.py's registry."""

    name = SOURCE
    provider: CapacityProvider  # this pass's (Karpenter: over ctx.api)

    def __init__(self, period_seconds: float = 10.0, *, instances: list[InstanceType] | None = None,
                 step_seconds: float = 60.0, checkpoint: Checkpoint | None = None) -> None:
        self.period_seconds = period_seconds
        source = os.environ.get(INSTANCES_ENV) or str(DEFAULT_INSTANCES)
        self.instances = instances if instances is not None else load_instances(source)
        self.by_type = {t.name: t for t in self.instances}
        self.step_seconds = step_seconds
        self.checkpoint = checkpoint or crash_checkpoint_from_env() or crashpoints.no_checkpoint
        self._empty_seen: dict[str, float] = {}  # node -> when this process first saw it empty
        self._was_busy: set[str] = set()  # nodes this process saw with pods
        self.last_launches: list[Launch] = []
        self.last_disruptions: list[Disruption] = []

    @property
    def products(self) -> dict[str, tuple[str, int, float]]:
        return {t.name: (t.model, t.gpus, t.price_per_hour) for t in self.instances}

    # -- the pass ---------------------------------------------------------------------
    def reconcile(self, ctx: ControllerContext) -> None:
        policies = ctx.policies.valid(PolicyKind.CAPACITY)
        if ctx.capacity_provider not in IMPLEMENTED:
            return  # the status says NotImplemented (gpupolicy/modes.handling); nothing to act with
        nodes = kl.list_nodes(ctx.api)
        in_flight = any(drain.DRAINING_ANNOTATION in _annotations(n) for n in nodes)
        if not policies and not in_flight:
            return
        provider = kk.KarpenterProvider(ctx.api, self.products)
        seen = _Seen(nodes, kl.list_pods(ctx.api), provider.nodes())
        self.provider = provider
        by_name = {p.name: p for p in policies}
        shown = self._advance_drains(ctx, seen, by_name)
        usage = self._usage(ctx, policies, seen)
        claimed: set[str] = set()  # a pending pod is provisioned for by the first policy covering it
        for policy in policies:
            assert policy.spec.capacity is not None
            mode = effective_mode(policy, ctx.default_mode, ctx.prometheus_configured).mode
            proposals = list(shown.get(policy.name, []))
            conditions: list[Condition] = []
            pool_ok = self._pool(ctx, policy, policy.spec.capacity, mode, proposals, conditions)
            self._provision(ctx, policy, policy.spec.capacity, mode, seen, pool_ok, proposals, conditions, claimed)
            self._consolidate(ctx, policy, policy.spec.capacity, mode, seen, usage, proposals, conditions)
            ctx.policies.publish(policy.name, SOURCE, proposals, conditions)

    def _decide(self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode, target: str, action: str) -> Any:
        base = make_proposal(policy.name, target, action, "", 0.0)
        before = ctx.policies.previous(policy.name).get(base.id)
        dismissed = before.state if before is not None and before.state is State.DISMISSED else None
        return decide_state(mode, target in policy.spec.approvals, dismissed)

    # -- 2. the NodePool -----------------------------------------------------------------
    def _pool(self, ctx: ControllerContext, policy: GpuPolicy, spec: CapacitySpec, mode: Mode,
              proposals: list[Proposal], conditions: list[Condition]) -> bool:
        """Keep the NodePool declared; True when it exists in the declared shape after this step."""
        target, action = f"NodePool/{spec.node_pool}", f"declare NodePool {spec.node_pool}"
        try:
            desired = desired_nodepool(policy.name, spec, {t.name: t.model for t in self.instances})
        except ValueError as exc:
            conditions.append(Condition(type="NodePool", status="False", reason="NoInstanceType", message=str(exc)))
            return False
        shape = self.provider.pool_in_shape(policy.name, spec)
        types = desired["spec"]["template"]["spec"]["requirements"][0]["values"]
        limit = f", limits nvidia.com/gpu={spec.max_gpus}" if spec.max_gpus is not None else ""
        reason = (f"{len(types)} instance type(s) ({', '.join(types[:6])}{', ...' if len(types) > 6 else ''}), "
                  f"taint nvidia.com/gpu:NoSchedule{limit}, disruption budget "
                  f"{spec.consolidation.max_disrupted_nodes} node(s), consolidateAfter Never")
        if shape:
            proposals.append(make_proposal(policy.name, target, action, f"in shape: {reason}", 0.0, State.APPLIED))
            conditions.append(Condition(type="NodePool", status="True", reason="InShape", message=reason))
            return True
        state = self._decide(ctx, policy, mode, target, action)
        shown, why = state.state, reason if shape is None else f"differs from the declared shape: {reason}"
        ok = False
        if state.apply and ctx.is_leader():
            problem = self.provider.ensure_pool(policy.name, spec)
            if problem:
                shown, why = State.APPROVED, f"not applied: {problem}"
                conditions.append(Condition(type="NodePool", status="False", reason="FieldConflict",
                                            message=f"{problem} (the optimizer never forces fields it does not "
                                                    "own; remove the other manager's value or the policy's)"))
            else:
                ok = True
                ctx.recorder.applied(TargetRef("NodePool", "", spec.node_pool, api_version=kk.GROUP), policy,
                                     f"Capacity: {action}", {}, reason, action_label="capacity")
                conditions.append(Condition(type="NodePool", status="True", reason="Applied", message=reason))
        elif state.apply:
            shown = State.APPROVED
        if not ok and not any(c.type == "NodePool" for c in conditions):
            conditions.append(Condition(type="NodePool", status="False", reason="NotApplied",
                                        message=f"{'missing' if shape is None else 'not in shape'}; "
                                                f"{shown.value.lower()} in mode {mode.value}"))
        proposals.append(make_proposal(policy.name, target, action, why, 0.0, shown))
        return ok

    # -- 3. provisioning ------------------------------------------------------------------
    def _pool_claims(self, seen: _Seen, pool: str) -> list[CapacityNode]:
        return [c for c in seen.claims if c.pool == pool]

    def _unserved(self, ctx: ControllerContext, seen: _Seen, claims: list[CapacityNode]) -> list[tuple[str, str]]:
        """(pod key, resource) of pending shared-GPU pods nothing can serve, launching claims counted."""
        registered = {n["metadata"]["name"] for n in seen.nodes}
        nodes = [_as_relaid(n) for n in seen.nodes]
        virtual = [claim_as_node(c.claim, self.by_type[c.instance_type], c.labels) for c in claims
                   if not c.deleting and c.node not in registered and c.instance_type in self.by_type]
        sharing = ctx.policies.valid(PolicyKind.SHARING)
        plan = plan_nodes(read_nodes([*nodes, *virtual], seen.pods, {}, DEFAULT_CATALOG),
                          read_demand(seen.pods, sharing, DEFAULT_CATALOG))
        unserved = {pod for pod, _ in plan.unserved}
        found = []
        for pod in seen.pods:
            if (pod.get("spec") or {}).get("nodeName") or not _live(pod) or _pod_key(pod) not in unserved:
                continue
            demand = read_demand([pod], sharing, DEFAULT_CATALOG)
            if demand and is_shared_resource(demand[0].resource):
                found.append((_pod_key(pod), demand[0].resource))
        return found

    def _provision(self, ctx: ControllerContext, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, seen: _Seen,
                   pool_ok: bool, proposals: list[Proposal], conditions: list[Condition], claimed: set[str]) -> None:
        claims = self._pool_claims(seen, spec.node_pool)
        for claim in claims:  # what was launched stays visible until its node registers
            if claim.launching and claim.labels.get(POLICY_LABEL) == policy.name:
                proposals.append(make_proposal(
                    policy.name, f"NodePool/{spec.node_pool}",
                    f"launch NodeClaim {claim.claim} ({claim.instance_type})",
                    f"launching for {', '.join(claim.launched_for) or 'pending pods'}", 0.0, State.APPLIED))
        pods = {_pod_key(p): p for p in seen.pods}
        waiting = [(key, resource) for key, resource in self._unserved(ctx, seen, claims)
                   if key not in claimed and _covers(policy, pods[key])]
        claimed.update(key for key, _ in waiting)
        if not waiting:
            conditions.append(Condition(type="Provisioned", status="True", reason="NothingPending",
                                        message="no pending shared-GPU pod lacks a node"))
            return
        sharing = ctx.policies.valid(PolicyKind.SHARING)
        demands: list[LaunchDemand] = []
        impossible: list[str] = []
        for key, resource in waiting:
            named = _annotations(pods[key]).get("gpu.kubeon.io/policy")
            own = next((p for p in sharing if p.name == named), None) or _sharing_for(resource, sharing)
            found = launch_demand(pods[key], resource, own, spec.gpu_models, DEFAULT_CATALOG)
            (demands.append(found) if found is not None else impossible.append(key))
        types = set(allowed_types(spec, {t.name: t.model for t in self.instances}))
        catalog = [t for t in self.instances if t.name in types and t.gpus > 0]
        used = sum(c.gpus for c in claims if not c.deleting)
        room = None if spec.max_gpus is None else max(0, spec.max_gpus - used)
        launches: list[tuple[Launch, LaunchDemand]] = []
        for group in group_by_resource(demands).values():
            planned = self._plan_group(group, catalog, room)
            for launch in planned:
                launches.append((launch, group[0]))
                if room is not None:
                    room -= launch.instance_type.gpus
        self.last_launches = [launch for launch, _ in launches]
        placed = {pod for launch, _ in launches for pod in launch.pods}
        left = [d.pod for d in demands if d.pod not in placed] + impossible
        for index, (launch, sample) in enumerate(launches):
            self._launch(ctx, policy, spec, mode, pool_ok, launch, sample, index, proposals)
        if left:
            why = f"maxGpus {spec.max_gpus} reached" if room == 0 else "no allowed instance type holds them"
            conditions.append(Condition(type="Provisioned", status="False", reason="Unserved",
                                        message=f"{len(left)} pending pod(s) get no node ({why}): "
                                                f"{', '.join(sorted(left)[:10])}"))
        else:
            conditions.append(Condition(type="Provisioned", status="True", reason="Planned",
                                        message=f"{len(launches)} node(s) planned for {len(placed)} pending pod(s)"))

    @staticmethod
    def _plan_group(group: list[LaunchDemand], catalog: list[InstanceType], room: int | None) -> list[Launch]:
        """Launches for pods waiting on one resource. MIG: planned per product (a slice is a different
        share of each product's GPU), keeping the plan that places the most pods, then the cheapest."""
        empty = NodeState.build([])
        products = sorted({p for d in group for p in d.by_product})
        if not products:
            return plan_launches([(d.pod, d.demand) for d in group], empty, [], catalog, max_gpus=room)
        best: tuple[tuple[int, float], list[Launch]] | None = None
        for product in products:
            pods = [(d.pod, d.by_product[product]) for d in group if product in d.by_product]
            plan = plan_launches(pods, empty, [], catalog, max_gpus=room)
            score = (-sum(len(launch.pods) for launch in plan), sum(la.instance_type.price_per_hour for la in plan))
            if plan and (best is None or score < best[0]):
                best = (score, plan)
        return best[1] if best else []

    def _launch(self, ctx: ControllerContext, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, pool_ok: bool,
                launch: Launch, sample: LaunchDemand, index: int, proposals: list[Proposal]) -> None:
        kind = launch.instance_type
        name = claim_name(spec.node_pool, kind.name, list(launch.pods), index)
        labels = boot_labels(sample.resource, sample.layout)
        layout = f", MIG {sample.layout}" if labels else ""
        target, action = f"NodePool/{spec.node_pool}", f"launch NodeClaim {name} ({kind.name}{layout})"
        reason = (f"{len(launch.pods)} pending {sample.resource} pod(s) no node can serve: "
                  f"{', '.join(launch.pods[:5])}{', ...' if len(launch.pods) > 5 else ''}; adds {kind.gpus} "
                  f"{kind.model} GPU(s), about ${kind.price_per_hour:.2f}/h")
        state = self._decide(ctx, policy, mode, target, action)
        shown = state.state
        if state.apply:
            if not pool_ok:
                shown, reason = State.APPROVED, f"{reason}; waiting for NodePool {spec.node_pool}"
            elif not ctx.is_leader():
                shown = State.APPROVED
            else:
                new = NewNode(name, kind.name, labels, reason, launch.pods)
                self.provider.add(policy.name, spec, new)
                self.checkpoint("launched")
                ctx.recorder.applied(TargetRef("NodeClaim", "", name, api_version=kk.GROUP), policy,
                                     f"Capacity: {action}", {}, reason, action_label="capacity")
        proposals.append(make_proposal(policy.name, target, action, reason,
                                       -kind.gpus * HOURS_PER_MONTH, shown))

    # -- 4. consolidation -------------------------------------------------------------------
    def _usage(self, ctx: ControllerContext, policies: list[GpuPolicy], seen: _Seen) -> dict[str, float | None]:
        names = [str(n["metadata"]["name"]) for n in seen.nodes]
        if ctx.metrics is None or not ctx.prometheus_configured or not policies:
            return dict.fromkeys(names)
        window = max(p.spec.capacity.consolidation.window_seconds for p in policies if p.spec.capacity)
        now = ctx.clock.now()
        try:
            return node_usage(ctx.metrics, names, start=now - window, end=now, step=self.step_seconds)
        except MetricsError as exc:
            log.warning("capacity: GPU utilisation unavailable: %s", exc)
            return dict.fromkeys(names)

    def _consolidate(self, ctx: ControllerContext, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, seen: _Seen,
                     usage: Mapping[str, float | None], proposals: list[Proposal], conditions: list[Condition]) -> None:
        rules = spec.consolidation
        now = ctx.clock.now()
        if not ctx.prometheus_configured:
            conditions.append(Condition(type="UsageAware", status="False", reason="PrometheusNotConfigured",
                                        message="usage-aware consolidation needs --prometheus-url (GPU utilisation "
                                                "from DCGM); empty nodes and nodes whose pods fit elsewhere are "
                                                "still consolidated in the policy's mode"))
        claims = {c.node: c for c in self._pool_claims(seen, spec.node_pool) if c.node is not None}
        gpu_nodes = [n for n in seen.nodes if _is_gpu_node(n)]
        try:
            state = state_from_kubernetes(gpu_nodes, seen.pods)
        except ObjectError as exc:
            conditions.append(Condition(type="Consolidation", status="False", reason="UnreadableObject",
                                        message=str(exc)[:500]))
            return
        pods_on: dict[int, list[tuple[str, PodDemand]]] = {}
        blocked: set[int] = set()
        empty_since: dict[int, float] = {}
        prices: list[float] = []
        pending = {_pod_key(p) for p in seen.pods if not (p.get("spec") or {}).get("nodeName") and _live(p)}
        cooldown = max(4 * rules.drain_seconds, 3600.0)
        for row, node in enumerate(gpu_nodes):
            name = str(node["metadata"]["name"])
            claim = claims.get(name)
            prices.append(claim.price_per_hour if claim is not None else 0.0)  # what the provider reports
            bound = [p for p in seen.by_node.get(name, []) if _live(p)]
            movable = [p for p in bound if drain.drainable(p)]
            try:
                pods_on[row] = [(_pod_key(p), demand_from_pod(p)) for p in movable]
            except ObjectError:
                blocked.add(row)
            notes = _annotations(node)
            undone = drain.read_undone(notes)
            launched_for = set(claim.launched_for) if claim else set()
            if (claim is None or claim.deleting or drain.DRAINING_ANNOTATION in notes
                    or RELAYOUT_ANNOTATION in notes or drain.do_not_disrupt(notes)
                    or any(drain.do_not_disrupt(_annotations(p)) for p in bound)
                    or (undone is not None and now - float(undone["at"]) < cooldown)
                    or launched_for & pending):
                blocked.add(row)
            empty_since[row] = self._empty_since(name, node, seen, bool(movable), now)
        in_progress = sum(1 for n in seen.nodes if drain.DRAINING_ANNOTATION in _annotations(n))
        plan = plan_disruptions(
            state, pods_on, prices, {i: usage.get(str(n["metadata"]["name"])) for i, n in enumerate(gpu_nodes)},
            ConsolidationRules(rules.underused_below_percent, rules.window_seconds, rules.max_disrupted_nodes,
                               rules.empty_seconds),
            blocked=blocked, now=now, empty_since=empty_since, in_progress=in_progress)
        self.last_disruptions = plan
        for disruption in plan:
            self._disrupt(ctx, policy, spec, mode, seen, gpu_nodes, claims, disruption, proposals)
        for node in seen.nodes:  # undone drains stay visible while they cool down
            undone = drain.read_undone(_annotations(node))
            if undone is not None and undone.get("policy") == policy.name and now - float(undone["at"]) < cooldown:
                proposals.append(make_proposal(policy.name, f"Node/{node['metadata']['name']}",
                                               "drain undone", str(undone.get("message", ""))[:500], 0.0))
        conditions.append(Condition(type="Consolidation", status="True", reason="Planned",
                                    message=f"{len(plan)} disruption(s) planned, {in_progress} drain(s) under way"))

    def _empty_since(self, name: str, node: Mapping[str, Any], seen: _Seen, busy: bool, now: float) -> float:
        """When the node last became empty: the latest of its creation, its last pod's finish and, when
        this process saw it busy before (pods deleted leave no trace), when it first saw it empty."""
        if busy:
            self._empty_seen.pop(name, None)
            self._was_busy.add(name)
            return now
        marks = [_timestamp(_meta(node).get("creationTimestamp"))]
        for pod in seen.by_node.get(name, []):
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                marks.append(_timestamp(((status.get("state") or {}).get("terminated") or {}).get("finishedAt")))
        first = self._empty_seen.setdefault(name, now)
        known = [m for m in marks if m is not None] + ([first] if name in self._was_busy else [])
        return max(known) if known else first

    def _disrupt(self, ctx: ControllerContext, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, seen: _Seen,
                 gpu_nodes: list[dict[str, Any]], claims: Mapping[str, CapacityNode],
                 disruption: Disruption, proposals: list[Proposal]) -> None:
        method_mode = disruption_mode(mode, disruption.method == UNDERUSED, ctx.prometheus_configured)
        names = [str(gpu_nodes[n]["metadata"]["name"]) for n in disruption.nodes]
        action = f"drain and delete ({disruption.method})" if disruption.method != EMPTY else "delete (empty)"
        states = [self._decide(ctx, policy, method_mode, f"Node/{name}", action) for name in names]
        apply = all(s.apply for s in states) and ctx.is_leader()
        for name, state in zip(names, states, strict=True):
            shown = State.APPLIED if apply else (State.APPROVED if state.apply else state.state)
            proposals.append(make_proposal(policy.name, f"Node/{name}", action, disruption.explanation,
                                           claims[name].gpus * HOURS_PER_MONTH if name in claims else 0.0, shown))
        if not apply:
            return
        now = ctx.clock.now()
        for name in names:
            node = next(n for n in gpu_nodes if n["metadata"]["name"] == name)
            plan_id = make_proposal(policy.name, f"Node/{name}", action, "", 0.0).id
            record = drain.Record(plan=plan_id, policy=policy.name, claim=claims[name].claim, started=now,
                                  deadline=now + spec.consolidation.drain_seconds,
                                  was_unschedulable=bool((node.get("spec") or {}).get("unschedulable")))
            kl.patch_node(ctx.api, name, drain.start_patch(record))
            self.checkpoint("cordoned")
            ctx.recorder.applied(TargetRef("Node", "", name, api_version="v1"), policy,
                                 f"Capacity: {action}", {}, disruption.explanation, action_label="capacity")
            self._step(ctx, name, record, _annotations(node), seen.by_node.get(name, []), policy)

    # -- 1. drains in flight ------------------------------------------------------------------
    def _advance_drains(self, ctx: ControllerContext, seen: _Seen,
                        policies: Mapping[str, GpuPolicy]) -> dict[str, list[Proposal]]:
        shown: dict[str, list[Proposal]] = {}
        state: NodeState | None = None
        gpu_nodes = [n for n in seen.nodes if _is_gpu_node(n)]
        for node in seen.nodes:
            notes = _annotations(node)
            record = drain.read_record(notes)
            if record is None or not ctx.is_leader():
                continue
            name = str(node["metadata"]["name"])
            pods = seen.by_node.get(name, [])
            if state is None:
                state = _state_or_none(gpu_nodes, seen.pods)
            outcome, message = self._step(ctx, name, record, notes, pods, policies.get(record.policy),
                                          _still_fits(state, name, pods))
            if record.policy in policies:
                undone = outcome == "undone"
                shown.setdefault(record.policy, []).append(make_proposal(
                    record.policy, f"Node/{name}", "drain undone" if undone else "drain in progress", message[:500],
                    0.0, State.PROPOSED if undone else State.APPLIED))
        return shown

    def _step(self, ctx: ControllerContext, name: str, record: drain.Record, notes: Mapping[str, Any],
              pods: list[dict[str, Any]], policy: GpuPolicy | None, fits: bool = True) -> tuple[str, str]:
        """One drain step on `name`; returns its outcome and what it did (the proposal's reason)."""
        now = ctx.clock.now()
        step = drain.advance(name, record, notes, pods, now, fits)
        if step.evict:
            accepted, refused = [], ""
            for namespace, pod, uid in step.evict:
                status, why = calls.evict(ctx.api, namespace, pod)
                if status in (201, 404):
                    accepted.append(uid)
                else:
                    refused = refused or f"eviction of {namespace}/{pod} refused ({status}): {why}"[:300]
            self.checkpoint("evicted")
            kl.patch_node(ctx.api, name, drain.record_patch(drain.after_evictions(record, accepted, refused, now)))
            return step.outcome, f"{step.message}; {refused}" if refused else step.message
        if step.patch is not None:
            try:
                kl.patch_node(ctx.api, name, step.patch)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if step.delete_claim:
            self.provider.remove(record.claim)
            self.checkpoint("deleted")
        if step.outcome == "undone":
            log.warning("capacity drain undone: %s", step.message)
            refs = [ObjectRef("v1", "Node", name)]
            if policy is not None:
                refs.append(ObjectRef(API_VERSION, KIND, policy.name, None, policy.metadata.uid))
            for ref in refs:
                ctx.recorder.warning(ref, "CapacityDrainUndone", step.message)
        return step.outcome, step.message


def _as_relaid(node: dict[str, Any]) -> dict[str, Any]:
    """A node in a MIG re-layout (controller/layout.py) as it will be: its target layout, schedulable.

    The re-layout cordons it while the MIG manager works, so read as it is it would look like
    no capacity, and the pods it is being prepared for would get a second node."""
    record = relayout.read_record(_annotations(node))
    if record is None:
        return node
    meta = _meta(node)
    labels = {**(meta.get("labels") or {}), MIG_CONFIG_LABEL: record.target}
    annotations = {k: v for k, v in _annotations(node).items() if k != RELAYOUT_ANNOTATION}
    return {**node, "metadata": {**meta, "labels": labels, "annotations": annotations},
            "spec": {**(node.get("spec") or {}),  # cordoned by the re-layout: capacity; by someone else: not
                     "unschedulable": not record.cordoned and bool((node.get("spec") or {}).get("unschedulable"))}}


def _is_gpu_node(node: Mapping[str, Any]) -> bool:
    labels = _meta(node).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return "nvidia.com/gpu.product" in labels or any(str(k).startswith("nvidia.com/") for k in allocatable)


def _state_or_none(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> NodeState | None:
    try:
        return state_from_kubernetes(nodes, pods)
    except ObjectError:
        return None


def _still_fits(state: NodeState | None, node: str, pods: list[dict[str, Any]]) -> bool:
    """The drainable pods left on `node` re-place on the other nodes (the packing engine, as planned).
    Unknown (an object the model cannot read) counts as fitting: the deadline still bounds the drain."""
    if state is None or node not in state.index:
        return True
    try:
        left = [(_pod_key(p), demand_from_pod(p)) for p in pods if drain.drainable(p)]
    except ObjectError:
        return True
    if not left:
        return True
    context = PackingContext(mix=TypicalMix.from_pods([d for _, d in left], 1.0))
    return replace_pods(state, [state.index[node]], left, get_strategy(None), context) is not None


def _covers(policy: GpuPolicy, pod: Mapping[str, Any]) -> bool:
    """The policy's selector covers the pod (namespace labels: the automatic name label only)."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "default")
    return selector_matches(policy.spec.selector, namespace, {"kubernetes.io/metadata.name": namespace},
                            dict(meta.get("labels") or {}))


def _sharing_for(resource: str, sharing: list[GpuPolicy]) -> GpuPolicy | None:
    wanted = SharingStrategy.TIME_SLICING if resource == "nvidia.com/gpu.shared" else SharingStrategy.MIG
    return next((p for p in sharing if p.spec.sharing is not None and p.spec.sharing.strategy is wanted), None)
