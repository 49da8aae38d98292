"""The taint kubeon's GPU nodes carry, and core/v1 toleration matching. Pure.

One rule in one place: the capacity planner puts `GPU_TAINT` on the nodes
it launches (capacity/nodepool.py), admission routes the CPU-only pods that
tolerate it (they may land on those nodes) to kubeon's scheduler
(admission/mutate.py), and the kube-scheduler emulation filters and scores
with `tolerates` (simulator/kubescheduler.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupolicy.catalog import GPU_RESOURCE

GPU_TAINT: Mapping[str, str] = {"key": GPU_RESOURCE, "effect": "NoSchedule"}


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint over a pod's tolerations: an empty effect matches any effect,
    an empty key with `Exists` tolerates every taint (the API server refuses an empty key otherwise)."""
    for toleration in tolerations:
        if not isinstance(toleration, Mapping):
            continue
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
