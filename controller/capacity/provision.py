"""Step 3 of a capacity pass: NodeClaims for pending shared-GPU pods that nothing can serve.

Pods claiming their GPU through one of our ResourceClaimTemplates (`sharing.via: DRA`) count as asking
for the devices the template names (`gpupolicy.packing.dradevices`), and nodes whose DRA driver publishes
ResourceSlices offer the devices listed there: the launch is the same NodeClaim booting the MIG layout,
whose devices the driver then publishes (Karpenter cannot provision for claims: karpenter #1231, #3228).
Pods naming a shared claim (`kubeon-ts-<policy>-<i>`, time-slicing through DRA) ask for one whole GPU per
claim not yet allocated, once for all its pods; a claim already allocated pins its pods to its node
(`dradevices.shared_claim_takers`). A claim-based pod's whole GPU is ours to launch for, `wholeGpus` or not.

Whole-GPU pods are Karpenter's own (it provisions them from the NodePool)
unless the policy says `wholeGpus: Optimizer` (the NodePool's limits then
keep Karpenter from launching); with node groups (`provider.whole_gpus`)
they are planned here too.
For pods on `nvidia.com/gpu.shared` / `nvidia.com/mig-*` (no instance type
advertises them before the GPU Operator runs) the sharing-layout planner
says which pods no node, re-laid node or launching NodeClaim can serve
(gpupolicy/capacity/demand.py counts a launching claim as an empty node of
its type, so a burst is planned once); `plan_launches` picks the nodes within
`maxGpus`; each launch is a NodeClaim booting the sharing layout, or, with
node groups, one step of the desired size of the group that boots that type
and layout with room left (gpupolicy/capacity/nodegroups.py `choose`; the
catalog is narrowed to such types first, and a launch no group has room for
leaves its pods unserved, the condition naming the full groups).
"""

from __future__ import annotations

from typing import Any

from controller.capacity.state import HOURS_PER_MONTH, Pass, annotations_of, covers, is_gpu_node, live, meta, pod_key
from gpupolicy.capacity import relayout
from gpupolicy.capacity.allocatable import Allocatable, free_on, held_nowhere
from gpupolicy.capacity.demand import (
    LaunchDemand,
    boot_labels,
    claim_as_node,
    group_by_resource,
    is_shared_resource,
    launch_demand,
)
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION, read_demand, read_nodes
from gpupolicy.capacity.layout import plan_layout as plan_nodes
from gpupolicy.capacity.nodegroups import why_full
from gpupolicy.capacity.nodepool import POLICY_LABEL, allowed_types, claim_name
from gpupolicy.capacity.provider import CapacityNode, NewNode
from gpupolicy.capacity.provisioning import Launch, plan_launches
from gpupolicy.catalog import DEFAULT_CATALOG, GPU_RESOURCE, MIG_CONFIG_LABEL
from gpupolicy.model import (
    CapacitySpec,
    Condition,
    GpuPolicy,
    Mode,
    PolicyKind,
    Proposal,
    SharingStrategy,
    WholeGpus,
)
from gpupolicy.model import ProposalState as State
from gpupolicy.packing.dradevices import is_claim_based
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.proposals import TargetRef, make_proposal
from kube import karpenter as kk


def provision(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, pool_ok: bool,
              proposals: list[Proposal], conditions: list[Condition], claimed: set[str]) -> list[Launch]:
    """Plan and (as the mode allows) launch; returns the launches planned. `claimed`: pending pods an
    earlier policy of this pass already provisioned for (a pod gets capacity from one policy only)."""
    seen = p.seen
    claims = seen.pool_claims(spec.node_pool)
    groups = seen.groups is not None
    for claim in claims:  # what was launched stays visible until its node registers
        if claim.launching and (groups or claim.labels.get(POLICY_LABEL) == policy.name):
            proposals.append(make_proposal(
                policy.name, f"NodePool/{spec.node_pool}",
                f"{'node' if groups else 'launch NodeClaim'} {claim.claim} ({claim.instance_type})",
                f"launching for {', '.join(claim.launched_for) or 'pending pods'}", 0.0, State.APPLIED))
    whole = p.provider.whole_gpus or spec.whole_gpus is WholeGpus.OPTIMIZER
    lacking = unserved(p, claims, whole)
    pods = {pod_key(pod): pod for pod in seen.pods} if lacking else {}  # most passes: no pod lacks a node
    waiting = [(key, resource) for key, resource in lacking if key not in claimed and covers(policy, pods[key])]
    claimed.update(key for key, _ in waiting)
    if not waiting:
        conditions.append(Condition(type="Provisioned", status="True", reason="NothingPending",
                                    message=f"no pending {'GPU' if whole else 'shared-GPU'} pod lacks a node"))
        return []
    sharing = p.ctx.policies.valid(PolicyKind.SHARING)
    demands: list[LaunchDemand] = []
    impossible: list[str] = []
    for key, resource in waiting:
        named = annotations_of(pods[key]).get("gpu.kubeon.io/policy")
        own = next((s for s in sharing if s.name == named), None) or _sharing_for(resource, sharing)
        found = launch_demand(pods[key], resource, own, spec.gpu_models, DEFAULT_CATALOG)
        (demands.append(found) if found is not None else impossible.append(key))
    allowed = allowed_types(spec, {t.name: t.model for t in p.instances})
    used = sum(c.gpus for c in claims if not c.deleting)
    room = None if spec.max_gpus is None else max(0, spec.max_gpus - used)
    launches: list[tuple[Launch, LaunchDemand, str]] = []
    planned = dict(p.raised)  # node group -> nodes asked for, this pass's earlier policies and this one
    full: list[str] = []
    for group in group_by_resource(demands).values():
        boot = boot_labels(group[0].resource, group[0].layout)
        for launch in plan_group(group, p.launchable(allowed, spec.node_pool, boot, planned), room):
            chosen = p.group_for(spec.node_pool, launch.instance_type.name, boot, planned) if groups else None
            if groups and chosen is None:
                continue
            if chosen is not None:
                planned[chosen.name] = planned.get(chosen.name, 0) + 1
            launches.append((launch, group[0], chosen.name if chosen else ""))
            if room is not None:
                room -= launch.instance_type.gpus
        if groups and (why := why_full(p.group_sizes(spec.node_pool, planned), boot)):
            full.append(why)
    placed = {pod for launch, _, _ in launches for pod in launch.pods}
    left = [d.pod for d in demands if d.pod not in placed] + impossible
    for index, (launch, sample, node_group) in enumerate(launches):
        _launch(p, policy, spec, mode, pool_ok, launch, sample, index, proposals, node_group)
    if left:
        why = (f"maxGpus {spec.max_gpus} reached" if room == 0 else "; ".join(full) if full
               else "no allowed instance type holds them")
        conditions.append(Condition(type="Provisioned", status="False", reason="Unserved",
                                    message=f"{len(left)} pending pod(s) get no node ({why}): "
                                            f"{', '.join(sorted(left)[:10])}"))
    else:
        conditions.append(Condition(type="Provisioned", status="True", reason="Planned",
                                    message=f"{len(launches)} node(s) planned for {len(placed)} pending pod(s)"))
    return [launch for launch, _, _ in launches]


def unserved(p: Pass, claims: list[CapacityNode], whole: bool) -> list[tuple[str, str]]:
    """(pod key, resource) of pending shared-GPU pods (`whole`: and whole-GPU pods) nothing can serve,
    launching claims counted."""
    seen = p.seen
    sharing = p.ctx.policies.valid(PolicyKind.SHARING)
    demand = read_demand(seen.pods, sharing, DEFAULT_CATALOG)
    if not demand:  # most passes: nothing pending and no pod wanting a slice, so no node need be read
        return []
    by_type = p.by_type
    registered = {n["metadata"]["name"] for n in seen.nodes}
    nodes = [as_relaid(n) for n in seen.nodes]
    launching = [c for c in claims if not c.deleting and c.node not in registered and c.instance_type in by_type]
    virtual = [claim_as_node(c.claim, by_type[c.instance_type], c.labels) for c in launching]
    plan = plan_nodes(read_nodes([*nodes, *virtual], seen.pods, {}, DEFAULT_CATALOG, seen.slices), demand)
    left = {pod for pod, _ in plan.unserved}
    asking = {d.pod for d in demand if d.count > 0}
    rooms: list[Allocatable] | None = None
    found = []
    for pod in seen.pods:
        if (pod.get("spec") or {}).get("nodeName") or not live(pod):
            continue
        key = pod_key(pod)
        if key not in left:  # its devices are there: served, unless it asks devices and no node has its CPU
            if key not in asking:  # and memory (a pod of a shared claim asks nothing: the claim's pod does)
                continue
            rooms = _rooms(p, claims, launching) if rooms is None else rooms
            if not held_nowhere(pod, rooms):
                continue
        demand = read_demand([pod], sharing, DEFAULT_CATALOG)
        if demand and (is_shared_resource(demand[0].resource) or
                       ((whole or is_claim_based(pod)) and demand[0].resource == GPU_RESOURCE)):
            found.append((pod_key(pod), demand[0].resource))
    return found


def _rooms(p: Pass, claims: list[CapacityNode], launching: list[CapacityNode]) -> list[Allocatable]:
    """Free CPU and memory of each GPU node (allocatable less its running pods' requests; a node of one of
    the provider's `claims` counts, whose GPUs may be DRA devices) and of each `launching` claim (what its type
    offers, `Pass.instances`), for `held_nowhere`."""
    by_node, by_type = p.seen.by_node, p.by_type
    ours = {c.node for c in claims if c.node}
    rooms = [r for n in p.seen.nodes if (is_gpu_node(n) or meta(n).get("name") in ours)
             and (r := free_on(n, [q for q in by_node.get(str(meta(n).get("name")), []) if live(q)])) is not None]
    return rooms + [(by_type[c.instance_type].cpu_milli, by_type[c.instance_type].memory_mib) for c in launching]


def plan_group(group: list[LaunchDemand], catalog: list[InstanceType], room: int | None) -> list[Launch]:
    """Launches for pods waiting on one resource. MIG: planned per product (a slice is a different
    share of each product's GPU), keeping the plan that places the most pods, then the cheapest."""
    empty = NodeState.build([])
    products = sorted({product for d in group for product in d.by_product})
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


def _launch(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode, pool_ok: bool,
            launch: Launch, sample: LaunchDemand, index: int, proposals: list[Proposal], node_group: str = "") -> None:
    """One planned node: a NodeClaim `name`, or with `node_group` one more node in that group."""
    ctx = p.ctx
    kind = launch.instance_type
    name = claim_name(spec.node_pool, kind.name, list(launch.pods), index)
    labels = boot_labels(sample.resource, sample.layout)
    layout = f", MIG {sample.layout}" if labels else ""
    action = (f"add a node to node group {node_group} ({kind.name}{layout}) for {name}" if node_group
              else f"launch NodeClaim {name} ({kind.name}{layout})")
    target = f"NodePool/{spec.node_pool}"
    reason = (f"{len(launch.pods)} pending {sample.resource} pod(s) no node can serve: "
              f"{', '.join(launch.pods[:5])}{', ...' if len(launch.pods) > 5 else ''}; adds {kind.gpus} "
              f"{kind.model} GPU(s), about ${kind.price_per_hour:.2f}/h{p.avoided()}")
    state = p.decide(policy, mode, target, action)
    shown = state.state
    if state.apply:
        if not pool_ok:
            shown, reason = State.APPROVED, f"{reason}; waiting for NodePool {spec.node_pool}"
        elif not ctx.is_leader():
            shown = State.APPROVED
        else:
            new = NewNode(name, kind.name, labels, reason, launch.pods, group=node_group)
            p.add(policy.name, spec, new)
            p.checkpoint("launched")
            ref = (TargetRef("NodeGroup", "", node_group, api_version=p.provider.name) if node_group
                   else TargetRef("NodeClaim", "", name, api_version=kk.GROUP))
            ctx.recorder.applied(ref, policy, f"Capacity: {action}", {}, reason, action_label="capacity")
    proposals.append(make_proposal(policy.name, target, action, reason,
                                   -kind.gpus * HOURS_PER_MONTH, shown))


def as_relaid(node: dict[str, Any]) -> dict[str, Any]:
    """A node in a MIG re-layout (controller/layout.py) as it will be: its target layout, schedulable.

    The re-layout cordons it while the MIG manager works, so read as it is it would look like
    no capacity, and the pods it is being prepared for would get a second node."""
    record = relayout.read_record(annotations_of(node))
    if record is None:
        return node
    m = meta(node)
    labels = {**(m.get("labels") or {}), MIG_CONFIG_LABEL: record.target}
    notes = {k: v for k, v in annotations_of(node).items() if k != RELAYOUT_ANNOTATION}
    return {**node, "metadata": {**m, "labels": labels, "annotations": notes},
            "spec": {**(node.get("spec") or {}),  # cordoned by the re-layout: capacity; by someone else: not
                     "unschedulable": not record.cordoned and bool((node.get("spec") or {}).get("unschedulable"))}}


def _sharing_for(resource: str, sharing: list[GpuPolicy]) -> GpuPolicy | None:
    wanted = SharingStrategy.TIME_SLICING if resource == "nvidia.com/gpu.shared" else SharingStrategy.MIG
    return next((s for s in sharing if s.spec.sharing is not None and s.spec.sharing.strategy is wanted), None)

