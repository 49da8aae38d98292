"""The one shape check: does a Kubernetes object have the types the core reads? Pure.

kube-apiserver validates objects before it calls a webhook, but the dry-run
endpoint, the command line and hand-made requests see whatever was written:
`labels: [a]`, `resources: "2"`, `containers: {}`. The core reads objects
with plain `.get` chains and does not check types at every step; checking
here once, before the core runs, turns such input into one message naming the
field path (`object.spec.containers[0].resources.limits: must be a map`),
answered as HTTP 400 or, on the command line, exit code 2.

Only the fields the core reads are checked (anything else passes untouched),
quantities are parsed with the one quantity parser, and the walk follows the
spec below, never the input, so its depth is fixed whatever the object. An
explicit null is accepted wherever a field is optional (YAML's `labels:` with
nothing after it), as the API server decodes null to the empty value.

Used by the webhook (/mutate, /validate, /dry-run), `kubeon-gpu dry-run` and
the extender (the Pod and Node objects in ExtenderArgs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from gpupolicy.k8s.quantity import QuantityError, parse_nanos, shown

# A spec is a type name, a dict of field specs (an object), ("list", spec) or ("map", spec).
Spec = Any
STRING, BOOLEAN, INTEGER, QUANTITY, ANY_OBJECT = "string", "boolean", "integer", "quantity", "object"

_MAP_OF_STRINGS = ("map", STRING)
_OWNER_REFERENCE = {"apiVersion": STRING, "kind": STRING, "name": STRING, "uid": STRING, "controller": BOOLEAN}
METADATA: Spec = {
    "name": STRING, "generateName": STRING, "namespace": STRING, "uid": STRING,
    "labels": _MAP_OF_STRINGS, "annotations": _MAP_OF_STRINGS, "ownerReferences": ("list", _OWNER_REFERENCE),
}
_RESOURCES = {"limits": ("map", QUANTITY), "requests": ("map", QUANTITY)}
_CONTAINER = {"name": STRING, "image": STRING, "resources": _RESOURCES}
_REQUIREMENT = {"key": STRING, "operator": STRING, "values": ("list", STRING)}
_TERM = {"matchExpressions": ("list", _REQUIREMENT), "matchFields": ("list", _REQUIREMENT)}
_NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ("list", _TERM)},
    "preferredDuringSchedulingIgnoredDuringExecution": ("list", {"weight": INTEGER, "preference": _TERM}),
}
_TOLERATION = {"key": STRING, "operator": STRING, "value": STRING, "effect": STRING, "tolerationSeconds": INTEGER}
POD_SPEC: Spec = {
    "containers": ("list", _CONTAINER), "initContainers": ("list", _CONTAINER),
    "nodeSelector": _MAP_OF_STRINGS, "nodeName": STRING, "schedulerName": STRING,
    "runtimeClassName": STRING, "priorityClassName": STRING,
    "tolerations": ("list", _TOLERATION), "affinity": {"nodeAffinity": _NODE_AFFINITY},
}
POD: Spec = {"kind": STRING, "apiVersion": STRING, "metadata": METADATA, "spec": POD_SPEC,
             "status": {"phase": STRING}}
POD_TEMPLATE: Spec = {"metadata": METADATA, "spec": POD_SPEC}
NODE: Spec = {
    "kind": STRING, "apiVersion": STRING, "metadata": METADATA,
    "spec": {"unschedulable": BOOLEAN, "taints": ("list", {"key": STRING, "value": STRING, "effect": STRING})},
    "status": {"allocatable": ("map", QUANTITY), "capacity": ("map", QUANTITY)},
}
NAMESPACE: Spec = {"kind": STRING, "apiVersion": STRING, "metadata": METADATA}
# A policy's spec is read by its pydantic model, which names fields itself.
POLICY: Spec = {"kind": STRING, "apiVersion": STRING, "metadata": METADATA, "spec": ANY_OBJECT}

# kind -> path of the pod template inside a workload (the same table the dry-run uses)
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]{1,80}", re.ASCII)
_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
          float: "a number", type(None): "null"}


def _key(key: Any) -> str:
    """A map key as a path step: plain keys as they are, anything else quoted, short and ASCII."""
    return f".{key}" if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else f"[{shown(key)}]"


def _wrong(path: str, want: str, value: Any) -> str:
    return f"{path}: must be {want}, not {_NAMES.get(type(value), 'a ' + type(value).__name__)}"


def _what(want: str, value: Any) -> str:
    return f"must be {want}, not {_NAMES.get(type(value), 'a ' + type(value).__name__)}"


@lru_cache(maxsize=4096, typed=True)
def _quantity_text_problem(text: str | int) -> str:
    """Why a quantity (a string, or a YAML integer such as `nvidia.com/gpu: 1`) is refused ("" when
    fine): a cluster repeats a few dozen quantities."""
    try:
        parse_nanos(text)
    except QuantityError as exc:
        return str(exc)
    return ""


def _quantity_problem(value: Any) -> str:
    if (isinstance(value, str) and len(value) <= 64) or (type(value) is int and -10**18 < value < 10**18):
        return _quantity_text_problem(value)
    try:
        parse_nanos(value)
    except QuantityError as exc:
        return str(exc)
    return ""


Problem = tuple[str, str] | None  # (path below the checked value, what is wrong), None when it fits


def _check(value: Any, spec: Spec) -> Problem:
    """The first place `value` departs from `spec`. The path is built only on the way back from a
    problem: a walk over a well-formed pod (every review) formats no strings."""
    if value is None:
        return None
    if type(spec) is str:
        if spec == STRING:
            return None if isinstance(value, str) else ("", _what("a string", value))
        if spec == QUANTITY:
            problem = _quantity_problem(value)
            return ("", problem) if problem else None
        if spec == BOOLEAN:
            return None if isinstance(value, bool) else ("", _what("true or false", value))
        if spec == INTEGER:
            return None if isinstance(value, int) and not isinstance(value, bool) else ("", _what("an integer", value))
        return None if isinstance(value, Mapping) else ("", _what("an object", value))  # ANY_OBJECT
    if type(spec) is tuple:
        kind, item = spec
        if kind == "list":
            if not isinstance(value, list):
                return "", _what("a list", value)
            for i, element in enumerate(value):
                if element is None and isinstance(item, dict):
                    return f"[{i}]", "must be an object, not null"
                found = _check(element, item)
                if found is not None:
                    return f"[{i}]{found[0]}", found[1]
            return None
        if not isinstance(value, Mapping):
            return "", _what("a map", value)
        for key, element in value.items():
            if not isinstance(key, str):
                return f"[{shown(key)}]", "keys must be strings"
            if element is None and item in (STRING, QUANTITY):
                return _key(key), f"must be {'a string' if item == STRING else 'a quantity'}, not null"
            found = _check(element, item)
            if found is not None:
                return _key(key) + found[0], found[1]
        return None
    if not isinstance(value, Mapping):
        return "", _what("an object", value)
    for name, field_spec in spec.items():
        element = value.get(name)
        if element is not None:
            found = _check(element, field_spec)
            if found is not None:
                return f".{name}{found[0]}", found[1]
    return None


def check(value: Any, spec: Spec, path: str) -> str:
    """The first place `value` departs from `spec`, as "path: what is wrong" ("" when it fits).

    A well-formed object (nearly every one) is accepted by `fits`, a yes/no
    check compiled from the spec; only when it says no does `_check` walk
    again to say where and why.
    """
    if fits(spec)(value):
        return ""
    found = _check(value, spec)
    return "" if found is None else f"{path}{found[0]}: {found[1]}"


Fits = Callable[[Any], bool]
_COMPILED: dict[int, tuple[Spec, Fits]] = {}


def fits(spec: Spec) -> Fits:
    """`spec` compiled to `value -> bool`: True exactly when `_check(value, spec)` finds no problem.

    The walk `_check` does, without its per-node dispatch on the spec's form
    (a third of a /mutate's shape check): string fields of an object are
    tested in one loop, a map of strings in one pass over its items.
    Compiled once per spec object (the module's specs are constants).
    """
    entry = _COMPILED.get(id(spec))
    if entry is None or entry[0] is not spec:
        entry = (spec, _compile(spec))
        _COMPILED[id(spec)] = entry
    return entry[1]


def _compile(spec: Spec) -> Fits:
    if type(spec) is str:
        return _LEAVES[spec]
    if type(spec) is tuple:
        kind, item = spec
        if kind == "list":
            return _list_fits(item)
        if item == STRING:
            return _string_map_fits
        return _map_fits(item)
    strings = tuple(name for name, field in spec.items() if field == STRING)
    others = tuple((name, _compile(field)) for name, field in spec.items() if field != STRING)

    def object_fits(value: Any) -> bool:
        if type(value) is not dict and not isinstance(value, Mapping):  # parsed JSON/YAML: a dict, no ABC check
            return value is None
        get = value.get
        for name in strings:
            element = get(name)
            if element is not None and not isinstance(element, str):
                return False
        for name, check_field in others:
            element = get(name)
            if element is not None and not check_field(element):
                return False
        return True

    return object_fits


def _list_fits(item: Spec) -> Fits:
    check_item, objects = _compile(item), isinstance(item, dict)

    def list_fits(value: Any) -> bool:
        if not isinstance(value, list):
            return value is None
        for element in value:
            if element is None:
                if objects:
                    return False
            elif not check_item(element):
                return False
        return True

    return list_fits


def _map_fits(item: Spec) -> Fits:
    check_item, no_null = _compile(item), item in (STRING, QUANTITY)

    def map_fits(value: Any) -> bool:
        if type(value) is not dict and not isinstance(value, Mapping):
            return value is None
        for key, element in value.items():
            if not isinstance(key, str):
                return False
            if element is None:
                if no_null:
                    return False
            elif not check_item(element):
                return False
        return True

    return map_fits


def _string_map_fits(value: Any) -> bool:
    if type(value) is not dict and not isinstance(value, Mapping):
        return value is None
    for key, element in value.items():  # noqa: SIM110 - a loop is faster than all() over a generator
        if not isinstance(key, str) or not isinstance(element, str):  # null included
            return False
    return True


_LEAVES: dict[str, Fits] = {
    STRING: lambda v: v is None or isinstance(v, str),
    QUANTITY: lambda v: v is None or not _quantity_problem(v),
    BOOLEAN: lambda v: v is None or isinstance(v, bool),
    INTEGER: lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    ANY_OBJECT: lambda v: v is None or type(v) is dict or isinstance(v, Mapping),
}


def pod_shape_error(pod: Any, path: str = "request.object") -> str:
    """Where a Pod departs from the shape the core reads ("" when fine)."""
    if not isinstance(pod, (dict, Mapping)):  # a parsed dict passes before the ABC check (object_fits)
        return _wrong(path, "a Pod object", pod)
    return check(pod, POD, path)


def node_shape_error(node: Any, path: str) -> str:
    """Where a Node departs from the shape the packing model reads ("" when fine)."""
    if not isinstance(node, Mapping):
        return _wrong(path, "a Node object", node)
    return check(node, NODE, path)


def template_shape_error(obj: Mapping[str, Any], path: str) -> str:
    """A workload's levels down to its pod template, then the template itself ("" when fine or absent)."""
    error = check(obj.get("metadata"), METADATA, f"{path}.metadata")
    current: Any = obj
    for key in TEMPLATE_PATHS[str(obj.get("kind"))]:
        if error:
            return error
        current = current.get(key)
        path = f"{path}.{key}"
        if current is None:
            return ""
        if not isinstance(current, Mapping):
            return _wrong(path, "an object", current)
    return error or check(current, POD_TEMPLATE, path)


def object_shape_error(obj: Any, path: str = "object") -> str:
    """Any object the dry-run or the command line reads, by kind ("" when fine; unknown kinds pass)."""
    if not isinstance(obj, Mapping):
        return _wrong(path, "a Kubernetes object", obj)
    kind = obj.get("kind")
    if not isinstance(kind, str):
        return _wrong(f"{path}.kind", "a string", kind) if kind is not None else f"{path}.kind: missing"
    if kind in TEMPLATE_PATHS:
        return template_shape_error(obj, path)
    spec = {"Pod": POD, "Node": NODE, "Namespace": NAMESPACE, "GpuPolicy": POLICY}.get(kind)
    return check(obj, spec, path) if spec is not None else check(obj.get("metadata"), METADATA, f"{path}.metadata")


def dry_run_body_error(body: Any) -> str:
    """The /dry-run request body: {object, policies?, nodes?, namespace?} ("" when its shape is fine)."""
    if not isinstance(body, Mapping):
        return _wrong("body", "a JSON object with an `object` field", body)
    if "object" not in body:
        return "object: missing (a Pod, Deployment, StatefulSet, Job or CronJob)"
    error = object_shape_error(body["object"], "object")
    policies = body.get("policies")
    if not error and policies is not None:
        if not isinstance(policies, list):
            return _wrong("policies", "a list of GpuPolicy objects", policies)
        error = next((e for i, p in enumerate(policies) if (e := check(p, POLICY, f"policies[{i}]"))), "")
        if not error:
            error = next((f"policies[{i}]: must be an object, not null" for i, p in enumerate(policies)
                          if p is None), "")
    nodes = body.get("nodes")
    if not error and nodes is not None:
        if not isinstance(nodes, list):
            return _wrong("nodes", "a list of Node objects", nodes)
        error = next((e for i, n in enumerate(nodes) if (e := node_shape_error(n, f"nodes[{i}]"))), "")
    namespace = body.get("namespace")
    if not error and namespace is not None:
        error = check(namespace, {"name": STRING, "labels": _MAP_OF_STRINGS}, "namespace")
    return error
