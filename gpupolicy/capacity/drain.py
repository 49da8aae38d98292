"""Draining a GPU node before it is given back: ordered, resumable steps whose state lives on the Node. Pure.

The record is the node annotation `gpu.kubeon.io/draining` (JSON), written in
the same merge patch that cordons the node, so there is never a cordon
without a record nor a record without a cordon. Any leader reads it and
takes the next step; nothing of the drain lives in a process:

1. start: annotate + cordon (one patch; `wasUnschedulable` kept, so undoing
   restores a cordon someone else had set).
2. evict: every drainable pod (not DaemonSet-owned, not a mirror pod, not
   finished or already terminating) through the Eviction API. A 429 (a
   PodDisruptionBudget forbids it now) is retried on a later pass after a
   back-off; a pod is never deleted around its PDB. Pods evicted for this
   plan are recorded by uid in the record (`evicted`): an evicted pod is
   gone or terminating and is never asked again for the same plan.
3. delete: once no drainable pod is left, the NodeClaim is deleted (the
   provider then terminates the instance). The record stays until the Node
   goes.
4. undo: past the deadline (consolidation.drainTimeout) with pods left,
   when a do-not-disrupt annotation appeared on the node or on a pod, or when
   the pods left no longer re-place on the other nodes (the caller simulates
   again before each round of evictions),
   the node is uncordoned (unless it was cordoned before), the record
   removed and `gpu.kubeon.io/drain-undone` written, in one patch; the
   caller reports why and plans no new drain of the node for a cool-down.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DRAINING_ANNOTATION = "gpu.kubeon.io/draining"
UNDONE_ANNOTATION = "gpu.kubeon.io/drain-undone"  # {"at", "plan", "message"}: no new drain before the cool-down
DO_NOT_DISRUPT = ("karpenter.sh/do-not-disrupt", "gpu.kubeon.io/do-not-disrupt")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
BACKOFF_SECONDS = 5.0  # kubectl drain waits 5 s after a 429


@dataclass(frozen=True)
class Record:
    """The drain in flight on one node (the annotation's content)."""

    plan: str                  # the proposal id this drain carries out
    policy: str
    claim: str                 # the NodeClaim to delete once empty
    started: float
    deadline: float
    was_unschedulable: bool = False
    evicted: tuple[str, ...] = ()   # pod uids evicted for this plan
    retry_at: float = 0.0           # no eviction before this (after a 429)
    blocked: str = ""               # the last refusal (pod and reason), for the report
    deleted: bool = False           # the NodeClaim deletion was requested

    def to_annotation(self) -> str:
        return json.dumps({"plan": self.plan, "policy": self.policy, "claim": self.claim,
                           "started": self.started, "deadline": self.deadline,
                           "wasUnschedulable": self.was_unschedulable, "evicted": list(self.evicted),
                           "retryAt": self.retry_at, "blocked": self.blocked, "deleted": self.deleted},
                          sort_keys=True, separators=(",", ":"))


def read_record(annotations: Mapping[str, str]) -> Record | None:
    """The record on a node; None when there is none or it does not parse (then nothing is resumed)."""
    text = annotations.get(DRAINING_ANNOTATION)
    if not text:
        return None
    try:
        raw = json.loads(text)
        return Record(plan=str(raw["plan"]), policy=str(raw.get("policy", "")), claim=str(raw["claim"]),
                      started=float(raw["started"]), deadline=float(raw["deadline"]),
                      was_unschedulable=bool(raw.get("wasUnschedulable", False)),
                      evicted=tuple(str(u) for u in raw.get("evicted") or []),
                      retry_at=float(raw.get("retryAt", 0.0)), blocked=str(raw.get("blocked", "")),
                      deleted=bool(raw.get("deleted", False)))
    except (ValueError, KeyError, TypeError):
        return None


def start_patch(record: Record) -> dict[str, Any]:
    """Annotate and cordon in one node patch."""
    return {"metadata": {"annotations": {DRAINING_ANNOTATION: record.to_annotation()}},
            "spec": {"unschedulable": True}}


def record_patch(record: Record) -> dict[str, Any]:
    return {"metadata": {"annotations": {DRAINING_ANNOTATION: record.to_annotation()}}}


def undo_patch(record: Record, now: float, message: str) -> dict[str, Any]:
    """Uncordon (unless it was cordoned before the drain), drop the record and note why, in one patch."""
    undone = json.dumps({"at": now, "plan": record.plan, "policy": record.policy, "message": message},
                        sort_keys=True, separators=(",", ":"))
    return {"metadata": {"annotations": {DRAINING_ANNOTATION: None, UNDONE_ANNOTATION: undone}},
            "spec": {"unschedulable": True if record.was_unschedulable else None}}


def read_undone(annotations: Mapping[str, str]) -> dict[str, Any] | None:
    """The note an undone drain left ({"at", "plan", "policy", "message"}), None when none or unreadable."""
    text = annotations.get(UNDONE_ANNOTATION)
    if not text:
        return None  # most nodes: read every pass, parsing "null" was a tenth of the consolidation's rows
    try:
        raw = json.loads(text)
        return raw if isinstance(raw, dict) and isinstance(raw.get("at"), int | float) else None
    except ValueError:
        return None


def do_not_disrupt(annotations: Mapping[str, Any]) -> str | None:
    """The do-not-disrupt annotation set (to anything but "false"), if any."""
    for key in DO_NOT_DISRUPT:
        value = annotations.get(key)
        if value is not None and str(value).lower() != "false":
            return key
    return None


def drainable(pod: Mapping[str, Any]) -> bool:
    """Pods a drain evicts: not DaemonSet-owned, not mirror pods, not finished, not already terminating."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Step:
    """What the caller does now, in this order: evict these pods, patch the node, delete the claim."""

    outcome: str                      # draining, waiting, deleting, done, undone
    evict: tuple[tuple[str, str, str], ...] = ()   # (namespace, name, uid)
    patch: dict[str, Any] | None = None
    delete_claim: bool = False
    message: str = ""
    pods_left: int = 0


def advance(node: str, record: Record, node_annotations: Mapping[str, Any],
            pods: Iterable[Mapping[str, Any]], now: float, fits: bool = True) -> Step:
    """The next step of the drain of `node` given its pods now (pods bound to it). `fits`: whether the
    pods left still re-place on the other nodes (checked again before every round of evictions)."""
    left = [p for p in pods if drainable(p)]
    if record.deleted:
        return Step("deleting", message=f"node {node}: NodeClaim {record.claim} deleted, waiting for it to go")
    held = do_not_disrupt(node_annotations) or next(
        (f"{key} on pod {(p.get('metadata') or {}).get('name')}" for p in left
         if (key := do_not_disrupt((p.get("metadata") or {}).get("annotations") or {}))), None)
    if held and left:
        message = f"node {node}: drain undone, {held}; node uncordoned"
        return Step("undone", patch=undo_patch(record, now, message), pods_left=len(left), message=message)
    if not left:
        done = Record(**{**record.__dict__, "deleted": True})
        return Step("deleting", patch=record_patch(done), delete_claim=True,
                    message=f"node {node}: empty after {len(record.evicted)} eviction(s); NodeClaim "
                            f"{record.claim} deleted")
    if not fits:
        message = (f"node {node}: drain undone, the {len(left)} pod(s) left no longer fit on the other nodes; "
                   "node uncordoned")
        return Step("undone", patch=undo_patch(record, now, message), pods_left=len(left), message=message)
    if now >= record.deadline:
        message = (f"node {node}: drain not finished within {record.deadline - record.started:.0f}s, "
                   f"{len(left)} pod(s) left{_why(record)}; node uncordoned")
        return Step("undone", patch=undo_patch(record, now, message), pods_left=len(left), message=message)
    if now < record.retry_at:
        return Step("waiting", pods_left=len(left),
                    message=f"node {node}: draining, {len(left)} pod(s) left, retrying evictions{_why(record)}")
    evict = tuple((str(m.get("namespace")), str(m.get("name")), str(m.get("uid") or ""))
                  for p in sorted(left, key=_key) if (m := p.get("metadata") or {}).get("uid") not in record.evicted)
    return Step("draining", evict=evict, pods_left=len(left),
                message=f"node {node}: draining, {len(left)} pod(s) left{_why(record)}")


def after_evictions(record: Record, evicted: Iterable[str], refused: str, now: float) -> Record:
    """The record once this pass's evictions were asked: the accepted uids added, a back-off on refusal."""
    return Record(**{**record.__dict__, "evicted": tuple(dict.fromkeys([*record.evicted, *evicted])),
                     "retry_at": now + BACKOFF_SECONDS if refused else 0.0,
                     "blocked": refused or record.blocked})


def _why(record: Record) -> str:
    return f" ({record.blocked})" if record.blocked else ""


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))
