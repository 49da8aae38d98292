"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
strategic merge patch for the built-in types.

Strategic merge is driven by a small table of list fields and their merge
keys (the `patchMergeKey` tags of the Go types the project touches). Lists
not in the table are replaced whole, which is also what upstream does for
fields without a patch strategy, e.g. `spec.taints` and `spec.tolerations`.
Supported directives: `$patch: replace|delete` on maps and list items,
`$deleteFromPrimitiveList/<field>`, `$retainKeys`; `$setElementOrder/<field>`
is accepted and ignored (order of merged lists: existing items first, new
ones appended).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

from tests.kubeapi.status import ApiError, bad_request, unsupported_media_type

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# field name -> merge key ("" = list of scalars merged as a set)
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "hostAliases": "ip", "conditions": "type",
    "ownerReferences": "uid", "finalizers": "", "addresses": "type",
    "containerStatuses": "name", "initContainerStatuses": "name", "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey", "ports": "containerPort",
}


def check_patch_type(content_type: str, custom: bool) -> str:
    """The patch type, or 415 as upstream answers before reading the object (no strategic
    merge for custom resources)."""
    ctype = content_type.split(";")[0].strip()
    if ctype not in (MERGE, JSON, STRATEGIC, APPLY) or (custom and ctype == STRATEGIC):
        raise unsupported_media_type(ctype)
    return ctype


def apply_patch(current: dict[str, Any], body: bytes, content_type: str, custom: bool) -> dict[str, Any]:
    """Return current with the patch applied; raise ApiError as kube-apiserver would. Apply
    patches are the registry's (tests/kubeapi/apply.py), not a patch of `current`."""
    ctype = check_patch_type(content_type, custom)
    if ctype == APPLY:
        raise unsupported_media_type(ctype)
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from None
    if ctype == JSON:
        if not isinstance(patch, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            result = jsonpatch.apply_patch(current, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                           f"{exc}") from None
        if not isinstance(result, dict):
            raise bad_request("patch result is not an object")
        return result
    if not isinstance(patch, dict):
        raise bad_request("patch body must be a JSON object")
    if ctype == MERGE:
        return merge_patch(current, patch)
    return strategic_merge(current, patch)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        else:
            result[key] = _strip_directives(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if not merge_key or not all(isinstance(p, dict) for p in patch + current):
        out = list(current)
        out.extend(p for p in patch if p not in out)
        return out
    if merge_key == "containerPort" and not any("containerPort" in p for p in patch):
        merge_key = "port"  # Service ports merge on port
    out = [copy.deepcopy(c) for c in current]
    for item in patch:
        key = item.get(merge_key)
        idx = next((i for i, c in enumerate(out) if c.get(merge_key) == key), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(_strip_directives(item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value
