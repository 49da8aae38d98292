"""GPU capacity against the real Karpenter (bench/capacity_live.py, issue 40): a 3-minute scenario on a small
NodePool, each arm on its own fresh cluster (real Karpenter v1.9.0 with its KWOK provider; the kubeon arm
with the chart's webhook, extender, second scheduler and controller). The events each arm writes are
replayed here, by code of this file alone, against the scenario and the catalog.
"""

from __future__ import annotations

import csv
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from bench.capacity_live import main
from tests.cluster.karpenter import INSTANCES

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SMALL = ("openb-p100-1g-8c-60gi", "openb-p100-2g-16c-120gi", "openb-t4-2g-104c-512gi", "openb-v100m16-4g-32c-128gi")


def small_catalog(path: Path) -> dict[str, tuple[int, float]]:
    with INSTANCES.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["instance_type"] in SMALL]
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    return {r["instance_type"]: (int(r["gpus"]), float(r["price_per_hour"])) for r in rows}


@pytest.mark.first  # about seven minutes: started first, beside the rest of the suite
@pytest.mark.timeout(1200)  # two arms of 3 minutes at once, each with its cluster's start and its capacity's tail
def test_three_minutes_of_gpu_workloads_cost_less_with_kubeon_than_with_karpenter_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = tmp_path / "instances.csv"
    types = small_catalog(catalog)
    monkeypatch.setenv("KUBEON_GPU_INSTANCE_TYPES", str(catalog))  # the bench sets it; put back after
    scenario, prefix = tmp_path / "scenario.csv", tmp_path / "run"
    assert main(["--minutes", "3", "--workloads", "12", "--seed", "0", "--instances", str(catalog),
                 "--max-gpus", "16", "--events", str(prefix), "--scenario", str(scenario), "--parallel"]) == 0
    lines = {d["arm"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    karpenter, kubeon = lines["karpenter"], lines["kubeon"]
    for line in (karpenter, kubeon):
        assert line["pods_never_placed"] == 0, line
        assert line["nodeclaims_left"] == 0 and line["nodes_cordoned_left"] == 0, line
        cost = replay(Path(f"{prefix}-{line['arm']}.csv"), scenario, types)
        assert cost == pytest.approx(line["cost"], abs=0.002), line
        # Karpenter's own log is kept beside the events, to read its decisions next to them
        assert "launched nodeclaim" in Path(f"{prefix}-{line['arm']}-karpenter.log").read_text(), line
    assert kubeon["cost"] <= karpenter["cost"], (kubeon, karpenter)
    # issue 40's bound on evictions is kubeon's; real Karpenter alone is only measured (its consolidation moved
    # one scenario pod 4 times in a CI run: evicted, placed on a new node, consolidated again)
    assert kubeon["max_evictions_per_pod"] <= 3, kubeon
    # never fighting Karpenter: no pod bound to a node we drain, none Karpenter evicts just after we placed it
    assert kubeon["pods_placed_on_draining_nodes"] == 0 and kubeon["karpenter_evictions_within_a_minute"] == 0
    assert set(lines["simulator"]["strategies"]) == {"karpenter", "kubeon"}


def test_a_scenario_the_gpu_limit_cannot_serve_is_refused_before_any_cluster_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 30-minute default scenario under the CI test's 16 GPUs: seed 0 asks 38.5 GPU-hours, 16 GPUs hold 24
    in the run's 90 minutes, so both arms would leave pods unplaced after 90 minutes of machine time."""
    catalog = tmp_path / "instances.csv"
    small_catalog(catalog)
    started = time.monotonic()
    assert main(["--minutes", "30", "--seed", "0", "--instances", str(catalog), "--max-gpus", "16"]) == 2
    err = capsys.readouterr().err
    assert "--max-gpus 16" in err and "asks 38.5 GPU-hours" in err and "use --max-gpus 26 or more" in err, err
    assert time.monotonic() - started < 30


def replay(events: Path, scenario: Path, types: dict[str, tuple[int, float]]) -> float:
    """Replay one arm's events: no node holds more GPUs than its type has (no GPU index twice, none past its
    GPUs), no pod lands on a node before it is ready or after it is deleted, no node is deleted with a pod on
    it, every scenario pod ran its full duration (each replica, a Deployment of its own named as its row,
    finished that long after it was placed) and nothing is left running. Returns the cost recomputed from the
    events."""
    with scenario.open(newline="") as fh:
        wanted = {r["name"]: float(r["deletion_time"]) - float(r["creation_time"]) for r in csv.DictReader(fh)}
    with events.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    launched: dict[str, float] = {}
    ready: dict[str, float] = {}
    deleted: dict[str, float] = {}
    kind: dict[str, str] = {}
    on: dict[str, dict[str, list[str]]] = defaultdict(dict)  # node -> pod -> GPU entries
    placed: dict[str, float] = {}
    ran: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        t, node, pod = float(r["time"]), r["node"], r["pod"]
        if r["event"] == "launch":
            launched[node], kind[node] = t, r["instance_type"]
        elif r["event"] == "ready":
            assert node in launched and t >= launched[node], r
            ready[node] = t
        elif r["event"] == "delete":
            assert not on[node], f"node {node} deleted at {t} with pods {sorted(on[node])}"
            deleted[node] = t
        elif r["event"] == "place":
            assert node in ready and ready[node] <= t and node not in deleted, f"{pod} on {node} at {t}: not ready"
            gpus = r["gpus"].split("|")
            on[node][pod] = gpus
            held = [g for entries in on[node].values() for g in entries]
            assert len(held) <= types[kind[node]][0], f"{node} holds {len(held)} GPUs at {t}"
            indexes = [g.split(":")[0] for g in held if not g.startswith("*")]
            assert len(indexes) == len(set(indexes)) and all(int(i) < types[kind[node]][0] for i in indexes), r
            placed[pod] = t
        else:  # finish or evict
            assert on[node].pop(pod, None) is not None, r
            if r["event"] == "finish":
                ran[pod.split("/")[0]].append(t - placed[pod])
    assert not any(on.values()), {n: sorted(p) for n, p in on.items() if p}
    for replica, duration in wanted.items():
        assert ran[replica] and max(ran[replica]) >= duration - 1e-6, (replica, ran[replica], duration)
    assert set(deleted) == set(launched), "NodeClaims left at the end"
    return sum(types[kind[n]][1] * (deleted[n] - launched[n]) / 3600 for n in launched)
