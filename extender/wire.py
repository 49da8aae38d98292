"""The kube-scheduler extender/v1 wire format: parse ExtenderArgs, build the answers.

The Go structs (k8s.io/kube-scheduler/extender/v1) have no json tags, so the
keys are the Go field names: `Pod`, `Nodes`, `NodeNames`, `FailedNodes`,
`FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`. With
`nodeCacheCapable: true` the scheduler sends `NodeNames` and `Nodes: null`;
otherwise a full v1.NodeList in `Nodes` (then the answer carries `Nodes`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypedDict

from gpupolicy.admission.shape import node_shape_error, pod_shape_error


class ExtenderFilterResult(TypedDict):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


# The last NodeNames lists found to hold only strings: extender.argsreader returns the very list object
# for a body it has seen (the same list pod after pod), and the service never modifies one.
_CHECKED: deque[list[Any]] = deque(maxlen=8)
# The last Pod objects found well-formed: /prioritize's body holds the very Pod object /filter's did (the
# reader does not parse a head it has seen; parsed bodies are never modified).
_CHECKED_PODS: deque[dict[str, Any]] = deque(maxlen=8)


class ArgsError(ValueError):
    """ExtenderArgs the extender cannot use; the message names the field."""


@dataclass(frozen=True)
class ExtenderArgs:
    """A parsed ExtenderArgs: the pod, the candidate node names in order, and the node objects if sent."""

    pod: dict[str, Any]
    names: list[str]
    node_objects: list[dict[str, Any]] | None = None  # set when the scheduler is not nodeCacheCapable
    extra: dict[str, Any] = field(default_factory=dict)


def parse_args(body: Any) -> ExtenderArgs:
    """Validate the shape of ExtenderArgs; raises ArgsError naming the field."""
    if not isinstance(body, dict):
        raise ArgsError("body: expected an ExtenderArgs JSON object")
    given: Any = body.get("Pod")
    pod: dict[str, Any] = given if any(given is seen for seen in _CHECKED_PODS) else _checked_pod(given)
    names = body.get("NodeNames")
    nodes = body.get("Nodes")
    if names is not None:
        if not isinstance(names, list):
            raise ArgsError("NodeNames: expected a list of node names")
        if not any(names is seen for seen in _CHECKED):  # the reader hands back the same list object
            try:
                "".join(names)  # a C loop that raises TypeError on any non-string item
            except TypeError:
                raise ArgsError("NodeNames: expected a list of node names") from None
            _CHECKED.append(names)
        return ExtenderArgs(pod, names)
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            raise ArgsError("Nodes.items: expected a list of v1.Node objects")
        found = []
        for i, node in enumerate(items):
            shape = node_shape_error(node, f"Nodes.items[{i}]")
            if shape:
                raise ArgsError(shape)
            name = (node.get("metadata") or {}).get("name") if isinstance(node.get("metadata"), dict) else None
            if not isinstance(name, str) or not name:
                raise ArgsError(f"Nodes.items[{i}].metadata.name: missing")
            found.append(name)
        return ExtenderArgs(pod, found, node_objects=items)
    raise ArgsError("NodeNames: missing (and Nodes is null)")


def _checked_pod(pod: Any) -> dict[str, Any]:
    """The Pod, remembered once well-formed (ArgsError naming the field otherwise)."""
    if pod is None:
        raise ArgsError("Pod: missing")
    if not isinstance(pod, dict):
        raise ArgsError("Pod: expected a v1.Pod object")
    if not isinstance(pod.get("metadata"), dict) or not (pod["metadata"].get("name")
                                                         or pod["metadata"].get("generateName")):
        raise ArgsError("Pod.metadata.name: missing")
    if not isinstance(pod.get("spec"), dict):
        raise ArgsError("Pod.spec: missing")
    shape = pod_shape_error(pod, "Pod")
    if shape:
        raise ArgsError(shape)
    _CHECKED_PODS.append(pod)
    return pod


def filter_result(args: ExtenderArgs, passed: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str]) -> ExtenderFilterResult:
    """The answer in the form the request came in: NodeNames, or Nodes when node objects were sent."""
    if args.node_objects is not None:
        keep = set(passed)
        items = [n for n in args.node_objects if n["metadata"]["name"] in keep]
        return {"Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items},
                "NodeNames": None, "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    return {"Nodes": None, "NodeNames": passed, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": ""}


def filter_error(message: str) -> ExtenderFilterResult:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
            "Error": message}
