"""Which PodDisruptionBudget keeps a node from being drained now. Pure.

A drain evicts every drainable pod of its node (gpupolicy/capacity/drain.py)
through the Eviction API, which refuses (429) a pod whose budget's
`status.disruptionsAllowed` is 0. A drain started on such a node cordons it
and evicts its other pods, then waits for the refused one until
drainTimeout and is undone: those evictions were for nothing. So, as
Karpenter ("Pods with blocking PDBs will not be evicted or considered for
voluntary disruption actions"), a node holding a drainable pod matched by a
budget (same namespace, its selector matches the pod's labels) whose
`disruptionsAllowed` is 0 is not a candidate; the reason is Karpenter's
wording, `pdb <namespace>/<name> prevents pod evictions`. Also blocking: a
pod matched by more than one budget (the Eviction API refuses it, 500).
Not blocking: a pod that is not Ready under a budget with
`unhealthyPodEvictionPolicy: AlwaysAllow` (the Eviction API lets it go).

policy/v1 selectors: a null selector matches no pod, an empty one every pod
of the namespace (metav1.LabelSelectorAsSelector); matching is the
project's (gpupolicy/matching.py). A selector the model cannot read (the
API server validates them, so only a field newer than this model) is taken
to match every pod of its namespace: a drain is not started on a guess. A
budget without a status (its controller has not computed it yet) allows no
disruption, as the Eviction API reads it. This check is at the start only;
the Eviction API stays the guard while a drain runs (the budget may change).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpupolicy.capacity.drain import drainable
from gpupolicy.matching import label_selector_matches
from gpupolicy.model import LabelSelector

ALWAYS_ALLOW = "AlwaysAllow"
EVERYTHING = LabelSelector()  # an unreadable selector: every pod of the namespace


@dataclass(frozen=True)
class Budget:
    """One PodDisruptionBudget as the check needs it."""

    namespace: str
    name: str
    selector: LabelSelector | None  # None: matches no pod
    disruptions_allowed: int
    always_allow_unhealthy: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (namespace == self.namespace and self.selector is not None
                and label_selector_matches(self.selector, labels))


def read_budgets(objects: Iterable[Mapping[str, Any]]) -> list[Budget]:
    """policy/v1 PodDisruptionBudget objects (wire dicts) as Budgets."""
    out = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        raw = spec.get("selector")
        selector: LabelSelector | None = None
        if raw is not None:
            try:
                selector = LabelSelector.model_validate(raw)
            except ValidationError:
                selector = EVERYTHING
        try:
            allowed = int((obj.get("status") or {}).get("disruptionsAllowed") or 0)
        except (TypeError, ValueError):
            allowed = 0
        out.append(Budget(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), selector,
                          allowed, spec.get("unhealthyPodEvictionPolicy") == ALWAYS_ALLOW))
    return out


def blocking_budget(pods: Iterable[Mapping[str, Any]], budgets: Sequence[Budget]) -> str | None:
    """Why the drainable ones of `pods` cannot all be evicted now (a budget allowing no disruption, or a pod
    under more than one budget); None when no budget stands in the way."""
    if not budgets:
        return None
    for pod in sorted((p for p in pods if drainable(p)), key=_key):
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        matched = sorted((b for b in budgets if b.matches(namespace, labels)), key=lambda b: b.key)
        if len(matched) > 1:
            return (f"pod {namespace}/{meta.get('name')} is matched by more than one pdb "
                    f"({', '.join(b.key for b in matched)}), which the Eviction API refuses")
        for budget in matched:
            if budget.always_allow_unhealthy and not _ready(pod):
                continue
            if budget.disruptions_allowed <= 0:
                return f"pdb {budget.key} prevents pod evictions"
    return None


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")
