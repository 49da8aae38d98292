"""Wake the capacity pass when pods turn unschedulable, batched as Karpenter batches them.

Why: a pass every 10 s alone adds 5 s on average (10 at worst) to every pending
GPU pod before its node is even asked for, where Karpenter launches within a
second or two of kube-scheduler giving up. Waking at the first event would
plan a Deployment's replicas one by one (the first pass sees one pod), so the
pass is due `IDLE_SECONDS` after the last such event, and never later than
`MAX_SECONDS` after the first of the batch: Karpenter's own batch window
(`BATCH_IDLE_DURATION` 1 s, `BATCH_MAX_DURATION` 10 s, karpenter
pkg/operator/options/options.go). The periodic pass stays as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

IDLE_SECONDS = 1.0
MAX_SECONDS = 10.0


def turned_unschedulable(event: str, pod: Mapping[str, Any]) -> bool:
    """A live pod kube-scheduler could not place (PodScheduled False, reason Unschedulable), not bound."""
    if event == "DELETED" or (pod.get("spec") or {}).get("nodeName"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in conditions if isinstance(c, Mapping))


class PendingBatch:
    """`on_pod(event, pod)` from the pod watch; calls `due_at(when)` with the batch's end (clock seconds)."""

    def __init__(self, due_at: Callable[[float], None], now: Callable[[], float]) -> None:
        self._due_at = due_at
        self._now = now
        self._first: float | None = None
        self._lock = threading.Lock()

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        if not turned_unschedulable(event, pod):
            return
        with self._lock:
            now = self._now()
            if self._first is None or now - self._first >= MAX_SECONDS:
                self._first = now  # a new batch
            when = min(now + IDLE_SECONDS, self._first + MAX_SECONDS)
        self._due_at(when)
