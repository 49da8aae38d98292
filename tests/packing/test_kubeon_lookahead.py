"""kubeon's typical-mix rules and the modular look-ahead fragment, on hand-worked node states.

Real: the packing engine (fit rules, FragModel, Kubeon, decide). Faked:
nothing; node states and the typical mix are built by hand with the builders.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.fragmentation import FragModel, frag_model, sigmoid_score
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.strategies.kubeon import Kubeon
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.builders import make_pod, make_state


def test_kubeon_keeps_rare_model_restricted_types_and_spares_their_gpus() -> None:
    # Mix: 20 unrestricted 1-GPU pods and 1 V100-only pod (1/21 < 5%: FGD's 95% cut drops it).
    # A (V100) and B (T4) are empty twins. An unrestricted 1-GPU pod changes no fragment of
    # the unrestricted type on either node (delta 0 -> score 50, tie, A first in the order).
    # With the V100-only type kept, B's free GPUs are all fragment for it (it cannot run on a
    # T4), so taking one of B's lowers F by 1000/21: score int(100*sigmoid(0.048)) = 51 on B
    # against 50 on A. kubeon takes B and leaves the V100s to the pod that can only use them.
    # (Its model pressure agrees: the V100 type wants 1000/21 from 2 V100 GPUs, 23.8 per GPU,
    # against the mix's 1000 over 4 GPUs, 250 per GPU: pressure 0.095, and A's change loses
    # 0.3 x 1000 x 0.095 = 29: 49.)
    mix = [make_pod(gpus=1, cpu=0, name=f"u{i}") for i in range(20)] + [make_pod(gpus=1, cpu=0, spec="V100")]
    state = make_state([("A", 8000, 8192, [1000, 1000], "V100"), ("B", 8000, 8192, [1000, 1000], "T4")])
    pod = make_pod(gpus=1)
    assert len(TypicalMix.from_pods(mix).truncated(0.95)) == 1
    full = TypicalMix.from_pods(mix, coverage=1.0)  # contexts carry the full mix; policies cut it
    old = decide(state, pod, Kubeon().without("spec-types"), PackingContext(mix=full))
    new = decide(state, pod, get_strategy("kubeon"), PackingContext(mix=full))
    assert state.names[old.node] == "A" and old.scores.tolist() == [50.0, 50.0]
    assert state.names[new.node] == "B" and new.scores.tolist() == [49.0, 51.0]


def test_modular_fragment_counts_what_one_type_leaves_unfilled() -> None:
    # Type 320m: a GPU with 680m free takes two of them and keeps 40m (680 % 320); a fully
    # free GPU takes three and keeps 40m. FGD's threshold fragment sees 0 on both.
    mix = TypicalMix.from_pods([make_pod(gpus=1, milli=320, cpu=0)])
    state = make_state([("A", 8000, 8192, [680, 1000], "T4")])
    assert FragModel(state, mix).frag.tolist() == [0.0]
    assert FragModel(state, mix, modular=True).frag.tolist() == [80.0]


@pytest.mark.parametrize("pod", [make_pod(gpus=1, milli=470, cpu=1000), make_pod(gpus=2, cpu=1000),
                                 make_pod(gpus=0, cpu=3000)])
def test_modular_after_matches_a_fresh_model_of_the_placed_state(pod: object) -> None:
    # The closed-form F_after of every candidate equals a model rebuilt from the state after placing.
    mix = TypicalMix.from_pods([make_pod(gpus=1, milli=m, cpu=c) for m, c in
                                ((320, 1000), (470, 2000), (810, 500), (1000, 4000))] + [make_pod(gpus=2)])
    rows = [("A", 8000, 8192, [680, 1000, 190, 1000], "T4"), ("B", 4000, 8192, [530, 1000, 1000, 0], "T4")]
    state = make_state(rows)
    model = FragModel(state, mix, modular=True)
    nodes = np.arange(len(state))
    f_after, pos, gpu = model.after(pod, nodes)  # type: ignore[arg-type]
    for f, p, g in zip(f_after, pos, gpu, strict=True):
        placed = make_state(rows)
        indices = (int(g),) if g >= 0 else tuple(int(i) for i in np.flatnonzero(placed.gpu_free[p] == 1000)[
            :pod.num_gpu if pod.gpu_total_milli else 0])  # type: ignore[attr-defined]
        placed.place(int(p), pod, indices)  # type: ignore[arg-type]
        assert FragModel(placed, mix, modular=True).frag[p] == pytest.approx(f)


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
