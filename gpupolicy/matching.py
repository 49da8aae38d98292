"""Which policies cover a pod: label selectors and the per-kind priority rule.

A policy's selector matches when every part given matches (namespaces list,
namespaceSelector on the namespace's labels, podSelector on the pod's labels);
an empty selector matches every pod. Among matching policies of one kind the
highest priority wins, ties broken by name, so the outcome never depends on
watch order. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupolicy.cluster import ClusterView
from gpupolicy.model import GpuPolicy, LabelSelector, PolicyKind, Selector


def label_selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: matchLabels AND every matchExpression."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        if req.operator == "In" and not (present and labels[req.key] in req.values):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in req.values:
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


def selector_matches(
    selector: Selector, namespace: str, namespace_labels: Mapping[str, str], pod_labels: Mapping[str, str]
) -> bool:
    """All given parts of a policy selector must match; missing parts match everything."""
    if selector.namespaces and namespace not in selector.namespaces:
        return False
    if selector.namespace_selector is not None and not label_selector_matches(
        selector.namespace_selector, namespace_labels
    ):
        return False
    return selector.pod_selector is None or label_selector_matches(selector.pod_selector, pod_labels)


def matching_policies(view: ClusterView, namespace: str, pod_labels: Mapping[str, str]) -> list[GpuPolicy]:
    """Every policy whose selector covers the pod, highest priority first, then by name."""
    ns_labels = view.labels_of_namespace(namespace)
    return [p for p in view.ordered_policies if selector_matches(p.spec.selector, namespace, ns_labels, pod_labels)]


def winning_policies(
    view: ClusterView, namespace: str, pod_labels: Mapping[str, str]
) -> dict[PolicyKind, GpuPolicy]:
    """The one policy per kind that applies to the pod (highest priority, ties by name)."""
    winners: dict[PolicyKind, GpuPolicy] = {}
    for policy in matching_policies(view, namespace, pod_labels):
        winners.setdefault(policy.spec.kind, policy)
    return winners
