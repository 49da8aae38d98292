"""Custom resources against their CRD's openAPIV3Schema: pruning, defaulting, validation.

What kube-apiserver does for a structural schema, in the same order: unknown
fields are pruned (unless `x-kubernetes-preserve-unknown-fields`), nulls on
non-nullable fields are dropped, `default`s are applied, then the object is
validated: type, enum, required, minimum/maximum (and exclusive), minLength/
maxLength, pattern, minItems/maxItems, uniqueItems, minProperties/
maxProperties, additionalProperties, x-kubernetes-int-or-string, allOf/anyOf/
oneOf/not. Messages follow apimachinery's field errors (`spec.mode:
Unsupported value: "X": supported values: "A", "B"`). Not done: `format`
checks, CEL `x-kubernetes-validations`, list-type/map-type uniqueness, and
metadata pruning beyond what ObjectMeta carries.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

Cause = tuple[str, str, str]  # field, reason, message


def render(value: Any) -> str:
    """Go's %#v-like rendering used inside field error messages."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# pruning + defaulting --------------------------------------------------------------------------
def prune(obj: Any, schema: dict[str, Any] | None, path: str = "", root: bool = False) -> tuple[Any, list[str]]:
    """Remove fields the schema does not know; return (obj, pruned field paths)."""
    pruned: list[str] = []
    if schema is None or not isinstance(obj, (dict, list)):
        return obj, pruned
    if isinstance(obj, list):
        items = schema.get("items")
        out = []
        for i, item in enumerate(obj):
            v, p = prune(item, items, f"{path}[{i}]")
            out.append(v)
            pruned += p
        return out, pruned
    if schema.get("x-kubernetes-embedded-resource") or schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties") or {}
        out_d = dict(obj)
        for k, sub in props.items():
            if k in out_d:
                out_d[k], p = prune(out_d[k], sub, _join(path, k))
                pruned += p
        return out_d, pruned
    props = schema.get("properties")
    addl = schema.get("additionalProperties")
    out_d = {}
    for k, v in obj.items():
        sub = None
        if root and k in ("apiVersion", "kind", "metadata"):
            out_d[k] = v
            continue
        if props is not None and k in props:
            sub = props[k]
        elif isinstance(addl, dict):
            sub = addl
        elif addl is True or (props is None and addl is None and schema.get("type") != "object"):
            out_d[k] = v
            continue
        else:
            pruned.append(_join(path, k))
            continue
        if v is None and not sub.get("nullable"):
            continue  # nulls on non-nullable fields are dropped before defaulting, as upstream
        out_d[k], p = prune(v, sub, _join(path, k))
        pruned += p
    return out_d, pruned


def apply_defaults(obj: Any, schema: dict[str, Any] | None) -> Any:
    if schema is None:
        return obj
    if isinstance(obj, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k not in obj and "default" in sub:
                obj[k] = copy.deepcopy(sub["default"])
            if k in obj:
                apply_defaults(obj[k], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for k, v in obj.items():
                if k not in (schema.get("properties") or {}):
                    apply_defaults(v, addl)
    elif isinstance(obj, list):
        for item in obj:
            apply_defaults(item, schema.get("items"))
    return obj


# validation ------------------------------------------------------------------------------------
def validate(obj: Any, schema: dict[str, Any] | None, path: str = "") -> list[Cause]:
    if schema is None:
        return []
    errs: list[Cause] = []
    if obj is None and schema.get("nullable"):
        return []
    typ = schema.get("type")
    int_or_string = schema.get("x-kubernetes-int-or-string")
    if int_or_string:
        if not (isinstance(obj, str) or (isinstance(obj, int) and not isinstance(obj, bool))):
            return [(path, "FieldValueInvalid",
                     f"Invalid value: {render(_type_name(obj))}: {path} in body must be of type "
                     f"integer,string: {render(_type_name(obj))}")]
    elif typ and not _is_type(obj, typ):
        return [(path, "FieldValueTypeInvalid" if obj is not None else "FieldValueRequired",
                 f"Invalid value: {render(_type_name(obj))}: {path} in body must be of type {typ}: "
                 f"{render(_type_name(obj))}")]
    if "enum" in schema and obj not in schema["enum"]:
        allowed = ", ".join(render(v) for v in schema["enum"])
        errs.append((path, "FieldValueNotSupported", f"Unsupported value: {render(obj)}: supported values: {allowed}"))
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        errs += _numeric(obj, schema, path)
    if isinstance(obj, str):
        errs += _string(obj, schema, path)
    if isinstance(obj, list):
        errs += _array(obj, schema, path)
    if isinstance(obj, dict):
        errs += _object(obj, schema, path)
    errs += _combinators(obj, schema, path)
    return errs


def _is_type(obj: Any, typ: str) -> bool:
    if typ == "object":
        return isinstance(obj, dict)
    if typ == "array":
        return isinstance(obj, list)
    if typ == "string":
        return isinstance(obj, str)
    if typ == "boolean":
        return isinstance(obj, bool)
    if typ == "integer":
        return (isinstance(obj, int) and not isinstance(obj, bool)) or (isinstance(obj, float) and obj.is_integer())
    if typ == "number":
        return isinstance(obj, (int, float)) and not isinstance(obj, bool)
    return True


def _numeric(obj: float, s: dict[str, Any], path: str) -> list[Cause]:
    errs = []
    if "minimum" in s:
        if s.get("exclusiveMinimum") and obj <= s["minimum"]:
            errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be "
                         f"greater than {render(s['minimum'])}"))
        elif obj < s["minimum"]:
            errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be "
                         f"greater than or equal to {render(s['minimum'])}"))
    if "maximum" in s:
        if s.get("exclusiveMaximum") and obj >= s["maximum"]:
            errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be "
                         f"less than {render(s['maximum'])}"))
        elif obj > s["maximum"]:
            errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be "
                         f"less than or equal to {render(s['maximum'])}"))
    if "multipleOf" in s and s["multipleOf"] and (obj / s["multipleOf"]) % 1:
        errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be a "
                     f"multiple of {render(s['multipleOf'])}"))
    return errs


def _string(obj: str, s: dict[str, Any], path: str) -> list[Cause]:
    errs = []
    if "minLength" in s and len(obj) < s["minLength"]:
        errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should be at "
                     f"least {s['minLength']} chars long"))
    if "maxLength" in s and len(obj) > s["maxLength"]:
        errs.append((path, "FieldValueTooLong", f"Too long: may not be more than {s['maxLength']} bytes"))
    if "pattern" in s and not re.search(s["pattern"], obj):
        errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body should match "
                     f"'{s['pattern']}'"))
    return errs


def _array(obj: list[Any], s: dict[str, Any], path: str) -> list[Cause]:
    errs = []
    if "minItems" in s and len(obj) < s["minItems"]:
        errs.append((path, "FieldValueInvalid", f"Invalid value: {len(obj)}: {path} in body should have at "
                     f"least {s['minItems']} items"))
    if "maxItems" in s and len(obj) > s["maxItems"]:
        errs.append((path, "FieldValueTooMany", f"Too many: {len(obj)}: must have at most {s['maxItems']} items"))
    if s.get("uniqueItems"):
        seen = [json.dumps(v, sort_keys=True) for v in obj]
        if len(set(seen)) != len(seen):
            errs.append((path, "FieldValueDuplicate", f"Duplicate value: {path} in body shouldn't contain "
                         f"duplicates"))
    for i, item in enumerate(obj):
        errs += validate(item, s.get("items"), f"{path}[{i}]")
    return errs


def _object(obj: dict[str, Any], s: dict[str, Any], path: str) -> list[Cause]:
    errs = []
    for req in s.get("required") or []:
        if req not in obj:
            errs.append((_join(path, req), "FieldValueRequired", "Required value"))
    if "minProperties" in s and len(obj) < s["minProperties"]:
        errs.append((path, "FieldValueInvalid", f"Invalid value: {len(obj)}: {path} in body should have at "
                     f"least {s['minProperties']} properties"))
    if "maxProperties" in s and len(obj) > s["maxProperties"]:
        errs.append((path, "FieldValueTooMany", f"Too many: {len(obj)}: must have at most "
                     f"{s['maxProperties']} items"))
    props = s.get("properties") or {}
    addl = s.get("additionalProperties")
    for k, v in obj.items():
        if path == "" and k in ("apiVersion", "kind", "metadata"):
            continue
        if k in props:
            errs += validate(v, props[k], _join(path, k))
        elif isinstance(addl, dict):
            errs += validate(v, addl, _join(path, k))
        elif addl is False:
            errs.append((_join(path, k), "FieldValueForbidden", "Forbidden: additional properties not allowed"))
    return errs


def _combinators(obj: Any, s: dict[str, Any], path: str) -> list[Cause]:
    errs = []
    for sub in s.get("allOf") or []:
        errs += validate(obj, sub, path)
    if s.get("anyOf") and all(validate(obj, sub, path) for sub in s["anyOf"]):
        errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body must match "
                     f"at least one schema (anyOf)"))
    if s.get("oneOf"):
        matches = sum(1 for sub in s["oneOf"] if not validate(obj, sub, path))
        if matches != 1:
            errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body must "
                         f"validate one and only one schema (oneOf)"))
    if "not" in s and not validate(obj, s["not"], path):
        errs.append((path, "FieldValueInvalid", f"Invalid value: {render(obj)}: {path} in body must not "
                     f"validate the schema (not)"))
    return errs
