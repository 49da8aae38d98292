"""What an evicted pod's work becomes in the capacity simulator: resumed (issue 19) or restarted (issue 40)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import PodDemand
from simulator.capacity import Cluster, Drain, run
from simulator.capacity_baselines import Karpenter
from simulator.capacity_compare import controller
from simulator.capacity_trace import TimedPod
from tests.capacity.events_checker import check

T4X4 = InstanceType("t4x4", "T4", 4, 96000, 393216, 2.696)
HOUR = 3600.0


@dataclass
class DrainAt(Karpenter):
    """Karpenter's provisioning, no consolidation: one drain of the pod's node at `at` seconds, no replacement."""

    at: float = 0.0
    done: bool = False

    def disrupt(self, cluster: Cluster, now: float) -> list[Drain]:
        rows = [r for r in cluster.live_rows() if cluster.pods_on[r]]
        if self.done or now < self.at or not rows:
            return []
        self.done = True
        return [Drain((rows[0],))]

    def next_timer(self, cluster: Cluster, now: float) -> float:
        return min(super().next_timer(cluster, now), math.inf if self.done else self.at)


def one_eviction(tmp_path: Path, rule: str) -> tuple[list[tuple[object, ...]], float]:
    """A 10-hour pod whose node is drained after it ran 4 hours; its events and its GPU-node-hours."""
    job = TimedPod("job", PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=1, gpu_milli=1000, name="job"),
                   0.0, 10 * HOUR)
    events: list[tuple[object, ...]] = []
    figures = run([job], [T4X4], DrainAt(instance_types=[T4X4], expire_after=math.inf, at=4 * HOUR + 180),
                  events=events, evicted_work=rule)
    assert figures.evictions == 1 and figures.pods_never_placed == 0
    return events, figures.gpu_node_hours


def finished_at(events: list[tuple[object, ...]]) -> float:
    return next(float(str(t)) for t, e, *_ in events if e == "finish")


def write(tmp_path: Path, events: list[tuple[object, ...]]) -> tuple[Path, Path, Path]:
    """The events, the one-pod trace and the one-type catalog as the checker reads them."""
    with open(tmp_path / "events.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(("time", "event", "node", "instance_type", "pod", "gpus"))
        out.writerows(events)
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
                                       f"job,4000,8192,1,1000,0,{10 * HOUR:.0f}\n")
    (tmp_path / "types.csv").write_text("instance_type,model,gpus,cpu_milli,memory_mib,price_per_hour\n"
                                        "t4x4,T4,4,96000,393216,2.696\n")
    return tmp_path / "events.csv", tmp_path / "pods.csv", tmp_path / "types.csv"


def test_a_resumed_pod_runs_what_it_had_left_and_a_restarted_one_its_whole_duration(tmp_path: Path) -> None:
    resumed, resumed_hours = one_eviction(tmp_path, "resume")
    restarted, restarted_hours = one_eviction(tmp_path, "restart")
    evicted = 4 * HOUR + 180  # placed when its node is ready (180 s), drained after it ran 4 h
    # back after a new node's 180 s: resumed, 6 h of its 10 h are left; restarted, all 10 h
    assert finished_at(resumed) == pytest.approx(evicted + 180 + 6 * HOUR, abs=20)
    assert finished_at(restarted) == pytest.approx(evicted + 180 + 10 * HOUR, abs=20)
    # the work done twice is paid for: 4 GPUs x the 4 h redone, on the node that redid it
    assert restarted_hours - resumed_hours == pytest.approx(4 * 4, abs=0.2)
    for rule, events in (("resume", resumed), ("restart", restarted)):
        figures = check(*write(tmp_path, events), 1.0, evicted_work=rule)
        assert figures["pods_finished"] == 1 and figures["evictions"] == 1
        other = "restart" if rule == "resume" else "resume"
        with pytest.raises(AssertionError, match="its duration is 36000"):
            check(*write(tmp_path, events), 1.0, evicted_work=other)


def test_with_restarts_karpenter_never_expires_nodes_so_a_pod_longer_than_30_days_can_finish() -> None:
    types = [T4X4]
    assert controller("karpenter", [], types, None, 0).expire_after == 720 * HOUR  # type: ignore[attr-defined]
    model = controller("karpenter", [], types, None, 0, "restart")
    assert model.expire_after == math.inf  # type: ignore[attr-defined]
    month = TimedPod("month", PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=1, gpu_milli=1000, name="m"),
                     0.0, 1000 * HOUR)
    figures = run([month], types, model, evicted_work="restart")
    assert figures.evictions == 0 and figures.gpu_node_hours == pytest.approx(4 * 1000, rel=0.01)


def test_an_unknown_rule_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--evicted-work must be one of resume, restart"):
        run([], [T4X4], Karpenter(instance_types=[T4X4]), evicted_work="checkpoint")


def test_a_run_that_restarts_a_pod_forever_stops_with_a_clear_error() -> None:
    """A forceful expiry shorter than a pod restarts it forever once work restarts: an error, not a hang."""
    long = TimedPod("long", PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=1, gpu_milli=1000, name="long"),
                    0.0, 500 * HOUR)
    model = Karpenter(instance_types=[T4X4], expire_after=400 * HOUR)
    assert run([long], [T4X4], Karpenter(instance_types=[T4X4], expire_after=400 * HOUR)).evictions == 1
    with pytest.raises(ValueError, match=r"did not end .* evicted before they finish"):
        run([long], [T4X4], model, evicted_work="restart")
