"""bench/capacity_calibrate.py on the committed 30-minute live run: the real arm's figures as measured live."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.capacity_calibrate import DIR, main

RESULTS = DIR.parent


def test_the_real_arm_recounted_from_its_events_matches_what_the_live_bench_measured(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["capacity_calibrate.py", "--seeds", "2"])
    assert main() == 0
    seed, mean = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    live = [json.loads(line) for line in Path(RESULTS / "capacity-live-m30-seed2.jsonl").read_text().splitlines()]
    real = next(x for x in live if x.get("arm") == "karpenter")
    assert real["nodeclaims_left"] == 0  # seed 2 left nothing: the events hold every NodeClaim's whole life
    assert seed["real"]["cost"] == pytest.approx(real["cost"], abs=0.01)
    assert seed["real"]["gpu_node_hours"] == pytest.approx(real["gpu_node_hours"], abs=0.01)
    assert seed["real"]["evictions"] == real["evictions"]
    # the model restarts evicted work, as the live replicas do
    assert seed["evicted_work"] == "restart" and seed["model"]["evictions"] > 0
    assert sum(seed["real"]["drained_nodes"].values()) > 0 and mean["mean"]["real"]["cost"] == seed["real"]["cost"]


def test_the_real_state_at_a_time_is_rebuilt_from_the_events(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """--at: seed 0 at 1,936 s, after the real Karpenter replaced two P100 x1 by the T4 x2 gpu-pvxwt (1,931 s)."""
    monkeypatch.setattr("sys.argv", ["capacity_calibrate.py", "--seeds", "0", "--at", "1936"])
    assert main() == 0
    line = json.loads(capsys.readouterr().out)
    nodes = line["nodes"]
    assert "gpu-s5v69" not in nodes and "gpu-zf4b7" not in nodes  # deleted at 1,931 and 1,932 s
    assert nodes["gpu-pvxwt"]["pods"] == ["w077-1", "w098-1"] and nodes["gpu-pvxwt"]["free_gpus"] == 0
    # gpu-8t7vr (V100 x4) holds three pods of 8,000 + 8,200 + 11,908 millicores of its 31,900 allocatable
    # (32,000 less the 100 the KWOK provider reserves)
    assert nodes["gpu-8t7vr"]["free_gpus"] == 1 and nodes["gpu-8t7vr"]["free_cpu_milli"] == 3792
    assert sum(n["type"].startswith("openb-t4") for n in nodes.values()) == 24 and line["pending"] == []
    assert line["model_command"] is not None


def test_the_model_decides_as_the_real_karpenter_did_on_the_states_it_decided_on(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--decisions: seed 2's 37 drains, each against the model's command on the real cluster when the real one
    was computed; the model picks the very nodes in most (76 %; 28 of 37 when measured, docs/benchmarks.md)."""
    monkeypatch.setattr("sys.argv", ["capacity_calibrate.py", "--seeds", "2", "--decisions"])
    assert main() == 0
    line = json.loads(capsys.readouterr().out)
    assert line["drains"] == 37 and line["same"] >= 0.7 * 37, line
    assert len(line["differ"]) == 37 - line["same"]
    assert all(d["real"] for d in line["differ"])


def test_a_bad_ties_count_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["capacity_calibrate.py", "--ties", "0"])
    assert main() == 2
    assert "--ties must be at least 1, got 0" in capsys.readouterr().err
