"""A pod as far as the admission decision can tell it apart from its sibling replicas.

The webhook decides each distinct pod once per view (webhook.memo). Pods of
one ReplicaSet arrive identical but for `metadata.managedFields` (kube-apiserver
calls admission before it names the pod). Pods of an Indexed Job or a
StatefulSet do not: their controllers stamp each one with its index
(`batch.kubernetes.io/job-completion-index`, `apps.kubernetes.io/pod-index`,
`statefulset.kubernetes.io/pod-name` as label and annotation), its hostname
and, for a StatefulSet, its name. A Job of 1,000 completions is then 1,000
full decisions that all come out the same.

`decision_input` drops exactly what `pod_shape_error`, `mutate_pod` and
`validate_pod` never read or cannot tell apart:

- `metadata.managedFields`: never read;
- the index labels and annotations above, unless a policy's podSelector
  names the key (`matching.pod_label_keys`); the maps
  themselves stay, so a patch that adds to them is written the same way;
- `spec.hostname`: never read;
- `metadata.name` when the pod's owner is its workload, not the pod itself
  (owners.pod_owner: the name is read for a bare pod's owner only).

Each is dropped only when its value is a string, which the shape check
accepts whatever it says, so a malformed pod keeps the field and is still
decided (and refused) on its own. tests/core/test_replicas.py checks, on
generated pods and views, that pods with one decision input get one answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupolicy.cluster import ClusterView
from gpupolicy.k8s.owners import pod_owner
from gpupolicy.matching import pod_label_keys

INDEX_KEYS = ("batch.kubernetes.io/job-completion-index", "apps.kubernetes.io/pod-index",
              "statefulset.kubernetes.io/pod-name")


def decision_input(pod: Any, namespace: str, view: ClusterView) -> Any:
    """`pod` without what tells its replicas apart and the decision never reads (module doc), as new
    dicts at the levels it drops from (`pod` itself when it has no metadata map). Never changes `pod`."""
    # (dict, Mapping): a parsed dict passes before the ABC's check, a Python call on every review
    if not isinstance(pod, (dict, Mapping)) or not isinstance(metadata := pod.get("metadata"), (dict, Mapping)):
        return pod
    meta = {k: v for k, v in metadata.items() if k != "managedFields"}
    read = pod_label_keys(view)
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if isinstance(values, (dict, Mapping)) and any(
                key in values and key not in read and isinstance(values[key], str) for key in INDEX_KEYS):
            meta[field] = {k: v for k, v in values.items()
                           if k not in INDEX_KEYS or k in read or not isinstance(v, str)}
    if isinstance(meta.get("name"), str) and _owned_by_workload(pod, namespace):
        del meta["name"]
    out = {**pod, "metadata": meta}
    spec = pod.get("spec")
    if isinstance(spec, (dict, Mapping)) and isinstance(spec.get("hostname"), str):
        out["spec"] = {k: v for k, v in spec.items() if k != "hostname"}
    return out


def _owned_by_workload(pod: Mapping[str, Any], namespace: str) -> bool:
    """Whether the pod's owner is its workload (owners.pod_owner reads no name then); False for a pod
    too malformed to tell, which keeps its name and is answered by the shape check."""
    try:
        return not pod_owner(pod, namespace).startswith("Pod/")
    except (TypeError, AttributeError):  # ownerReferences or labels of the wrong type
        return False
