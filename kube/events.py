"""Event verbs: core/v1 Events on the objects the controller acts on.

Events on cluster-scoped objects (GpuPolicy, Node) go to the `default` namespace, as
client-go's recorder puts them, so `kubectl describe gpupolicy NAME` shows them: the API
server refuses a core/v1 Event whose involvedObject has no namespace in any other namespace
(pkg/apis/core/validation/events.go, legacyValidateEvent). An Event that
cannot be written is logged and dropped: it never undoes or blocks an action.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import rest

log = logging.getLogger(__name__)

CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None


def emit_event(
    api: client.ApiClient, ref: ObjectRef, reason: str, message: str, now: float,
    event_type: str = "Normal", component: str = "kubeon-gpu-controller", instance: str = "",
    cluster_scoped_namespace: str = CLUSTER_SCOPED_EVENT_NAMESPACE,
) -> bool:
    """Create one Event; False (logged) when the API refused it.

    An Event about a cluster-scoped object goes to `cluster_scoped_namespace` (`default`: the
    only namespace the API server accepts it in, short of kube-system with eventTime set)."""
    namespace = ref.namespace or cluster_scoped_namespace
    stamp = datetime.fromtimestamp(now, tz=UTC).isoformat()
    involved = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "namespace": ref.namespace,
                "uid": ref.uid}
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items() if v is not None},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance or component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        rest.call(api, "POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        return True
    except ApiException as exc:
        log.warning("event not written kind=%s name=%s reason=%s status=%s", ref.kind, ref.name, reason,
                    exc.status)
        return False
