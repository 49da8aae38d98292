"""Label and field selectors: the query-string forms (`labelSelector=`, `fieldSelector=`)
and the structured `LabelSelector` used by PDBs and webhook configurations.

Grammar follows apimachinery's labels.Parse: `k`, `!k`, `k=v`, `k==v`, `k!=v`,
`k in (a,b)`, `k notin (a,b)`, comma-joined (AND). Field selectors support
`=`, `==`, `!=` on the fields each resource type registers (unknown fields are
400 as on a real server).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.kubeapi.status import bad_request

Requirement = tuple[str, str, tuple[str, ...]]  # key, op, values
_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|!=|=|\s+in\s+|\s+notin\s+)\s*(.*?))?\s*$")


def _split_terms(text: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t for t in terms if t.strip()]


def parse_labels(text: str | None) -> list[Requirement]:
    if not text:
        return []
    reqs: list[Requirement] = []
    for term in _split_terms(text):
        m = _TERM.match(term)
        if not m:
            raise bad_request(f"unable to parse requirement: {term!r}")
        neg, key, op, value = m.group(1), m.group(2), (m.group(3) or "").strip(), m.group(4)
        if neg:
            if op:
                raise bad_request(f"unable to parse requirement: {term!r}")
            reqs.append((key, "!", ()))
        elif not op:
            reqs.append((key, "exists", ()))
        elif op in ("in", "notin"):
            if not (value and value.startswith("(") and value.endswith(")")):
                raise bad_request(f"unable to parse requirement: found '{value}', expected: '('")
            vals = tuple(v.strip() for v in value[1:-1].split(",") if v.strip())
            reqs.append((key, op, vals))
        else:
            reqs.append((key, "!=" if op == "!=" else "=", (value or "",)))
    return reqs


def match_requirements(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, vals in reqs:
        has = key in labels
        val = labels.get(key)
        if op == "exists":
            ok = has
        elif op == "!":
            ok = not has
        elif op == "=":
            ok = has and val == vals[0]
        elif op == "!=":
            ok = not has or val != vals[0]  # `!=` matches objects without the key, as upstream
        elif op == "in":
            ok = has and val in vals
        else:
            ok = not has or val not in vals
        if not ok:
            return False
    return True


def match_label_selector(selector: dict[str, Any] | None, labels: dict[str, str] | None,
                         null_matches: bool = True) -> bool:
    """metav1.LabelSelector semantics: {} matches everything; None matches per null_matches."""
    if selector is None:
        return null_matches
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr.get("key"), expr.get("operator"), expr.get("values") or []
        has = key in labels
        if op == "In" and not (has and labels[key] in vals):
            return False
        if op == "NotIn" and has and labels[key] in vals:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise bad_request(f'"{op}" is not a valid label selector operator')
    return True


def selector_string(selector: dict[str, Any] | None) -> str:
    """The query-string form of a LabelSelector (Scale.status.selector)."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        op, key, vals = e["operator"], e["key"], ",".join(sorted(e.get("values") or []))
        parts.append({"In": f"{key} in ({vals})", "NotIn": f"{key} notin ({vals})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])
    return ",".join(parts)


# Field selectors -------------------------------------------------------------------------------
def _path(*keys: str) -> Callable[[dict[str, Any]], str]:
    def get(obj: dict[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)
    return get


_COMMON = {"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")}
_EXTRA: dict[str, tuple[str, ...]] = {
    "/pods": ("spec.nodeName", "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName",
              "status.phase", "status.podIP", "status.nominatedNodeName"),
    "/nodes": ("spec.unschedulable",),
    "/namespaces": ("status.phase",),
    "/secrets": ("type",),
    "/events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
    "events.k8s.io/events": ("regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
                             "reason", "reportingController", "type"),
    "apps/replicasets": ("status.replicas",),
}


def parse_fields(text: str | None, key: str) -> list[tuple[Callable[[dict[str, Any]], str], bool, str]]:
    """Parse a fieldSelector for storage key `key`: list of (getter, equal?, value)."""
    if not text:
        return []
    allowed = dict(_COMMON)
    for f in _EXTRA.get(key, ()):
        allowed[f] = _path(*f.split("."))
    out = []
    for term in text.split(","):
        if not term.strip():
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = m.groups()
        if field not in allowed:
            raise bad_request(f'field label not supported: {field}')
        out.append((allowed[field], op != "!=", value))
    return out


def match_fields(reqs: list[tuple[Callable[[dict[str, Any]], str], bool, str]], obj: dict[str, Any]) -> bool:
    return all((get(obj) == value) == equal for get, equal, value in reqs)
