"""Right-sizing reconciler: proposals for whole-GPU workloads matched by sharing policies.

Per pass, for each valid sharing policy (highest priority first; a workload
is claimed by the first policy that matches it): find the Deployments and
StatefulSets whose pod template asks `nvidia.com/gpu: 1` and matches the
policy's selector, read their GPU memory and utilisation history from the
metrics source, size them with the pure core (gpupolicy/scaling/rightsizing.py) and
publish the proposals into the policy's status.

Applying (Approve with the target in spec.approvals, or Automatic): the
controller marks the proposal Applied with its `resource`, and the webhook's
rewrite gives the workload's new pods exactly that resource (the policy status
is the single source of truth; each rewritten pod carries
`gpu.kubeon.io/rewritten-from`, its undo record). Without `rollout: Restart`
the controller does not write the workload at all (an Event on the target
and the policy says what was applied). With `rollout: Restart` it patches the
workload once: the `gpu.kubeon.io/undo` record plus the template's
`kubectl.kubernetes.io/restartedAt`, so running pods move. That write needs
the scaler RoleBinding in the workload's namespace (controller/workload_access.py),
ensured at the start of the same pass; where it is missing nothing is written
and the proposal stays Approved until a later pass. The record (keyed by the
proposal's stable id) and the restart are one conditional write, so a crash
at any point neither loses the record nor restarts twice.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.context import ControllerContext
from controller.workload_access import sync_write_access
from gpupolicy.catalog import DEFAULT_CATALOG, GPU_RESOURCE, PRODUCT_LABEL, Catalog
from gpupolicy.matching import selector_matches
from gpupolicy.model import Condition, GpuPolicy, Mode, PolicyKind, Proposal, ProposalState, Rollout
from gpupolicy.modes import effective_mode
from gpupolicy.proposals import (
    UNDO_ANNOTATION,
    TargetRef,
    decide_state,
    is_approved,
    make_proposal,
    read_undo,
    with_undo,
)
from gpupolicy.scaling.rightsizing import (
    Sizing,
    Usage,
    Workload,
    query_step,
    size_workload,
    summarise_usage,
    usage_queries,
    whole_gpu_request,
    window_seconds,
)
from kube.workloads import (
    Conflict,
    NotFound,
    list_namespaces,
    list_nodes,
    list_pods,
    list_workloads,
    patch_workload,
    selector_string,
)

log = logging.getLogger(__name__)

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
SKIP = "gpu.kubeon.io/skip"
CONDITION = "RightSizing"


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _template(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("spec") or {}).get("template") or {}


def _skipped(obj: dict[str, Any]) -> bool:
    for meta in (_meta(obj), _template(obj).get("metadata") or {}):
        if (meta.get("labels") or {}).get(SKIP) == "true" or (meta.get("annotations") or {}).get(SKIP) == "true":
            return True
    return False


def _target(obj: dict[str, Any]) -> TargetRef:
    meta = _meta(obj)
    return TargetRef(obj.get("kind", "Deployment"), meta.get("namespace", ""), meta.get("name", ""),
                     obj.get("apiVersion", "apps/v1"), meta.get("uid"))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RightSizingReconciler:
    """Reconciler 2: sharing policies' right-sizing proposals (and their application)."""

    name = "rightsizing"

    def __init__(self, catalog: Catalog = DEFAULT_CATALOG, period_seconds: float = 300.0) -> None:
        self.catalog = catalog
        self.period_seconds = period_seconds
        self._writable: frozenset[str] = frozenset()  # namespaces with the scaler binding, this pass

    def reconcile(self, ctx: ControllerContext) -> None:
        # Restarts write workloads: bind the scaler role where policies allow it first (same pass).
        self._writable = sync_write_access(ctx)
        policies = ctx.policies.valid(PolicyKind.SHARING)
        if not policies:
            return
        workloads = [w for w in list_workloads(ctx.api)
                     if whole_gpu_request(_template(w).get("spec") or {}) == 1 and not _skipped(w)]
        namespaces = list_namespaces(ctx.api)
        nodes = list_nodes(ctx.api)
        claimed: set[str] = set()
        for policy in policies:
            mode = effective_mode(policy, ctx.default_mode, ctx.prometheus_configured).mode
            proposals: list[Proposal] = []
            notes: list[str] = []
            missing_data = False
            for obj in workloads:
                target = _target(obj)
                if target.key in claimed or not self._matches(policy, obj, namespaces):
                    continue
                claimed.add(target.key)
                if ctx.metrics is None:
                    notes.append(f"{target.key}: no proposal, no metrics source configured")
                    missing_data = True
                    continue
                sizing, usage = self._size(ctx, policy, obj, nodes)
                if not sizing.proposal:
                    notes.append(sizing.reason)
                    missing_data = missing_data or not usage.complete
                    continue
                proposals.append(self._decide(ctx, policy, mode, obj, sizing, notes))
            ctx.policies.publish(policy.name, self.name, proposals, [_condition(proposals, notes, missing_data)])

    # -- matching and sizing ------------------------------------------------------
    @staticmethod
    def _matches(policy: GpuPolicy, obj: dict[str, Any], namespaces: dict[str, dict[str, str]]) -> bool:
        namespace = _meta(obj).get("namespace", "")
        labels = (_template(obj).get("metadata") or {}).get("labels") or {}
        return selector_matches(policy.spec.selector, namespace, namespaces.get(namespace, {}), labels)

    def _size(self, ctx: ControllerContext, policy: GpuPolicy, obj: dict[str, Any],
              nodes: dict[str, dict[str, str]]) -> tuple[Sizing, Usage]:
        assert policy.spec.sharing is not None and ctx.metrics is not None
        spec = policy.spec.sharing
        target = _target(obj)
        window = window_seconds(spec)
        end = ctx.clock.now()
        start = end - window
        step = query_step(window)
        queries = usage_queries(target.kind, target.namespace, target.name, step)
        try:
            memory = ctx.metrics.query_range(queries.memory, start, end, step)
            util = ctx.metrics.query_range(queries.util, start, end, step)
            if not util:
                util = ctx.metrics.query_range(queries.mig_util, start, end, step)
        except Exception as exc:  # the metrics source's errors vary by client; none may stop the pass
            log.warning("metrics query failed target=%s error=%s", target.key, exc)
            usage = Usage(missing=f"metrics query failed: {type(exc).__name__}")
            return Sizing(False, f"{target.key}: no proposal, {usage.missing}"), usage
        usage = summarise_usage(memory, util, start, end, step)
        node_labels = self._node_labels(ctx, obj, nodes, usage)
        workload = Workload(
            kind=target.kind, namespace=target.namespace, name=target.name,
            replicas=int((obj.get("spec") or {}).get("replicas", 1) or 0),
            product_label=node_labels.get(PRODUCT_LABEL) if node_labels else None,
            node_labels=node_labels or None,
        )
        return size_workload(workload, usage, spec, self.catalog), usage

    @staticmethod
    def _node_labels(ctx: ControllerContext, obj: dict[str, Any], nodes: dict[str, dict[str, str]],
                     usage: Usage) -> dict[str, str]:
        """Labels of a GPU node the workload runs on: its pods' nodes first, then DCGM's hosts."""
        match = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        names: list[str] = []
        if match:
            for pod in list_pods(ctx.api, _meta(obj).get("namespace", ""), selector_string(match)):
                node = (pod.get("spec") or {}).get("nodeName")
                if node:
                    names.append(node)
        names.extend(usage.hosts)
        for name in names:
            labels = nodes.get(name)
            if labels and PRODUCT_LABEL in labels:
                return labels
        return {}

    # -- state and application ----------------------------------------------------
    def _decide(self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode, obj: dict[str, Any],
                sizing: Sizing, notes: list[str]) -> Proposal:
        """The proposal's state; applies (marks Applied) and, one pass later, restarts.

        Status first, then act: a restart's new pods are sized by the webhook from
        the Applied proposal in the policy status, so the restart waits until a
        previous pass's status (read back from the API server) shows it Applied.
        The webhook's watch has had a whole period to see it by then.
        """
        assert policy.spec.sharing is not None
        target = _target(obj)
        proposal = make_proposal(policy.name, target.key, sizing.action, sizing.reason, sizing.gpu_hours_per_month,
                                 resource=sizing.resource)
        previous = ctx.policies.previous(policy.name).get(proposal.id)
        undo = read_undo((_meta(obj).get("annotations") or {}).get(UNDO_ANNOTATION))
        decision = decide_state(mode, is_approved(target.key, policy.spec.approvals),
                                previous.state if previous else None, already_applied=proposal.id in undo)
        state = decision.state
        if decision.apply:
            state = ProposalState.APPLIED if self._apply(ctx, policy, obj, proposal, sizing) else (
                ProposalState.APPROVED)
        elif (state is ProposalState.APPLIED and policy.spec.sharing.rollout is Rollout.RESTART
              and previous is not None and previous.state is ProposalState.APPLIED and proposal.id not in undo
              and mode is not Mode.RECOMMEND):
            if target.namespace not in self._writable:
                notes.append(f"{target.key}: restart pending, no scaler rolebinding in {target.namespace} yet")
            elif not self._restart(ctx, policy, obj, proposal, sizing):
                notes.append(f"{target.key}: restart pending (workload changed or write refused; retried)")
        return proposal.model_copy(update={"state": state})

    def _apply(self, ctx: ControllerContext, policy: GpuPolicy, obj: dict[str, Any], proposal: Proposal,
               sizing: Sizing) -> bool:
        """Mark applied (no workload write): the webhook gives new pods `proposal.resource`."""
        assert policy.spec.sharing is not None
        if not ctx.is_leader():
            return False
        restart = policy.spec.sharing.rollout is Rollout.RESTART
        entry = self._undo_entry(ctx, policy, proposal, sizing, restart)
        ctx.recorder.applied(_target(obj), policy, proposal.action, entry, sizing.reason, action_label="rightsize")
        return True

    @staticmethod
    def _undo_entry(ctx: ControllerContext, policy: GpuPolicy, proposal: Proposal, sizing: Sizing,
                    restart: bool) -> dict[str, Any]:
        return {
            "policy": policy.name, "action": proposal.action, "from": f"{GPU_RESOURCE}=1",
            "to": sizing.resource, "appliedAt": _iso(ctx.clock.now()),
            "undo": "remove the target from spec.approvals (or set the policy to Recommend)"
                    + (" and restart the workload" if restart else "; rewritten pods carry "
                       "gpu.kubeon.io/rewritten-from"),
        }

    def _restart(self, ctx: ControllerContext, policy: GpuPolicy, obj: dict[str, Any], proposal: Proposal,
                 sizing: Sizing) -> bool:
        """rollout: Restart: ONE conditional patch with the undo record and the template's restartedAt.

        The record is keyed by the proposal id, so a crash after the write never
        restarts twice, and a stale read (409) restarts nothing.
        """
        if not ctx.is_leader():
            return False
        target = _target(obj)
        meta = _meta(obj)
        now = _iso(ctx.clock.now())
        entry = {**self._undo_entry(ctx, policy, proposal, sizing, True), "restartedAt": now}
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {UNDO_ANNOTATION: with_undo((meta.get("annotations") or {}).get(UNDO_ANNOTATION),
                                                           proposal.id, entry)},
            },
            "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}},
        }
        try:
            patch_workload(ctx.api, target.kind, target.namespace, target.name, patch)
        except (Conflict, NotFound, ApiException) as exc:
            log.info("right-sizing restart not done yet target=%s error=%s", target.key, exc)
            return False
        ctx.recorder.applied(target, policy, f"restart for {proposal.action}", entry, sizing.reason,
                             action_label="rightsize-restart")
        return True


def _condition(proposals: list[Proposal], notes: list[str], missing_data: bool) -> Condition:
    """One condition per policy summarising what right-sizing could and could not judge."""
    if missing_data:
        reason, status = "InsufficientData", "False"
    else:
        reason, status = "Evaluated", "True"
    message = f"{len(proposals)} proposal(s)"
    if notes:
        message += "; " + "; ".join(sorted(notes))
    return Condition(type=CONDITION, status=status, reason=reason, message=message[:1500])
