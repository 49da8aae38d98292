"""What of the optimizer's is on a node, and the one merge patch that takes it off (uninstall). Pure.

The optimizer marks what it writes on nodes so that it can be found again:

- labels and annotations under `gpu.kubeon.io/` are ours (re-layout and
  drain records, pool and policy labels, `mig-config-from`), but for the ones
  users set for us to read (`gpu.kubeon.io/do-not-disrupt`), which stay;
- `nvidia.com/device-plugin.config` is ours when its value is one of our
  time-slicing keys (`kubeon-ts-*`): the key itself leaves the ConfigMap in
  the same uninstall, so the label must not point at it;
- `nvidia.com/mig.config` is ours when `gpu.kubeon.io/mig-config-from`
  records what it was before our first re-layout: it is put back to that
  value (removed when there was none; the GPU Operator's MIG manager then
  re-partitions when the GPUs are free);
- a cordon is ours when a re-layout or drain record says we set it
  (`cordoned` / `wasUnschedulable: false`);
- taints whose key is under `gpu.kubeon.io/`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpupolicy.capacity.layout import MIG_CONFIG_FROM_ANNOTATION, RELAYOUT_ANNOTATION
from gpupolicy.capacity.timeslicing import is_our_key
from gpupolicy.catalog import MIG_CONFIG_LABEL, PLUGIN_CONFIG_LABEL

PREFIX = "gpu.kubeon.io/"
USERS_KEYS = frozenset({"gpu.kubeon.io/do-not-disrupt"})  # set by users, read by us: theirs to remove
DRAINING_ANNOTATION = "gpu.kubeon.io/draining"  # the capacity drain's record (wasUnschedulable)


def _record(annotations: Mapping[str, str], key: str) -> dict[str, Any]:
    try:
        value = json.loads(annotations.get(key) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _ours(key: str) -> bool:
    return key.startswith(PREFIX) and key not in USERS_KEYS


def we_cordoned(annotations: Mapping[str, str]) -> bool:
    """A re-layout or drain record on the node says the optimizer set its cordon."""
    relayout = _record(annotations, RELAYOUT_ANNOTATION)
    drain = _record(annotations, DRAINING_ANNOTATION)
    return bool(relayout.get("cordoned")) or (bool(drain) and drain.get("wasUnschedulable") is False)


def node_cleanup_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that removes what is ours from the node; None when nothing is.

    The patch carries the node's resourceVersion (a taint list is replaced whole), so a
    concurrent edit makes it fail (409) rather than lose someone else's change.
    """
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    new_labels: dict[str, str | None] = {k: None for k in labels if _ours(k)}
    if is_our_key(str(labels.get(PLUGIN_CONFIG_LABEL, ""))):
        new_labels[PLUGIN_CONFIG_LABEL] = None
    if MIG_CONFIG_FROM_ANNOTATION in annotations:
        before = annotations[MIG_CONFIG_FROM_ANNOTATION] or None
        if labels.get(MIG_CONFIG_LABEL) != before:
            new_labels[MIG_CONFIG_LABEL] = before
    new_annotations: dict[str, str | None] = {k: None for k in annotations if _ours(k)}
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if new_labels:
        patch["metadata"]["labels"] = new_labels
    if new_annotations:
        patch["metadata"]["annotations"] = new_annotations
    taints = list(spec.get("taints") or [])
    kept = [t for t in taints if not str(t.get("key", "")).startswith(PREFIX)]
    node_spec: dict[str, Any] = {}
    if len(kept) != len(taints):
        node_spec["taints"] = kept or None
    if spec.get("unschedulable") and we_cordoned(annotations):
        node_spec["unschedulable"] = None
    if node_spec:
        patch["spec"] = node_spec
    return patch if len(patch) > 1 or len(patch["metadata"]) > 1 else None
