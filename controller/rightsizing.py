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
`gpu.kubeon.io/rewritten-from`, its undo record). The controller never writes
the workload (the install guide gives it no write on workloads but their scale
subresource, and that only for scale to zero). Without `rollout: Restart`
running pods keep their size until they are replaced; an Event on the policy
says what was applied. With `rollout: Restart` it restarts the workload through
the Eviction API (`pods/eviction`, which honours PodDisruptionBudgets): it
first writes a restart record into the policy status (`status.restarts`:
the proposal id, the time and the uids of the workload's pods then), then
evicts those pods, at most a quarter of the replicas (at least one) per pass,
so the workload's controller replaces them a few at a time with pods the
webhook sizes. A crash after the record only delays the evictions to the next
pass; while the record names the Applied proposal the workload is never
restarted twice for it, and a pod created after the start is never evicted.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.context import ControllerContext
from gpupolicy.catalog import DEFAULT_CATALOG, GPU_RESOURCE, PRODUCT_LABEL, Catalog
from gpupolicy.matching import selector_matches
from gpupolicy.model import (
    Condition,
    GpuPolicy,
    Mode,
    PolicyKind,
    Proposal,
    ProposalState,
    RestartRecord,
    Rollout,
)
from gpupolicy.modes import effective_mode, metric_driven
from gpupolicy.proposals import TargetRef, decide_state, is_approved, make_proposal
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
from kube.workloads import evict_pod, list_namespaces

log = logging.getLogger(__name__)

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

    def reconcile(self, ctx: ControllerContext) -> None:
        # `via: DRA` policies claim by declared memory; right-sized device-plugin resources mean nothing there
        policies = [p for p in ctx.policies.valid(PolicyKind.SHARING) if metric_driven(p)]
        if not policies:
            return
        workloads = [w for w in ctx.cluster().workloads()
                     if whole_gpu_request(_template(w).get("spec") or {}) == 1 and not _skipped(w)]
        namespaces = list_namespaces(ctx.api)
        nodes = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in ctx.cluster().nodes()}
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
            self._drop_restart_records(ctx, policy, mode, proposals)
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
            for pod in ctx.cluster().pods(_meta(obj).get("namespace", ""), match):
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
        record = restart_records(ctx, policy.name).get(target.key)
        restarted = record is not None and record.proposal == proposal.id
        decision = decide_state(mode, is_approved(target.key, policy.spec.approvals),
                                previous.state if previous else None, already_applied=restarted)
        state = decision.state
        if decision.apply:
            state = ProposalState.APPLIED if self._apply(ctx, policy, obj, proposal, sizing) else (
                ProposalState.APPROVED)
        elif (state is ProposalState.APPLIED and policy.spec.sharing.rollout is Rollout.RESTART
              and (restarted or (previous is not None and previous.state is ProposalState.APPLIED))
              and mode is not Mode.RECOMMEND):
            note = self._restart(ctx, policy, obj, proposal, sizing, record if restarted else None)
            if note:
                notes.append(note)
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
                 sizing: Sizing, record: RestartRecord | None) -> str | None:
        """rollout: Restart: the record first (once per proposal), then evict the pods older than it.

        Returns a note for the policy's RightSizing condition while the restart is not complete.
        """
        if not ctx.is_leader():
            return None
        target = _target(obj)
        match = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        pods = ctx.cluster().pods(target.namespace, match) if match else []
        if record is None:
            entry = {**self._undo_entry(ctx, policy, proposal, sizing, True), "restartedAt": _iso(ctx.clock.now())}
            record = RestartRecord(proposal=proposal.id, started_at=entry["restartedAt"], undo=entry,
                                   pods=sorted(str(_meta(p).get("uid")) for p in pods if _meta(p).get("uid")))
            body = record.model_dump(by_alias=True, mode="json")
            if not ctx.policies.set_record(ctx.api, policy.name, RESTARTS, target.key, body):
                return None
            ctx.recorder.applied(target, policy, f"restart for {proposal.action}", entry, sizing.reason,
                                 action_label="rightsize-restart")
        listed = set(record.pods)
        old = sorted((p for p in pods if _meta(p).get("uid") in listed and not _meta(p).get("deletionTimestamp")),
                     key=lambda p: str(_meta(p).get("name") or ""))
        if not old:
            return None
        replicas = int((obj.get("spec") or {}).get("replicas", 1) or 1)
        budget = max(1, replicas // 4)
        evicted = 0
        for pod in old[:budget]:
            name = _meta(pod).get("name", "")
            try:
                if not evict_pod(ctx.api, target.namespace, name):
                    break  # a PodDisruptionBudget says not now: next pass
            except ApiException as exc:
                log.info("right-sizing restart eviction failed pod=%s/%s error=%s", target.namespace, name, exc)
                break
            evicted += 1
            log.info("right-sizing restart evicted pod=%s/%s target=%s", target.namespace, name, target.key)
        left = len(old) - evicted
        return f"{target.key}: restart in progress, {left} pod(s) from before it left" if left else None

    @staticmethod
    def _drop_restart_records(ctx: ControllerContext, policy: GpuPolicy, mode: Mode,
                              proposals: list[Proposal]) -> None:
        """A restart record whose proposal is no longer Applied goes (a later re-apply restarts again)."""
        if mode is Mode.RECOMMEND or not ctx.is_leader():
            return
        applied = {p.target: p.id for p in proposals if p.state is ProposalState.APPLIED}
        for key, record in restart_records(ctx, policy.name).items():
            if applied.get(key) != record.proposal:
                ctx.policies.set_record(ctx.api, policy.name, RESTARTS, key, None)


RESTARTS = "restarts"


def restart_records(ctx: ControllerContext, policy: str) -> dict[str, RestartRecord]:
    """status.restarts of one policy, by target key (unreadable entries skipped)."""
    entry = ctx.policies.get(policy)
    found: dict[str, RestartRecord] = {}
    for key, value in ((entry.raw_status if entry else {}).get(RESTARTS) or {}).items():
        try:
            found[str(key)] = RestartRecord.model_validate(value)
        except ValueError:
            log.warning("restart record unreadable policy=%s target=%s", policy, key)
    return found


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
