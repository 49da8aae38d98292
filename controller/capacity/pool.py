"""Step 2 of a capacity pass: keep the policy's NodePool in the declared shape (server-side apply, never forced).

The shape is gpupolicy/capacity/nodepool.py's; a field another manager owns
comes back from the API server as a 409 and is reported as condition
NodePool=False, FieldConflict, never taken over.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.capacity.state import Pass
from gpupolicy.capacity.nodepool import desired_nodepool
from gpupolicy.catalog import GPU_RESOURCE, MIG_CONFIG_LABEL
from gpupolicy.model import CapacitySpec, Condition, GpuPolicy, Mode, Proposal, WholeGpus
from gpupolicy.model import ProposalState as State
from gpupolicy.proposals import TargetRef, make_proposal
from kube import karpenter as kk


def unseen_gpus(p: Pass, spec: CapacitySpec) -> tuple[int, int]:
    """GPUs of the pool's registered nodes that Karpenter's own `nvidia.com/gpu` count misses, and on how
    many nodes: it counts each Node's capacity (nodepool/counter/controller.go), and a time-sliced node
    advertises nvidia.com/gpu.shared, a MIG node nvidia.com/mig-*, instead (negative: counted more than
    there are, as with replicas advertised under nvidia.com/gpu itself)."""
    nodes = {str(n["metadata"]["name"]): n for n in p.seen.nodes}
    by_type = p.by_type
    missed, count = 0, 0
    for claim in p.seen.pool_claims(spec.node_pool):
        node = nodes.get(claim.node or "")
        kind = by_type.get(claim.instance_type)
        if claim.deleting or node is None or kind is None:
            continue
        advertised = str(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE) or "0")
        gap = kind.gpus - (int(advertised) if advertised.isdigit() else 0)
        if gap:
            missed, count = missed + gap, count + 1
    return missed, count


def keep_pool(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode,
              proposals: list[Proposal], conditions: list[Condition]) -> bool:
    """Keep the NodePool declared; True when it exists in the declared shape after this step.

    Its `limits nvidia.com/gpu` is `maxGpus` less the GPUs Karpenter's count misses, so Karpenter's own
    provisioning of whole-GPU pods keeps the pool within `maxGpus` too. Node groups: `find_groups`."""
    if p.seen.groups is not None:
        return find_groups(p, spec, conditions)
    ctx = p.ctx
    optimizer = spec.whole_gpus is WholeGpus.OPTIMIZER  # limits 0: the optimizer launches for every GPU pod
    missed, shared = unseen_gpus(p, spec) if spec.max_gpus is not None and not optimizer else (0, 0)
    declared = spec.max_gpus
    if missed and spec.max_gpus is not None:
        spec = spec.model_copy(update={"max_gpus": max(0, spec.max_gpus - missed)})
    target, action = f"NodePool/{spec.node_pool}", f"declare NodePool {spec.node_pool}"
    try:
        desired = desired_nodepool(policy.name, spec, {t.name: t.model for t in p.instances})
    except ValueError as exc:
        conditions.append(Condition(type="NodePool", status="False", reason="NoInstanceType", message=str(exc)))
        return False
    shape = p.provider.pool_in_shape(policy.name, spec)
    types = desired["spec"]["template"]["spec"]["requirements"][0]["values"]
    limit = f", limits nvidia.com/gpu={spec.max_gpus}" if spec.max_gpus is not None else ""
    if optimizer:
        limit = (", limits nvidia.com/gpu=0 (wholeGpus Optimizer: Karpenter launches no node itself; the "
                 f"optimizer's NodeClaims serve every GPU pod{f' within maxGpus {spec.max_gpus}' if limit else ''})")
    if missed:
        limit += (f" (maxGpus {declared} less {missed} GPU(s) on {shared} time-sliced or MIG node(s) that "
                  "Karpenter's nvidia.com/gpu count does not see)")
    reason = (f"{len(types)} instance type(s) ({', '.join(types[:6])}{', ...' if len(types) > 6 else ''}), "
              f"taint nvidia.com/gpu:NoSchedule{limit}, disruption budget "
              f"{spec.consolidation.max_disrupted_nodes} node(s), consolidateAfter Never")
    if shape:
        proposals.append(make_proposal(policy.name, target, action, f"in shape: {reason}", 0.0, State.APPLIED))
        conditions.append(Condition(type="NodePool", status="True", reason="InShape", message=reason))
        return True
    state = p.decide(policy, mode, target, action)
    shown, why = state.state, reason if shape is None else f"differs from the declared shape: {reason}"
    ok = False
    if state.apply and ctx.is_leader():
        problem = p.provider.ensure_pool(policy.name, spec)
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


def find_groups(p: Pass, spec: CapacitySpec, conditions: list[Condition]) -> bool:
    """Node groups are the cluster owner's, never created or reshaped: the pool is the groups tagged for it
    (gpupolicy/capacity/nodegroups.py), reported with their sizes; True when there is one."""
    problem = p.provider.ensure_pool("", spec)  # reads only
    if problem:
        conditions.append(Condition(type="NodePool", status="False", reason="NodeGroupNotFound", message=problem))
        return False
    shown = ", ".join(f"{g.name} ({g.instance_type}{_layout(g.labels)}: {g.desired} of {g.min_size}..{g.max_size})"
                      for g in p.group_sizes(spec.node_pool))
    conditions.append(Condition(type="NodePool", status="True", reason="NodeGroupsFound",
                                message=f"{p.provider.name}: {shown}"[:1000]))
    return True


def _layout(labels: Mapping[str, str]) -> str:
    return f", MIG {labels[MIG_CONFIG_LABEL]}" if MIG_CONFIG_LABEL in labels else ""
