"""The API answers our writers treat as outcomes rather than errors, in one place.

A repeated pass must be idempotent: creating what exists (409) or deleting
what is gone (404) is "nothing to do", listing a kind whose CRD is not
installed (404) is "none"; an eviction refused by a PodDisruptionBudget
(429) or a pod already gone (404) is "not now". Everything else raises.

`UNREACHABLE`: what the kubernetes client raises when no HTTP answer came
back at all (connection refused or reset, a name that does not resolve, a
TLS failure, retries exhausted): urllib3's errors, which are not OSErrors,
and the OSErrors beneath them. A loop that must outlive an API server
restart catches these beside ApiException (`API_ERRORS`: both).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kube import rest

UNREACHABLE: tuple[type[Exception], ...] = (HTTPError, OSError)
API_ERRORS: tuple[type[Exception], ...] = (ApiException, *UNREACHABLE)  # an answer that is an error, or none


def message(exc: ApiException) -> str:
    """The API's own message in an error answer (its Status body), else the HTTP reason."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


def one_line(exc: BaseException) -> str:
    """An API call's failure as one log line: the API's status and message, or the transport error's type
    and text (urllib3's messages nest their cause's repr over several lines)."""
    if isinstance(exc, ApiException):
        return f"API error {exc.status} {message(exc)}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def items_or_empty(call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """A list call's items; [] on 404 (the CRD is not installed: nothing of that kind exists)."""
    try:
        answer = call(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(answer.get("items") or [])


def deleted(call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Run a delete; False when the object was already gone (404)."""
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def created(call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Run a create; False when an object of that name exists already (409: a repeated pass)."""
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def evict(api: client.ApiClient, namespace: str, name: str) -> tuple[int, str]:
    """Ask the Eviction API (policy/v1) to remove a pod: (201, "") accepted, (404, "") gone,
    (429 | 500, why) refused (a PodDisruptionBudget; upstream answers 500 for a misconfigured one)."""
    body: Any = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    try:
        rest.call(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
    except ApiException as exc:
        if exc.status == 404:
            return 404, ""
        if exc.status in (429, 500):
            return int(exc.status), message(exc)
        raise
    return 201, ""
