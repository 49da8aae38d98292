"""Proposals: stable ids, what state a proposal is in, and whether it may be applied. Pure.

A proposal's id hashes (policy, target, action) only, so the same advice keeps
its id from pass to pass and across controller restarts, while a different
action on the same target (a bigger MIG profile after usage grew) is a new
proposal. The reason text (current peaks) may change freely without a new id.

Mode gating, the one place it is decided:
- Recommend: never apply. A target listed in approvals shows as Approved (it
  will apply once the policy is switched to Approve or Automatic).
- Approve: apply only targets listed in spec.approvals.
- Automatic: apply.
Applied and Dismissed are sticky: an applied proposal is not applied twice,
and a proposal a user dismissed (state set to Dismissed in the status) stays so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from gpupolicy.k8s.owners import is_approved as owners_is_approved
from gpupolicy.model import Mode, Proposal, ProposalState


@dataclass(frozen=True)
class TargetRef:
    """A workload a proposal is about: `Kind/namespace/name` on the wire."""

    kind: str
    namespace: str
    name: str
    api_version: str = "apps/v1"
    uid: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> TargetRef:
        """Parse `Kind/namespace/name` (as in spec.approvals)."""
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{text!r} is not Kind/namespace/name")
        return cls(parts[0], parts[1], parts[2])


def proposal_id(policy: str, target: str, action: str) -> str:
    """Stable id: the first 12 hex digits of sha256(policy, target, action)."""
    digest = hashlib.sha256("\x00".join((policy, target, action)).encode()).hexdigest()
    return digest[:12]


def is_approved(target: str, approvals: Iterable[str]) -> bool:
    """Whether spec.approvals covers the target, by the webhook's own rule (gpupolicy.k8s.owners)."""
    return owners_is_approved(list(approvals), target)


def may_apply(mode: Mode, approved: bool) -> bool:
    """Mode gating: Automatic applies; Approve applies approved targets; Recommend never."""
    if mode is Mode.AUTOMATIC:
        return True
    return mode is Mode.APPROVE and approved


@dataclass(frozen=True)
class StateDecision:
    """What to show and whether the caller should apply now."""

    state: ProposalState
    apply: bool


def decide_state(
    mode: Mode, approved: bool, previous: ProposalState | None, already_applied: bool = False
) -> StateDecision:
    """The proposal's next state. `already_applied`: the target carries the record of this proposal.

    When `apply` is True the caller applies and then shows Applied; if it could
    not (lost the lease, API error) it shows Approved and retries next pass.
    """
    if previous is ProposalState.DISMISSED:
        return StateDecision(ProposalState.DISMISSED, False)
    if already_applied or previous is ProposalState.APPLIED:
        return StateDecision(ProposalState.APPLIED, False)
    if may_apply(mode, approved):
        return StateDecision(ProposalState.APPLIED, True)
    if approved:
        return StateDecision(ProposalState.APPROVED, False)
    return StateDecision(ProposalState.PROPOSED, False)


def make_proposal(
    policy: str, target: str, action: str, reason: str, gpu_hours_per_month: float,
    state: ProposalState = ProposalState.PROPOSED, resource: str | None = None,
) -> Proposal:
    """A proposal with its stable id; GPU-hours rounded to 0.1 so status does not churn.

    `resource` (what the target's pods should ask for) is not part of the id: the
    action text already names it, and ids must not change when the field is added.
    """
    return Proposal(
        id=proposal_id(policy, target, action),
        target=target,
        action=action,
        reason=reason,
        estimated_gpu_hours_per_month=round(gpu_hours_per_month, 1),
        state=state,
        resource=resource or None,
    )


def applied_resource(proposals: Iterable[Proposal], target: str) -> Proposal | None:
    """The Applied proposal that fixes the resource of `target`'s pods (the first one listed), if any.

    Only Applied counts: the controller marks a proposal Applied only when the
    policy's mode allowed it (Automatic, or Approve with the target approved),
    so the webhook may trust it without re-deciding. Pure.
    """
    for proposal in proposals:
        if proposal.target == target and proposal.state is ProposalState.APPLIED and proposal.resource:
            return proposal
    return None

