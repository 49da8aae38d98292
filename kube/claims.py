"""DRA's API (resource.k8s.io/v1): whether it is served, and the ResourceClaimTemplate and ResourceClaim verbs
the controller's claim-template reconciler needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import rest

DRA_API = "/apis/resource.k8s.io/v1"


def _path(namespace: str, plural: str) -> str:
    return f"{DRA_API}/namespaces/{namespace}/{plural}"


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


def get_template(api: client.ApiClient, namespace: str, name: str,
                 plural: str = "resourceclaimtemplates") -> dict[str, Any] | None:
    """The template (`plural` resourceclaims: the claim), or None when there is none of that name."""
    try:
        return rest.call(api, "GET", f"{_path(namespace, plural)}/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_template(api: client.ApiClient, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create it (a ResourceClaimTemplate or a ResourceClaim); None when one of that name appeared meanwhile (409)."""
    plural = "resourceclaims" if body.get("kind") == "ResourceClaim" else "resourceclaimtemplates"
    try:
        return rest.call(api, "POST", _path(body["metadata"]["namespace"], plural), body=dict(body))
    except ApiException as exc:
        if exc.status == 409:
            return None
        raise
