"""Discovery documents (`/version`, `/api`, `/apis`, APIResourceLists) and the Table
form `kubectl get` asks for, built from the resource catalog.

Aggregated discovery (apidiscovery.k8s.io/v2) is not served: the answers are
plain `application/json`, which makes kubectl and client-go fall back to the
legacy documents, as they do against older servers.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from tests.kubeapi.resources import VERBS, Catalog, Resource

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kubeon-test", "gitCommit": "0" * 40,
           "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23",
           "compiler": "gc", "platform": "linux/amd64"}

# subresource -> (kind, group, version, verbs) when it differs from the parent's.
_SUBRESOURCES: dict[str, tuple[str | None, str | None, str | None, list[str]]] = {
    "status": (None, None, None, ["get", "patch", "update"]),
    "scale": ("Scale", "autoscaling", "v1", ["get", "patch", "update"]),
    "binding": ("Binding", "", "v1", ["create"]),
    "eviction": ("Eviction", "policy", "v1", ["create"]),
    "finalize": (None, None, None, ["update"]),
    "log": ("Pod", "", "v1", ["get"]),
}


def api_versions(host: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_groups(catalog: Catalog) -> dict[str, Any]:
    groups = [_group(g, vs) for g, vs in catalog.groups().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(catalog: Catalog, name: str) -> dict[str, Any] | None:
    versions = catalog.groups().get(name)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def resource_list(catalog: Catalog, group: str, version: str) -> dict[str, Any] | None:
    served = [r for r in catalog.all() if r.group == group and r.version == version]
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for r in sorted(served, key=lambda r: r.plural):
        entry: dict[str, Any] = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                                 "kind": r.kind, "verbs": [*VERBS, "deletecollection"]}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        resources.append(entry)
        for sub in r.subresources:
            kind, sgroup, sversion, verbs = _SUBRESOURCES[sub]
            sub_entry: dict[str, Any] = {"name": f"{r.plural}/{sub}", "singularName": "",
                                         "namespaced": r.namespaced, "kind": kind or r.kind, "verbs": verbs}
            if sgroup is not None:
                sub_entry["group"], sub_entry["version"] = sgroup, sversion
            resources.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    secs = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * 2:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _json_path(obj: Any, path: str) -> Any:
    cur = obj
    parts = [p.replace("\\.", ".") for p in re.split(r"(?<!\\)\.", path.strip("{}")) if p]
    for part in parts:
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _ready(obj: dict[str, Any]) -> str:
    return f"{(obj.get('status') or {}).get('readyReplicas', 0)}/{(obj.get('spec') or {}).get('replicas', 1)}"


def _status_int(field: str) -> Any:
    return lambda obj: (obj.get("status") or {}).get(field, 0)


# The columns kube-apiserver's table printers show first for the built-in types tests read.
_BUILTIN_COLUMNS: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "/pods": (("Status", "string", ".status.phase"), ("Node", "string", ".spec.nodeName")),
    "apps/deployments": (("Ready", "string", _ready), ("Up-to-date", "integer", _status_int("updatedReplicas")),
                         ("Available", "integer", _status_int("availableReplicas"))),
    "apps/statefulsets": (("Ready", "string", _ready),),
    "apps/replicasets": (("Desired", "integer", lambda o: (o.get("spec") or {}).get("replicas", 1)),
                         ("Current", "integer", _status_int("replicas")), ("Ready", "integer",
                                                                           _status_int("readyReplicas"))),
}


def table(res: Resource, body: dict[str, Any], include_object: str) -> dict[str, Any]:
    """meta.k8s.io/v1 Table: Name, the CRD's additionalPrinterColumns (or Status for pods), Age."""
    items = body.get("items", [body])
    extra: list[tuple[str, str, Any]] = [
        (c["name"], c.get("type", "string"), c["jsonPath"]) for c in res.printer_columns
        if c.get("priority", 0) == 0 and c["jsonPath"] != ".metadata.creationTimestamp"]
    extra = list(_BUILTIN_COLUMNS.get(res.key, extra))
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    columns += [{"name": n, "type": t, "format": "", "description": "", "priority": 0} for n, t, _ in extra]
    columns.append({"name": "Age", "type": "string", "format": "", "description": "", "priority": 0})
    rows = []
    for item in items:
        cells: list[Any] = [item["metadata"]["name"]]
        for _, _, path in extra:
            value = path(item) if callable(path) else _json_path(item, path)
            cells.append("<none>" if value is None else value)
        cells.append(_age(item["metadata"].get("creationTimestamp")))
        if include_object == "None":
            row_obj = None
        elif include_object == "Object":
            row_obj = item
        else:
            row_obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": item["metadata"]}
        rows.append({"cells": cells, "object": row_obj})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": body.get("metadata", {}).get("resourceVersion", "")},
            "columnDefinitions": columns, "rows": rows}
