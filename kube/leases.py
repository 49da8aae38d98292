"""Lease verbs (coordination.k8s.io/v1) for leader election.

Every update carries the resourceVersion it read, so two replicas racing for
the same Lease cannot both win: the loser gets 409 and `LeaseConflict`.
Times are RFC 3339 MicroTime as the API stores them; this module converts to
and from unix seconds so the caller's (possibly fake) clock decides expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import rest


class LeaseConflict(Exception):
    """Someone else wrote the Lease first (409) or created it first."""


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease leader election reads."""

    name: str
    namespace: str
    holder: str | None
    lease_duration_seconds: int
    acquire_time: float | None
    renew_time: float | None
    transitions: int
    resource_version: str | None

    def expired(self, now: float) -> bool:
        """No holder, never renewed, or renewTime + duration has passed."""
        if not self.holder or self.renew_time is None:
            return True
        return now > self.renew_time + self.lease_duration_seconds


def to_micro_time(ts: float) -> str:
    """`ts` as the API's MicroTime text, always with six fractional digits.

    kube-apiserver parses MicroTime with the fixed layout `2006-01-02T15:04:05.000000Z07:00`
    (apimachinery meta/v1 micro_time.go): a time on a whole second sent as Python's `isoformat()`
    writes it (`...:20+00:00`, no fraction) is refused with 400, so the client's own datetime
    serialization may not be used."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(value: datetime | str | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _record(lease: dict[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    meta = lease.get("metadata") or {}
    return LeaseRecord(
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace")),
        holder=spec.get("holderIdentity"),
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_seconds(spec.get("acquireTime")),
        renew_time=_seconds(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=meta.get("resourceVersion"),
    )


def _path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


def get_lease(api: client.ApiClient, namespace: str, name: str) -> LeaseRecord | None:
    """The Lease, or None when it does not exist."""
    try:
        return _record(rest.call(api, "GET", _path(namespace, name)))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _body(
    name: str, namespace: str, holder: str, duration: int, acquire: float, renew: float,
    transitions: int, resource_version: str | None,
) -> dict[str, Any]:
    """The Lease as wire JSON: sent through kube.rest, as the generated client's pydantic models turn
    MicroTime text back into datetimes and write them with `isoformat()`."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                 "acquireTime": to_micro_time(acquire), "renewTime": to_micro_time(renew),
                 "leaseTransitions": transitions},
    }


def create_lease(
    api: client.ApiClient, namespace: str, name: str, holder: str, duration: int, now: float
) -> LeaseRecord:
    """Create the Lease held by `holder`; `LeaseConflict` when it already exists."""
    body = _body(name, namespace, holder, duration, now, now, 0, None)
    try:
        return _record(rest.call(api, "POST", _path(namespace), body=body))
    except ApiException as exc:
        if exc.status == 409:
            raise LeaseConflict(f"lease {namespace}/{name} created by someone else") from exc
        raise


def replace_lease(
    api: client.ApiClient, current: LeaseRecord, holder: str, duration: int,
    acquire: float, renew: float, transitions: int,
) -> LeaseRecord:
    """Write the Lease if nobody changed it since `current` was read; `LeaseConflict` otherwise."""
    body = _body(current.name, current.namespace, holder, duration, acquire, renew, transitions,
                 current.resource_version)
    try:
        updated = rest.call(api, "PUT", _path(current.namespace, current.name), body=body)
    except ApiException as exc:
        if exc.status == 409:
            raise LeaseConflict(f"lease {current.namespace}/{current.name} changed under us") from exc
        raise
    return _record(updated)
