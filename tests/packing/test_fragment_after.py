"""FGD's closed-form fragment after a placement, and kubeon's CPU-fed copies, on hand-worked node states.

Real: the packing engine (fit rules, FragModel, Kubeon, decide). Faked:
nothing; node states and the typical mix are built by hand with the builders.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.fragmentation import FragModel, frag_model, sigmoid_score
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.builders import make_pod, make_state


@pytest.mark.parametrize("pod", [make_pod(gpus=1, milli=470, cpu=1000), make_pod(gpus=2, cpu=1000),
                                 make_pod(gpus=0, cpu=3000)])
def test_after_matches_a_fresh_model_of_the_placed_state(pod: object) -> None:
    # The closed-form F_after of every candidate (each node; each usable GPU of a sharing pod)
    # equals a model rebuilt from the state after placing.
    mix = TypicalMix.from_pods([make_pod(gpus=1, milli=m, cpu=c) for m, c in
                                ((320, 1000), (470, 2000), (810, 500), (1000, 4000))] + [make_pod(gpus=2)])
    rows = [("A", 8000, 8192, [680, 1000, 190, 1000], "T4"), ("B", 4000, 8192, [530, 1000, 1000, 0], "T4")]
    state = make_state(rows)
    model = FragModel(state, mix)
    nodes = np.arange(len(state))
    f_after, pos, gpu = model.after(pod, nodes)  # type: ignore[arg-type]
    for f, p, g in zip(f_after, pos, gpu, strict=True):
        placed = make_state(rows)
        indices = (int(g),) if g >= 0 else tuple(int(i) for i in np.flatnonzero(placed.gpu_free[p] == 1000)[
            :pod.num_gpu if pod.gpu_total_milli else 0])  # type: ignore[attr-defined]
        placed.place(int(p), pod, indices)  # type: ignore[arg-type]
        assert FragModel(placed, mix).frag[p] == pytest.approx(f)


def _cpu_case() -> tuple:
    mix = TypicalMix.from_pods([make_pod(gpus=1, cpu=4000)], coverage=1.0)
    state = make_state([("A", 8000, 8192, [1000, 1000], "T4"), ("B", 16000, 8192, [1000, 1000], "T4")])
    return mix, state, make_pod(gpus=0, cpu=4000)


def _scores(model: FragModel, pod: object) -> list[float]:
    nodes = np.arange(len(model.state))
    f_after, _, _ = model.after(pod, nodes)  # type: ignore[arg-type]
    return sigmoid_score(model.frag[nodes] - f_after).tolist()


def test_the_copies_fragment_counts_gpus_the_free_cpu_can_no_longer_feed() -> None:
    # Mix: 1-GPU pods asking 4 cores. A and B each have 2 free GPUs; A has 8 cores, B 16.
    # A CPU-only pod of 4 cores: FGD sees no fragment change on either (both can still host
    # a typical pod) -> 50 and 50, A first in the order. The copies fragment blended in at
    # 0.25 counts the GPUs the node's CPU can no longer feed: on A only one 4-core pod fits
    # afterwards, so one GPU (1000m) is stranded -> delta -250 -> int(100*sigmoid(-0.25)) = 43;
    # B can still feed three -> 50. kubeon blends it in and takes B, leaving A's cores to A's GPUs.
    mix, state, pod = _cpu_case()
    fgd = decide(state, pod, get_strategy("fgd"), PackingContext(mix=mix))
    ours = decide(state, pod, get_strategy("kubeon"), PackingContext(mix=mix))
    assert state.names[fgd.node] == "A" and fgd.scores.tolist() == [50.0, 50.0]
    assert state.names[ours.node] == "B" and ours.scores.tolist() == [43.0, 50.0]
    assert _scores(FragModel(state, mix, copies=True, copies_weight=0.25), pod) == [43.0, 50.0]


def test_fragment_models_with_different_flags_do_not_share_a_cache_entry() -> None:
    # Same context, same mix, same cache key: the plain and the copies-blended fragment must
    # each be their own model (the scores of the CPU test above, in either order).
    mix, state, pod = _cpu_case()
    ctx = PackingContext(mix=mix)
    assert _scores(frag_model(state, ctx, mix, key="k"), pod) == [50.0, 50.0]
    assert _scores(frag_model(state, ctx, mix, key="k", copies=True, copies_weight=0.25), pod) == [43.0, 50.0]
    assert _scores(frag_model(state, ctx, mix, key="k"), pod) == [50.0, 50.0]
