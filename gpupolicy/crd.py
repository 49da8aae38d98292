"""The GpuPolicy CustomResourceDefinition, generated from the pydantic model.

The model is the single source of truth; this turns its JSON Schema into a
*structural* openAPIV3Schema the API server accepts: `$ref`s inlined,
`Optional[X]` (`anyOf [X, null]`) collapsed to `X` (absent means unset; the
model dumps without nulls), titles and defaults dropped (defaults live in the
model, and an omitted `mode` must stay omitted so the install's defaultMode
applies), `additionalProperties: false` dropped (pruning already refuses
unknown fields) and `additionalProperties: true` (status, conditions) turned
into `x-kubernetes-preserve-unknown-fields`. Enums are kept.

Printer column Kind: which body a policy has is not a single field, and a
printer column is one simple JSONPath, so Kind reads the label
`gpu.kubeon.io/kind`, which the webhook's /mutate sets on GpuPolicy
CREATE/UPDATE (validation.kind_label_patch). Pure.
"""

from __future__ import annotations

from typing import Any

from gpupolicy.model import GROUP, KIND, PLURAL, VERSION, GpuPolicy, GpuPolicySpec, GpuPolicyStatus

CRD_NAME = f"{PLURAL}.{GROUP}"
SHORT_NAMES = ["gpup"]
_DROP = {"title", "default", "$defs"}


class SchemaError(ValueError):
    """The model produced a schema shape a structural CRD schema cannot express."""


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaError(f"anyOf with {len(branches)} non-null branches cannot be structural")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _resolve({**branches[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _resolve(value, defs)
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
            continue
        out[key] = _resolve(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def structural_schema(model: type[Any]) -> dict[str, Any]:
    """The model's JSON Schema, made structural (see the module docstring)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    _check_structural(schema, "")
    return schema


def _check_structural(node: dict[str, Any], path: str) -> None:
    for banned in ("anyOf", "oneOf", "allOf", "$ref"):
        if banned in node:
            raise SchemaError(f"{path or '(root)'}: {banned} left in schema")
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{path or '(root)'}: no type")
    for name, sub in (node.get("properties") or {}).items():
        _check_structural(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        _check_structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _check_structural(node["additionalProperties"], f"{path}{{}}")


def open_api_schema() -> dict[str, Any]:
    spec = structural_schema(GpuPolicySpec)
    status = structural_schema(GpuPolicyStatus)
    return {
        "type": "object",
        "description": "GpuPolicy: how the optimizer may share, pack, scale and guard GPU workloads.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Kind", "type": "string", "jsonPath": ".metadata.labels.gpu\\.kubeon\\.io/kind",
         "description": "policy body (set by the admission webhook)"},
        {"name": "Mode", "type": "string", "jsonPath": ".status.effectiveMode",
         "description": "the mode the optimizer enforces (lowered to Recommend without GPU metrics for "
                        "sharing and scaleToZero); empty until the controller has seen the policy"},
        {"name": "Requested", "type": "string", "jsonPath": ".status.requestedMode",
         "description": "the mode the policy asks for: spec.mode, else the install's defaultMode"},
        {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
        {"name": "Hub", "type": "string", "jsonPath": ".metadata.labels.gpu\\.kubeon\\.io/hub",
         "description": "Connected or Disconnected for hub-managed policies (set by the controller's hub sync)"},
        {"name": "Via", "type": "string", "jsonPath": ".spec.sharing.via",
         "description": "sharing policies: DRA when pods claim through ResourceClaimTemplates kubeon-<class>-<size> "
                        "(docs/designs/dra.md), else the device plugin"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition for GpuPolicy."""
    assert GpuPolicy.model_fields  # the model the schema comes from
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": PLURAL, "singular": KIND.lower(), "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": SHORT_NAMES},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": open_api_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer_columns(),
            }],
        },
    }
