"""RFC 6902 JSON Patch between an object and its mutated copy.

The mutation code edits a deep copy of the object; this module turns the
difference into add/remove/replace operations (no move/copy, so a reader of
the dry-run answer sees plainly what changes). Pointers escape `~` as `~0`
and `/` as `~1` (`nvidia.com~1gpu`). Pure.
"""

from __future__ import annotations

from typing import Any

PatchOp = dict[str, Any]


def escape(token: str) -> str:
    """JSON Pointer escaping of one reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[PatchOp]:
    """Operations that turn `old` into `new` (applying them with any RFC 6902 library gives `new`).

    Subtrees shared by identity are skipped without being walked: mutation
    copies only what it writes (rewrite.writable_copy), so this stays cheap
    on large pods.
    """
    if old is new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[PatchOp] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": path + "/" + escape(key)})
        for key, value in new.items():
            sub = path + "/" + escape(key)
            if key not in old:
                ops.append({"op": "add", "path": sub, "value": value})
            else:
                ops.extend(diff(old[key], value, sub))
        return ops
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new):
            return [op for i, (a, b) in enumerate(zip(old, new, strict=True))
                    for op in diff(a, b, f"{path}/{i}")]
        if len(new) > len(old) and new[: len(old)] == old:
            return [{"op": "add", "path": f"{path}/-", "value": v} for v in new[len(old):]]
        return [{"op": "replace", "path": path, "value": new}]
    if type(old) is type(new) and old == new:
        return []
    return [{"op": "replace", "path": path, "value": new}]
