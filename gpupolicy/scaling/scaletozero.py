"""Scale-to-zero decisions: park an idle GPU workload at zero, wake it on demand. Pure.

The controller reads the world (replicas, the user's annotations, the park
record in the policy status, a KEDA ScaledObject, the workload's
GPU-utilisation samples, the wake query's value, the clock) and hands it
here; this module says what to do and why, and which record to write or
drop. It never reads a clock: `now` is an argument.

Safety rules (issue 5), all decided here so every caller obeys them:
- No data is never idle: the samples must cover the whole `idleFor` window,
  with no hole longer than `max_gap_seconds`, and every one must be below
  `idleBelowPercent`. A bursty workload whose samples often read 0 is busy.
- While a workload runs (replicas > 0, not paused), its live replica count is
  the truth and a leftover record is stale. While it is parked (replicas 0,
  or its KEDA ScaledObject paused), the park record (`status.parked` of the
  policy, a `ParkRecord`) is the truth. The record is written before the
  scale to zero and dropped after the wake, so a crash between the two
  writes leaves a running workload with a stale record (cleared or
  re-decided next pass), never a parked workload without one; and a
  parked workload is never parked again (which would record 0).
- GPU utilisation never wakes a workload (there are no samples at zero):
  the wake query or the user's `gpu.kubeon.io/wake: "true"` annotation
  does. The optimizer cannot remove that annotation (the install guide
  gives it no write on workloads but their scale): while it is there the
  workload is held awake; remove it to let the workload park again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any

from gpupolicy.k8s.quantity import parse_duration
from gpupolicy.matching import label_selector_matches
from gpupolicy.model import ParkRecord, ScaleToZeroSpec

WAKE = "gpu.kubeon.io/wake"  # set by users; read only
DO_NOT_SCALE = "gpu.kubeon.io/do-not-scale"  # set by users; read only
KEDA_PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"


class Action(StrEnum):
    NONE = "None"
    SCALE_TO_ZERO = "ScaleToZero"
    WAKE = "Wake"
    CLEAR_RECORD = "ClearRecord"


class Reason(StrEnum):
    IDLE = "Idle"
    BUSY = "Busy"
    NO_DATA = "NoData"
    PARTIAL_WINDOW = "PartialWindow"
    STALE_DATA = "StaleData"
    GAP = "Gap"
    DEMAND = "Demand"
    WAKE_QUERY = "WakeQuery"
    WAKE_ANNOTATION = "WakeAnnotation"
    PARKED = "Parked"
    DO_NOT_SCALE = "DoNotScale"
    ZERO_NOT_OURS = "ZeroNotOurs"
    STALE_RECORD = "StaleRecord"
    BAD_RECORD = "BadRecord"


Point = tuple[float, float]


@dataclass(frozen=True)
class IdleVerdict:
    """Whether a utilisation series shows a workload idle for the whole window, and why (pure)."""

    idle: bool
    reason: Reason
    message: str
    samples: int = 0
    peak: float | None = None


@dataclass(frozen=True)
class Workload:
    """What the controller read about one scalable workload."""

    kind: str  # Deployment | StatefulSet
    namespace: str
    name: str
    replicas: int
    annotations: Mapping[str, str] = field(default_factory=dict)  # the user's (wake, do-not-scale)
    keda_paused: bool | None = None  # None: no ScaledObject targets it
    record: ParkRecord | None = None  # this policy's park record for it, from the policy status

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def keda_managed(self) -> bool:
        return self.keda_paused is not None


@dataclass(frozen=True)
class Signals:
    """Measurements for one pass: the workload's per-timestamp utilisation and the wake value."""

    utilization: Sequence[Point] | None  # None: the metrics source had nothing
    wake_value: float | None = None  # None: no wake query, or it returned no samples
    now: float = 0.0
    max_gap_seconds: float = 30.0


@dataclass(frozen=True)
class Decision:
    """What to do with one workload, why, and the writes that do it.

    `record` is the park record to write into the policy status before
    anything else; `clear_record` drops it after the other writes.
    `replicas` is the spec.replicas to write through the scale subresource
    (None: leave it). `pause_keda` is True to pause the ScaledObject at 0,
    False to unpause, None to leave it. `undo` says how to reverse the action
    (kept in the record and the Event).
    """

    action: Action
    reason: Reason
    message: str
    replicas: int | None = None
    record: ParkRecord | None = None
    clear_record: bool = False
    pause_keda: bool | None = None
    undo: Mapping[str, Any] = field(default_factory=dict)

    @property
    def writes(self) -> bool:
        return self.action is not Action.NONE


def selects(spec: ScaleToZeroSpec, namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether the policy body selects a workload: in `namespaces`, and its labels match `workloadSelector`."""
    if namespace not in spec.namespaces:
        return False
    return spec.workload_selector is None or label_selector_matches(spec.workload_selector, dict(labels))


def window_seconds(spec: ScaleToZeroSpec) -> float:
    return parse_duration(spec.idle_for)


def assess_idle(
    points: Sequence[Point] | None,
    *,
    threshold: float,
    window: float,
    now: float,
    max_gap: float,
) -> IdleVerdict:
    """Idle only if samples cover [now - window, now] with holes <= max_gap, all below threshold.

    Pure. Samples outside the window are ignored; a sample equal to the
    threshold is not below it (busy).
    """
    start = now - window
    inside = sorted((t, v) for t, v in (points or ()) if start <= t <= now)
    if not inside:
        return IdleVerdict(False, Reason.NO_DATA, f"no GPU samples in the last {window:g}s: no data is never idle")
    peak = max(v for _, v in inside)
    count = len(inside)
    above = [v for _, v in inside if v >= threshold]
    if above:
        return IdleVerdict(
            False, Reason.BUSY,
            f"{len(above)} of {count} samples at or above {threshold:g}% (peak {peak:g}%)",
            count, peak,
        )
    if inside[0][0] - start > max_gap:
        return IdleVerdict(
            False, Reason.PARTIAL_WINDOW,
            f"samples only since {now - inside[0][0]:.0f}s ago, window is {window:g}s",
            count, peak,
        )
    if now - inside[-1][0] > max_gap:
        return IdleVerdict(
            False, Reason.STALE_DATA, f"last sample {now - inside[-1][0]:.0f}s old (max gap {max_gap:g}s)",
            count, peak,
        )
    holes = [b[0] - a[0] for a, b in pairwise(inside)]
    widest = max(holes, default=0.0)
    if widest > max_gap:
        return IdleVerdict(
            False, Reason.GAP, f"a {widest:.0f}s hole in the samples (max gap {max_gap:g}s)", count, peak,
        )
    return IdleVerdict(
        True, Reason.IDLE, f"all {count} samples below {threshold:g}% for {window:g}s (peak {peak:g}%)",
        count, peak,
    )


def recorded_replicas(record: ParkRecord | None) -> int | None:
    """The replica count recorded when the workload was parked; None if absent or not positive."""
    if record is None:
        return None
    return record.replicas if record.replicas > 0 else None


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "yes", "1")


def _undo(action: Action, workload: Workload, replicas: int) -> dict[str, Any]:
    """What to do to reverse the action (kept in the park record and the Event's text)."""
    how = (
        f"set spec.replicas of {workload.ref} to {replicas} and remove status.parked[{workload.ref}]"
        if action is Action.SCALE_TO_ZERO
        else f"set spec.replicas of {workload.ref} to 0"
    )
    undo: dict[str, Any] = {"action": str(action), "restoreReplicas": replicas, "how": how}
    if workload.keda_managed:
        undo["keda"] = (
            f"remove {KEDA_PAUSED_REPLICAS} from its ScaledObject" if action is Action.SCALE_TO_ZERO
            else f"set {KEDA_PAUSED_REPLICAS}: \"0\" on its ScaledObject"
        )
    return undo


def _is_parked(workload: Workload) -> bool:
    if workload.keda_managed:
        return bool(workload.keda_paused) or workload.replicas == 0
    return workload.replicas == 0


def decide(spec: ScaleToZeroSpec, workload: Workload, signals: Signals, scaled_at: str,
           uid: str | None = None) -> Decision:
    """The scale-to-zero state machine for one workload. Pure.

    `scaled_at` is the timestamp text to record (the caller formats its clock), `uid` the
    workload's, kept in the record so a re-created workload of the same name is not woken by it.
    """
    annotations = workload.annotations
    record = recorded_replicas(workload.record)
    wake_above = spec.wake.above if spec.wake else 0.0
    demand = signals.wake_value is not None and signals.wake_value > wake_above
    wake_requested = _truthy(annotations.get(WAKE))

    if _is_parked(workload):
        if workload.record is None:
            return Decision(Action.NONE, Reason.ZERO_NOT_OURS, f"{workload.ref} is at 0 but was not parked by us")
        if record is None and spec.min_replicas_on_wake is None:
            return Decision(
                Action.NONE, Reason.BAD_RECORD,
                f"the park record's replicas {workload.record.replicas} is not a positive count; set "
                "minReplicasOnWake",
            )
        if not (demand or wake_requested):
            return Decision(Action.NONE, Reason.PARKED, f"parked at 0 (recorded {record}), no wake signal")
        target = spec.min_replicas_on_wake or record
        assert target is not None
        reason = Reason.WAKE_ANNOTATION if wake_requested else Reason.WAKE_QUERY
        why = (
            f"annotation {WAKE}=true" if wake_requested
            else f"wake query {signals.wake_value:g} > {wake_above:g}"
        )
        return Decision(
            Action.WAKE, reason, f"{why}: back to {target} replicas",
            replicas=target,
            clear_record=True,
            pause_keda=False if workload.keda_managed else None,
            undo=_undo(Action.WAKE, workload, 0),
        )

    # Running: the live replica count is the truth.
    if DO_NOT_SCALE in annotations and annotations[DO_NOT_SCALE].strip().lower() != "false":
        return Decision(Action.NONE, Reason.DO_NOT_SCALE, f"{workload.ref} is annotated {DO_NOT_SCALE}")
    window = window_seconds(spec)
    verdict = assess_idle(
        signals.utilization, threshold=spec.idle_below_percent, window=window,
        now=signals.now, max_gap=signals.max_gap_seconds,
    )
    stale = workload.record is not None
    if wake_requested:  # a user wants it up: it is; never park it while the annotation says so
        if stale:
            return Decision(
                Action.CLEAR_RECORD, Reason.WAKE_ANNOTATION,
                f"{workload.ref} already runs {workload.replicas} replicas: the park record is stale",
                clear_record=True,
            )
        return Decision(
            Action.NONE, Reason.WAKE_ANNOTATION,
            f"{workload.ref} is held awake by {WAKE}=true: remove the annotation to let it park again",
        )
    if verdict.idle and demand:
        verdict = IdleVerdict(
            False, Reason.DEMAND, f"GPU idle but wake query {signals.wake_value:g} > {wake_above:g}",
            verdict.samples, verdict.peak,
        )
    if not verdict.idle:
        if stale:
            return Decision(
                Action.CLEAR_RECORD, Reason.STALE_RECORD,
                f"{workload.ref} runs {workload.replicas} replicas: the park record is stale ({verdict.message})",
                clear_record=True,
            )
        return Decision(Action.NONE, verdict.reason, verdict.message)
    undo = _undo(Action.SCALE_TO_ZERO, workload, workload.replicas)
    return Decision(
        Action.SCALE_TO_ZERO, Reason.IDLE, verdict.message,
        replicas=None if workload.keda_managed else 0,
        record=ParkRecord(replicas=workload.replicas, scaled_at=scaled_at, uid=uid, undo=undo),
        pause_keda=True if workload.keda_managed else None,
        undo=undo,
    )


def wake_warning(spec: ScaleToZeroSpec) -> str | None:
    """The status warning for a policy that has no wake signal but the annotation (pure)."""
    if spec.wake is None or not (spec.wake.prometheus_query or "").strip():
        return (
            "scaleToZero has no wake.prometheusQuery: GPU utilisation cannot wake a workload at 0, "
            f"only the annotation {WAKE}: \"true\" will"
        )
    return None
