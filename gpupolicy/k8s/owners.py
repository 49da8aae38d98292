"""Who owns a pod, as `Kind/namespace/name`: the key Approve-mode approvals list.

Pods of a Deployment are owned by a ReplicaSet named `<deployment>-<pod-template-hash>`;
the pod carries the same hash as its `pod-template-hash` label, so the
Deployment's name is recovered without an API call. StatefulSet and Job owners
are used as they are; anything else (bare pods, DaemonSets, bare ReplicaSets)
resolves to the pod itself. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DIRECT_OWNER_KINDS = ("StatefulSet", "Job")


def _controller_ref(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    # (dict, Mapping): a parsed dict passes before the ABC's check, a Python call per reference
    refs = [r for r in (metadata.get("ownerReferences") or []) if isinstance(r, (dict, Mapping))]
    controller = [r for r in refs if r.get("controller")]
    chosen = controller or refs
    return chosen[0] if chosen else None


def pod_owner(pod: Mapping[str, Any], namespace: str) -> str:
    """The workload whose approval lets a pod be changed (`Kind/namespace/name`)."""
    metadata = pod.get("metadata") or {}
    ref = _controller_ref(metadata)
    if ref is not None:
        kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
        if kind == "ReplicaSet":
            pod_hash = (metadata.get("labels") or {}).get("pod-template-hash")
            if pod_hash and name.endswith("-" + pod_hash):
                return f"Deployment/{namespace}/{name[: -len(pod_hash) - 1]}"
        elif kind in DIRECT_OWNER_KINDS and name:
            return f"{kind}/{namespace}/{name}"
    name = metadata.get("name") or metadata.get("generateName") or ""
    return f"Pod/{namespace}/{name}"


def approval_covers(approval: str, owner: str) -> bool:
    """Does an approvals entry cover an owner?

    `Kind/namespace/name` must match exactly; `Kind/name` (two parts) matches
    that name in any namespace. A CronJob approval also covers the Jobs it
    starts (`<cronjob>-<digits>`), since a Job pod carries no CronJob reference.
    """
    a_parts, o_parts = approval.split("/"), owner.split("/")
    if len(o_parts) != 3:
        return False
    o_kind, o_ns, o_name = o_parts
    if len(a_parts) == 2:
        a_kind, a_ns, a_name = a_parts[0], o_ns, a_parts[1]
    elif len(a_parts) == 3:
        a_kind, a_ns, a_name = a_parts
    else:
        return False
    if a_ns != o_ns:
        return False
    if a_kind == o_kind and a_name == o_name:
        return True
    if a_kind == "CronJob" and o_kind == "Job" and o_name.startswith(a_name + "-"):
        return o_name[len(a_name) + 1:].isdigit()
    return False


def is_approved(approvals: list[str], owner: str) -> bool:
    return any(approval_covers(a, owner) for a in approvals)
