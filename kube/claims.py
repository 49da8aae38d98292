"""DRA's API (resource.k8s.io/v1): whether it is served, and the ResourceClaimTemplate verbs the controller's
claim-template reconciler needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import rest

DRA_API = "/apis/resource.k8s.io/v1"
_PATH = DRA_API + "/namespaces/{namespace}/resourceclaimtemplates"


def serves_dra(api: client.ApiClient) -> bool:
    """Whether the API serves `resource.k8s.io/v1` (Kubernetes 1.34+): only then are ResourceSlices and
    ResourceClaims watched (an older cluster has no DRA devices, and a watch there would never sync)."""
    try:
        rest.call(api, "GET", DRA_API)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def get_template(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The template, or None when there is none of that name."""
    try:
        return rest.call(api, "GET", f"{_PATH.format(namespace=namespace)}/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_template(api: client.ApiClient, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create it; None when one of that name appeared meanwhile (409)."""
    try:
        return rest.call(api, "POST", _PATH.format(namespace=body["metadata"]["namespace"]), body=dict(body))
    except ApiException as exc:
        if exc.status == 409:
            return None
        raise
