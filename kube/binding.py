"""The extender's bind verb against the API: bind the pod and record its GPU indices in one call.

A core/v1 Binding (the pod's `binding` subresource, what kube-scheduler's
default binder posts) whose `metadata.annotations` carry the record:
kube-apiserver copies them onto the pod in the same update that sets
`spec.nodeName`, and refuses it when the pod is already bound
(pkg/registry/core/pod/storage/storage.go, setPodNodeAndMetadata). So a pod
is never bound without its record, and no record lands on a pod someone
else bound: kube-scheduler binds a pod itself when our `ignorable` extender's
/bind answers late, and a record patched beside that binding would name GPUs
decided for a binding that never happened. The Binding carries the pod's UID
so a pod deleted and re-created under the same name is not bound by mistake.
Errors propagate: the service answers them in `Error`, and kube-scheduler
retries the pod (or, the extender being ignorable, binds it itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube import rest


class ApiBinder:
    """`extender.service.Binder` over the kubernetes client (needs pods/binding create)."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body: Any = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                     "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        rest.call(self.api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)
