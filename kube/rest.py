"""Plain REST calls on an `ApiClient`, for the core and apps API groups, without their generated classes.

Why: in kubernetes-client 37 the generated API classes are pydantic. The first
touch of `client.CoreV1Api` imports a 4 MB module and ~250 models, `AppsV1Api`
another ~100: 1.4-1.6 s and 1.1 s on this 2-core VM at load 5 (docs/testing.md,
"Under load"), paid by every process before its first request (the controller's first pass,
the webhook's and the extender's first LIST, so their readiness). Our adapters
never used the models: they asked `_preload_content=False` and read the JSON.
These calls send the same requests through the same `ApiClient` (its
configuration, bearer token or exec-plugin refresh, client certificate, default
headers, and the `rest_client` that `kube.stoppable` guards) and raise the same
`ApiException` on an answer outside 2xx. The small groups (custom objects,
coordination, RBAC) keep their generated classes: 0.1-0.2 s each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

Query = Mapping[str, str | int | bool | None]


def send(api: client.ApiClient, method: str, path: str, *, query: Query | None = None, body: Any = None,
         content_type: str = JSON, timeout: Any = None) -> Any:
    """Send one request; the urllib3 response with its body unread (a watch streams it). Non-2xx: ApiException."""
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    params = [(k, v) for k, v in (query or {}).items() if v is not None]
    method, url, headers, body, post = api.param_serialize(
        method=method, resource_path=path, query_params=params, header_params=headers, body=body,
        auth_settings=["BearerToken"])
    answer = api.call_api(method, url, header_params=headers, body=body, post_params=post, _request_timeout=timeout)
    if not 200 <= answer.status <= 299:
        answer.read()  # type: ignore[no-untyped-call]
        raise ApiException.from_response(http_resp=answer, body=None, data=None)
    return answer.response


def call(api: client.ApiClient, method: str, path: str, *, query: Query | None = None, body: Any = None,
         content_type: str = JSON, timeout: Any = None) -> dict[str, Any]:
    """One request; the answer's JSON body as a dict ({} when empty)."""
    response = send(api, method, path, query=query, body=body, content_type=content_type, timeout=timeout)
    try:
        data = response.data
    finally:
        response.release_conn()
    return dict(json.loads(data)) if data else {}


def lister(api: client.ApiClient, path: str, **fixed: str) -> Callable[..., Any]:
    """A list function for `kubernetes.watch.Watch.stream` and `kube.reflector.Reflector` on `path`.

    The generated list methods' calling convention, only the arguments those two pass: with
    `_preload_content=False` (both always pass it) the urllib3 response, else the JSON dict.
    `fixed` are query parameters of every call (fieldSelector, labelSelector).
    """

    def list_objects(*, watch: bool | None = None, resource_version: str | None = None,
                     timeout_seconds: int | None = None, allow_watch_bookmarks: bool | None = None,
                     _preload_content: bool = True, _request_timeout: Any = None) -> Any:
        query = {**fixed, "watch": watch, "resourceVersion": resource_version,
                 "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": allow_watch_bookmarks}
        if _preload_content:
            return call(api, "GET", path, query=query, timeout=_request_timeout)
        return send(api, "GET", path, query=query, timeout=_request_timeout)

    list_objects.__name__ = f"list {path}"
    return list_objects
