"""Pods pinned to a GPU model: a flexible pod leaves the GPU a model-restricted pod needs (issue 41).

Real: the packing engine's production decision (`decide`, `Kubeon`, the
typical mix) on hand-built states; the extender's Flask app, its node model
built from Node and Pod objects, its /filter (which learns pending GPU pods
into the mix, restrictions included) and /prioritize. Faked: nothing; the
watch is fed by hand (tests/extender/payloads.py).

The case: two one-GPU nodes, an H100 listed first (it wins ties) and an
A100; one pod in 30 of the workload may run only on an H100, the others
anywhere. A flexible pod arrives first. Without a notion of model scarcity
the two nodes tie and the flexible pod takes the H100, so the restricted
pod that follows fits nowhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.parts import without as ablated
from gpupolicy.packing.engine import commit, decide
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.strategies.kubeon import Kubeon
from gpupolicy.packing.strategies.modelscarcity import model_scarcity
from gpupolicy.packing.typicalmix import TypicalMix
from tests.cluster.objects import make_node, required_node_affinity
from tests.extender.payloads import Harness, bound, policy, wire_pod
from tests.packing.builders import make_pod, make_state

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
PINNED = make_pod(1, spec=H100, name="pinned")
FLEXIBLE = make_pod(1, name="flexible")
# the full mix, as contexts carry it; the pinned type is 3.3% of it, below FGD's 95% cut
MIX = TypicalMix.from_pods([PINNED] + [FLEXIBLE] * 29, 1.0)


def two_models() -> NodeState:
    return make_state([("h", 64000, 65536, [1000], H100), ("a", 64000, 65536, [1000], A100)])


def test_scarcity_is_what_restricted_types_want_per_gpu_against_the_whole_mix() -> None:
    # Demand per pod 1000 over 2 GPUs: 500 per GPU. The pinned type wants 1000 / 30 from the one H100:
    # 33.3 per GPU, scarcity 1 / 15; nobody needs the A100 in particular (models sorted: A100, H100).
    assert two_models().models == (A100, H100)
    assert model_scarcity(two_models(), MIX).tolist() == pytest.approx([0.0, 1 / 15])
    assert model_scarcity(two_models(), TypicalMix.from_pods([FLEXIBLE, make_pod(1, milli=500)])).tolist() == [0, 0]


def test_the_flexible_pod_leaves_the_h100_and_the_pinned_pod_still_fits() -> None:
    # Flexible pod on h: the fragment does not move (both types fit h before, nothing is free after);
    # scarcity takes 0.3 x 1000 x 1/15 = 20: int(100 sigmoid(-0.02)) = 49. On a: the A100 was fragment for
    # the pinned type (1/30 of 1000), now taken: int(100 sigmoid(0.033)) = 50.
    state, ctx = two_models(), PackingContext(mix=MIX)
    first = decide(state, FLEXIBLE, Kubeon(), ctx)
    assert state.names[first.node] == "a" and first.scores.tolist() == [49.0, 50.0]
    commit(state, FLEXIBLE, first)
    second = decide(state, PINNED, Kubeon(), ctx)
    assert second.node is not None and state.names[second.node] == "h"


@pytest.mark.parametrize("part", ["model-scarcity", "restricted-types"])
def test_without_either_part_the_flexible_pod_takes_the_h100_and_the_pinned_pod_fails(part: str) -> None:
    state, ctx = two_models(), PackingContext(mix=MIX)
    strategy = ablated(Kubeon(), part)
    first = decide(state, FLEXIBLE, strategy, ctx)
    assert state.names[first.node] == "h" and first.scores.tolist() == [50.0, 50.0]
    commit(state, FLEXIBLE, first)
    assert decide(state, PINNED, strategy, ctx).node is None


def learned(h: Harness, pinned: dict[str, Any], flexible: dict[str, Any]) -> None:
    """The extender sees the workload's pods pending (/filter learns them into its mix), 1 pinned in 30."""
    for i in range(30):
        pod = dict(pinned if i == 0 else flexible)
        pod = {**pod, "metadata": {**pod["metadata"], "name": f"seen-{i}", "uid": f"uid-seen-{i}"}}
        h.filter(pod, NAMES)
    # none of them is bound here: the pinned one, which passed /filter on the H100 alone, was assumed there
    # (kube-scheduler binds such a pod without /prioritize); never bound, its assumption expires
    h.now += 31


NAMES = ["gpu-1-h100", "gpu-2-a100"]  # row order: the H100 node first


def cluster() -> list[dict[str, Any]]:
    return [make_node("gpu-1-h100", H100, 1), make_node("gpu-2-a100", A100, 1)]


def pinned_by_affinity(name: str) -> dict[str, Any]:
    return wire_pod(name, "ml", gpus=1, affinity=required_node_affinity(
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}))


@pytest.mark.parametrize("how", ["node affinity", "typeFit gpuModels policy"])
def test_through_the_extender_the_flexible_pod_leaves_the_h100(how: str) -> None:
    if how == "node affinity":
        h = Harness(cluster())
        pinned = pinned_by_affinity("pinned")
    else:  # our own typeFit policy pins the pods of namespace "pinned" to the H100
        h = Harness(cluster(), policies=[policy("h100-only", {"typeFit": {"allowedModels": [H100]}},
                                                selector={"namespaces": ["pinned"]})])
        pinned = wire_pod("pinned", "pinned", gpus=1)
    flexible = wire_pod("flexible", "ml", gpus=1)
    learned(h, pinned, flexible)
    assert h.cache.mix_in_force() is not None
    chosen = h.schedule(flexible, NAMES)
    assert chosen == "gpu-2-a100"
    h.cache.on_pod("ADDED", bound(flexible, chosen))
    assert h.schedule(pinned, NAMES) == "gpu-1-h100"
