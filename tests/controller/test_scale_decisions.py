"""The pure scale-to-zero and autoscale decisions (gpupolicy/scaling/scaletozero.py, gpupolicy/scaling/autoscale.py).

Real: the decision functions, the KEDA ScaledObject CRD's openAPIV3Schema
(vendor/crds/keda.sh_scaledobjects.yaml) checked with jsonschema, the
real H200 trace's bursty phase. Faked: nothing (inputs are built by hand).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpupolicy.model import AutoscaleSpec, ParkRecord, ScaleToZeroSpec
from gpupolicy.scaling import autoscale
from gpupolicy.scaling import scaletozero as core
from tests.promharness import replay

NOW = 1_800_000_000.0
KEDA_CRD = Path(__file__).resolve().parents[2] / "vendor" / "crds" / "keda.sh_scaledobjects.yaml"


def spec(**kw: Any) -> ScaleToZeroSpec:
    base: dict[str, Any] = {"namespaces": ["research"], "idleFor": "60s", "idleBelowPercent": 5,
                            "wake": {"prometheusQuery": "sum(queue_depth)", "above": 0}}
    base.update(kw)
    return ScaleToZeroSpec.model_validate(base)


def series(values: list[float | None], every: float = 2.0, end: float = NOW) -> list[tuple[float, float]]:
    n = len(values)
    return [(end - (n - 1 - i) * every, v) for i, v in enumerate(values) if v is not None]


def running(replicas: int = 3, recorded: int | None = None, **annotations: str) -> core.Workload:
    """A workload with the user's annotations and, when `recorded` is set, this policy's park record."""
    record = None if recorded is None else ParkRecord(replicas=recorded, scaled_at="t")
    return core.Workload("Deployment", "research", "llm", replicas, annotations, record=record)


def signals(points: list[tuple[float, float]] | None, wake: float | None = None) -> core.Signals:
    return core.Signals(points, wake, NOW, max_gap_seconds=6.0)


@pytest.mark.parametrize(
    ("points", "reason"),
    [
        pytest.param(None, core.Reason.NO_DATA, id="no-data"),
        pytest.param([], core.Reason.NO_DATA, id="empty"),
        pytest.param(series([0.0] * 31), core.Reason.IDLE, id="idle-whole-window"),
        pytest.param(series([0.0] * 20), core.Reason.PARTIAL_WINDOW, id="history-shorter-than-window"),
        pytest.param(series([0.0] * 31, end=NOW - 20), core.Reason.STALE_DATA, id="samples-stopped"),
        pytest.param(series([0.0] * 10 + [None] * 5 + [0.0] * 16), core.Reason.GAP, id="hole"),
        pytest.param(series([0.0] * 30 + [5.0]), core.Reason.BUSY, id="at-threshold-is-busy"),
        pytest.param(series([0.0, 0.0, 100.0] * 10 + [0.0]), core.Reason.BUSY, id="bursty"),
    ],
)
def test_idle_needs_full_window_below_threshold(points: Any, reason: core.Reason) -> None:
    decision = core.decide(spec(), running(), signals(points), "t")
    assert decision.reason is reason
    assert (decision.action is core.Action.SCALE_TO_ZERO) == (reason is core.Reason.IDLE)


def test_real_h200_bursty_phase_is_not_idle_though_most_samples_read_zero() -> None:
    script = replay("bursty", origin=NOW - 600, period=1.0)
    points = [(NOW - 60 + t, v) for t in range(61) if (v := script(NOW - 60 + t)) is not None]
    zeros = sum(1 for _, v in points if v == 0)
    assert zeros > 0
    verdict = core.assess_idle(points, threshold=5, window=60, now=NOW, max_gap=6)
    assert not verdict.idle and verdict.reason is core.Reason.BUSY


def test_scale_to_zero_patch_records_replicas_time_and_undo() -> None:
    decision = core.decide(spec(), running(3), signals(series([0.0] * 31)), "2027-01-15T08:00:00Z", uid="u1")
    assert decision.replicas == 0
    assert decision.record is not None and decision.record.replicas == 3
    assert decision.record.scaled_at == "2027-01-15T08:00:00Z" and decision.record.uid == "u1"
    assert decision.undo["restoreReplicas"] == 3 and decision.record.undo == decision.undo
    assert not decision.clear_record


def test_idle_gpu_with_live_demand_stays_up() -> None:
    decision = core.decide(spec(), running(), signals(series([0.0] * 31), wake=4), "t")
    assert decision.action is core.Action.NONE and decision.reason is core.Reason.DEMAND


@pytest.mark.parametrize(
    ("wake", "annotation", "action", "reason"),
    [
        pytest.param(None, None, core.Action.NONE, core.Reason.PARKED, id="no-signal"),
        pytest.param(0.0, None, core.Action.NONE, core.Reason.PARKED, id="query-not-above"),
        pytest.param(3.0, None, core.Action.WAKE, core.Reason.WAKE_QUERY, id="query"),
        pytest.param(None, "true", core.Action.WAKE, core.Reason.WAKE_ANNOTATION, id="annotation"),
    ],
)
def test_wake(wake: float | None, annotation: str | None, action: core.Action, reason: core.Reason) -> None:
    annotations = {core.WAKE: annotation} if annotation else {}
    decision = core.decide(spec(), running(0, 4, **annotations), signals(None, wake), "t")
    assert (decision.action, decision.reason) == (action, reason)
    if action is core.Action.WAKE:
        assert decision.replicas == 4
        assert decision.clear_record and decision.record is None


def test_wake_annotation_holds_a_running_workload_awake_until_removed() -> None:
    """The optimizer cannot remove the user's annotation (no workload write): it holds, never parks."""
    held = running(4, **{core.WAKE: "true"})
    decision = core.decide(spec(), held, signals(series([0.0] * 31)), "t")
    assert (decision.action, decision.reason) == (core.Action.NONE, core.Reason.WAKE_ANNOTATION)
    assert "remove the annotation" in decision.message
    stale = core.decide(spec(), running(4, 4, **{core.WAKE: "true"}), signals(series([0.0] * 31)), "t")
    assert stale.action is core.Action.CLEAR_RECORD and stale.clear_record


def test_min_replicas_on_wake_overrides_record() -> None:
    parked = running(0, 4, **{core.WAKE: "true"})
    assert core.decide(spec(minReplicasOnWake=1), parked, signals(None), "t").replicas == 1


def test_parked_workload_is_never_parked_again_and_foreign_zero_is_left_alone() -> None:
    parked = running(0, 4)
    assert core.decide(spec(), parked, signals(series([0.0] * 31)), "t").action is core.Action.NONE
    foreign = running(0)
    assert core.decide(spec(), foreign, signals(series([0.0] * 31), wake=9), "t").reason is core.Reason.ZERO_NOT_OURS


def test_do_not_scale_and_stale_record() -> None:
    skipped = running(2, **{core.DO_NOT_SCALE: "true"})
    assert core.decide(spec(), skipped, signals(series([0.0] * 31)), "t").reason is core.Reason.DO_NOT_SCALE
    scaled_up_by_user = running(2, 4)
    decision = core.decide(spec(), scaled_up_by_user, signals(series([50.0] * 31)), "t")
    assert decision.action is core.Action.CLEAR_RECORD and decision.replicas is None and decision.clear_record


@pytest.mark.parametrize("value", ["true", "yes", "", "TRUE ", "0", "no"],
                         ids=["true", "yes", "empty", "upper-padded-true", "zero", "no"])
def test_do_not_scale_blocks_parking_for_any_value_but_false(value: str) -> None:
    """docs/designs/scale-to-zero.md: any value but "false" keeps an idle workload up; a typo or an empty value
    must not let it be parked."""
    skipped = running(2, **{core.DO_NOT_SCALE: value})
    decision = core.decide(spec(), skipped, signals(series([0.0] * 31)), "t")
    assert decision.action is core.Action.NONE and decision.reason is core.Reason.DO_NOT_SCALE
    assert decision.replicas is None


@pytest.mark.parametrize("value", ["false", " False ", "FALSE"], ids=["false", "padded-False", "FALSE"])
def test_do_not_scale_false_lets_an_idle_workload_park(value: str) -> None:
    """`do-not-scale: "false"` (any case, surrounding blanks) is the annotation switched off: parked as usual."""
    workload = running(2, **{core.DO_NOT_SCALE: value})
    decision = core.decide(spec(), workload, signals(series([0.0] * 31)), "t")
    assert decision.action is core.Action.SCALE_TO_ZERO and decision.reason is core.Reason.IDLE
    assert decision.replicas == 0


def test_keda_target_is_paused_not_scaled() -> None:
    keda = core.Workload("Deployment", "research", "llm", 3, {}, keda_paused=False)
    decision = core.decide(spec(), keda, signals(series([0.0] * 31)), "t")
    assert decision.action is core.Action.SCALE_TO_ZERO
    assert decision.replicas is None and decision.pause_keda is True
    parked = core.Workload("Deployment", "research", "llm", 0, {core.WAKE: "true"},
                           keda_paused=True, record=ParkRecord(replicas=3, scaled_at="t"))
    wake = core.decide(spec(), parked, signals(None), "t")
    assert wake.action is core.Action.WAKE and wake.pause_keda is False and wake.replicas == 3


def test_policy_without_wake_signal_warns() -> None:
    assert core.wake_warning(spec(wake=None)) is not None
    assert "annotation" in (core.wake_warning(spec(wake=None)) or "")
    assert core.wake_warning(spec()) is None


@pytest.mark.parametrize(
    ("kind", "pod", "matches"),
    [
        ("Deployment", "llm-7d9f6c8b5-x2b4z", True),
        ("Deployment", "llm-big-7d9f6c8b5-x2b4z", False),
        ("Deployment", "llm-0", False),
        ("StatefulSet", "llm-0", True),
        ("StatefulSet", "llm-big-0", False),
    ],
)
def test_pod_regex(kind: str, pod: str, matches: bool) -> None:
    import re

    assert bool(re.fullmatch(autoscale.pod_regex(kind, "llm"), pod)) is matches


def _keda_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return dict(version["schema"]["openAPIV3Schema"])


def test_scaled_object_is_valid_against_keda_crd() -> None:
    obj = autoscale.scaled_object(
        policy_name="gpu-idle", kind="Deployment", namespace="research", name="llm",
        spec=AutoscaleSpec(target_utilization_percent=60, min=1, max=4),
        server_address="http://prometheus.monitoring:9090",
    )
    jsonschema.validate(obj, _keda_schema())
    trigger = obj["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "60"
    assert "avg(" in trigger["metadata"]["query"] and "DCGM_FI_DEV_GPU_UTIL" in trigger["metadata"]["query"]
    assert obj["spec"]["minReplicaCount"] == 1 and obj["spec"]["maxReplicaCount"] == 4
    broken = {**obj, "spec": {**obj["spec"], "triggers": []}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, _keda_schema())
    assert not autoscale.differs(obj, {**obj, "status": {"x": 1}})
    assert autoscale.differs(obj, {**obj, "spec": {**obj["spec"], "maxReplicaCount": 9}})
