"""The webhook's count of pods per shared ResourceClaim (docs/designs/dra.md, "Time-slicing through one shared claim").

A TimeSlicing `via: DRA` policy gives each pod a share of a claim `kubeon-ts-<policy>-<i>` that at most
`replicas` pods name; the webhook picks the claim (`gpupolicy.admission.sharedclaims.pick_shared_claim`)
from these counts. They come from a watch of the pods labelled `gpu.kubeon.io/shared-claim` (those the
webhook rewrote; a pod that ended, Succeeded or Failed, or is being deleted no longer counts) plus the
pods this process admitted in the last `remember_seconds`, which its watch may not show yet: so within one
process a burst of a Deployment's replicas fills one claim and moves on. A pod the watch adds takes the
place of the oldest remembered admission of its claim (the same pod, or one of another process: the sum is
what counts). Across gunicorn workers and webhook replicas a claim may take more than `replicas` pods for as
long as a watch lags (they still run, sharing the GPU more thinly, up to the 256 a claim can be reserved
for). A create refused after the webhook (a later webhook, a quota) is counted for `remember_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpupolicy.dra import SHARED_CLAIM_LABEL
from kube import rest
from kube.reflector import Reflector

ENDED = ("Succeeded", "Failed")


def share_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A shared pod as the cache keeps it: its namespace, name, claim label, phase, deletion."""
    metadata, status = obj.get("metadata") or {}, obj.get("status") or {}
    return {"metadata": {k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels",
                                                   "deletionTimestamp") if k in metadata},
            "status": {"phase": status.get("phase")} if isinstance(status, Mapping) else {}}


class SharedClaimPods:
    """Pods per (namespace, claim): watched, plus this process's recent admissions."""

    def __init__(self, api_client: Any, on_change: Callable[[str, dict[str, Any]], None], *,
                 remember_seconds: float = 30.0, timeout_seconds: int = 300,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._remember, self._clock, self._on_change = remember_seconds, clock, on_change
        self._admitted: list[tuple[float, str, str]] = []  # (when, namespace, claim)
        self._lock = threading.Lock()
        self.reflector = Reflector(rest.lister(api_client, "/api/v1/pods", labelSelector=SHARED_CLAIM_LABEL),
                                   on_change=self._seen, transform=share_fields, name="shared-claim-pods",
                                   timeout_seconds=timeout_seconds)

    def _seen(self, event: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        claim = (metadata.get("labels") or {}).get(SHARED_CLAIM_LABEL)
        if event == "ADDED" and claim:
            with self._lock:
                key = (str(metadata.get("namespace")), str(claim))
                index = next((i for i, entry in enumerate(self._admitted) if entry[1:] == key), None)
                if index is not None:
                    del self._admitted[index]
        self._on_change(event, pod)

    def note(self, namespace: str, claim: str) -> None:
        """A pod this process just admitted naming `claim`."""
        with self._lock:
            self._admitted.append((self._clock(), namespace, claim))

    def counts(self) -> dict[tuple[str, str], int]:
        """(namespace, claim) -> pods naming it that have not ended."""
        found: dict[tuple[str, str], int] = {}
        for pod in self.reflector.snapshot().values():
            metadata = pod.get("metadata") or {}
            claim = (metadata.get("labels") or {}).get(SHARED_CLAIM_LABEL)
            if claim and not metadata.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ENDED:
                key = (str(metadata.get("namespace")), str(claim))
                found[key] = found.get(key, 0) + 1
        with self._lock:
            since = self._clock() - self._remember
            self._admitted = [entry for entry in self._admitted if entry[0] >= since]
            for _, namespace, claim in self._admitted:
                found[(namespace, claim)] = found.get((namespace, claim), 0) + 1
        return found
