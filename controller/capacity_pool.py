"""Step 2 of a capacity pass: keep the policy's NodePool in the declared shape (server-side apply, never forced).

The shape is gpupolicy/capacity/nodepool.py's; a field another manager owns
comes back from the API server as a 409 and is reported as condition
NodePool=False, FieldConflict, never taken over.
"""

from __future__ import annotations

from controller.capacity_pass import Pass
from gpupolicy.capacity.nodepool import desired_nodepool
from gpupolicy.model import CapacitySpec, Condition, GpuPolicy, Mode, Proposal
from gpupolicy.model import ProposalState as State
from gpupolicy.proposals import TargetRef, make_proposal
from kube import karpenter as kk


def keep_pool(p: Pass, policy: GpuPolicy, spec: CapacitySpec, mode: Mode,
              proposals: list[Proposal], conditions: list[Condition]) -> bool:
    """Keep the NodePool declared; True when it exists in the declared shape after this step."""
    ctx = p.ctx
    target, action = f"NodePool/{spec.node_pool}", f"declare NodePool {spec.node_pool}"
    try:
        desired = desired_nodepool(policy.name, spec, {t.name: t.model for t in p.instances})
    except ValueError as exc:
        conditions.append(Condition(type="NodePool", status="False", reason="NoInstanceType", message=str(exc)))
        return False
    shape = p.provider.pool_in_shape(policy.name, spec)
    types = desired["spec"]["template"]["spec"]["requirements"][0]["values"]
    limit = f", limits nvidia.com/gpu={spec.max_gpus}" if spec.max_gpus is not None else ""
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
