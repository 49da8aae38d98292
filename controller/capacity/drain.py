"""Step 1 of a capacity pass, and the writes of every drain step: evict, delete the NodeClaim, or undo.

The drain's state is the node annotation `gpu.kubeon.io/draining`
(gpupolicy/capacity/drain.py decides each step from it). Every pass first
moves every recorded drain one step, whatever the policies say now, so a new
leader finishes or undoes what the last one started and no node stays
cordoned. Before each round of evictions the packing engine checks again
that the pods left still re-place on the other nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.capacity import eviction_counts
from controller.capacity.state import Pass, annotations_of, is_gpu_node, pod_key
from gpupolicy.capacity import drain
from gpupolicy.capacity.disruption import replace_pods
from gpupolicy.model import GpuPolicy, Proposal
from gpupolicy.model import ProposalState as State
from gpupolicy.packing.engine import get_strategy
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, state_from_kubernetes
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.typicalmix import TypicalMix
from gpupolicy.proposals import make_proposal
from kube import calls

log = logging.getLogger(__name__)


def advance_drains(p: Pass, policies: Mapping[str, GpuPolicy]) -> dict[str, list[Proposal]]:
    """One step of every drain in flight; the proposals showing them, by policy."""
    ctx, seen = p.ctx, p.seen
    shown: dict[str, list[Proposal]] = {}
    state: NodeState | None = None
    gpu_nodes = [n for n in seen.nodes if is_gpu_node(n)]
    for node in seen.nodes:
        notes = annotations_of(node)
        record = drain.read_record(notes)
        if record is None or not ctx.is_leader():
            continue
        name = str(node["metadata"]["name"])
        pods = seen.by_node.get(name, [])
        if state is None:
            # unreadable objects left out (kubemodel); DRA nodes with their devices
            state = state_from_kubernetes(gpu_nodes, seen.pods, slices=seen.slices)
        outcome, message = step(p, name, record, notes, pods, policies.get(record.policy),
                                _still_fits(state, name, pods))
        if record.policy in policies:
            undone = outcome == "undone"
            shown.setdefault(record.policy, []).append(make_proposal(
                record.policy, f"Node/{name}", "drain undone" if undone else "drain in progress", message[:500],
                0.0, State.PROPOSED if undone else State.APPLIED))
    return shown


def step(p: Pass, name: str, record: drain.Record, notes: Mapping[str, Any],
         pods: list[dict[str, Any]], policy: GpuPolicy | None, fits: bool = True) -> tuple[str, str]:
    """One drain step on `name`; returns its outcome and what it did (the proposal's reason)."""
    ctx = p.ctx
    now = ctx.clock.now()
    decided = drain.advance(name, record, notes, pods, now, fits)
    if decided.evict:
        eviction_counts.before_evictions(p, policy, [uid for _, _, uid in decided.evict])
        accepted, refused = [], ""
        for namespace, pod, uid in decided.evict:
            status, why = calls.evict(ctx.api, namespace, pod)
            if status in (201, 404):
                accepted.append(uid)
            else:
                refused = refused or f"eviction of {namespace}/{pod} refused ({status}): {why}"[:300]
        p.checkpoint("evicted")
        eviction_counts.after_evictions(p, policy, accepted)
        ctx.patch_node(name, drain.record_patch(drain.after_evictions(record, accepted, refused, now)))
        return decided.outcome, f"{decided.message}; {refused}" if refused else decided.message
    if decided.patch is not None:
        try:
            ctx.patch_node(name, decided.patch)
        except ApiException as exc:
            if exc.status != 404:
                raise
    if decided.delete_claim:
        p.remove(record.claim)
        p.checkpoint("deleted")
    if decided.outcome == "undone":
        log.warning("capacity drain undone: %s", decided.message)
        p.warn_undone(name, policy, decided.message)
    return decided.outcome, decided.message


def _still_fits(state: NodeState | None, node: str, pods: list[dict[str, Any]]) -> bool:
    """The drainable pods left on `node` re-place on the other nodes (the packing engine, as planned).
    Unknown (an object the model cannot read) counts as fitting: the deadline still bounds the drain."""
    if state is None or node not in state.index:
        return True
    try:
        left = [(pod_key(pod), demand_from_pod(pod)) for pod in pods if drain.drainable(pod)]
    except ObjectError:
        return True
    if not left:
        return True
    context = PackingContext(mix=TypicalMix.from_pods([d for _, d in left], 1.0))
    return replace_pods(state, [state.index[node]], left, get_strategy(None), context) is not None
