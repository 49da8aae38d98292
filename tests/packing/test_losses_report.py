"""bench/losses.py: where a replay's allocation goes missing at the 100% arrival point adds up to the metric.

Real: the openb trace (vendor/openb, the first 100 nodes and 600 pods), the
production replay and the tool's re-application of its placements; a
hand-made node state for why a pod failed. Faked: nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.losses import main, measure, why_failed
from tests.packing.builders import make_pod, make_state
from tests.packing.test_live_replay import VENDOR, subset


@pytest.mark.parametrize("strategy", ["kubeon", "fgd"])
def test_the_free_gpu_milli_at_the_100_percent_point_is_what_the_metric_misses(tmp_path: Path,
                                                                               strategy: str) -> None:
    nodes = subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 100)
    pods = subset(VENDOR / "openb_pod_list_default.csv", tmp_path / "pods.csv", 600)
    got = measure(nodes, pods, strategy, 42)
    assert got.alloc_pct_at_100 < 100.0 and got.free_milli > 0
    assert got.alloc_pct_at_100 == pytest.approx(100.0 * (1 - got.free_milli / got.capacity_milli), abs=1e-9)
    sliced = sum(left * n for (_, left), n in got.slices.items())
    assert sliced <= sum(s for _, s in got.free_by_model.values())  # slices of share pods' GPUs are free slices
    assert sum(got.failed.values()) >= got.free_milli  # what failed could not use what was left


def test_why_a_pod_failed_names_the_resource_no_node_with_gpu_room_had() -> None:
    state = make_state([("cpu-short", 1000, 65536, [1000, 1000], "T4"), ("full", 32000, 65536, [0, 0], "T4")])
    assert why_failed(state, make_pod(gpus=1, cpu=4000)) == "GPU room, short of CPU"
    assert why_failed(state, make_pod(gpus=1, cpu=500, mem=131072)) == "GPU room, short of memory"
    assert why_failed(state, make_pod(gpus=4, cpu=500)) == "no GPU room"


def test_an_unknown_strategy_or_missing_trace_is_a_clear_error(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--strategies", "nope"]) == 2
    assert "unknown strategy 'nope'" in capsys.readouterr().err
    assert main(["--data", str(tmp_path)]) == 2
    assert "openb_node_list_gpu_node.csv: no such file" in capsys.readouterr().err
