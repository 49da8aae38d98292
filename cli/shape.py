"""The fields of a Pod, workload or Node that dry-run reads, checked for type before any decision.

Why here: the decision core assumes the API server's shapes (maps where maps
belong, quantities that parse); a file on disk has no API server in front of
it. A wrong type is answered as `FIELD: what is wrong`, the way kubectl would
refuse it, instead of an AttributeError deep inside a decision. This is the
command line's edge; the shared shape check of the core (issue 15) replaces
it when it lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from gpupolicy.admission.dryrun import TEMPLATE_PATHS
from gpupolicy.quantity import QuantityError, parse_quantity

CONTAINER_KEYS = ("initContainers", "containers", "ephemeralContainers")
# A quantity with an exponent this large is not a resource amount (upstream caps far lower).
MAX_EXPONENT = 60


class ShapeError(ValueError):
    """`field: what is wrong`."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def _map(value: Any, field: str, required: bool = False) -> dict[Any, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ShapeError(field, f"must be a map, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {dict: "a map", list: "a list", str: "a string", bool: "a boolean"}
    return names.get(type(value), f"a {type(value).__name__}")


def _strings(value: Any, field: str) -> None:
    """labels, annotations, nodeSelector: a map of strings to strings."""
    for key, item in _map(value, field).items():
        if not isinstance(key, str):
            raise ShapeError(f"{field}[{key}]", f"key must be a string, not {_kind(key)}")
        if not isinstance(item, str):
            raise ShapeError(f"{field}[{key}]", f"must be a string, not {_kind(item)} (quote it)")


def _string(value: Any, field: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ShapeError(field, f"must be a string, not {_kind(value)}")


def check_quantity(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ShapeError(field, f"must be a quantity such as 1, 500m or 8Gi, not {_kind(value)}")
    problem = _quantity_problem(str(value))
    if problem:
        raise ShapeError(field, problem)


@lru_cache(maxsize=4096)
def _quantity_problem(text: str) -> str:
    """Why `text` is not a usable quantity ("" when it is); cached: the same few values repeat in every pod."""
    text = text.strip()
    if "e" in text.lower() and not text.endswith(("Ei", "E")):
        exponent = text.lower().rsplit("e", 1)[1].lstrip("+-")
        if exponent.isdigit() and (len(exponent) > 2 or int(exponent) > MAX_EXPONENT):
            return f"{text[:40]!r} is out of range for a quantity"
    try:
        parse_quantity(text)
    except QuantityError as exc:
        return str(exc)
    except ArithmeticError:
        return f"{text[:40]!r} is out of range for a quantity"
    return ""


def _metadata(value: Any, field: str) -> None:
    meta = _map(value, field)
    _string(meta.get("name"), f"{field}.name")
    _string(meta.get("namespace"), f"{field}.namespace")
    _strings(meta.get("labels"), f"{field}.labels")
    _strings(meta.get("annotations"), f"{field}.annotations")
    owners = meta.get("ownerReferences")
    if owners is not None:
        if not isinstance(owners, list):
            raise ShapeError(f"{field}.ownerReferences", f"must be a list, not {_kind(owners)}")
        for i, owner in enumerate(owners):
            _map(owner, f"{field}.ownerReferences[{i}]", required=True)


def _containers(spec: dict[Any, Any], field: str) -> Iterator[tuple[str, dict[Any, Any]]]:
    for key in CONTAINER_KEYS:
        containers = spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise ShapeError(f"{field}.{key}", f"must be a list of containers, not {_kind(containers)}")
        for i, container in enumerate(containers):
            yield f"{field}.{key}[{i}]", _map(container, f"{field}.{key}[{i}]", required=True)


def _pod_spec(value: Any, field: str) -> None:
    spec = _map(value, field)
    _strings(spec.get("nodeSelector"), f"{field}.nodeSelector")
    _map(spec.get("affinity"), f"{field}.affinity")
    _string(spec.get("schedulerName"), f"{field}.schedulerName")
    for where, container in _containers(spec, field):
        _string(container.get("name"), f"{where}.name")
        resources = _map(container.get("resources"), f"{where}.resources")
        for section in ("limits", "requests"):
            for name, amount in _map(resources.get(section), f"{where}.resources.{section}").items():
                check_quantity(amount, f"{where}.resources.{section}[{name}]")


def check_object(obj: dict[Any, Any]) -> None:
    """A Pod or a workload with a pod template; raises ShapeError naming the first bad field."""
    _metadata(obj.get("metadata"), "metadata")
    kind = obj.get("kind")
    if kind == "Pod":
        _pod_spec(obj.get("spec"), "spec")
        return
    path = TEMPLATE_PATHS.get(str(kind), ())
    current: Any = obj
    for depth, key in enumerate(path):
        current = _map(current, ".".join(path[:depth]) or "object").get(key)
    if current is None:
        return  # dry_run names the missing template
    field = ".".join(path)
    template = _map(current, field)
    _metadata(template.get("metadata"), f"{field}.metadata")
    _pod_spec(template.get("spec"), f"{field}.spec")


def check_node(obj: dict[Any, Any]) -> None:
    """A Node as dry-run reads it: a name, string labels, quantities in status.allocatable/capacity."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ShapeError("metadata.name", "missing: a Node needs a name")
    _strings(meta.get("labels"), "metadata.labels")
    status = _map(obj.get("status"), "status")
    for section in ("allocatable", "capacity"):
        for name, amount in _map(status.get(section), f"status.{section}").items():
            check_quantity(amount, f"status.{section}[{name}]")


def check_namespace(obj: dict[Any, Any]) -> None:
    meta = _map(obj.get("metadata"), "metadata", required=True)
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ShapeError("metadata.name", "missing: a Namespace needs a name")
    _strings(meta.get("labels"), "metadata.labels")
