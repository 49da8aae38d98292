"""Policy matching and priority: the real core (gpupolicy.matching) on built policies; nothing faked."""

from __future__ import annotations

import pytest

from gpupolicy.matching import label_selector_matches, matching_policies, winning_policies
from gpupolicy.model import LabelSelector, PolicyKind
from tests.core.builders import make_policy, make_view


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {}, True),
        ({"matchLabels": {"app": "llm"}}, {"app": "llm", "x": "y"}, True),
        ({"matchLabels": {"app": "llm"}}, {"app": "web"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "1"}, False),
        ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    ],
    ids=["empty", "labels-hit", "labels-miss", "in-hit", "in-absent", "notin-absent", "notin-hit",
         "exists", "exists-miss", "doesnotexist", "labels-and-expr"],
)
def test_label_selector(selector: dict, labels: dict, expected: bool) -> None:
    assert label_selector_matches(LabelSelector.model_validate(selector), labels) is expected


@pytest.mark.parametrize(
    ("selector", "namespace", "pod_labels", "expected"),
    [
        ({}, "anything", {}, True),
        ({"namespaces": ["ml"]}, "ml", {}, True),
        ({"namespaces": ["ml"]}, "web", {}, False),
        ({"namespaceSelector": {"matchLabels": {"team": "ml"}}}, "ml", {}, True),
        ({"namespaceSelector": {"matchLabels": {"team": "ml"}}}, "web", {}, False),
        ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "web"}}}, "web", {}, True),
        ({"podSelector": {"matchLabels": {"app": "llm"}}}, "ml", {"app": "llm"}, True),
        ({"namespaces": ["ml"], "podSelector": {"matchLabels": {"app": "llm"}}}, "ml", {"app": "x"}, False),
    ],
    ids=["empty-matches-all", "ns-hit", "ns-miss", "nssel-hit", "nssel-miss", "nssel-auto-name-label",
         "podsel-hit", "all-parts-must-match"],
)
def test_selector(selector: dict, namespace: str, pod_labels: dict, expected: bool) -> None:
    view = make_view(make_policy(selector=selector), namespaces={"ml": {"team": "ml"}, "web": {}})
    assert bool(matching_policies(view, namespace, pod_labels)) is expected


def test_highest_priority_wins_per_kind() -> None:
    low = make_policy("a-low", priority=1)
    high = make_policy("z-high", priority=5)
    guard = make_policy("guard", priority=0, guardrail={"maxGpusPerPod": 1})
    winners = winning_policies(make_view(low, high, guard), "ml", {})
    assert winners[PolicyKind.SHARING].name == "z-high"
    assert winners[PolicyKind.GUARDRAIL].name == "guard"


def test_priority_ties_broken_by_name_whatever_the_order() -> None:
    b, a = make_policy("bravo", priority=3), make_policy("alpha", priority=3)
    assert winning_policies(make_view(b, a), "ml", {})[PolicyKind.SHARING].name == "alpha"
    assert winning_policies(make_view(a, b), "ml", {})[PolicyKind.SHARING].name == "alpha"


def test_a_policy_labelled_hub_disconnected_is_not_in_force() -> None:
    """The webhook's and the extender's view leave out policies whose cluster token was refused."""
    from gpupolicy.cluster import view_from_objects

    live = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "live"},
            "spec": {"packing": {"strategy": "default"}}}
    cut = {**live, "metadata": {"name": "cut", "labels": {"gpu.kubeon.io/hub": "Disconnected"}}}
    view, invalid = view_from_objects([live, cut], [])
    assert [p.name for p in view.policies] == ["live"] and invalid == []
