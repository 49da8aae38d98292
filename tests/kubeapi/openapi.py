"""A minimal OpenAPI v3 answer: just enough for kubectl to see that the server does
field validation itself (the `fieldValidation` query parameter on each kind's
PATCH operation), so `kubectl create -f` / `apply` work without
`--validate=false` and send `fieldValidation=Strict`.

Schemas are not published (no `components.schemas`): `kubectl explain` does
not work, and `/openapi/v2` answers 404, which kubectl only needs when
server-side validation is unsupported.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tests.kubeapi.resources import Catalog

_PARAM = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
          "description": "Strict, Warn or Ignore"}


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def root(catalog: Catalog) -> dict[str, Any]:
    paths = {}
    for group, versions in catalog.groups().items():
        for version in versions:
            gv = _gv_path(group, version)
            doc_hash = hashlib.sha256(repr(group_version(catalog, group, version)).encode()).hexdigest()[:32]
            paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={doc_hash}"}
    return {"paths": paths}


def group_version(catalog: Catalog, group: str, version: str) -> dict[str, Any] | None:
    served = [r for r in catalog.all() if r.group == group and r.version == version]
    if not served:
        return None
    paths: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    for r in sorted(served, key=lambda r: r.plural):
        item = f"{prefix}/namespaces/{{namespace}}/{r.plural}/{{name}}" if r.namespaced \
            else f"{prefix}/{r.plural}/{{name}}"
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        op = {"operationId": f"patch{r.kind}", "x-kubernetes-group-version-kind": gvk,
              "x-kubernetes-action": "patch", "parameters": [_PARAM],
              "responses": {"200": {"description": "OK"}}}
        paths[item] = {"patch": op}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths,
            "components": {"schemas": {}}}
