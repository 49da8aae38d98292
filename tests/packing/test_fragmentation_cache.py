"""FragModel keeps F_after per pod shape and recomputes only the rows that moved: same values as a fresh model."""

from __future__ import annotations

import numpy as np

from gpupolicy.packing.fragmentation import SHAPES_KEPT, FragModel, frag_model
from gpupolicy.packing.placement import PackingContext, to_gpu_indices
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.builders import make_pod, make_state


def _cluster() -> tuple:
    state = make_state([(f"n{i}", 32_000 + 1000 * i, 256_000, [1000] * 8, "A100") for i in range(6)])
    mix = TypicalMix.from_pods([make_pod(1), make_pod(2, cpu=8000), make_pod(1, milli=500), make_pod(0, cpu=4000)])
    return state, mix


def test_cached_f_after_follows_placements_and_matches_a_fresh_model() -> None:
    state, mix = _cluster()
    model = FragModel(state, mix, use_memory=True, copies=True, copies_weight=0.25)
    nodes = np.arange(len(state))
    pod = make_pod(2, cpu=8000)
    first, _, _ = model.after(pod, nodes)
    # the pod lands on node 3: its F_after for the same shape must change, the others must not
    state.place(3, pod, to_gpu_indices(state, 3, pod, -1))
    model.sync()
    second, _, _ = model.after(pod, nodes)
    assert second[3] != first[3]
    np.testing.assert_array_equal(np.delete(second, 3), np.delete(first, 3))
    fresh, _, _ = FragModel(state, mix, use_memory=True, copies=True, copies_weight=0.25).after(pod, nodes)
    np.testing.assert_allclose(second, fresh, rtol=0, atol=1e-9)


def test_a_subset_of_nodes_reads_the_same_values_and_shapes_are_bounded() -> None:
    state, mix = _cluster()
    model = FragModel(state, mix)
    all_nodes, _, _ = model.after(make_pod(1), np.arange(len(state)))
    some, _, _ = model.after(make_pod(1), np.array([4, 1]))
    np.testing.assert_array_equal(some, all_nodes[[4, 1]])
    for cpu in range(1, SHAPES_KEPT + 10):
        model.after(make_pod(1, cpu=cpu), np.arange(len(state)))
    assert len(model._after_by_shape) == SHAPES_KEPT


def test_context_keeps_a_derived_value_until_an_input_is_another_object() -> None:
    ctx = PackingContext()
    builds: list[int] = []
    state, mix = _cluster()
    first, second = state, _cluster()[0]
    for node_state in (first, first, second, first):
        ctx.derived("feed", (mix, node_state), lambda: builds.append(1) or len(builds))
    assert len(builds) == 3  # first, second, first again: the equal twin still counts as new


def test_copies_that_diverge_fork_the_model_and_each_matches_a_fresh_one() -> None:
    # consolidation simulates on copies: the context's model forks onto each copy; two copies changed in
    # different ways share no stale row (row versions are unique across states)
    state, mix = _cluster()
    ctx = PackingContext(mix=mix)
    pod = make_pod(2, cpu=8000)
    nodes = np.arange(len(state))
    frag_model(state, ctx).after(pod, nodes)
    left, right = state.copy(), state.copy()
    left.place(3, pod, to_gpu_indices(left, 3, pod, -1))
    right.place(3, make_pod(1, milli=500), (0,))
    for twin in (left, right, state, left):
        model = frag_model(twin, ctx)
        assert model.state is twin
        got, _, _ = model.after(pod, nodes)
        fresh, _, _ = FragModel(twin, mix).after(pod, nodes)
        np.testing.assert_allclose(got, fresh, rtol=0, atol=1e-9)
        np.testing.assert_allclose(model.frag, FragModel(twin, mix).frag, rtol=0, atol=1e-9)


def test_a_new_mix_computes_only_the_rows_a_decision_reads_and_the_same_values() -> None:
    """The extender's typical mix changes every 30 s: the model for it computes the rows read (a decision's
    candidates), the others when read later, each with the values a model computing every row has."""
    state = make_state([(f"n{i}", 32_000 + 1000 * (i % 5), 256_000, [1000] * 8, "A100") for i in range(40)])
    state.place(3, make_pod(2), to_gpu_indices(state, 3, make_pod(2), -1))
    _, mix = _cluster()
    ctx = PackingContext()
    rows = np.array([2, 3, 17, 30])
    model = frag_model(state, ctx, mix, key="k", use_memory=True, copies=True, copies_weight=0.25, rows=rows)
    computed = np.flatnonzero(model.seen >= 0)
    np.testing.assert_array_equal(computed, rows)
    full = FragModel(state, mix, use_memory=True, copies=True, copies_weight=0.25)
    np.testing.assert_allclose(model.frag[rows], full.frag[rows], rtol=0, atol=1e-9)
    later = frag_model(state, ctx, mix, key="k", use_memory=True, copies=True, copies_weight=0.25)
    assert later is model
    np.testing.assert_allclose(later.frag, full.frag, rtol=0, atol=1e-9)
