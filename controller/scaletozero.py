"""Scale to zero: park idle GPU workloads at 0 replicas, wake them on demand (issue 5).

One pass, for every valid ScaleToZero policy (highest priority first; a
workload belongs to the first policy that matches it):

1. Scaler RBAC: the RoleBinding `kubeon-gpu-optimizer-scaler` exists exactly
   in the namespaces named by policies that may act (effective mode Approve
   or Automatic; controller/workload_access.py); Recommend policies get
   none, since they never write.
2. Workloads: Deployments and StatefulSets in `scaleToZero.namespaces`
   matching `workloadSelector`. For each, the pure core
   (gpupolicy/scaling/scaletozero.py) decides from the replicas, annotations, its
   KEDA ScaledObject (if any), its GPU utilisation over `idleFor` and the
   wake query.
3. Mode gating (gpupolicy/proposals.py): Recommend publishes proposals and
   writes nothing; Approve applies only targets in spec.approvals;
   Automatic applies. Every applied action keeps its undo in the park record
   and goes through the recorder (Events + metric).

What it writes, and nothing else (the install guide's RBAC): the workload's
`spec.replicas` only through its scale subresource (`deployments/scale`,
`statefulsets/scale`: get, patch), and the park record in the policy's own
status (`status.parked["Kind/namespace/name"]`: replicas before parking,
time, uid, undo), one key per merge patch; with KEDA on, the ScaledObject's
pause annotation.

Crash safety: the record is written first, then the scale patch sets 0,
conditional on the workload's resourceVersion as read (the scale carries it):
a crash in between leaves a running workload with a stale record, which the
next pass re-decides (parks again with the live count, or drops it), and a
stale read (a user scaling at the same time) fails with 409 instead of
overwriting. A KEDA-managed target is recorded first, then its ScaledObject is
paused. Waking unpauses KEDA first, then restores the replicas through the
scale, then drops the record: a crash before the drop leaves a running
workload with a stale record (dropped next pass), never one at 0 without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller import crashpoints
from controller.context import ControllerContext
from controller.crashpoints import Checkpoint
from controller.metrics_source import MetricsError, wake_value, workload_utilization
from controller.workload_access import DEFAULT_SERVICE_ACCOUNT, sync_write_access
from gpupolicy.model import (
    Condition,
    GpuPolicy,
    Mode,
    ParkRecord,
    PolicyKind,
    Proposal,
    ProposalState,
    ScaleToZeroSpec,
)
from gpupolicy.modes import effective_mode
from gpupolicy.proposals import TargetRef, decide_state, is_approved, make_proposal
from gpupolicy.scaling import scaletozero as core
from kube import scale as kscale
from kube.workloads import Conflict, NotFound, patch_scale

log = logging.getLogger(__name__)

SOURCE = "scaletozero"
HOURS_PER_MONTH = 730.0

# after each write: KUBEON_GPU_CRASH_AT=scaletozero:<one of these> crashes there (controller/crashpoints.py)
CHECKPOINTS = ("recorded", "paused", "parked", "unpaused", "woken")


def gpus_per_pod(workload: Mapping[str, Any]) -> float:
    """GPUs (whole or slices) one pod of the workload asks for, from its template's limits."""
    total = 0.0
    template = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in template.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for name, value in limits.items():
            if name.startswith("nvidia.com/"):
                try:
                    total += float(value)
                except (TypeError, ValueError):
                    continue
    return total


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Target:
    """One workload as read this pass."""

    obj: dict[str, Any]
    kind: str
    namespace: str
    name: str

    @property
    def ref(self) -> TargetRef:
        return TargetRef(self.kind, self.namespace, self.name, uid=self.meta.get("uid"))

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.obj.get("metadata") or {})

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.meta.get("annotations") or {})

    @property
    def replicas(self) -> int:
        value = (self.obj.get("spec") or {}).get("replicas")
        return 1 if value is None else int(value)


def matched_targets(spec: ScaleToZeroSpec, workloads: list[dict[str, Any]], claimed: set[str]) -> list[_Target]:
    """Workloads in spec.namespaces matching workloadSelector and not claimed by an earlier policy.

    Claims them (adds their keys to `claimed`): one workload, one policy.
    """
    found: list[_Target] = []
    for obj in workloads:
        meta = obj.get("metadata") or {}
        target = _Target(obj, str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))
        if target.ref.key in claimed or not core.selects(spec, target.namespace, meta.get("labels") or {}):
            continue
        claimed.add(target.ref.key)
        found.append(target)
    return found


class ScaleToZeroReconciler:
    """Reconciler 3 in controller/loop.py's registry."""

    name = SOURCE

    def __init__(
        self,
        period_seconds: float = 30.0,
        *,
        step_seconds: float = 30.0,
        max_gap_seconds: float | None = None,
        service_account: str = DEFAULT_SERVICE_ACCOUNT,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """`step_seconds` should be at least the DCGM scrape interval; a hole longer than
        `max_gap_seconds` (default 3 steps) in the samples means "not known idle"."""
        self.period_seconds = period_seconds
        self.step_seconds = step_seconds
        self.max_gap_seconds = max_gap_seconds if max_gap_seconds is not None else 3 * step_seconds
        self.service_account = service_account
        self.checkpoint = checkpoint or crashpoints.from_env(SOURCE, CHECKPOINTS)
        self.last_decisions: dict[str, core.Decision] = {}  # target key -> decision (diagnostics, tests)

    # -- the pass -----------------------------------------------------------------
    def reconcile(self, ctx: ControllerContext) -> None:
        policies = ctx.policies.valid(PolicyKind.SCALE_TO_ZERO)
        modes = {p.name: effective_mode(p, ctx.default_mode, ctx.prometheus_configured).mode for p in policies}
        sync_write_access(ctx, self.service_account)
        workloads = ctx.cluster().workloads()
        claimed: set[str] = set()
        keda_cache: dict[str, list[dict[str, Any]]] = {}
        for policy in policies:
            proposals, conditions = self._policy_pass(ctx, policy, modes[policy.name], workloads, claimed,
                                                      keda_cache)
            ctx.policies.publish(policy.name, SOURCE, proposals, conditions)

    def _policy_pass(
        self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode, workloads: list[dict[str, Any]],
        claimed: set[str], keda_cache: dict[str, list[dict[str, Any]]],
    ) -> tuple[list[Proposal], list[Condition]]:
        spec = policy.spec.scale_to_zero
        assert spec is not None
        conditions: list[Condition] = []
        warning = core.wake_warning(spec)
        conditions.append(
            Condition(type="WakeSignal", status="False", reason="AnnotationOnly", message=warning)
            if warning else
            Condition(type="WakeSignal", status="True", reason="PrometheusQuery", message="wake.prometheusQuery set")
        )
        wake = self._wake_value(ctx, spec)
        previous = ctx.policies.previous(policy.name)
        entry = ctx.policies.get(policy.name)
        records = park_records(entry.raw_status if entry else {})
        proposals: list[Proposal] = []
        for target in matched_targets(spec, workloads, claimed):
            if target.namespace not in keda_cache:  # without --keda: no KEDA RBAC, nothing read
                keda_cache[target.namespace] = (kscale.list_scaled_objects(ctx.api, target.namespace)
                                                if ctx.keda else [])
            record = records.get(target.ref.key)
            if record is not None and record.uid and target.meta.get("uid") and record.uid != target.meta["uid"]:
                record = None  # a record of an earlier workload of that name: not this one's
            proposal = self._workload_pass(ctx, policy, spec, mode, target, wake, keda_cache[target.namespace],
                                           previous, record)
            if proposal is not None:
                proposals.append(proposal)
        self._drop_orphans(ctx, policy, mode, records, workloads)
        return proposals, conditions

    def _drop_orphans(self, ctx: ControllerContext, policy: GpuPolicy, mode: Mode,
                      records: Mapping[str, ParkRecord], workloads: list[dict[str, Any]]) -> None:
        """Records of workloads that no longer exist (deleted, or re-created with a new uid) go."""
        if mode is Mode.RECOMMEND or not ctx.is_leader() or not records:
            return
        live = {f"{w.get('kind')}/{(w.get('metadata') or {}).get('namespace')}/"
                f"{(w.get('metadata') or {}).get('name')}": (w.get("metadata") or {}).get("uid") for w in workloads}
        for key, record in records.items():
            if key in live and not (record.uid and live[key] and record.uid != live[key]):
                continue
            log.info("park record dropped policy=%s target=%s: the workload is gone", policy.name, key)
            self._set_record(ctx, policy, key, None)

    def _wake_value(self, ctx: ControllerContext, spec: ScaleToZeroSpec) -> float | None:
        query = (spec.wake.prometheus_query or "").strip() if spec.wake else ""
        if not query or ctx.metrics is None:
            return None
        try:
            return wake_value(ctx.metrics, query)
        except MetricsError as exc:
            log.warning("wake query failed: %s", exc)
            return None

    def _utilization(self, ctx: ControllerContext, target: _Target, window: float) -> list[tuple[float, float]] | None:
        if ctx.metrics is None:
            return None
        now = ctx.clock.now()
        try:
            return workload_utilization(
                ctx.metrics, target.kind, target.namespace, target.name,
                start=now - window, end=now, step=self.step_seconds,
            )
        except MetricsError as exc:
            log.warning("utilisation query failed target=%s: %s", target.ref.key, exc)
            return None

    # -- one workload -------------------------------------------------------------
    def _workload_pass(
        self, ctx: ControllerContext, policy: GpuPolicy, spec: ScaleToZeroSpec, mode: Mode, target: _Target,
        wake: float | None, scaled_objects: list[dict[str, Any]], previous: Mapping[str, Proposal],
        record: ParkRecord | None,
    ) -> Proposal | None:
        scaled_object = kscale.scaled_object_for(scaled_objects, target.kind, target.name)
        workload = core.Workload(
            target.kind, target.namespace, target.name, target.replicas, target.annotations,
            keda_paused=None if scaled_object is None else kscale.is_paused_at_zero(scaled_object),
            record=record,
        )
        parked = record is not None and (workload.replicas == 0 or bool(workload.keda_paused))
        utilization = None if parked else self._utilization(ctx, target, core.window_seconds(spec))
        now = ctx.clock.now()
        signals = core.Signals(utilization, wake, now, self.max_gap_seconds)
        decision = core.decide(spec, workload, signals, _rfc3339(now), uid=target.meta.get("uid"))
        self.last_decisions[target.ref.key] = decision
        log.debug("scale-to-zero decision target=%s action=%s reason=%s %s", target.ref.key,
                  decision.action, decision.reason, decision.message)

        if decision.action is core.Action.CLEAR_RECORD:
            if mode is not Mode.RECOMMEND and ctx.is_leader():
                self._set_record(ctx, policy, target.ref.key, None)
            return None
        gpus = gpus_per_pod(target.obj)
        if decision.action is core.Action.NONE:
            if parked and record is not None:  # show what was done and how it will come back
                recorded = core.recorded_replicas(record) or 0
                return make_proposal(
                    policy.name, target.ref.key, str(core.Action.SCALE_TO_ZERO),
                    f"parked at 0 since {record.scaled_at} (from {recorded} replicas); {decision.message}",
                    recorded * gpus * HOURS_PER_MONTH, ProposalState.APPLIED,
                )
            return None

        action = str(decision.action)
        approved = is_approved(target.ref.key, policy.spec.approvals)
        pid_proposal = make_proposal(policy.name, target.ref.key, action, decision.message, 0.0)
        before = previous.get(pid_proposal.id)
        dismissed = before.state if before is not None and before.state is ProposalState.DISMISSED else None
        state = decide_state(mode, approved, dismissed)
        freed = workload.replicas * gpus * HOURS_PER_MONTH if decision.action is core.Action.SCALE_TO_ZERO else 0.0
        shown = state.state
        if state.apply:
            if not ctx.is_leader():
                shown = ProposalState.APPROVED
            else:
                try:
                    self._apply(ctx, policy, target, decision, scaled_object)
                except (Conflict, NotFound) as exc:
                    log.info("scale-to-zero retry next pass target=%s: %s", target.ref.key, exc)
                    shown = ProposalState.APPROVED
                except ApiException as exc:
                    if exc.status != 403:
                        raise
                    # the scaler binding not (yet) in force on the API server that answered: the record
                    # written first says what to do, the next pass does it
                    log.warning("scale-to-zero forbidden, retry next pass target=%s: %s", target.ref.key,
                                exc.reason)
                    shown = ProposalState.APPROVED
        return make_proposal(policy.name, target.ref.key, action, decision.message, freed, shown)

    def _apply(
        self, ctx: ControllerContext, policy: GpuPolicy, target: _Target, decision: core.Decision,
        scaled_object: dict[str, Any] | None,
    ) -> None:
        """The writes in their crash-safe order: record, (pause | scale) -- or (unpause,) scale, drop record."""
        so_meta = (scaled_object or {}).get("metadata") or {}
        key = target.ref.key
        if decision.record is not None:
            self._set_record(ctx, policy, key, decision.record)
            self.checkpoint("recorded")
        if decision.action is core.Action.WAKE and decision.pause_keda is False and scaled_object is not None \
                and kscale.is_paused_at_zero(scaled_object):
            self._keda(ctx, so_meta, paused=False)
            self.checkpoint("unpaused")
        if decision.replicas is not None:
            self._scale(ctx, target, decision.replicas)
            self.checkpoint("parked" if decision.action is core.Action.SCALE_TO_ZERO else "woken")
        if decision.pause_keda is True and scaled_object is not None:
            if not ctx.is_leader():
                return
            self._keda(ctx, so_meta, paused=True)
            self.checkpoint("paused")
        if decision.clear_record:
            self._set_record(ctx, policy, key, None)
        ctx.recorder.applied(
            target.ref, policy, _action_text(decision, target), dict(decision.undo), decision.message,
            action_label="scale-to-zero" if decision.action is core.Action.SCALE_TO_ZERO else "wake",
        )

    def _keda(self, ctx: ControllerContext, so_meta: Mapping[str, Any], *, paused: bool) -> None:
        try:
            kscale.set_paused(ctx.api, so_meta["namespace"], so_meta["name"], paused)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(str(exc.reason)) from exc
            raise

    @staticmethod
    def _scale(ctx: ControllerContext, target: _Target, replicas: int) -> None:
        """spec.replicas through the scale subresource, conditional on the resourceVersion read this pass."""
        patch = {"metadata": {"resourceVersion": target.meta.get("resourceVersion")}, "spec": {"replicas": replicas}}
        patch_scale(ctx.api, target.kind, target.namespace, target.name, patch)

    @staticmethod
    def _set_record(ctx: ControllerContext, policy: GpuPolicy, key: str, record: ParkRecord | None) -> None:
        """One key of the policy's status.parked (None removes it); the store sees the answer at once."""
        body = None if record is None else record.model_dump(by_alias=True, exclude_none=True, mode="json")
        if not ctx.policies.set_record(ctx.api, policy.name, "parked", key, body):
            raise NotFound(f"GpuPolicy {policy.name} is gone")


def park_records(raw_status: Mapping[str, Any]) -> dict[str, ParkRecord]:
    """status.parked of one policy, by target key (unreadable entries skipped: never a crash)."""
    found: dict[str, ParkRecord] = {}
    for key, value in (raw_status.get("parked") or {}).items():
        try:
            found[str(key)] = ParkRecord.model_validate(value)
        except ValueError:
            log.warning("park record unreadable target=%s: %r", key, value)
    return found


def _action_text(decision: core.Decision, target: _Target) -> str:
    if decision.action is core.Action.SCALE_TO_ZERO:
        how = "paused its KEDA ScaledObject at 0" if decision.pause_keda else "0 replicas"
        return f"ScaleToZero: {target.ref.key} from {target.replicas} to {how}"
    return f"Wake: {target.ref.key} to {decision.replicas} replicas"
