"""Fit rules, rejection reasons, incremental node updates and the typical mix.

Real: NodeState, fit, TypicalMix, OnlineMix. Faked: nothing.
"""

from __future__ import annotations

import pytest

from gpupolicy.packing.nodemodel import NodeSpec, NodeState, PodDemand
from gpupolicy.packing.placement import RejectReason, fit
from gpupolicy.packing.typicalmix import OnlineMix, TypicalMix
from tests.packing.builders import make_pod, make_state


def _reason(state: NodeState, pod: PodDemand, node: int = 0) -> RejectReason:
    return fit(state, pod).reason(node)


@pytest.mark.parametrize(
    ("gpus", "pod", "expected"),
    [
        pytest.param([1000, 1000], make_pod(gpus=2), RejectReason.FITS, id="two-free-gpus"),
        pytest.param([1000, 999], make_pod(gpus=2), RejectReason.INSUFFICIENT_WHOLE_GPUS, id="whole-needs-full"),
        pytest.param([300, 0], make_pod(gpus=1, milli=300), RejectReason.FITS, id="share-exact"),
        pytest.param([299, 0], make_pod(gpus=1, milli=300), RejectReason.INSUFFICIENT_GPU_SHARE, id="share-short"),
        pytest.param([200, 200], make_pod(gpus=1, milli=300), RejectReason.INSUFFICIENT_GPU_SHARE,
                     id="share-not-summed-across-gpus"),
        pytest.param([0, 0], make_pod(gpus=0), RejectReason.FITS, id="cpu-only-on-full-node"),
        pytest.param([1000], make_pod(gpus=1, spec="V100M16|V100M32"), RejectReason.GPU_MODEL, id="model"),
        pytest.param([1000], make_pod(gpus=1, cpu=8001), RejectReason.INSUFFICIENT_CPU, id="cpu"),
        pytest.param([1000], make_pod(gpus=1, mem=8193), RejectReason.INSUFFICIENT_MEMORY, id="memory"),
    ],
)
def test_fit_rules(gpus: list[int], pod: PodDemand, expected: RejectReason) -> None:
    state = make_state([("A", 8000, 8192, gpus, "T4")])
    assert _reason(state, pod) is expected


def test_no_gpu_node_and_unschedulable() -> None:
    state = NodeState.build([NodeSpec("cpu", 8000, 8192), NodeSpec("g", 8000, 8192, 1, "T4")])
    assert _reason(state, make_pod(gpus=1), 0) is RejectReason.NO_GPU
    state.schedulable[1] = False
    assert _reason(state, make_pod(gpus=1), 1) is RejectReason.UNSCHEDULABLE


def test_mig_and_shared_counts() -> None:
    state = NodeState.build([NodeSpec("m", 8000, 8192, 0, "A100", mig={"nvidia.com/mig-1g.10gb": 2}, shared=1)])
    mig = PodDemand(cpu_milli=100, mig={"nvidia.com/mig-1g.10gb": 2})
    assert _reason(state, mig) is RejectReason.FITS
    assert _reason(state, PodDemand(mig={"nvidia.com/mig-3g.40gb": 1})) is RejectReason.INSUFFICIENT_MIG
    state.place(0, mig)
    assert _reason(state, mig) is RejectReason.INSUFFICIENT_MIG
    assert _reason(state, PodDemand(shared=1)) is RejectReason.FITS
    assert _reason(state, PodDemand(shared=2)) is RejectReason.INSUFFICIENT_SHARED


def test_place_and_remove_update_summaries() -> None:
    state = make_state([("A", 8000, 8192, [1000, 1000, 1000], "T4")])
    share = make_pod(gpus=1, milli=300, cpu=1000)
    state.place(0, share, (1,))
    assert state.gpu_free[0].tolist() == [1000, 700, 1000]
    assert (state.full_count[0], state.max_partial[0], state.gpu_free_total[0]) == (2, 700, 2700)
    assert state.cpu_free[0] == 7000
    with pytest.raises(ValueError):
        state.place(0, make_pod(gpus=1, milli=800), (1,))  # GPU 1 has only 700m
    assert state.gpu_free[0].tolist() == [1000, 700, 1000]  # a failed place changes nothing
    state.remove(0, share, (1,))
    assert (state.full_count[0], state.max_partial[0], state.cpu_free[0]) == (3, 0, 8000)
    copy = state.copy()
    copy.place(0, make_pod(gpus=3), (0, 1, 2))
    assert state.full_count[0] == 3 and copy.full_count[0] == 0


def test_typical_mix_keeps_most_common_until_95_percent() -> None:
    pods = [make_pod(gpus=1)] * 60 + [make_pod(gpus=0)] * 36 + [make_pod(gpus=8)] * 4
    mix = TypicalMix.from_pods(pods)
    assert len(mix) == 2  # 60% + 36% = 96% >= 95%: the 8-GPU group is dropped
    assert mix.weight.tolist() == pytest.approx([60 / 96, 36 / 96])
    assert mix.num_gpu.tolist() == [1, 0]


def test_online_mix_follows_recent_pods() -> None:
    online = OnlineMix(decay=0.9)
    for _ in range(50):
        online.observe(make_pod(gpus=1))
    for _ in range(50):
        online.observe(make_pod(gpus=2))
    mix = online.mix()
    assert mix.num_gpu[0] == 2 and mix.weight[0] > 0.95


def test_truncated_mix_matches_a_mix_built_with_that_coverage() -> None:
    pods = [make_pod(gpus=1)] * 60 + [make_pod(gpus=0)] * 36 + [make_pod(gpus=8)] * 4
    full = TypicalMix.from_pods(pods, coverage=1.0)
    assert len(full) == 3  # the context carries every group ...
    cut = full.truncated(0.95)  # ... and FGD keeps the paper's 95%
    direct = TypicalMix.from_pods(pods)
    assert cut.num_gpu.tolist() == direct.num_gpu.tolist() == [1, 0]
    assert cut.weight.tolist() == pytest.approx(direct.weight.tolist())
    assert full.truncated(1.0) is full
