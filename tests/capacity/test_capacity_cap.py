"""bench/capacity_cap.py: our Karpenter model with `karpenter.sh/do-not-disrupt` on pods at the eviction cap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from capacity_cap import DoNotDisrupt, interrupted_gpu_hours

from simulator.capacity_baselines import Karpenter
from tests.capacity.test_baselines import HOUR, P100X1, T4X4, pod, replay

BENCH = Path(__file__).resolve().parents[2] / "bench" / "capacity_cap.py"


def evictions_per_pod(events: list[tuple[float, str, str, str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, event, _, _, name in events:
        if event == "evict":
            out[name] = out.get(name, 0) + 1
    return out


def test_a_pod_at_the_cap_pins_its_node_and_empty_nodes_still_go() -> None:
    # 1-GPU pods arriving apart each get a P100 node; the model then replaces pairs by T4x4 nodes, moving pods
    pods = [pod(f"p{i:02}", 600 * i, 30 * HOUR) for i in range(20)]
    free = evictions_per_pod(replay(Karpenter(instance_types=[T4X4, P100X1]), pods))
    assert free and max(free.values()) == 2  # some pods move twice uncapped
    once = evictions_per_pod(replay(DoNotDisrupt(instance_types=[T4X4, P100X1], cap=1), pods))
    assert once and max(once.values()) == 1  # moved once, then its node is no candidate
    never = replay(DoNotDisrupt(instance_types=[T4X4, P100X1], cap=0), pods)
    assert not evictions_per_pod(never)
    assert sum(1 for _, e, *_ in never if e == "delete") == 20  # emptied nodes are still deleted


def test_bad_options_exit_2_with_a_message() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--variants", "loose"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--variants from uncapped, do-not-disrupt, strict, kubeon" in done.stderr
    bad = subprocess.run([sys.executable, str(BENCH), "--seeds", "x-y"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--seeds N, N-M" in bad.stderr and "Traceback" not in bad.stderr


def test_interrupted_work_is_each_evicted_pods_time_on_its_node_times_its_gpus() -> None:
    events: list[tuple[object, ...]] = [
        ("0.000", "place", "n1", "t4x4", "a", "0:1000|1:1000"),  # 2 GPUs for an hour, then evicted
        ("0.000", "place", "n1", "t4x4", "b", "2:500"),  # half a GPU, finishes: nothing interrupted
        ("3600.000", "evict", "n1", "t4x4", "a", ""),
        ("3600.000", "place", "n2", "t4x4", "a", "0:1000|1:1000"),
        ("5400.000", "evict", "n2", "t4x4", "a", ""),  # half an hour more on n2
        ("7200.000", "finish", "n1", "t4x4", "b", ""),
    ]
    assert interrupted_gpu_hours(events) == 2 * 1.0 + 2 * 0.5
