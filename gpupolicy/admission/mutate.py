"""Admission decisions for pods: mutate (sharing, tolerations, scheduler) and guardrails.

Solve first, act after: these functions return an AdmissionResult value
(allowed, JSON Patch ops, warnings, one Decision per winning policy); the
webhook serialises it and bumps metrics, the dry-run prints it. Modes:
Recommend never changes a pod and says what it would do in a warning;
Approve changes pods whose owning workload is listed in spec.approvals and
otherwise behaves like Recommend; Automatic changes. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpupolicy.admission.claims import POD_CLAIM_PREFIX, TEMPLATE_ANNOTATION, plan_claims
from gpupolicy.admission.patch import PatchOp
from gpupolicy.admission.rewrite import (
    ANNOTATION_POLICY,
    ANNOTATION_REWRITTEN_FROM,
    GpuScan,
    has_skip_marker,
    plan_sharing,
    resource_toleration,
    rewritten_from_json,
    scan_gpus,
    toleration_dict,
    would_add_tolerations,
    would_set_scheduler,
)
from gpupolicy.admission.sharedclaims import plan_share
from gpupolicy.admission.writes import PodWrites
from gpupolicy.catalog import GPU_RESOURCE, SHARED_GPU_RESOURCE, WANTED_RESOURCE_ANNOTATION
from gpupolicy.cluster import ClusterView
from gpupolicy.dra import SHARED_CLAIM_LABEL
from gpupolicy.k8s.owners import is_approved, pod_owner
from gpupolicy.k8s.taints import GPU_TAINT, tolerates
from gpupolicy.matching import winning_policies
from gpupolicy.model import GpuPolicy, Mode, PolicyKind, SharingStrategy, SharingVia
from gpupolicy.proposals import applied_resource

WARNING_LIMIT = 120


class Action(StrEnum):
    """What a policy did (or would do) to one pod; a closed set so metrics stay bounded."""

    USE_MIG = "UseMIG"
    USE_TIME_SLICING = "UseTimeSlicing"
    USE_CLAIM = "UseResourceClaim"
    INJECT = "Inject"
    SKIP = "Skip"
    DENY = "Deny"
    WARN = "Warn"
    ALLOW = "Allow"


@dataclass(frozen=True)
class Decision:
    policy: str
    mode: Mode
    action: Action
    applied: bool
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"policy": self.policy, "mode": str(self.mode), "action": str(self.action),
                "applied": self.applied, "reason": self.reason}


@dataclass(frozen=True)
class AdmissionResult:
    """The answer for one object; `object` is the object after mutation (same as input when unchanged)."""

    allowed: bool = True
    patch: list[PatchOp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    message: str = ""
    object: Any = None
    note: str = ""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "allowed": self.allowed, "object": self.object, "patch": self.patch,
            "warnings": self.warnings, "decisions": [d.to_wire() for d in self.decisions],
        }
        if self.message:
            wire["message"] = self.message
        if self.note:
            wire["note"] = self.note
        return wire


def short_warning(text: str) -> str:
    """Warnings travel in HTTP headers to kubectl: keep them under 120 characters."""
    return text if len(text) < WARNING_LIMIT else text[: WARNING_LIMIT - 2] + "…"


def pod_namespace(pod: Mapping[str, Any], namespace: str | None) -> str:
    """The request's namespace wins (pods from controllers arrive with an empty metadata.namespace)."""
    return namespace or str((pod.get("metadata") or {}).get("namespace") or "default")


def _pod_labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    # (dict, Mapping): a parsed dict passes before the ABC's check, a Python call on every review
    return labels if isinstance(labels, (dict, Mapping)) else {}


def may_apply(policy: GpuPolicy, mode: Mode, owner: str) -> bool:
    return mode == Mode.AUTOMATIC or (mode == Mode.APPROVE and is_approved(policy.spec.approvals, owner))


NO_GPU = "pod asks for no GPU"
DEFAULT_SCHEDULER = "default-scheduler"  # what the API server defaults spec.schedulerName to


def placed_without_scheduler(pod: Mapping[str, Any]) -> str:
    """Why no scheduler's choice places this pod ("" when one does): it names its node (`spec.nodeName`:
    the kubelet admits it against that node's own devices), or it is a DaemonSet's (pinned to its node,
    and it must start while kubeon's scheduler is down). Mutation leaves such a pod alone: a slice, a
    node pin or a schedulerName would leave it Pending or refused by its kubelet."""
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if node:
        return f"pod is already on node {str(node)[:63]} (spec.nodeName): no scheduler places it"
    refs = (pod.get("metadata") or {}).get("ownerReferences")
    if isinstance(refs, list) and any(isinstance(r, Mapping) and r.get("kind") == "DaemonSet" for r in refs):
        return "a DaemonSet's pod: its controller pins it to its node"
    return ""


def routes_cpu_pod(pod: Mapping[str, Any], view: ClusterView) -> bool:
    """Whether a pod that asks for no GPU still gets the schedulerName of the policies it matches.

    kubeon's GPU nodes carry `GPU_TAINT`; a CPU-only pod that tolerates it
    may land on them, and the default-scheduler would spread it onto the
    empty nodes whole-GPU pods need (docs/benchmarks/history/packing.md, "Packing through
    kube-scheduler"). Such a pod is routed as GPU pods are (schedulerName
    only: no tolerations, no sharing), except a DaemonSet's pod (pinned to
    its node, and it must run even when kubeon's scheduler is down: the
    device plugin is one), a pod already on a node (`spec.nodeName`: no
    scheduler binds it), a pod naming another scheduler, and when the
    install switched it off (`view.route_cpu_pods`).
    """
    spec = pod.get("spec")
    if not view.route_cpu_pods or not isinstance(spec, Mapping) or placed_without_scheduler(pod):
        return False
    if spec.get("schedulerName") not in (None, "", DEFAULT_SCHEDULER):
        return False
    tolerations = spec.get("tolerations")
    return isinstance(tolerations, list) and tolerates(tolerations, GPU_TAINT)


def _scope(pod: Mapping[str, Any], namespace: str, view: ClusterView, scan: GpuScan) -> tuple[str, bool]:
    """(why the pod is out of scope, "" when in scope; whether it is in scope for routing alone)."""
    if view.is_protected(namespace):
        return f"namespace {namespace} is never touched", False
    if has_skip_marker(pod):
        return "pod is marked gpu.kubeon.io/skip=true", False
    if not any(count > 0 for count in scan.totals().values()):
        return ("", True) if routes_cpu_pod(pod, view) else (NO_GPU, False)
    return "", False


def out_of_scope(pod: Mapping[str, Any], namespace: str, view: ClusterView) -> str:
    """Why a pod is out of scope for every policy, or "" when it is in scope (a CPU-only pod that
    `routes_cpu_pod` is, for the policies' schedulerName alone)."""
    return _scope(pod, namespace, view, scan_gpus(pod))[0]


def _not_applied_warning(policy: GpuPolicy, mode: Mode, owner: str, what: str) -> str:
    """The warning for a change not made; in Approve mode the owner to approve survives shortening."""
    if mode == Mode.APPROVE:
        tail = f"; approve {owner}"
        head = f"kubeon-gpu {policy.name}: would {what}"
        room = WARNING_LIMIT - 1 - len(tail)
        if len(head) > room:
            head = head[: max(room - 1, 0)] + "…"
        return short_warning(head + tail)
    return short_warning(f"kubeon-gpu {policy.name} (Recommend): would {what}")


def _enforced_type_fit(winners: Mapping[PolicyKind, GpuPolicy], view: ClusterView,
                       owner: str) -> frozenset[str] | None:
    """The products an enforced typeFit policy allows the pod (None: no such policy in force)."""
    policy = winners.get(PolicyKind.TYPE_FIT)
    if policy is None or policy.spec.type_fit is None or not policy.spec.type_fit.allowed_models:
        return None
    if not may_apply(policy, view.mode_of(policy).mode, owner):
        return None
    return frozenset(policy.spec.type_fit.allowed_models)


def _apply_sharing_policy(
    policy: GpuPolicy, mode: Mode, owner: str, writes: PodWrites, view: ClusterView,
    warnings: list[str], rewritten: dict[str, Any], type_fit_models: frozenset[str] | None, scan: GpuScan,
    namespace: str,
) -> Decision:
    sharing = policy.spec.sharing
    assert sharing is not None
    if sharing.via is SharingVia.DRA and sharing.strategy is SharingStrategy.TIME_SLICING:
        return _apply_share_policy(policy, mode, owner, writes, view, warnings, rewritten, scan, namespace)
    if sharing.via is SharingVia.DRA:
        return _apply_claim_policy(policy, mode, owner, writes, view, warnings, rewritten, type_fit_models, scan)
    right_sized = applied_resource(policy.status.proposals, owner) if policy.status else None
    plan = plan_sharing(writes.pod, sharing, view, right_sized, type_fit_models, scan)
    if plan.resource is None:
        if plan.warning:
            warnings.append(short_warning(f"kubeon-gpu {policy.name}: {plan.warning}"))
        if plan.wanted and may_apply(policy, mode, owner):
            writes.annotate({WANTED_RESOURCE_ANNOTATION: plan.wanted})
        return Decision(policy.name, mode, Action.SKIP, False, plan.skip_reason)
    action = Action.USE_TIME_SLICING if plan.resource == SHARED_GPU_RESOURCE else Action.USE_MIG
    what = f"use {plan.resource} instead of {GPU_RESOURCE}"
    if not may_apply(policy, mode, owner):
        warnings.append(_not_applied_warning(policy, mode, owner, f"use {plan.resource}"))
        why = "Recommend mode" if mode == Mode.RECOMMEND else f"{owner} is not in approvals"
        return Decision(policy.name, mode, action, False, f"{what}: {plan.detail}; not applied ({why})")
    if plan.node_selector:
        writes.select_nodes(plan.node_selector)
    rewritten.update(writes.swap_gpu(plan.resource, plan.containers))
    writes.tolerate([resource_toleration(plan.resource)])
    return Decision(policy.name, mode, action, True, f"{what}: {plan.detail}")


def _apply_claim_policy(
    policy: GpuPolicy, mode: Mode, owner: str, writes: PodWrites, view: ClusterView,
    warnings: list[str], rewritten: dict[str, Any], type_fit_models: frozenset[str] | None, scan: GpuScan,
) -> Decision:
    """A `via: DRA` policy: claim the pod's GPUs through ResourceClaimTemplates (docs/designs/dra.md)."""
    assert policy.spec.sharing is not None
    plan = plan_claims(writes.pod, policy.spec.sharing, view, scan, type_fit_models)
    if plan.containers is None:
        if plan.warning:
            warnings.append(short_warning(f"kubeon-gpu {policy.name}: {plan.warning}"))
        return Decision(policy.name, mode, Action.SKIP, False, plan.skip_reason)
    names = sorted({t.name for t in plan.containers.values()})
    what = f"claim {GPU_RESOURCE} through ResourceClaimTemplate {', '.join(names)}"
    if not may_apply(policy, mode, owner):
        warnings.append(_not_applied_warning(policy, mode, owner, f"use ResourceClaimTemplate {', '.join(names)}"))
        why = "Recommend mode" if mode == Mode.RECOMMEND else f"{owner} is not in approvals"
        return Decision(policy.name, mode, Action.USE_CLAIM, False, f"{what}: {plan.detail}; not applied ({why})")
    rewritten.update(writes.claim_through({c: t.name for c, t in plan.containers.items()}, POD_CLAIM_PREFIX))
    writes.tolerate([resource_toleration(GPU_RESOURCE)])
    writes.annotate({TEMPLATE_ANNOTATION: ",".join(names)})
    return Decision(policy.name, mode, Action.USE_CLAIM, True, f"{what}: {plan.detail}")


def _apply_share_policy(
    policy: GpuPolicy, mode: Mode, owner: str, writes: PodWrites, view: ClusterView,
    warnings: list[str], rewritten: dict[str, Any], scan: GpuScan, namespace: str,
) -> Decision:
    """A TimeSlicing `via: DRA` policy: the pod's GPU is a share of one ResourceClaim several pods name
    (docs/designs/dra.md, "Time-slicing through one shared claim")."""
    assert policy.spec.sharing is not None
    plan = plan_share(writes.pod, policy.name, policy.spec.sharing.time_slicing_replicas, scan, view, namespace)
    if not plan.claim:
        if plan.warning:
            warnings.append(short_warning(f"kubeon-gpu {policy.name}: {plan.warning}"))
        return Decision(policy.name, mode, Action.SKIP, False, plan.skip_reason)
    what = f"share a GPU through ResourceClaim {plan.claim}"
    if not may_apply(policy, mode, owner):
        warnings.append(_not_applied_warning(policy, mode, owner, f"use ResourceClaim {plan.claim}"))
        why = "Recommend mode" if mode == Mode.RECOMMEND else f"{owner} is not in approvals"
        return Decision(policy.name, mode, Action.USE_CLAIM, False, f"{what}; not applied ({why})")
    rewritten.update(writes.claim_through({plan.container: plan.claim}, POD_CLAIM_PREFIX, "resourceClaimName"))
    writes.tolerate([resource_toleration(GPU_RESOURCE)])
    writes.label({SHARED_CLAIM_LABEL: plan.claim})
    return Decision(policy.name, mode, Action.USE_CLAIM, True,
                    f"{what} (at most {policy.spec.sharing.time_slicing_replicas} pods each)")


def _tolerations(policy: GpuPolicy, view: ClusterView) -> list[dict[str, Any]]:
    """The policy's tolerations as dicts, dumped once per policy and view (pydantic's dump per review
    cost more than the check). Callers copy what they add (`PodWrites.tolerate`)."""
    return view.remembered("tolerations", policy, lambda: [toleration_dict(t) for t in policy.spec.tolerations])


def _apply_injections(
    policy: GpuPolicy, mode: Mode, owner: str, writes: PodWrites, view: ClusterView, warnings: list[str],
    quiet: bool, route_only: bool = False,
) -> Decision | None:
    """Tolerations and schedulerName from any policy kind (`route_only`: schedulerName alone); None when
    the policy injects nothing."""
    tolerations = [] if route_only else _tolerations(policy, view)
    scheduler = policy.spec.scheduler_name
    if not tolerations and not scheduler:
        return None
    changed = would_add_tolerations(writes.pod, tolerations)
    if scheduler:
        changed = would_set_scheduler(writes.pod, scheduler) or changed
    if not changed:
        return None
    parts = ([f"{len(tolerations)} toleration(s)"] if tolerations else []) + (
        [f"schedulerName {scheduler}"] if scheduler else [])
    what = "add " + " and ".join(parts)
    if not may_apply(policy, mode, owner):
        if not quiet:
            warnings.append(_not_applied_warning(policy, mode, owner, what))
        return Decision(policy.name, mode, Action.INJECT, False, f"{what}; not applied ({mode})")
    writes.tolerate(tolerations)
    if scheduler:
        writes.schedule_with(scheduler)
    return Decision(policy.name, mode, Action.INJECT, True, what)


def mutate_pod(
    pod: Mapping[str, Any], view: ClusterView, namespace: str | None = None, owner: str | None = None, *,
    with_patch: bool = True,
) -> AdmissionResult:
    """The mutating decision for a Pod CREATE. `owner` defaults to the pod's resolved owner.

    `with_patch=False`: no JSON Patch (`patch` empty) for a caller that expresses the change against
    another object (the dry-run of a workload diffs the workload, not its pod)."""
    ns = pod_namespace(pod, namespace)
    scan = scan_gpus(pod)
    skipped, route_only = _scope(pod, ns, view, scan)
    if skipped:
        return AdmissionResult(object=pod, note=skipped)
    placed = "" if route_only else placed_without_scheduler(pod)  # a routed CPU-only pod passed it in _scope
    if placed:
        return AdmissionResult(object=pod, note=placed)
    owner = owner or pod_owner(pod, ns)
    winners = winning_policies(view, ns, _pod_labels(pod))
    if not winners:
        return AdmissionResult(object=pod, note="no policy matches")
    writes = PodWrites(pod)
    warnings: list[str] = []
    decisions: list[Decision] = []
    rewritten: dict[str, Any] = {}
    applied: list[str] = []
    for kind, policy in winners.items():
        mode = view.mode_of(policy).mode
        quiet = route_only  # a CPU-only pod's author has nothing to act on; the decision still says it
        if kind == PolicyKind.SHARING and not route_only:
            decision = _apply_sharing_policy(policy, mode, owner, writes, view, warnings, rewritten,
                                             _enforced_type_fit(winners, view, owner), scan, ns)
            decisions.append(decision)
            quiet = not decision.applied and decision.action != Action.SKIP
            if decision.applied:
                applied.append(policy.name)
        injected = _apply_injections(policy, mode, owner, writes, view, warnings, quiet, route_only)
        if injected is not None:
            decisions.append(injected)
            if injected.applied and policy.name not in applied:
                applied.append(policy.name)
    if applied:
        metadata = writes.pod.get("metadata") or {}
        previous = str((metadata.get("annotations") or {}).get(ANNOTATION_POLICY, ""))
        names = [n for n in previous.split(",") if n]
        names += [n for n in applied if n not in names]
        notes = {ANNOTATION_POLICY: ",".join(names)}
        if rewritten:
            notes[ANNOTATION_REWRITTEN_FROM] = rewritten_from_json(rewritten)
        writes.annotate(notes)
    return AdmissionResult(True, writes.ops if with_patch else [], warnings, decisions, object=writes.pod)


def _guardrail_violation(gpus: Mapping[str, float], policy: GpuPolicy) -> str:
    guard = policy.spec.guardrail
    assert guard is not None
    total = sum(gpus.values())
    if guard.max_gpus_per_pod is not None and total > guard.max_gpus_per_pod:
        return f"pod asks for {total:g} GPUs, more than maxGpusPerPod {guard.max_gpus_per_pod}"
    if guard.allowed_gpu_resources:
        outside = sorted(n for n, c in gpus.items() if c > 0 and n not in guard.allowed_gpu_resources)
        if outside:
            return f"{outside[0]} is not in allowedGpuResources"
    return ""


def validate_pod(
    pod: Mapping[str, Any], view: ClusterView, namespace: str | None = None, owner: str | None = None
) -> AdmissionResult:
    """Guardrails for a Pod CREATE: deny (Automatic, or Approve for approved owners) or warn."""
    ns = pod_namespace(pod, namespace)
    scan = scan_gpus(pod)
    skipped, route_only = _scope(pod, ns, view, scan)
    if skipped or route_only:  # guardrails are about GPUs: a routed CPU-only pod has none
        return AdmissionResult(object=pod, note=skipped or NO_GPU)
    policy = winning_policies(view, ns, _pod_labels(pod)).get(PolicyKind.GUARDRAIL)
    if policy is None:
        return AdmissionResult(object=pod, note="no guardrail policy matches")
    mode = view.mode_of(policy).mode
    violation = _guardrail_violation(scan.totals(), policy)
    if not violation:
        return AdmissionResult(object=pod, decisions=[Decision(policy.name, mode, Action.ALLOW, False,
                                                               "within guardrail")])
    owner = owner or pod_owner(pod, ns)
    if may_apply(policy, mode, owner):
        message = f"GpuPolicy {policy.name}: {violation}"
        return AdmissionResult(False, message=message, object=pod,
                               decisions=[Decision(policy.name, mode, Action.DENY, True, violation)])
    warning = short_warning(f"kubeon-gpu {policy.name}: {violation}")
    return AdmissionResult(True, warnings=[warning], object=pod,
                           decisions=[Decision(policy.name, mode, Action.WARN, False, violation)])
