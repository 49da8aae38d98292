"""The extender's array-based hot path: answers from fragments, cached NodeNames rows, fit reuse.

Real: `AnswerWriter`, `NodeNameRows`, the engine's `NodeState`, and (for the
reuse cases) the Flask app, `ExtenderService` and `ClusterCache`.
Faked: the watch (events fed by hand) and the HTTP transport (Flask's test client).
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from extender.answers import (
    DEFAULT_PLUGIN_SWING,
    REASONS,
    UNKNOWN,
    UNRESOLVABLE_PER_REASON,
    AnswerWriter,
    score_reach,
)
from extender.nodenames import UNKNOWN_ROW, NodeNameRows
from gpupolicy.packing.nodemodel import NodeSpec, NodeState
from tests.cluster.objects import make_node
from tests.extender.payloads import Harness, args, bound, wire_pod

STATE_NAMES = ("n-a", 'n-"quoted"', "n-ü", "n-d")


def expected_filter(names: list[str], codes: list[int], hopeless: list[bool]) -> bytes:
    return orjson.dumps({
        "Nodes": None, "NodeNames": [n for n, c in zip(names, codes, strict=True) if c == 0],
        "FailedNodes": {n: REASONS[c] for n, c, h in zip(names, codes, hopeless, strict=True) if c and not h},
        "FailedAndUnresolvableNodes": {n: REASONS[c] for n, c, h in zip(names, codes, hopeless, strict=True)
                                       if c and h},
        "Error": ""})


@pytest.mark.parametrize(("names", "codes", "hopeless"), [
    pytest.param(["n-a", 'n-"quoted"', "n-ü", "n-d"], [0, 3, 1, 0], [False, False, True, False], id="mixed"),
    pytest.param(["n-d", "ghost", "n-a"], [0, UNKNOWN, 6], [False, False, False], id="unknown-name"),
    pytest.param(["n-a", "n-d"], [0, 0], [False, False], id="all-pass"),
    pytest.param(["n-a", "n-d"], [4, 2], [False, True], id="none-pass"),
    pytest.param([], [], [], id="empty"),
])
def test_filter_answer_is_byte_equal_to_serialising_the_dicts(names: list[str], codes: list[int],
                                                              hopeless: list[bool]) -> None:
    writer = AnswerWriter(STATE_NAMES)
    index = {n: i for i, n in enumerate(STATE_NAMES)}
    rows = np.array([index.get(n, UNKNOWN_ROW) for n in names], dtype=np.int64)
    got = writer.filter_answer(names, rows, np.array(codes, dtype=np.int64), np.array(hopeless, dtype=bool))
    assert got == expected_filter(names, codes, hopeless)
    assert writer.filter_answer(names, rows, np.array(codes, dtype=np.int64),
                                np.array(hopeless, dtype=bool)) == got  # again, from the rendered tables


def expected_prioritize(names: list[str], scores: list[int], reach: int | None = None) -> bytes:
    """The HostPriorityList contract: in input order, the hosts within `reach` points of the top score;
    every host when `reach` is unknown or none scores above 0."""
    top = max(scores, default=0)
    listed = [(n, int(s)) for n, s in zip(names, scores, strict=True)
              if reach is None or top == 0 or s >= top - reach]
    return orjson.dumps([{"Host": n, "Score": int(s)} for n, s in listed])


@pytest.mark.parametrize("reach", [None, 0, 1, 3])
def test_prioritize_answer_is_byte_equal_to_serialising_the_list(reach: int | None) -> None:
    writer = AnswerWriter(STATE_NAMES)
    names = ["n-d", "ghost", 'n-"quoted"', "n-a", "n-ü"]
    rows = np.array([3, UNKNOWN_ROW, 1, 0, 2], dtype=np.int64)
    for values in ([10, 0, 9, 0, 3], [0, 4, 0, 0, 0], [0, 0, 0, 0, 0], [2, 1, 0, 1, 2]):
        scores = np.array(values, dtype=np.int64)
        assert writer.prioritize_answer(names, rows, scores, reach) == expected_prioritize(names, values, reach)
    assert writer.prioritize_answer([], rows[:0], scores[:0], reach) == b"[]"


@pytest.mark.parametrize("reach", [None, 0, 1])
def test_prioritize_answer_of_known_names_writes_digits_into_zero_entries_byte_equal(reach: int | None) -> None:
    writer = AnswerWriter(STATE_NAMES)
    names = ["n-d", 'n-"quoted"', "n-a", "n-ü"]
    rows = np.array([3, 1, 0, 2], dtype=np.int64)
    for scores in ([10, 0, 9, 3], [0, 7, 1, 10], [4, 4, 4, 4], [10, 10, 0, 0], [1, 2, 3, 4], [0, 0, 0, 0]):
        expected = expected_prioritize(names, scores, reach)
        assert writer.prioritize_answer(names, rows, np.array(scores, dtype=np.int64), reach) == expected
    one = orjson.dumps([{"Host": "n-ü", "Score": 10}])
    assert writer.prioritize_answer(["n-ü"], np.array([2]), np.array([10]), reach) == one


def test_score_reach_is_the_points_kube_schedulers_plugins_can_make_up() -> None:
    """One point is weight x 10 of kube-scheduler's total; its default plugins swing at most 1,200."""
    assert DEFAULT_PLUGIN_SWING == 1200
    assert score_reach(0) is None  # not told: every host is listed
    assert score_reach(71) == 1  # the chart's weight: 710 per point, so a host 1 point down may still win
    assert score_reach(120) == 1  # 1,200 = 1 x 1,200: a tie is possible, the host stays listed
    assert score_reach(121) == 0  # 1,210 > 1,200: only the top scorers can be placed
    assert score_reach(1) == 120 and score_reach(71, swing=700) == 0


def test_unresolvable_nodes_are_bounded_per_reason_with_the_count_named() -> None:
    """FailedAndUnresolvableNodes: at most UNRESOLVABLE_PER_REASON nodes per reason, in input order, the
    reason naming how many nodes it covers; FailedNodes (preemption may help) and NodeNames stay whole."""
    names = [f"n{i:03d}" for i in range(100)]
    writer = AnswerWriter(names)
    rows = np.arange(100, dtype=np.int64)
    codes = np.array([0 if i % 10 == 0 else (2 if i % 2 else 6) for i in range(100)], dtype=np.int64)
    hopeless = np.array([i % 10 != 0 and (i % 2 == 1 or i > 60) for i in range(100)])
    got = orjson.loads(writer.filter_answer(names, rows, codes, hopeless))
    assert got["NodeNames"] == [n for i, n in enumerate(names) if i % 10 == 0]
    assert got["FailedNodes"] == {n: REASONS[6] for i, n in enumerate(names)
                                  if codes[i] == 6 and not hopeless[i]}
    model = [n for i, n in enumerate(names) if codes[i] == 2 and hopeless[i]]  # 50 nodes: sampled
    fresh = [n for i, n in enumerate(names) if codes[i] == 6 and hopeless[i]]  # 15 nodes: all listed
    assert len(model) > UNRESOLVABLE_PER_REASON >= len(fresh)
    assert got["FailedAndUnresolvableNodes"] == {
        **{n: f"{REASONS[2]} ({len(model)} nodes)" for n in model[:UNRESOLVABLE_PER_REASON]},
        **{n: REASONS[6] for n in fresh}}
    assert list(got["FailedAndUnresolvableNodes"]) == sorted(got["FailedAndUnresolvableNodes"])  # input order


def test_node_name_rows_are_reused_only_for_the_same_list_and_state() -> None:
    state = NodeState.build([NodeSpec(n, 1000, 1024) for n in ("a", "b", "c", "d")])
    lookup = NodeNameRows()
    first = lookup.rows(state, ["a", "b", "d"])
    assert first.tolist() == [0, 1, 3] and lookup.misses == 1
    assert lookup.rows(state, ["a", "b", "d"]) is first and lookup.hits == 1  # equal list, new object
    # same length, first and last name, different middle: not the cached rows
    assert lookup.rows(state, ["a", "c", "d"]).tolist() == [0, 2, 3]
    assert lookup.rows(state, ["a", "ghost"]).tolist() == [0, UNKNOWN_ROW]
    rebuilt = NodeState.build([NodeSpec(n, 1000, 1024) for n in ("d", "a", "b")])
    assert lookup.rows(rebuilt, ["a", "b", "d"]).tolist() == [1, 2, 0]  # a new state: rows recomputed


def test_node_name_rows_after_learning_kube_schedulers_order_are_the_states() -> None:
    """Lists are stretches of a rotating order unrelated to the rows' (kube-scheduler's sampled NodeNames,
    nodes left out where its own filters failed, names the state does not know); every list maps to the
    state's rows before, while and after the lookup is laid out in that order."""
    import random

    names = [f"node-{i:03d}" for i in range(300)]
    state = NodeState.build([NodeSpec(n, 1000, 1024) for n in names])
    rng = random.Random(7)
    order = names[:]
    rng.shuffle(order)
    lookup = NodeNameRows()
    start, turns = 0, []
    for _ in range(40):
        window = [order[(start + k) % len(order)] for k in range(40)]
        start += 40
        asked = [n for n in window if rng.random() < 0.9] + (["ghost"] if rng.random() < 0.3 else [])
        turns.append(lookup.learning)
        assert lookup.rows(state, asked).tolist() == [state.index.get(n, UNKNOWN_ROW) for n in asked]
    assert turns[1] and not turns[-1]  # laid out once a turn of the rotation brought nothing new


def nodes() -> list[dict]:
    return [make_node(f"a100-{i}", "NVIDIA-A100-SXM4-80GB", 8) for i in range(3)]


def test_prioritize_after_filter_sees_a_pod_bound_in_between() -> None:
    # The filter passes all three nodes; then the watch shows a pod taking all 8 GPUs of a100-1 (the
    # node the engine would otherwise pick: used first). Prioritize must not reuse the stale fit.
    h = Harness(nodes(), [bound(wire_pod("small", gpus=1, cpu="1"), "a100-1")])
    pod = wire_pod("p", gpus=4)
    names = h.filter(pod, ["a100-0", "a100-1", "a100-2"])["NodeNames"]
    assert names == ["a100-0", "a100-1", "a100-2"]
    h.cache.on_pod("ADDED", bound(wire_pod("big", gpus=7, cpu="1"), "a100-1"))
    scores = h.prioritize(pod, names)
    assert scores["a100-1"] == 0 and max(scores.values()) == 10


def test_prioritize_after_filter_matches_a_fresh_service() -> None:
    # Same pod, same names, nothing changed: the reused fit gives what a service without memo gives.
    busy = [bound(wire_pod("small", gpus=3, cpu="1"), "a100-2")]
    pod = wire_pod("p", gpus=2)
    h = Harness(nodes(), busy)
    passed = h.filter(pod, ["a100-0", "a100-1", "a100-2"])["NodeNames"]
    with_memo = h.prioritize(pod, passed)
    assert with_memo == Harness(nodes(), busy).prioritize(pod, passed)
    assert with_memo["a100-2"] == 10  # the used node first


def test_prioritize_decided_once_the_filter_answer_is_out_is_the_decision_it_would_make() -> None:
    """/filter's answer out (the WSGI iterable closed, as gunicorn does), the service decides /prioritize's
    pod ahead; /prioritize answers with that decision (its CPU in X-Kubeon-Ahead-Cpu-Seconds), byte-equal
    to deciding then; an event in between (a pod bound) makes /prioritize decide again."""
    busy = [bound(wire_pod("small", gpus=3, cpu="1"), "a100-2")]
    pod = wire_pod("p", gpus=2)
    names = ["a100-0", "a100-1", "a100-2"]

    def prioritize(h: Harness, passed: list[str]) -> tuple[bytes, float]:
        resp = h.client.post("/prioritize", json=args(pod, passed))
        return resp.get_data(), float(resp.headers["X-Kubeon-Ahead-Cpu-Seconds"])

    ahead = Harness(nodes(), busy)
    passed = ahead.filter(pod, names)["NodeNames"]  # closes the answer: the decision is made now
    decided_ahead, cpu = prioritize(ahead, passed)
    assert cpu > 0
    then = Harness(nodes(), busy)
    resp = then.client.post("/filter", json=args(pod, names))  # not closed: nothing ahead
    assert resp.get_json()["NodeNames"] == passed
    decided_then, cpu_then = prioritize(then, passed)
    assert cpu_then == 0 and decided_ahead == decided_then
    moved = Harness(nodes(), busy)
    moved.filter(pod, names)
    moved.cache.on_pod("ADDED", bound(wire_pod("big", gpus=5, cpu="1"), "a100-2"))
    decided_moved, cpu_moved = prioritize(moved, passed)
    assert cpu_moved == 0 and decided_moved != decided_ahead  # a100-2 is full now: decided again


def test_answers_carry_wall_and_cpu_handler_times() -> None:
    h = Harness(nodes())
    resp = h.client.post("/filter", json={"Pod": wire_pod("p", gpus=1), "Nodes": None, "NodeNames": ["a100-0"]})
    assert resp.status_code == 200
    wall = float(resp.headers["X-Kubeon-Handler-Seconds"])
    cpu = float(resp.headers["X-Kubeon-Handler-Cpu-Seconds"])
    assert 0 < wall < 5 and 0 <= cpu < 5


def test_node_names_with_a_non_string_item_are_an_error_naming_the_field() -> None:
    h = Harness(nodes())
    resp = h.client.post("/filter", json={"Pod": wire_pod("p", gpus=1), "Nodes": None, "NodeNames": ["a100-0", 7]})
    assert resp.status_code == 200
    assert resp.get_json()["Error"] == "NodeNames: expected a list of node names"


def test_node_name_rows_pick_follows_the_list_it_is_given() -> None:
    rows = NodeNameRows()
    first = ["a", "b", "c", "d"]
    assert rows.pick(first, np.array([3, 0])) == ["d", "a"]
    second = ["x", "y"]
    assert rows.pick(second, np.array([1])) == ["y"]  # a new list object: not the old one's names
    assert rows.pick(first, np.array([], dtype=np.int64)) == []
