"""RFC 6902 JSON Patch between an object and its mutated copy.

This module turns the difference between an object and a changed copy into
add/remove/replace operations (no move/copy, so a reader of
the dry-run answer sees plainly what changes). Pointers escape `~` as `~0`
and `/` as `~1` (`nvidia.com~1gpu`). Pure.
"""

from __future__ import annotations

from typing import Any

PatchOp = dict[str, Any]
_MISSING: Any = object()


def escape(token: str) -> str:
    """JSON Pointer escaping of one reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[PatchOp]:
    """Operations that turn `old` into `new` (applying them with any RFC 6902 library gives `new`).

    Subtrees shared by identity are skipped without being walked, or even
    called: a copy that shares every value it did not change is walked only
    along the paths that changed. A pod's mutation builds its patch from its
    writes instead (gpupolicy.admission.writes); this serves the dry-run of a
    workload, the kind label, and the tests' reference for the built patch.
    """
    ops: list[PatchOp] = []
    if old is not new:
        _walk(old, new, path, ops)
    return ops


def _walk(old: Any, new: Any, path: str, ops: list[PatchOp]) -> None:
    """`diff` of two values that are not the same object, appended to `ops` (one list, no per-level lists:
    the admission hot path calls this for every level the rewrite copied)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if not old.keys() <= new.keys():  # a C-level check; the per-key loop only when a key went
            ops += [{"op": "remove", "path": path + "/" + escape(key)} for key in old if key not in new]
        get = old.get
        for key, value in new.items():
            before = get(key, _MISSING)
            if before is value:  # shared with the original: not written, not walked
                continue
            if before is _MISSING:
                ops.append({"op": "add", "path": path + "/" + escape(key), "value": value})
            else:
                _walk(before, value, path + "/" + escape(key), ops)
        return
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new):
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                if a is not b:
                    _walk(a, b, f"{path}/{i}", ops)
            return
        if len(new) > len(old) and new[: len(old)] == old:
            ops += [{"op": "add", "path": f"{path}/-", "value": v} for v in new[len(old):]]
            return
        ops.append({"op": "replace", "path": path, "value": new})
        return
    if type(old) is type(new) and old == new:
        return
    ops.append({"op": "replace", "path": path, "value": new})
