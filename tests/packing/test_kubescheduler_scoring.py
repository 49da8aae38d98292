"""kube-scheduler's scoring arithmetic as emulated (simulator/kubescheduler.py), against hand-worked upstream values.

Real: the emulation and upstream's integer formulas (kubernetes v1.35
noderesources least/most_allocated, requested_to_capacity_ratio,
balanced_allocation; schedule_one.go numFeasibleNodesToFind). Faked: nothing;
nodes and pods are literal dicts.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.kubescheduler import ClusterScores, Profile, num_nodes_to_find
from tests.cluster.objects import make_node, make_pod


def cluster() -> ClusterScores:
    nodes = [make_node("a", None, 0, cpu="10", memory="100Gi"), make_node("b", None, 0, cpu="10", memory="100Gi")]
    scores = ClusterScores(nodes)
    scores.add(make_pod("busy", cpu="6", memory="20Gi"), "a")
    return scores


def profile(strategy: str, **extra: object) -> Profile:
    args: dict[str, object] = {"type": strategy, "resources": [{"name": "cpu", "weight": 1},
                                                                {"name": "memory", "weight": 1}]}
    args.update(extra)
    return Profile.from_config({"profiles": [{"schedulerName": "s", "plugins": {"score": {"disabled": [
        {"name": "NodeResourcesBalancedAllocation"}, {"name": "TaintToleration"}, {"name": "NodeAffinity"}]}},
        "pluginConfig": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": args}}]}]})


POD = make_pod("p", cpu="2", memory="10Gi")


def test_least_allocated() -> None:
    # upstream integer arithmetic. a: cpu (10-8)*100/10 = 20, memory (100-30)*100/100 = 70 -> 45; b: 80, 90 -> 85
    assert cluster().score(POD, np.array([0, 1]), profile("LeastAllocated")).tolist() == [45, 85]


def test_most_allocated() -> None:
    assert cluster().score(POD, np.array([0, 1]), profile("MostAllocated")).tolist() == [55, 15]


def test_requested_to_capacity_ratio_shape() -> None:
    shape = {"requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0}, {"utilization": 100,
                                                                                     "score": 10}]}}
    assert cluster().score(POD, np.array([0, 1]), profile("RequestedToCapacityRatio", **shape)).tolist() == [55, 15]


def test_balanced_allocation_and_default_weights() -> None:
    default = Profile.from_config({"profiles": [{"schedulerName": "s"}]})
    # a: fractions .8/.3 -> std .25 -> 75; b: .2/.1 -> 95. Fit 45/85, taints (none) 100 x 3, affinity 0.
    assert cluster().score(POD, np.array([0, 1]), default).tolist() == [45 + 75 + 300, 85 + 95 + 300]


@pytest.mark.parametrize("percentage, nodes, want", [(0, 50, 50), (0, 1213, 497), (0, 5000, 500),
                                                     (100, 1213, 1213), (10, 500, 100)])
def test_nodes_to_find(percentage: int, nodes: int, want: int) -> None:
    assert num_nodes_to_find(percentage, nodes) == want
