"""`kubeon-gpu simulate --through-extender`: a short openb replay through the extender, as kube-scheduler calls it.

Real: the CLI, the openb traces (vendor/openb, the first 100 nodes and 600
pods of the default trace and of gpuspec20, whose pods name GPU models),
the extender's Flask app and node model built from Node and Pod objects,
its /filter, /prioritize and /bind handlers, and kube-scheduler's scoring
of the chart's rendered profile (simulator/kubescheduler.py). The FGD
referee is the simulator's FGD on the same trace and seeds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cli.livereplay import DEFAULT_SCHEDULER, pod_object, routing_view
from cli.main import main
from gpupolicy.packing.nodemodel import PodDemand

VENDOR = Path(__file__).resolve().parents[2] / "vendor" / "openb"
SEEDS = (42, 43, 44)


def subset(src: Path, dst: Path, rows: int) -> Path:
    with src.open(newline="") as fh:
        reader = csv.reader(fh)
        kept = [next(reader)] + [row for _, row in zip(range(rows), reader, strict=False)]
    with dst.open("w", newline="") as fh:
        csv.writer(fh).writerows(kept)
    return dst


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["simulate", *args]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("trace", ["default", "gpuspec20"])
def test_kubeon_through_the_extender_allocates_at_least_what_fgd_does(
        trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 100)
    pods = subset(VENDOR / f"openb_pod_list_{trace}.csv", tmp_path / "pods.csv", 600)
    live, fgd = [], []
    for seed in SEEDS:
        placements = tmp_path / f"live-{seed}.csv"
        got = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--seed", str(seed),
                       "--through-extender", "--placements", str(placements))
        assert got["strategy"] == "kubeon+extender" and got["pods"] == sum(1 for _ in placements.open()) - 1
        live.append(float(got["alloc_pct_at_100"]))  # type: ignore[arg-type]
        ref = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--seed", str(seed), "--strategy", "fgd")
        fgd.append(float(ref["alloc_pct_at_100"]))  # type: ignore[arg-type]
    assert sum(live) / len(live) >= sum(fgd) / len(fgd), (live, fgd)


def test_a_bad_scheduler_config_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("kind: ConfigMap\ndata: {}\n")
    nodes = subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 5)
    pods = subset(VENDOR / "openb_pod_list_default.csv", tmp_path / "pods.csv", 5)
    code = main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--through-extender",
                 "--scheduler-config", str(bad)])
    assert code == 2
    assert "no KubeSchedulerConfiguration" in capsys.readouterr().err


def test_the_replay_routes_pods_as_the_webhook_does() -> None:
    """The replay's pods pass the webhook's own mutate_pod: the trace's pods tolerate the GPU taint (they run
    on GPU nodes), so CPU-only pods are routed to the profile as GPU pods are; with the webhook's switch off
    (`--route-cpu-pods-on-gpu-nodes=false`) they stay with the default-scheduler, which calls no extender."""
    cases = {"cpu": PodDemand(cpu_milli=4000, memory_mib=1024), "whole": PodDemand(num_gpu=2, gpu_milli=1000),
             "share": PodDemand(num_gpu=1, gpu_milli=250)}
    for switch, cpu_by in ((True, "kubeon-gpu-scheduler"), (False, DEFAULT_SCHEDULER)):
        view = routing_view("kubeon-gpu-scheduler", route_cpu_pods=switch)
        pods = {k: pod_object(d, i, view) for i, (k, d) in enumerate(cases.items())}
        assert {k: p["spec"]["schedulerName"] for k, p in pods.items()} == {
            "cpu": cpu_by, "whole": "kubeon-gpu-scheduler", "share": "kubeon-gpu-scheduler"}, switch


def test_the_switch_reaches_the_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--route-cpu-pods-on-gpu-nodes` is the live replay's (the simulator routes nothing: a clear error)."""
    nodes = subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 5)
    pods = subset(VENDOR / "openb_pod_list_default.csv", tmp_path / "pods.csv", 5)
    code = main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--route-cpu-pods-on-gpu-nodes", "false"])
    assert code == 2 and "needs --through-extender" in capsys.readouterr().err
