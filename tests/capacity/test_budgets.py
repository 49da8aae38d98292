"""Which PodDisruptionBudget keeps a node out of consolidation (gpupolicy/capacity/budgets.py), and planning
around the nodes it holds (`plan_around`). Pure: plain dicts and the core's planner; nothing faked."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from gpupolicy.capacity.budgets import blocking_budget, read_budgets
from gpupolicy.capacity.disruption import SINGLE_NODE, Disruption, plan_around


def pod(name: str, labels: dict[str, str], namespace: str = "ml", ready: bool = True,
        **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels, **meta},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pdb(name: str, selector: Any, allowed: int | None, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector, **spec}}
    if allowed is not None:
        obj["status"] = {"disruptionsAllowed": allowed}
    return obj


def test_a_pod_whose_budget_allows_no_disruption_blocks_in_karpenters_words() -> None:
    budgets = read_budgets([pdb("guard", {"matchLabels": {"app": "a"}}, 0)])
    assert blocking_budget([pod("b", {"app": "b"}), pod("a", {"app": "a"})], budgets) == \
        "pdb ml/guard prevents pod evictions"
    assert blocking_budget([pod("b", {"app": "b"})], budgets) is None
    assert blocking_budget([pod("a", {"app": "a"})], read_budgets([pdb("guard", {"matchLabels": {"app": "a"}}, 1)])) \
        is None


def test_only_the_same_namespace_and_drainable_pods_count() -> None:
    budgets = read_budgets([pdb("guard", {"matchLabels": {"app": "a"}}, 0)])
    assert blocking_budget([pod("a", {"app": "a"}, namespace="other")], budgets) is None
    daemon = pod("a", {"app": "a"}, ownerReferences=[{"kind": "DaemonSet", "name": "d"}])
    terminating = pod("a2", {"app": "a"}, deletionTimestamp="2026-01-01T00:00:00Z")
    assert blocking_budget([daemon, terminating], budgets) is None


def test_selectors_follow_policy_v1() -> None:
    everything = read_budgets([pdb("all", {}, 0)])
    nothing = read_budgets([pdb("none", None, 0)])
    expressions = read_budgets([pdb("expr", {"matchExpressions": [{"key": "tier", "operator": "In",
                                                                    "values": ["serve"]}]}, 0)])
    assert blocking_budget([pod("x", {})], everything) == "pdb ml/all prevents pod evictions"
    assert blocking_budget([pod("x", {})], nothing) is None
    assert blocking_budget([pod("x", {"tier": "serve"})], expressions) == "pdb ml/expr prevents pod evictions"
    assert blocking_budget([pod("x", {"tier": "batch"})], expressions) is None


def test_no_status_yet_allows_nothing_and_two_budgets_on_one_pod_block() -> None:
    assert blocking_budget([pod("a", {"app": "a"})], read_budgets([pdb("new", {"matchLabels": {"app": "a"}}, None)])) \
        == "pdb ml/new prevents pod evictions"
    two = read_budgets([pdb("one", {"matchLabels": {"app": "a"}}, 5), pdb("two", {}, 5)])
    why = blocking_budget([pod("a", {"app": "a"})], two)
    assert why is not None and "more than one pdb (ml/one, ml/two)" in why


def test_an_unready_pod_under_always_allow_does_not_block() -> None:
    budgets = read_budgets([pdb("guard", {"matchLabels": {"app": "a"}}, 0, unhealthyPodEvictionPolicy="AlwaysAllow")])
    assert blocking_budget([pod("a", {"app": "a"}, ready=False)], budgets) is None
    assert blocking_budget([pod("a", {"app": "a"})], budgets) == "pdb ml/guard prevents pod evictions"


def test_plan_around_drops_held_rows_names_them_and_gives_the_next_candidate_its_turn() -> None:
    calls: list[set[int]] = []

    def plan(blocked: Set[int]) -> list[Disruption]:
        calls.append(set(blocked))
        row = min({0, 1, 2} - set(blocked), default=None)
        return [] if row is None else [Disruption((row,), SINGLE_NODE, {}, 1.0, f"node {row}")]

    out, kept = plan_around(plan, {2}, {0: "pdb ml/a prevents pod evictions", 1: "pdb ml/b prevents pod evictions"})
    assert out == [] and calls == [{2}, {0, 2}, {0, 1, 2}]
    assert {row: why for row, (_, why) in kept.items()} == {0: "pdb ml/a prevents pod evictions",
                                                           1: "pdb ml/b prevents pod evictions"}
    assert kept[0][0].explanation == "node 0"
    out, kept = plan_around(plan, set(), {1: "held"})
    assert [d.nodes for d in out] == [(0,)] and kept == {}  # a held row the plan does not touch is not named
    calls.clear()
    out, kept = plan_around(plan, set(), {0: "a", 1: "b", 2: "c"}, max_replans=1)
    assert out == [] and calls[-1] == {0, 1, 2} and set(kept) == {0, 1}  # the bound: every held row blocked
