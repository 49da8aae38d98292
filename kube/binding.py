"""The extender's bind verb against the API: record the GPU indices on the pod, then bind it.

Two calls, in this order, so a pod is never bound without its record: a
merge patch of `metadata.annotations` (skipped when there is nothing to
record), then a core/v1 Binding (the pod's `binding` subresource, what
kube-scheduler's default binder posts). The Binding carries the pod's UID
so a pod deleted and re-created under the same name is not bound by
mistake. Errors propagate: the service answers them in `Error`, and
kube-scheduler retries the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube import rest


class ApiBinder:
    """`extender.service.Binder` over the kubernetes client (needs pods patch and pods/binding create)."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if annotations:
            rest.call(self.api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                      body={"metadata": {"annotations": dict(annotations)}}, content_type=rest.MERGE_PATCH)
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body: Any = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        rest.call(self.api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)
