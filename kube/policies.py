"""GpuPolicy verbs: list, watch-free read, and status writes via the status subresource.

GpuPolicy is cluster-scoped (gpu.kubeon.io/v1alpha1, plural gpupolicies). Status
goes through `/status` with merge patches, so the spec (owned by users) is never
written by the controller: `write_status` sets the fields the status writer owns,
`patch_status_entry` one key of a map the reconcilers keep there (`parked`:
scale to zero's park records; `restarts`: right-sizing's restart records).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupolicy.model import GROUP, PLURAL, VERSION


def list_policies(api: client.ApiClient) -> tuple[list[dict[str, Any]], str | None]:
    """All GpuPolicy objects as dicts, and the list's resourceVersion."""
    answer: dict[str, Any] = client.CustomObjectsApi(api).list_cluster_custom_object(  # type: ignore[assignment]
        GROUP, VERSION, PLURAL)
    return list(answer.get("items", [])), (answer.get("metadata") or {}).get("resourceVersion")


def write_status(api: client.ApiClient, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """Replace the policy's status (merge patch on /status). None when the policy is gone."""
    body = {"status": status}
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).patch_cluster_custom_object_status(  # type: ignore[assignment]
            GROUP, VERSION, PLURAL, name, body, _content_type="application/merge-patch+json",
        )
        return obj
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_status_entry(api: client.ApiClient, name: str, field: str, key: str,
                       value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Set (or, with None, remove) status.<field>[key] by a merge patch. None when the policy is gone."""
    return write_status(api, name, {field: {key: value}})


def create_policy(api: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_cluster_custom_object(  # type: ignore[assignment]
        GROUP, VERSION, PLURAL, body)
    return obj


def replace_policy(api: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """Replace metadata and spec whole (body carries the resourceVersion read; 409 on a race)."""
    obj: dict[str, Any] = client.CustomObjectsApi(api).replace_cluster_custom_object(  # type: ignore[assignment]
        GROUP, VERSION, PLURAL, body["metadata"]["name"], body)
    return obj


def delete_policy(api: client.ApiClient, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
