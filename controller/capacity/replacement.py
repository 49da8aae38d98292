"""Replacing a node by cheaper new capacity: launch first, drain once the new nodes are there.

The core's single-node consolidation may answer "these pods fit on the other
nodes plus new nodes that cost less than this one" (a Disruption with
`launches`, as Karpenter's replace). The new nodes must be up before a pod
is evicted, or the pods would wait for them. The steps, state on the Node
(annotation `gpu.kubeon.io/replacing`, written before any NodeClaim, whose
names are stable: a repeated pass or a new leader asks again, never twice):
1. record + launch the NodeClaims (named from the pool, type and node);
2. every pass: when every claim has a Ready, schedulable Node with its GPUs
   registered (`nvidia.com/gpu` allocatable), the drain
   record and the cordon are written in one patch (gpupolicy/capacity/drain.py
   takes it from there); this record stays until the node is gone, so the
   new nodes are no consolidation candidates while they wait for the pods;
   while a PodDisruptionBudget allows no disruption of one of the node's pods
   (gpupolicy/capacity/budgets.py) the drain does not start: it waits;
3. a claim gone (a failed launch) or the deadline (the policy's
   drainTimeout) passed before the drain started: the claims launched for it
   that hold no pod are deleted, the record dropped and
   `gpu.kubeon.io/drain-undone` written, so the node cools down as after an
   undone drain; a drain undone later drops the record and those claims too.
Replacement is skipped (the proposal says why) for nodes holding
shared-GPU or MIG pods, whose new node would need a sharing layout first,
and when the new nodes would go over `maxGpus`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.capacity.state import Pass, annotations_of, meta
from gpupolicy.capacity import drain
from gpupolicy.capacity.disruption import Disruption
from gpupolicy.capacity.nodepool import claim_name
from gpupolicy.capacity.provider import CapacityNode, NewNode
from gpupolicy.catalog import GPU_RESOURCE
from gpupolicy.k8s.quantity import QuantityError, parse_quantity
from gpupolicy.model import CapacitySpec, GpuPolicy, Proposal
from gpupolicy.model import ProposalState as State
from gpupolicy.proposals import make_proposal

log = logging.getLogger(__name__)

REPLACING_ANNOTATION = "gpu.kubeon.io/replacing"


@dataclass(frozen=True)
class Replacement:
    """A replacement in flight on one node (the annotation's content)."""

    plan: str
    policy: str
    claims: tuple[str, ...]  # the NodeClaims launched for it
    types: tuple[str, ...]   # their instance types (a claim missing after a crash is asked for again)
    started: float
    deadline: float

    def to_annotation(self) -> str:
        return json.dumps({"plan": self.plan, "policy": self.policy, "claims": list(self.claims),
                           "types": list(self.types), "started": self.started, "deadline": self.deadline},
                          sort_keys=True, separators=(",", ":"))


def read(notes: Mapping[str, str]) -> Replacement | None:
    """The record on a node; None when there is none or it does not parse."""
    try:
        raw = json.loads(notes.get(REPLACING_ANNOTATION) or "null")
        if not isinstance(raw, dict):
            return None
        return Replacement(plan=str(raw["plan"]), policy=str(raw.get("policy", "")),
                           claims=tuple(str(c) for c in raw.get("claims") or []),
                           types=tuple(str(t) for t in raw.get("types") or []),
                           started=float(raw["started"]), deadline=float(raw["deadline"]))
    except (ValueError, KeyError, TypeError):
        return None


def disrupting(node: Mapping[str, Any]) -> bool:
    """A drain or a replacement is recorded on the node (the disruptions a pass carries on)."""
    notes = annotations_of(node)
    return drain.DRAINING_ANNOTATION in notes or REPLACING_ANNOTATION in notes


def replacing_claims(p: Pass) -> set[str]:
    """NodeClaims launched as replacements still waiting for their drain (not consolidation candidates)."""
    found: set[str] = set()
    for node in p.seen.nodes:
        record = read(annotations_of(node))
        if record is not None:
            found.update(record.claims)
    return found


def why_not(p: Pass, spec: CapacitySpec, pods: list[dict[str, Any]], disruption: Disruption) -> str:
    """Why this replacement cannot be started (empty when it can)."""
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            requests = (container.get("resources") or {}).get("requests") or {}
            shared = [r for r in requests if str(r).startswith("nvidia.com/") and r != "nvidia.com/gpu"]
            if shared:
                return f"not applied: pod {meta(pod).get('name')} asks for {shared[0]}; a replacement would " \
                       "need its sharing layout first"
    if spec.max_gpus is not None:
        used = sum(c.gpus for c in p.seen.pool_claims(spec.node_pool) if not c.deleting)
        adds = sum(t.gpus for t in disruption.launches)
        if used + adds > spec.max_gpus:
            return f"not applied: {adds} new GPU(s) would go over maxGpus {spec.max_gpus} ({used} in the pool)"
    return ""


def start(p: Pass, policy: GpuPolicy, spec: CapacitySpec, node: str, plan: str, disruption: Disruption,
          pods: list[str], reason: str) -> None:
    """Step 1: record, then launch the new nodes."""
    now = p.ctx.clock.now()
    names = tuple(claim_name(spec.node_pool, t.name, [node], i) for i, t in enumerate(disruption.launches))
    record = Replacement(plan, policy.name, names, tuple(t.name for t in disruption.launches), now,
                         now + spec.consolidation.drain_seconds)
    p.ctx.patch_node(node, {"metadata": {"annotations": {REPLACING_ANNOTATION: record.to_annotation()}}})
    p.checkpoint("replacing")
    for name, kind in zip(names, disruption.launches, strict=True):
        p.add(policy.name, spec, NewNode(name, kind.name, {}, reason, tuple(pods)))
    p.checkpoint("launched")


def advance(p: Pass, policies: Mapping[str, GpuPolicy]) -> dict[str, list[Proposal]]:
    """Steps 2 and 3 for every replacement in flight; the proposals showing them, by policy."""
    ctx, seen = p.ctx, p.seen
    shown: dict[str, list[Proposal]] = {}
    claims = {c.claim: c for c in seen.claims}
    nodes = {str(n["metadata"]["name"]): n for n in seen.nodes}
    now = ctx.clock.now()
    for name, node in nodes.items():
        record = read(annotations_of(node))
        if record is None or not ctx.is_leader():
            continue
        notes = annotations_of(node)
        if drain.DRAINING_ANNOTATION in notes:
            continue  # draining: the record stays so the new nodes are no candidates until this one goes
        policy = policies.get(record.policy)
        undone = drain.read_undone(notes)
        if (undone is not None and undone.get("plan") == record.plan
                and float(undone["at"]) >= record.started):  # this replacement's drain was undone: clean up
            _drop_new(p, record, claims)
            ctx.patch_node(name, {"metadata": {"annotations": {REPLACING_ANNOTATION: None}}})
            continue
        missing = [(c, t) for c, t in zip(record.claims, record.types, strict=False) if c not in claims]
        if missing and policy is not None and policy.spec.capacity is not None and now < record.deadline:
            for claim, kind in missing:  # a crash between the record and the launch: ask again (same name)
                p.add(policy.name, policy.spec.capacity, NewNode(claim, kind, {}, "replacement", ()))
            continue
        failed = [c for c in record.claims if c not in claims or claims[c].deleting]
        up = [c for c in record.claims if c not in failed and _ready(nodes.get(claims[c].node or ""))]
        # the new nodes are up, but a PodDisruptionBudget allows no disruption now: no drain starts (it would
        # evict the other pods, then wait for the refused one); it waits, and is undone at the deadline
        held = (p.held_by_budget(seen.by_node.get(name, []))
                if not failed and len(up) == len(record.claims) else None)
        if failed or now >= record.deadline:
            why = (f"NodeClaim {', '.join(failed)} gone before its node was up" if failed and now < record.deadline
                   else f"drain not started within {record.deadline - record.started:.0f}s: {held}" if held
                   else f"new node(s) not up within {record.deadline - record.started:.0f}s")
            message = f"node {name}: replacement undone, {why}; the new NodeClaims without pods deleted"
            _drop_new(p, record, claims)
            note = json.dumps({"at": now, "plan": record.plan, "policy": record.policy, "message": message},
                              sort_keys=True, separators=(",", ":"))
            ctx.patch_node(name, {"metadata": {"annotations": {REPLACING_ANNOTATION: None,
                                                                       drain.UNDONE_ANNOTATION: note}}})
            log.warning("capacity replacement undone: %s", message)
            p.warn_undone(name, policy, message)
            state, action = State.PROPOSED, "drain undone"
        elif held:
            message = f"node {name}: new node(s) {', '.join(record.claims)} up; not draining yet: {held}"
            state, action = State.APPLIED, "replacement in progress"
        elif len(up) == len(record.claims):
            own = next((c.claim for c in seen.claims if c.node == name), "")
            drain_seconds = (policy.spec.capacity.consolidation.drain_seconds
                             if policy is not None and policy.spec.capacity else record.deadline - record.started)
            started = drain.Record(plan=record.plan, policy=record.policy, claim=own, started=now,
                                   deadline=now + drain_seconds,
                                   was_unschedulable=bool((node.get("spec") or {}).get("unschedulable")))
            ctx.patch_node(name, drain.start_patch(started))
            p.checkpoint("cordoned")
            message = f"node {name}: new node(s) {', '.join(record.claims)} up; draining"
            state, action = State.APPLIED, "drain in progress"
        else:
            message = (f"node {name}: waiting for the new node(s) {', '.join(sorted(set(record.claims) - set(up)))} "
                       f"before draining ({len(up)}/{len(record.claims)} up)")
            state, action = State.APPLIED, "replacement in progress"
        if policy is not None:
            shown.setdefault(policy.name, []).append(make_proposal(policy.name, f"Node/{name}", action,
                                                                   message[:500], 0.0, state))
    return shown


def _drop_new(p: Pass, record: Replacement, claims: Mapping[str, CapacityNode]) -> None:
    """Delete the NodeClaims launched for an undone replacement that hold no pod."""
    for claim in record.claims:
        if claim in claims and not claims[claim].deleting and not p.seen.by_node.get(claims[claim].node or ""):
            p.remove(claim)


def _ready(node: Mapping[str, Any] | None) -> bool:
    """A Node that takes the pods: Ready, not cordoned, and its GPUs registered (`nvidia.com/gpu` in its
    allocatable). A GPU node is Ready minutes before the GPU Operator's device plugin registers the GPUs;
    a drain started then found no room for the pods (the packing model counts registered GPUs) and was
    undone, with a cool-down. Karpenter waits the same way: a replacement is used once Initialized, which
    takes the requested extended resources registered."""
    if node is None or (node.get("spec") or {}).get("unschedulable"):
        return False
    status = node.get("status") or {}
    try:
        gpus = parse_quantity((status.get("allocatable") or {}).get(GPU_RESOURCE) or 0)
    except QuantityError:
        return False
    return gpus > 0 and any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in status.get("conditions") or [])
