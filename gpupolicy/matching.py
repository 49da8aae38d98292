"""Which policies cover a pod (selectors, per-kind priority), and which GPU products the pod accepts.

A policy's selector matches when every part given matches (namespaces list,
namespaceSelector on the namespace's labels, podSelector on the pod's labels);
an empty selector matches every pod. Among matching policies of one kind the
highest priority wins, ties broken by name, so the outcome never depends on
watch order. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupolicy.catalog import PRODUCT_LABEL, normalise_product_label
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


def pod_label_keys(view: ClusterView) -> frozenset[str]:
    """The pod label keys `selector_matches` reads for the view's policies (their podSelectors'), once
    per view: a pod's other labels cannot change which policies cover it."""
    found = view.view_answers.get("pod-label-keys")
    if found is None:
        keys: set[str] = set()
        for policy in view.policies:
            selector = policy.spec.selector.pod_selector
            if selector is not None:
                keys.update(selector.match_labels)
                keys.update(req.key for req in selector.match_expressions)
        found = view.view_answers["pod-label-keys"] = frozenset(keys)
    return found


def matching_policies(view: ClusterView, namespace: str, pod_labels: Mapping[str, str]) -> list[GpuPolicy]:
    """Every policy whose selector covers the pod, highest priority first, then by name."""
    ns_labels = view.labels_of_namespace(namespace)
    return [p for p in view.ordered_policies if selector_matches(p.spec.selector, namespace, ns_labels, pod_labels)]


WINNERS_KEPT = 4096  # (namespace, labels) answers remembered per view


def winning_policies(
    view: ClusterView, namespace: str, pod_labels: Mapping[str, str]
) -> dict[PolicyKind, GpuPolicy]:
    """The one policy per kind that applies to the pod (highest priority, ties by name).

    Remembered per view for each (namespace, labels) seen: a workload's pods
    share their labels, and the answer depends on the view alone otherwise.
    """
    try:
        key: Any = (namespace, frozenset(pod_labels.items()))
    except TypeError:  # unhashable label values (unchecked input): not remembered
        key = None
    memo = view.view_answers.setdefault("winners", {}) if key is not None else {}
    found = memo.get(key)
    if found is None:
        found = {}
        for policy in matching_policies(view, namespace, pod_labels):
            found.setdefault(policy.spec.kind, policy)
        if len(memo) >= WINNERS_KEPT:
            memo.clear()
        memo[key] = found
    return dict(found)


def pod_allowed_products(pod: Mapping[str, Any]) -> frozenset[str] | None:
    """GPU products the pod accepts: nodeSelector or required node affinity on `nvidia.com/gpu.product`.

    None: no constraint. With several nodeSelectorTerms (ORed), the union of
    their `In` values; a term without a product constraint allows any product.
    The admission rewrite (a MIG profile the pod's nodes offer) and the packing
    model (where the pod may go) both read it here.
    """
    spec = pod.get("spec") or {}
    # (dict, Mapping): a parsed dict passes before the ABC's check, a Python call on every review
    if not isinstance(spec, (dict, Mapping)):
        return None
    node_selector = spec.get("nodeSelector") or {}
    selected = node_selector.get(PRODUCT_LABEL) if isinstance(node_selector, (dict, Mapping)) else None
    allowed: set[str] | None = {normalise_product_label(str(selected))} if selected else None
    affinity = spec.get("affinity") or {}
    node_affinity = (affinity.get("nodeAffinity") or {}) if isinstance(affinity, (dict, Mapping)) else {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = (required.get("nodeSelectorTerms") or []) if isinstance(required, (dict, Mapping)) else []
    union: set[str] = set()
    unconstrained = False
    for term in terms if isinstance(terms, list) else ():
        values = None
        exprs = term.get("matchExpressions") if isinstance(term, (dict, Mapping)) else None
        for expr in exprs if isinstance(exprs, list) else ():
            if isinstance(expr, (dict, Mapping)) and expr.get("key") == PRODUCT_LABEL and expr.get("operator") == "In":
                listed = expr.get("values")
                values = {normalise_product_label(str(v)) for v in (listed if isinstance(listed, list) else ())}
        if values is None:
            unconstrained = True
        else:
            union |= values
    if terms and not unconstrained:
        allowed = union if allowed is None else allowed & union
    return frozenset(allowed) if allowed is not None else None
