"""PodDisruptionBudget arithmetic for the Eviction API (policy/v1).

The real server reads `status.disruptionsAllowed`, which the disruption
controller keeps up to date. The double has no such controller, so it
computes the same numbers at eviction time from the pods in the namespace:

- expected: for an integer minAvailable, the number of matching pods; for
  maxUnavailable or a percentage, the sum of `spec.replicas` of the pods'
  controllers (ReplicaSet, StatefulSet, ReplicationController, Deployment);
  a matching pod without such a controller makes the budget unusable
  (disruptions allowed 0), as the disruption controller fails safe there;
- healthy: matching pods, not being deleted, with condition Ready=True;
- desired healthy: minAvailable (percent rounds up) or expected minus
  maxUnavailable (percent rounds up);
- disruptions allowed = healthy - desired healthy (not below 0).

An eviction of a pod that is not Ready (or Pending, Succeeded, Failed, or
already terminating) is not checked against the budget, as upstream with the
default unhealthyPodEvictionPolicy (IfHealthyBudget) while the budget is met.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tests.kubeapi.selectors import match_label_selector
from tests.kubeapi.store import Store

_OWNER_KEYS = {"ReplicaSet": "apps/replicasets", "StatefulSet": "apps/statefulsets",
               "ReplicationController": "/replicationcontrollers", "Deployment": "apps/deployments"}


@dataclass(frozen=True)
class Budget:
    name: str
    expected: int
    healthy: int
    desired_healthy: int
    failed: bool = False  # the disruption controller could not compute it: allow nothing

    @property
    def disruptions_allowed(self) -> int:
        return 0 if self.failed else max(0, self.healthy - self.desired_healthy)


def is_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def scaled(value: int | str, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent with roundUp=true."""
    if isinstance(value, int):
        return value
    if value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def matching_budgets(store: Store, pod: dict[str, Any]) -> list[dict[str, Any]]:
    pdbs, _ = store.list("policy/poddisruptionbudgets", pod["metadata"]["namespace"])
    labels = pod["metadata"].get("labels")
    return [p for p in pdbs if match_label_selector((p.get("spec") or {}).get("selector"), labels,
                                                    null_matches=False)]


def budget(store: Store, pdb: dict[str, Any]) -> Budget:
    spec = pdb.get("spec") or {}
    ns = pdb["metadata"]["namespace"]
    pods, _ = store.list("/pods", ns)
    pods = [p for p in pods if match_label_selector(spec.get("selector"), p["metadata"].get("labels"),
                                                    null_matches=False)
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    healthy = sum(1 for p in pods if is_ready(p))
    min_available = spec.get("minAvailable")
    if min_available is not None and isinstance(min_available, int):
        expected = len(pods)
        desired = min_available
    else:
        counted = _expected_from_controllers(store, ns, pods)
        if counted is None:
            return Budget(pdb["metadata"]["name"], 0, healthy, healthy + 1, failed=True)
        expected = counted
        if min_available is not None:
            desired = scaled(min_available, expected)
        else:
            desired = max(0, expected - scaled(spec.get("maxUnavailable", 0), expected))
    return Budget(pdb["metadata"]["name"], expected, healthy, desired)


def _expected_from_controllers(store: Store, ns: str, pods: list[dict[str, Any]]) -> int | None:
    total, seen = 0, set()
    for pod in pods:
        ctrl = next((o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if ctrl is None or ctrl.get("kind") not in _OWNER_KEYS:
            return None
        if ctrl["uid"] in seen:
            continue
        seen.add(ctrl["uid"])
        owner = store.get(_OWNER_KEYS[ctrl["kind"]], ns, ctrl["name"])
        if owner is None:
            return None
        total += int((owner.get("spec") or {}).get("replicas", 1))
    return total
