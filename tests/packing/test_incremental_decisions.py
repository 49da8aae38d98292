"""The extender's incremental decision caches answer exactly what the from-scratch rules answer.

Issue 16 keeps per-state arrays up to date from `NodeState.row_version`
instead of re-deriving them per request (`scheduling.RowKeys` for "nodes
identical to the pick", `scheduling.UsedFirstRank` for the tie order,
`NodeState.static` for the share basis). The reference is the previous
code, kept here and patched in for a second run. Real: the openb trace
(the first 160 nodes, 300 pods; a fifth asking for V100s only), the
extender's app, service and node model through the stand-in kube-scheduler
(cli.livereplay). Every /filter and /prioritize answer, byte for byte, and
every placement must be the same both ways.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.livereplay import replay_through_extender
from extender import service
from extender.answers import AnswerWriter
from gpupolicy.packing import kubemodel, scheduling
from gpupolicy.packing.nodemodel import BoolArray, IntArray, NodeSpec, NodeState, PodDemand
from gpupolicy.packing.placement import PackingContext
from simulator.trace import load_nodes, load_pods
from tests.packing.test_smaller_answers import VENDOR, subset


def reference_identical_to(state: NodeState, node: int, nodes: IntArray, keys: Any = None) -> BoolArray:
    same = ((state.model_idx[nodes] == state.model_idx[node]) & (state.cpu_free[nodes] == state.cpu_free[node])
            & (state.mem_free[nodes] == state.mem_free[node]) & (state.shared_free[nodes] == state.shared_free[node])
            & (state.cpu_cap[nodes] == state.cpu_cap[node]) & (state.mem_cap[nodes] == state.mem_cap[node]))
    same &= (state.mig_free[nodes] == state.mig_free[node]).all(axis=1)
    rows = np.sort(state.gpu_free[nodes], axis=1)
    same &= (rows == np.sort(state.gpu_free[node])).all(axis=1)
    out: BoolArray = same
    return out


def reference_used_first_rank(state: NodeState) -> IntArray:
    used = (state.gpu_free_total < state.gpu_count * 1000) | (state.shared_free < state.shared_cap) | (
        state.mig_free < state.mig_cap).any(axis=1)
    rank: IntArray = np.arange(len(state), dtype=np.int64) + np.where(used, 0, len(state))
    return rank


def reference_share_basis(state: NodeState) -> tuple[int, int]:
    sliced = (state.shared_cap > 0) & (state.gpu_count > 0)
    if not sliced.any():
        return 0, 0
    mem = state.gpu_memory_mib[sliced]
    known = mem[mem > 0]
    replicas = state.shared_cap[sliced] // state.gpu_count[sliced]
    return (int(known.min()) if known.size else 0), int(replicas.min())


class FromScratch:
    """`UsedFirstRank` without its cache: the reference rank every call."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    def sync(self, rows: IntArray | None = None) -> IntArray:
        return reference_used_first_rank(self.state)


class Answers:
    """Every answer the replay's extender writes, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.got: list[bytes] = []
        for verb in ("filter_answer", "prioritize_answer"):
            original = getattr(AnswerWriter, verb)

            def recorded(writer: AnswerWriter, *args: Any, _original: Any = original) -> bytes:
                out: bytes = _original(writer, *args)
                self.got.append(out)
                return out

            monkeypatch.setattr(AnswerWriter, verb, recorded)


def test_incremental_caches_give_the_same_answers_on_an_openb_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = load_nodes(subset(VENDOR / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 160))
    pods = load_pods(subset(VENDOR / "openb_pod_list_default.csv", tmp_path / "pods.csv", 300, spec_every=5))
    with monkeypatch.context() as patch:
        fast = Answers(patch)
        incremental = replay_through_extender(nodes, pods, seed=42, keep_placements=True)
    with monkeypatch.context() as patch:
        patch.setattr(scheduling, "identical_to", reference_identical_to)
        patch.setattr(scheduling, "UsedFirstRank", FromScratch)
        patch.setattr(kubemodel, "cluster_share_basis", reference_share_basis)
        patch.setattr(scheduling, "cluster_share_basis", reference_share_basis)
        patch.setattr(service, "cluster_share_basis", reference_share_basis)
        slow = Answers(patch)
        reference = replay_through_extender(nodes, pods, seed=42, keep_placements=True)
    assert len(fast.got) == len(slow.got) > 400
    assert fast.got == slow.got  # equal filter sets, reasons and scores, request by request
    assert incremental.placements == reference.placements
    assert sum(p.node is not None for p in incremental.placements) > 150
    # identical nodes did score 10 beside the pick: the case RowKeys answers
    assert sum(answer.count(b'"Score":10}') > 1 for answer in fast.got) > 20


def random_state(rng: np.random.Generator, n: int = 60) -> NodeState:
    models = ["A100", "V100", "T4"]
    specs = [NodeSpec(f"n{i}", int(rng.choice([32000, 64000])), int(rng.choice([128000, 256000])),
                      int(rng.choice([0, 2, 4, 8])), models[int(rng.integers(3))],
                      mig={"nvidia.com/mig-1g.10gb": 7} if i % 7 == 0 else {}, shared=4 * (i % 5 == 0))
             for i in range(n)]
    return NodeState.build(specs)


def test_row_keys_and_used_rank_follow_every_row_change() -> None:
    rng = np.random.default_rng(7)
    state = random_state(rng)
    keys, rank = scheduling.RowKeys(state), scheduling.UsedFirstRank(state)
    everyone = np.arange(len(state), dtype=np.int64)
    placed: list[tuple[int, PodDemand, tuple[int, ...]]] = []
    for step in range(400):
        if placed and rng.random() < 0.3:
            node, demand, gpus = placed.pop(int(rng.integers(len(placed))))
            state.remove(node, demand, gpus)
        else:
            node = int(rng.integers(len(state)))
            count = int(state.gpu_count[node])
            k = int(rng.integers(0, count + 1)) if count else 0
            free = np.flatnonzero(state.gpu_free[node] == 1000)[:k]
            demand = PodDemand(cpu_milli=int(rng.choice([0, 1000, 4000])), memory_mib=int(rng.choice([0, 1024])),
                               num_gpu=len(free), gpu_milli=1000 if len(free) else 0)
            try:
                state.place(node, demand, tuple(int(g) for g in free))
            except ValueError:
                continue
            placed.append((node, demand, tuple(int(g) for g in free)))
        if step % 3 == 0:  # callers sync at their own pace: several changes between two syncs
            assert np.array_equal(rank.sync(), reference_used_first_rank(state))
            pick = int(rng.integers(len(state)))
            assert np.array_equal(scheduling.identical_to(state, pick, everyone, keys),
                                  reference_identical_to(state, pick, everyone))
    assert kubemodel.cluster_share_basis(state) == reference_share_basis(state)


def test_the_row_key_table_starts_again_without_changing_answers() -> None:
    state = random_state(np.random.default_rng(3), n=8)
    keys = scheduling.RowKeys(state)
    everyone = np.arange(len(state), dtype=np.int64)
    for i in range(3000):  # many distinct CPU values: the table fills and is started again
        node = i % len(state)
        state.reset_row(node)
        state.place(node, PodDemand(cpu_milli=1 + i % 2000))
        for pick in (0, node):
            assert np.array_equal(scheduling.identical_to(state, pick, everyone, keys),
                                  reference_identical_to(state, pick, everyone))
    assert len(keys._table) <= 4 * len(state) + 1024 + len(state)


def test_a_packing_context_keeps_one_cache_per_state() -> None:
    ctx = PackingContext()
    a, b = random_state(np.random.default_rng(1)), random_state(np.random.default_rng(2))
    first = ctx.derived("row-keys", (a,), lambda: scheduling.RowKeys(a))
    assert ctx.derived("row-keys", (a,), lambda: scheduling.RowKeys(a)) is first
    assert ctx.derived("row-keys", (b,), lambda: scheduling.RowKeys(b)).state is b
