"""Right-sizing math and proposal rules, pure (gpupolicy/scaling/rightsizing.py, proposals.py, effective_mode.py).

Real: the catalog (real MIG memory), the sizing and state functions. Faked:
nothing; metric series are built by hand (scripted memory peaks).
"""

from __future__ import annotations

import pytest

from gpupolicy.catalog import DEFAULT_CATALOG, GIB
from gpupolicy.model import Mode, ProposalState, SharingSpec, parse_policy
from gpupolicy.modes import effective_mode
from gpupolicy.proposals import decide_state, is_approved, proposal_id
from gpupolicy.scaling.metrics import Series
from gpupolicy.scaling.rightsizing import (
    Usage,
    Workload,
    coverage_gap,
    pod_name_regex,
    query_step,
    short_product,
    size_workload,
    summarise_usage,
    usage_queries,
    whole_gpu_request,
)

DAY = 86400.0
END = 1_700_000_000.0
WEEK = 7 * DAY
A100_80 = "NVIDIA-A100-SXM4-80GB"


def series(value_mib: float, start: float = END - WEEK, end: float = END, every: float = 600.0,
           peak_at: float | None = None, peak: float | None = None, pod: str = "llm-5d9f7c-abcde") -> Series:
    points = []
    t = start
    while t <= end:
        v = peak if peak_at is not None and abs(t - peak_at) < every / 2 else value_mib
        points.append((t, float(v)))
        t += every
    return Series({"namespace": "inference", "pod": pod, "Hostname": "gpu-1"}, points)


def usage(peak_gib: float, p95_util: float = 12.0) -> Usage:
    return Usage(peak_memory_mib=peak_gib * GIB, p95_memory_mib=peak_gib * GIB, peak_util=p95_util,
                 p95_util=p95_util, samples=1000)


def workload(product: str | None = A100_80, replicas: int = 1) -> Workload:
    return Workload("Deployment", "inference", "llm", replicas, product)


def mig(**kw: object) -> SharingSpec:
    return SharingSpec.model_validate({"strategy": "MIG", **kw})


@pytest.mark.parametrize(
    ("product", "peak_gib", "expected"),
    [
        pytest.param(A100_80, 7.1, "nvidia.com/mig-1g.10gb", id="a100-80-7.1GiB-fits-1g.10gb"),
        pytest.param(A100_80, 8.0, "nvidia.com/mig-1g.20gb", id="a100-80-8GiB+20%-exceeds-9.5GiB"),
        pytest.param(A100_80, 30.0, "nvidia.com/mig-3g.40gb", id="a100-80-30GiB-3g"),
        pytest.param("NVIDIA-H200", 13.0, "nvidia.com/mig-1g.18gb", id="h200-13GiB-15.6-fits-16GiB-real"),
        pytest.param("NVIDIA-H200", 14.0, "nvidia.com/mig-1g.35gb", id="h200-14GiB-16.8-exceeds-16GiB-real"),
    ],
)
def test_smallest_mig_profile_by_real_memory(product: str, peak_gib: float, expected: str) -> None:
    sizing = size_workload(workload(product), usage(peak_gib), mig(), DEFAULT_CATALOG)
    assert sizing.proposal, sizing.reason
    assert sizing.resource == expected


def test_proposal_text_and_gpu_hours_match_the_issue_example() -> None:
    sizing = size_workload(workload(replicas=2), usage(7.1, 12), mig(), DEFAULT_CATALOG)
    assert sizing.action == "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb"
    assert "Deployment/inference/llm: nvidia.com/gpu=1 (A100-80GB, peak 7.1 GiB, p95 util 12%)" in sizing.reason
    assert sizing.gpu_hours_per_month == pytest.approx(2 * (1 - 1 / 7) * 730)


def test_headroom_is_configurable() -> None:
    assert size_workload(workload(), usage(8.0), mig(headroomPercent=0), DEFAULT_CATALOG).resource == (
        "nvidia.com/mig-1g.10gb")


def test_utilisation_above_the_slice_compute_share_needs_a_bigger_slice() -> None:
    sizing = size_workload(workload(), usage(5.0, p95_util=20.0), mig(), DEFAULT_CATALOG)
    assert sizing.resource == "nvidia.com/mig-2g.20gb"  # 1g is 14% of compute, 2g 28%


def test_no_smaller_profile_means_no_proposal() -> None:
    sizing = size_workload(workload(), usage(60.0), mig(), DEFAULT_CATALOG)
    assert not sizing.proposal
    assert "no smaller MIG profile fits" in sizing.reason


def test_non_mig_gpu_gets_no_mig_proposal_but_time_slicing_works() -> None:
    assert not size_workload(workload("NVIDIA-L4"), usage(4.0), mig(), DEFAULT_CATALOG).proposal
    ts = size_workload(workload("NVIDIA-L4"), usage(4.0, 20), SharingSpec.model_validate(
        {"strategy": "TimeSlicing", "replicas": 4}), DEFAULT_CATALOG)
    assert ts.proposal and ts.resource == "nvidia.com/gpu.shared"
    assert ts.gpu_hours_per_month == pytest.approx(0.75 * 730)


def time_slicing(**kw: object) -> SharingSpec:
    return SharingSpec.model_validate({"strategy": "TimeSlicing", **kw})


@pytest.mark.parametrize(
    ("p95_util", "proposed"),
    [pytest.param(25.0, True, id="4x25%-is-one-gpu"), pytest.param(25.5, False, id="4x25.5%-over-one-gpu"),
     pytest.param(60.0, False, id="compute-saturated")],
)
def test_time_slicing_is_not_proposed_for_a_workload_whose_compute_would_not_fit(p95_util: float,
                                                                                 proposed: bool) -> None:
    """Small memory is not enough: 4 time-sliced replicas of a workload busy 60% of the time would need 240% of
    one GPU, so no proposal (the reason says memory or compute); at 4 x 25% = 100% it still fits."""
    sizing = size_workload(workload("NVIDIA-L4"), usage(4.0, p95_util), time_slicing(replicas=4), DEFAULT_CATALOG)
    assert sizing.proposal is proposed, sizing.reason
    if proposed:
        assert sizing.resource == "nvidia.com/gpu.shared"
    else:
        assert sizing.reason == (f"Deployment/inference/llm: no proposal, nvidia.com/gpu=1 (L4, peak 4.0 GiB, "
                                 f"p95 util {p95_util:.0f}%): 4 time-sliced replicas would not fit its memory or "
                                 f"compute")
        assert sizing.action == "" and sizing.gpu_hours_per_month == 0


@pytest.mark.parametrize("spec", [mig(gpuModels=["NVIDIA-H100-80GB-HBM3"]),
                                  time_slicing(gpuModels=["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"])],
                         ids=["mig", "time-slicing"])
def test_workload_on_a_gpu_outside_the_policys_gpu_models_gets_no_proposal(spec: SharingSpec) -> None:
    """spec.sharing.gpuModels limits the policy to those GPUs: an A100 workload under an H100-only policy is
    left alone, though a slice would fit it."""
    sizing = size_workload(workload(), usage(7.1), spec, DEFAULT_CATALOG)
    assert not sizing.proposal
    assert sizing.reason == ("Deployment/inference/llm: no proposal, NVIDIA-A100-SXM4-80GB is not among the "
                             "policy's gpuModels")


@pytest.mark.parametrize("models", [[A100_80], ["NVIDIA-H100-80GB-HBM3", A100_80], ["NVIDIA-A100-80GB-PCIe"]],
                         ids=["only-it", "among-others", "catalog-alias"])
def test_workload_on_a_gpu_among_the_policys_gpu_models_is_proposed(models: list[str]) -> None:
    """A gpuModels entry naming the workload's product (or an alias the catalog folds into it) allows it."""
    sizing = size_workload(workload(), usage(7.1), mig(gpuModels=models), DEFAULT_CATALOG)
    assert sizing.proposal, sizing.reason
    assert sizing.resource == "nvidia.com/mig-1g.10gb"


def test_fixed_profile_is_proposed_only_when_it_fits() -> None:
    assert size_workload(workload(), usage(7.1), mig(migProfile="2g.20gb"), DEFAULT_CATALOG).resource == (
        "nvidia.com/mig-2g.20gb")
    assert not size_workload(workload(), usage(18.0), mig(migProfile="1g.20gb"), DEFAULT_CATALOG).proposal


def test_missing_data_means_no_proposal_with_the_reason() -> None:
    sizing = size_workload(workload(), Usage(missing="no GPU metrics for the workload's pods in the window"),
                           mig(), DEFAULT_CATALOG)
    assert not sizing.proposal and "no GPU metrics" in sizing.reason


def test_summary_takes_the_peak_between_steps_and_pools_pods() -> None:
    mem = [series(2000, peak_at=END - 3 * DAY, peak=7270), series(3000, pod="llm-5d9f7c-fghij")]
    util = [series(10)]
    got = summarise_usage(mem, util, END - WEEK, END, query_step(WEEK))
    assert got.complete, got.missing
    assert got.peak_memory_mib == 7270
    assert 2000 <= got.p95_memory_mib <= 3000
    assert got.hosts == ("gpu-1",)


@pytest.mark.parametrize(
    ("start", "end", "expect"),
    [
        pytest.param(END - WEEK, END, None, id="whole-window"),
        pytest.param(END - 2 * DAY, END, "start of the window", id="started-two-days-ago"),
        pytest.param(END - WEEK, END - DAY, "no recent metrics", id="stopped-yesterday"),
    ],
)
def test_coverage_of_the_window(start: float, end: float, expect: str | None) -> None:
    times = [p[0] for p in series(1000, start, end).points]
    gap = coverage_gap(times, END - WEEK, END, query_step(WEEK))
    assert (gap is None) if expect is None else (expect in (gap or ""))


def test_a_hole_in_the_middle_is_not_coverage() -> None:
    times = [t for t, _ in series(1000).points if not END - 4 * DAY < t < END - 3 * DAY]
    assert "gap" in (coverage_gap(times, END - WEEK, END, query_step(WEEK)) or "")


HOUR = 3600.0


@pytest.mark.parametrize(
    ("missed_steps", "proposed"),
    [pytest.param(0, True, id="every-step"), pytest.param(2, True, id="hole-of-3-steps-tolerated"),
     pytest.param(3, False, id="hole-of-4-steps-is-a-gap"), pytest.param(10, False, id="hole-of-11-steps")],
)
def test_a_hole_wider_than_three_steps_means_no_proposal(missed_steps: int, proposed: bool) -> None:
    """A 1h window is read at 60s steps; a few missed scrapes (a 3-step hole) still cover it, a wider hole
    could hide the peak, so the workload gets no proposal and the reason names the gap."""
    step = query_step(HOUR)
    assert step == 60
    hole_from = END - HOUR / 2
    full = series(7.1 * GIB, END - HOUR, END, every=step)
    memory = Series(full.labels, [(t, v) for t, v in full.points
                                  if not hole_from < t < hole_from + (missed_steps + 1) * step])
    got = summarise_usage([memory], [series(12.0, END - HOUR, END, every=step)], END - HOUR, END, step)
    sizing = size_workload(workload(), got, mig(window="1h"), DEFAULT_CATALOG)
    assert sizing.proposal is proposed, sizing.reason
    if proposed:
        assert sizing.resource == "nvidia.com/mig-1g.10gb"
    else:
        assert sizing.reason == ("Deployment/inference/llm: no proposal, a gap in the metrics inside the window "
                                 "(window 1h)")


def test_a_two_hour_hole_in_a_week_is_a_gap() -> None:
    """Over a week (840s steps) the tolerance is 1% of the window, about 1.7h: a 2h outage is a gap."""
    times = [t for t, _ in series(1000).points if not END - 3 * DAY < t < END - 3 * DAY + 2 * HOUR]
    assert coverage_gap(times, END - WEEK, END, query_step(WEEK)) == "a gap in the metrics inside the window"
    times = [t for t, _ in series(1000).points if not END - 3 * DAY < t < END - 3 * DAY + 1.5 * HOUR]
    assert coverage_gap(times, END - WEEK, END, query_step(WEEK)) is None


def test_queries_select_the_workloads_pods_by_name_pattern() -> None:
    q = usage_queries("Deployment", "inference", "llm.v2", 840)
    assert 'namespace="inference"' in q.memory and "DCGM_FI_DEV_FB_USED" in q.memory
    assert "max_over_time" in q.memory and "[840s]" in q.memory
    assert "DCGM_FI_DEV_GPU_UTIL" in q.util and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in q.mig_util
    assert "* 100" in q.mig_util
    import re

    assert re.fullmatch(pod_name_regex("Deployment", "llm"), "llm-5d9f7c-abcde")
    assert not re.fullmatch(pod_name_regex("Deployment", "llm"), "llm-big-5d9f7c-abcde")
    assert re.fullmatch(pod_name_regex("StatefulSet", "db"), "db-0")
    assert not re.fullmatch(pod_name_regex("StatefulSet", "db"), "db-x")


def test_whole_gpu_request_and_product_names() -> None:
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}, {"resources": {}}]}
    assert whole_gpu_request(spec) == 1
    assert whole_gpu_request({"containers": [{}]}) == 0
    assert short_product(A100_80) == "A100-80GB"


# -- proposals and modes -------------------------------------------------------
def test_proposal_ids_are_stable_and_depend_on_the_action() -> None:
    a = proposal_id("p", "Deployment/ns/x", "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb")
    assert a == proposal_id("p", "Deployment/ns/x", "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb")
    assert a != proposal_id("p", "Deployment/ns/x", "nvidia.com/gpu=1 → nvidia.com/mig-1g.20gb")
    assert a != proposal_id("q", "Deployment/ns/x", "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb")
    assert len(a) == 12


@pytest.mark.parametrize(
    ("mode", "approved", "previous", "applied", "state", "apply"),
    [
        pytest.param(Mode.RECOMMEND, False, None, False, ProposalState.PROPOSED, False, id="recommend"),
        pytest.param(Mode.RECOMMEND, True, None, False, ProposalState.APPROVED, False, id="recommend-approved"),
        pytest.param(Mode.APPROVE, False, None, False, ProposalState.PROPOSED, False, id="approve-unlisted"),
        pytest.param(Mode.APPROVE, True, None, False, ProposalState.APPLIED, True, id="approve-listed"),
        pytest.param(Mode.AUTOMATIC, False, None, False, ProposalState.APPLIED, True, id="automatic"),
        pytest.param(Mode.AUTOMATIC, False, ProposalState.APPLIED, False, ProposalState.APPLIED, False,
                     id="applied-is-sticky"),
        pytest.param(Mode.AUTOMATIC, False, None, True, ProposalState.APPLIED, False, id="record-on-target"),
        pytest.param(Mode.AUTOMATIC, True, ProposalState.DISMISSED, False, ProposalState.DISMISSED, False,
                     id="dismissed-is-sticky"),
    ],
)
def test_state_transitions(mode: Mode, approved: bool, previous: ProposalState | None, applied: bool,
                           state: ProposalState, apply: bool) -> None:
    decision = decide_state(mode, approved, previous, applied)
    assert (decision.state, decision.apply) == (state, apply)


def test_approvals_use_the_webhooks_rule() -> None:
    assert is_approved("Deployment/ns/x", ["Deployment/ns/x"])
    assert is_approved("Deployment/ns/x", ["Deployment/x"])
    assert not is_approved("Deployment/ns/x", ["Deployment/other/x", "StatefulSet/ns/x"])


def _policy(body: dict[str, object], mode: str | None = None) -> object:
    spec: dict[str, object] = dict(body)
    if mode:
        spec["mode"] = mode
    return parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
                         "metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize(
    ("body", "mode", "prom", "expected", "degraded"),
    [
        pytest.param({"sharing": {"strategy": "MIG"}}, "Automatic", False, Mode.RECOMMEND, True,
                     id="sharing-without-prometheus-stays-recommend"),
        pytest.param({"sharing": {"strategy": "MIG"}}, "Automatic", True, Mode.AUTOMATIC, False,
                     id="sharing-with-prometheus"),
        pytest.param({"scaleToZero": {"namespaces": ["r"]}}, "Approve", False, Mode.RECOMMEND, True,
                     id="scale-to-zero-without-prometheus"),
        pytest.param({"guardrail": {"maxGpusPerPod": 2}}, "Automatic", False, Mode.AUTOMATIC, False,
                     id="guardrail-needs-no-metrics"),
        pytest.param({"guardrail": {}}, None, False, Mode.APPROVE, False, id="default-mode-applies"),
    ],
)
def test_effective_mode(body: dict[str, object], mode: str | None, prom: bool, expected: Mode,
                        degraded: bool) -> None:
    eff = effective_mode(_policy(body, mode), Mode.APPROVE, prom)  # type: ignore[arg-type]
    assert eff.mode is expected
    assert eff.degraded is degraded
    if degraded:
        assert "--prometheus-url" in (eff.degraded_reason or "")
