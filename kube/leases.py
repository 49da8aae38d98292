"""Lease verbs (coordination.k8s.io/v1) for leader election.

Every update carries the resourceVersion it read, so two replicas racing for
the same Lease cannot both win: the loser gets 409 and `LeaseConflict`.
Times are RFC 3339 MicroTime as the API stores them; this module converts to
and from unix seconds so the caller's (possibly fake) clock decides expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException


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


def to_micro_time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _seconds(value: datetime | str | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _record(lease: client.V1Lease) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    meta = lease.metadata or client.V1ObjectMeta()
    return LeaseRecord(
        name=str(meta.name),
        namespace=str(meta.namespace),
        holder=spec.holder_identity,
        lease_duration_seconds=int(spec.lease_duration_seconds or 0),
        acquire_time=_seconds(spec.acquire_time),
        renew_time=_seconds(spec.renew_time),
        transitions=int(spec.lease_transitions or 0),
        resource_version=meta.resource_version,
    )


def get_lease(api: client.ApiClient, namespace: str, name: str) -> LeaseRecord | None:
    """The Lease, or None when it does not exist."""
    try:
        return _record(client.CoordinationV1Api(api).read_namespaced_lease(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _body(
    name: str, namespace: str, holder: str, duration: int, acquire: float, renew: float,
    transitions: int, resource_version: str | None,
) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, resource_version=resource_version),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=duration,
            acquire_time=to_micro_time(acquire),
            renew_time=to_micro_time(renew),
            lease_transitions=transitions,
        ),
    )


def create_lease(
    api: client.ApiClient, namespace: str, name: str, holder: str, duration: int, now: float
) -> LeaseRecord:
    """Create the Lease held by `holder`; `LeaseConflict` when it already exists."""
    body = _body(name, namespace, holder, duration, now, now, 0, None)
    try:
        return _record(client.CoordinationV1Api(api).create_namespaced_lease(namespace, body))
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
        updated = client.CoordinationV1Api(api).replace_namespaced_lease(current.name, current.namespace, body)
    except ApiException as exc:
        if exc.status == 409:
            raise LeaseConflict(f"lease {current.namespace}/{current.name} changed under us") from exc
        raise
    return _record(updated)
