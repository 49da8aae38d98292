"""The openb replay and `kubeon-gpu simulate`: procedure, metrics, placements CSV, error paths.

Real: trace loading, the replay procedure, the packing engine and the CLI
entry point (`cli.main.main`, in process). Faked: the traces are small CSVs
written to tmp_path (a hand-made one with a known optimal packing, and a
seeded random one for the capacity re-check).
"""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from cli.main import main
from gpupolicy.packing.nodemodel import PodDemand
from simulator.replay import arrival_order, replay
from simulator.trace import load_nodes, load_pods

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n")


def write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


@pytest.fixture
def tight_trace(tmp_path: Path) -> tuple[Path, Path]:
    """Two 2-GPU nodes; one 2-GPU pod and four 500m pods: demand == capacity (4 GPUs).

    The only full packing puts the four sharing pods on one node (two per
    GPU) and the 2-GPU pod on the other. Spreading sharing pods over both
    nodes strands the 2-GPU pod.
    """
    nodes = write(tmp_path / "nodes.csv", NODE_HEADER, ["n1,16000,65536,2,T4", "n2,16000,65536,2,T4"])
    pods = write(tmp_path / "pods.csv", POD_HEADER,
                 ["big,4000,8192,2,1000,,LS,Running,0,1,0"]
                 + [f"s{i},1000,2048,1,500,,LS,Running,0,1,0" for i in range(4)])
    return nodes, pods


@pytest.mark.parametrize("strategy", ["kubeon", "fgd"])
def test_fragmentation_aware_strategies_find_the_full_packing(tight_trace: tuple[Path, Path], strategy: str) -> None:
    nodes, pods = (load_nodes(tight_trace[0]), load_pods(tight_trace[1]))
    for seed in range(42, 52):
        result = replay(nodes, pods, strategy, seed, tune=1.0, keep_placements=True)
        assert result.pods == 5
        assert result.alloc_pct_at_100 == pytest.approx(100.0), (seed, result.placements)
        by_node = defaultdict(list)
        for p in result.placements:
            by_node[p.node].append(p.pod.name)
        assert sorted(len(v) for v in by_node.values()) == [1, 4]


def test_arrival_order_tunes_to_target_and_is_seeded() -> None:
    pods = [PodDemand(num_gpu=1, gpu_milli=1000, name=f"p{i}") for i in range(10)]
    import numpy as np

    a = arrival_order(pods, 10_000, 1.3, np.random.default_rng(1))
    b = arrival_order(pods, 10_000, 1.3, np.random.default_rng(1))
    assert [p.name for p in a] == [p.name for p in b]
    assert len(a) == 13 and sum(p.gpu_total_milli for p in a) == 13_000
    assert sorted(p.name for p in a[:10]) == sorted(p.name for p in pods)  # every trace pod first


def _random_trace(tmp_path: Path) -> tuple[Path, Path]:
    rnd = random.Random(7)
    nodes = [f"n{i:02d},{rnd.choice([16000, 32000, 64000])},{rnd.choice([65536, 131072])},"
             f"{rnd.choice([1, 2, 4, 8])},{rnd.choice(['T4', 'V100', 'G2'])}" for i in range(25)]
    pods = []
    for i in range(300):
        kind = rnd.random()
        num, milli = (0, 0) if kind < 0.15 else (1, rnd.choice([100, 250, 460, 500, 810])) if kind < 0.6 else \
            (rnd.choice([1, 1, 2, 4, 8]), 1000)
        spec = rnd.choice(["", "", "", "T4", "V100|G2"])
        pods.append(f"p{i:03d},{rnd.choice([1000, 4000, 8000, 12000])},{rnd.choice([2048, 8192, 16384])},"
                    f"{num},{milli},{spec},LS,Running,0,1,0")
    return write(tmp_path / "n.csv", NODE_HEADER, nodes), write(tmp_path / "p.csv", POD_HEADER, pods)


@pytest.mark.parametrize("strategy", ["kubeon", "fgd", "bestfit", "packing", "dotprod", "random"])
def test_placements_csv_never_overcommits(tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = _random_trace(tmp_path)
    out = tmp_path / "placements.csv"
    assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--strategy", strategy,
                 "--placements", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip())
    assert set(summary) == {"strategy", "seed", "pods", "alloc_pct_at_100", "alloc_pct_at_end",
                            "unallocated_pct_at_100", "seconds"}
    assert summary["strategy"] == strategy and summary["seed"] == 42

    nodes = {n.name: n for n in load_nodes(nodes_csv)}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gpu: dict[tuple[str, int], int] = defaultdict(int)
    placed_milli = 0
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["seq"]) for r in rows] == list(range(summary["pods"]))
    for r in rows:
        if not r["node"]:
            assert r["gpu_indices"] == ""
            continue
        spec, n = nodes[r["node"]], r["node"]
        if r["gpu_spec"]:
            assert spec.model in r["gpu_spec"].split("|")
        cpu[n] += int(r["cpu_milli"])
        mem[n] += int(r["memory_mib"])
        idx = [int(g) for g in r["gpu_indices"].split("|")] if r["gpu_indices"] else []
        assert len(idx) == int(r["num_gpu"]) and len(set(idx)) == len(idx)
        for g in idx:
            assert 0 <= g < spec.gpu_count
            gpu[(n, g)] += int(r["gpu_milli"])
            if int(r["gpu_milli"]) == 1000:
                assert gpu[(n, g)] == 1000  # a whole-GPU pod got a GPU nobody else holds
        placed_milli += int(r["num_gpu"]) * int(r["gpu_milli"])
    for n, used in cpu.items():
        assert used <= nodes[n].cpu_milli and mem[n] <= nodes[n].memory_mib
    assert all(v <= 1000 for v in gpu.values())
    capacity = sum(n.gpu_count for n in nodes.values()) * 1000
    assert summary["alloc_pct_at_end"] == pytest.approx(100.0 * placed_milli / capacity, abs=1e-3)


def test_unknown_strategy_exits_2(tight_trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tight_trace
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "tetris"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tetris" in err and len(err.splitlines()) == 1


def test_missing_column_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,model\n", ["n1,1000,1000,T4"])
    pods = write(tmp_path / "p.csv", POD_HEADER, ["a,1000,1024,1,1000,,LS,Running,0,1,0"])
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods)]) == 2
    err = capsys.readouterr().err.strip()
    assert "'gpu'" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("row", "column"), [("a,1000,1024,x,1000,", "num_gpu"), ("a,1000,1024,2,500,", "gpu_milli")])
def test_bad_value_exits_2_naming_column(tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str,
                                         column: str) -> None:
    nodes = write(tmp_path / "n.csv", NODE_HEADER, ["n1,1000,1000,1,T4"])
    pods = write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n", [row])
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods)]) == 2
    assert f"'{column}'" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", str(tmp_path / "none.csv"), "--pods", str(tmp_path / "p.csv")]) == 2
    assert "none.csv" in capsys.readouterr().err


@pytest.mark.parametrize(("nodes_row", "pods_row", "needle"), [
    ("n1,1000,1000,inf,T4", "a,1000,1024,1,1000,", "n.csv:2: column 'gpu' is not a finite number: 'inf'"),
    ("n1,1000,1000,1e9,T4", "a,1000,1024,1,1000,", "n.csv:2: column 'gpu' is above 256"),
    ("n1,1e300,1000,1,T4", "a,1000,1024,1,1000,", "n.csv:2: column 'cpu_milli' is above 1,000,000,000"),
    ("n1,1000,1000,1,T4", "a,1000,nan,1,1000,", "p.csv:2: column 'memory_mib' is not a finite number"),
    ("n1,1000,1000,1,T4", "a,1000,1024,300,1000,", "p.csv:2: column 'num_gpu' is above 256"),
    ("n1,1000,1000,2.5,T4", "a,1000,1024,1,1000,", "n.csv:2: column 'gpu' is not a whole number: '2.5'"),
    ("n1,1000,1000,1,T4", "a,1000,1024,1.5,1000,", "p.csv:2: column 'num_gpu' is not a whole number: '1.5'"),
    ("n1,1000,1000,1,T4", "a,1000,1024,1," + "9" * 5000 + ",", "p.csv:2: column 'gpu_milli'"),
    ("n1,1000,1000,1,T4", 'a,"' + "x" * 200_000 + '",1024,1,1000,', "p.csv:2: field larger than field limit"),
])
def test_numbers_past_the_bounds_exit_2_naming_row_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              nodes_row: str, pods_row: str, needle: str) -> None:
    nodes = write(tmp_path / "n.csv", NODE_HEADER, [nodes_row])
    pods = write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n", [pods_row])
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and len(err) < 300, err


def test_a_trace_that_is_not_utf8_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = write(tmp_path / "n.csv", NODE_HEADER, ["n1,1000,1000,1,T4"])
    pods = tmp_path / "p.csv"
    pods.write_bytes("name,cpu_milli,memory_mib,num_gpu,gpu_milli\ncaf\xe9,1,1,0,0\n".encode("latin-1"))
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods)]) == 2
    assert f"{pods}: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "needle"), [
    (["--tune", "inf"], "--tune must be positive and at most 100"),
    (["--tune", "nan"], "--tune must be positive and at most 100"),
    (["--tune", "0"], "--tune must be positive and at most 100"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
])
def test_replay_flags_out_of_range_exit_2(tight_trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                          flags: list[str], needle: str) -> None:
    nodes, pods = tight_trace
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_arrival_order_refuses_an_endless_tune() -> None:
    import numpy as np

    with pytest.raises(ValueError, match="--tune"):
        arrival_order([PodDemand(1, 1, 1, 1000, name="a")], 1000, float("inf"), np.random.default_rng(0))


def test_multigpu_list_without_gpu_spec_loads_with_any_model(tmp_path: Path) -> None:
    """The published multigpu lists have only name,cpu_milli,memory_mib,num_gpu,gpu_milli."""
    path = tmp_path / "multigpu.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nm-0,8000,16384,2,1000\nm-1,4000,8192,1,250\n")
    pods = load_pods(path)
    assert [(p.num_gpu, p.gpu_milli, p.allowed_models) for p in pods] == [(2, 1000, None), (1, 250, None)]
