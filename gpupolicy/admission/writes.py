"""The writes mutation makes to a pod, each recorded as the JSON Patch operation it is.

Mutation never changes the pod it is given: it writes into a copy of the
levels it may write (`writable_copy`), and every write here also appends the
RFC 6902 operation that makes it. The admission patch is therefore built
from the decision, operation by operation, instead of by diffing the pod
before and after (which walked every key of every copied level).

What the operations are, write by write, is what a diff of the two objects
would find (tests/core/test_patch_built.py holds them to it, as a set and
applied): "add" where the key was absent, "replace" where it held another
value, nothing where it held the same; a level made by a write (an absent
`metadata.annotations`, say) is one "add" whose value is the level itself,
so later writes into it add no operation of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupolicy.admission.patch import PatchOp, escape
from gpupolicy.admission.rewrite import CONTAINER_LISTS
from gpupolicy.catalog import GPU_RESOURCE


def writable_copy(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Copy exactly the parts of a pod that mutation writes; everything else stays shared.

    A deep copy of a real pod (managedFields, volumes, env) costs more than the
    whole decision. Writes go only through the copied levels:
    metadata(.annotations), spec(.tolerations, .schedulerName, .nodeSelector)
    and each container's resources(.limits, .requests).
    """
    out = dict(pod)
    metadata = out.get("metadata")
    if isinstance(metadata, dict):
        out["metadata"] = dict(metadata)
        if isinstance(metadata.get("annotations"), dict):
            out["metadata"]["annotations"] = dict(metadata["annotations"])
    spec = out.get("spec")
    if isinstance(spec, dict):
        spec = out["spec"] = dict(spec)
        if isinstance(spec.get("tolerations"), list):
            spec["tolerations"] = list(spec["tolerations"])
        for key in CONTAINER_LISTS:
            if isinstance(spec.get(key), list):
                spec[key] = [_writable_container(c) for c in spec[key]]
    return out


def _writable_container(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    copied = dict(container)
    resources = copied.get("resources")
    if isinstance(resources, dict):
        copied["resources"] = {k: dict(v) if isinstance(v, dict) else v for k, v in resources.items()}
    return copied


class PodWrites:
    """A pod being mutated (`pod`, a writable copy) and the JSON Patch of what was written to it (`ops`)."""

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self.pod = writable_copy(pod)
        self.ops: list[PatchOp] = []
        # ids of the levels made by a write (each held by `pod` and `ops` while this lives): their "add"
        # already carries what goes in
        self._made: set[int] = set()

    def _put(self, parent: dict[str, Any], key: str, value: Any, path: str) -> None:
        """parent[key] = value, with its operation unless the parent was made here or nothing changes."""
        if id(parent) not in self._made:
            if key not in parent:
                self.ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
            elif parent[key] != value:
                self.ops.append({"op": "replace", "path": f"{path}/{escape(key)}", "value": value})
        parent[key] = value

    def _make(self, parent: dict[str, Any], key: str, path: str, value: Any) -> Any:
        """A new level at parent[key] (where there is none, or not of the right type)."""
        self._put(parent, key, value, path)
        self._made.add(id(value))
        return value

    def _level(self, key: str) -> dict[str, Any]:
        """pod[key] as a dict to write into, made when absent or null (JSON null decodes to the empty value)."""
        value = self.pod.get(key)
        return value if isinstance(value, dict) else self._make(self.pod, key, "", {})

    def annotate(self, values: Mapping[str, str]) -> None:
        """Set metadata.annotations[key] for each of `values`."""
        metadata = self._level("metadata")
        annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            annotations = self._make(metadata, "annotations", "/metadata", {})
        for key, value in values.items():
            self._put(annotations, key, value, "/metadata/annotations")

    def label(self, values: Mapping[str, str]) -> None:
        """Set metadata.labels[key] for each of `values`."""
        metadata = self._level("metadata")
        labels = metadata.get("labels")
        if not isinstance(labels, dict):
            labels = self._make(metadata, "labels", "/metadata", {})
        for key, value in values.items():
            self._put(labels, key, value, "/metadata/labels")

    def select_nodes(self, selector: Mapping[str, str]) -> None:
        """Add `selector`'s labels to spec.nodeSelector (the pod's own labels kept, ours win)."""
        spec = self._level("spec")
        current = spec.get("nodeSelector")
        if isinstance(current, dict):
            merged = spec["nodeSelector"] = dict(current)  # a copy: writable_copy shares the pod's own
            for key, value in selector.items():
                self._put(merged, key, value, "/spec/nodeSelector")
        else:
            self._make(spec, "nodeSelector", "/spec", dict(selector))

    def swap_gpu(self, resource: str, containers: tuple[str, ...]) -> dict[str, dict[str, dict[str, str]]]:
        """Swap `nvidia.com/gpu` for `resource: "1"` in the named containers' limits and requests;
        returns the original GPU resources per container (for the rewritten-from annotation)."""
        original: dict[str, dict[str, dict[str, str]]] = {}
        spec = self.pod.get("spec")
        for list_key in CONTAINER_LISTS:
            listed = spec.get(list_key) if isinstance(spec, dict) else None
            for index, container in enumerate(listed if isinstance(listed, list) else ()):
                if not isinstance(container, dict) or str(container.get("name", "")) not in containers:
                    continue
                before = self._swap_in(container, resource, f"/spec/{list_key}/{index}/resources")
                if before:
                    original[str(container.get("name", ""))] = before
        return original

    def _swap_in(self, container: dict[str, Any], resource: str, path: str) -> dict[str, dict[str, str]]:
        """One container's swap (`path`: its resources); returns its original GPU resources by section."""
        resources = container.get("resources") or {}
        before: dict[str, dict[str, str]] = {}
        for section in ("limits", "requests"):
            values = resources.get(section)
            if not isinstance(values, dict) or GPU_RESOURCE not in values:
                continue
            before[section] = {GPU_RESOURCE: str(values[GPU_RESOURCE])}
            # The plan rewrites only pods that ask for no slice yet, so `resource` is a new key here.
            rebuilt = {}  # the new resource where the GPU was, the other keys in their order
            for key, value in values.items():
                if key == GPU_RESOURCE:
                    rebuilt[resource] = "1"
                else:
                    rebuilt[key] = value
            where = f"{path}/{section}"
            self.ops.append({"op": "remove", "path": f"{where}/{escape(GPU_RESOURCE)}"})
            self.ops.append({"op": "add", "path": f"{where}/{escape(resource)}", "value": "1"})
            resources[section] = rebuilt
        return before

    def claim_through(self, templates: Mapping[str, str], claim_prefix: str,
                      source: str = "resourceClaimTemplateName") -> dict[str, dict[str, dict[str, str]]]:
        """Claim each named container's GPUs through a ResourceClaimTemplate (container name -> template):
        a `spec.resourceClaims` entry `<claim_prefix><i>` per container, named in its `resources.claims`, and
        its `nvidia.com/gpu` request and limit removed. Returns the original GPU resources per container."""
        original: dict[str, dict[str, dict[str, str]]] = {}
        entries: list[dict[str, str]] = []
        spec = self._level("spec")
        for list_key in CONTAINER_LISTS:
            listed = spec.get(list_key)
            for index, container in enumerate(listed if isinstance(listed, list) else ()):
                name = str(container.get("name", "")) if isinstance(container, dict) else ""
                if name not in templates:
                    continue
                claim = f"{claim_prefix}{len(entries)}"
                entries.append({"name": claim, source: templates[name]})
                original[name] = self._claim_in(container, claim, f"/spec/{list_key}/{index}/resources")
        self._make(spec, "resourceClaims", "/spec", entries)
        return original

    def _claim_in(self, container: dict[str, Any], claim: str, path: str) -> dict[str, dict[str, str]]:
        resources = container["resources"]  # the container asks for a GPU, so it has resources
        before: dict[str, dict[str, str]] = {}
        for section in ("limits", "requests"):
            values = resources.get(section)
            if isinstance(values, dict) and GPU_RESOURCE in values:
                before[section] = {GPU_RESOURCE: str(values[GPU_RESOURCE])}
                resources[section] = {k: v for k, v in values.items() if k != GPU_RESOURCE}
                self.ops.append({"op": "remove", "path": f"{path}/{section}/{escape(GPU_RESOURCE)}"})
        claims = resources.get("claims")
        if isinstance(claims, list):
            resources["claims"] = [*claims, {"name": claim}]
            self.ops.append({"op": "add", "path": f"{path}/claims/-", "value": {"name": claim}})
        else:
            self._make(resources, "claims", path, [{"name": claim}])
        return before

    def tolerate(self, wanted: Iterable[Mapping[str, Any]]) -> bool:
        """Append each wanted toleration unless an equal one is there already; True when one was added."""
        spec = self._level("spec")
        current = spec.get("tolerations")
        if not isinstance(current, list):
            fresh: list[Any] = []
            for toleration in map(dict, wanted):
                if toleration not in fresh:
                    fresh.append(toleration)
            if fresh:
                self._make(spec, "tolerations", "/spec", fresh)
            return bool(fresh)
        added = False
        for toleration in map(dict, wanted):
            if toleration not in current:
                current.append(toleration)  # writable_copy's list, or one made here
                if id(current) not in self._made:
                    self.ops.append({"op": "add", "path": "/spec/tolerations/-", "value": toleration})
                added = True
        return added

    def schedule_with(self, scheduler: str) -> bool:
        """Set spec.schedulerName unless the pod already chose a non-default scheduler."""
        spec = self._level("spec")
        current = spec.get("schedulerName")
        if current in (None, "", "default-scheduler") and current != scheduler:
            self._put(spec, "schedulerName", scheduler, "/spec")
            return True
        return False
