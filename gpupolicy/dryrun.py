"""Dry-run: what the webhook would do to a Pod or a workload, without admitting anything.

A workload (Deployment, StatefulSet, Job, CronJob, ...) is evaluated through its
pod template with the workload itself as the owner, then the mutated template
is put back so the patch is relative to the submitted object
(`/spec/template/spec/containers/0/...`). Mutation runs first, then the
guardrails on the mutated pod, as the API server runs mutating before
validating webhooks. Pure: the CLI and POST /dry-run parse their input and
call `dry_run`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gpupolicy.admission import AdmissionResult, mutate_pod, validate_pod
from gpupolicy.catalog import DEFAULT_CATALOG, Catalog
from gpupolicy.cluster import ClusterView, node_from_object
from gpupolicy.model import GpuPolicy
from gpupolicy.patch import diff
from gpupolicy.validation import check_policy

# kind -> path of the pod template inside the object
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
SUPPORTED_KINDS = ("Pod", *TEMPLATE_PATHS)


class DryRunError(ValueError):
    """Input the dry-run cannot evaluate; the message names the field."""


def _dig(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def parse_policies(items: Any, catalog: Catalog = DEFAULT_CATALOG, where: str = "policies") -> list[GpuPolicy]:
    """Parse a list of GpuPolicy objects, raising DryRunError naming `policies[i].spec...`."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise DryRunError(f"{where}: must be a list of GpuPolicy objects")
    policies: list[GpuPolicy] = []
    for i, item in enumerate(items):
        policy, errors = check_policy(item, catalog)
        if errors or policy is None:
            raise DryRunError(f"{where}[{i}].{errors[0]}" if errors else f"{where}[{i}]: invalid")
        policies.append(policy)
    return policies


def view_for_request(body: Mapping[str, Any], base: ClusterView) -> ClusterView:
    """The view a dry-run body asks for: its policies/nodes/namespace when given, else the base view's."""
    view = base
    if body.get("policies") is not None:
        view = view.with_policies(parse_policies(body.get("policies"), base.catalog))
    nodes = body.get("nodes")
    if nodes is not None:
        if not isinstance(nodes, list) or not all(isinstance(n, Mapping) for n in nodes):
            raise DryRunError("nodes: must be a list of Node objects")
        view = view.with_nodes(node_from_object(n) for n in nodes)
    namespace = body.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, Mapping) or not isinstance(namespace.get("name"), str):
            raise DryRunError("namespace: must be {name: ..., labels: {...}}")
        labels = namespace.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise DryRunError("namespace.labels: must be a map of strings")
        view = view.with_namespace(namespace["name"], {str(k): str(v) for k, v in labels.items()})
    return view


def dry_run(obj: Any, view: ClusterView, namespace: str | None = None) -> AdmissionResult:
    """Evaluate a Pod or workload; raises DryRunError for objects it cannot read."""
    if not isinstance(obj, Mapping):
        raise DryRunError("object: must be a Kubernetes object")
    kind = obj.get("kind")
    if kind not in SUPPORTED_KINDS:
        raise DryRunError(f"object.kind: {kind!r} is not one of {', '.join(SUPPORTED_KINDS)}")
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise DryRunError("object.metadata: must be an object")
    ns = namespace or str(metadata.get("namespace") or "default")
    if kind == "Pod":
        return _combine(obj, mutate_pod(obj, view, ns), view, ns, None, ())
    path = TEMPLATE_PATHS[str(kind)]
    template = _dig(obj, path)
    if not isinstance(template, Mapping):
        raise DryRunError(f"object.{'.'.join(path)}: missing pod template")
    owner = f"{kind}/{ns}/{metadata.get('name', '')}"
    pod_metadata: dict[str, Any] = {**(template.get("metadata") or {}), "namespace": ns}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": template.get("spec") or {}}
    return _combine(obj, mutate_pod(pod, view, ns, owner), view, ns, owner, path)


def _combine(
    obj: Mapping[str, Any], mutation: AdmissionResult, view: ClusterView, ns: str, owner: str | None,
    path: tuple[str, ...],
) -> AdmissionResult:
    """Run guardrails on the mutated pod and express everything relative to the submitted object."""
    pod = mutation.object
    validation = validate_pod(pod, view, ns, owner)
    if path:
        result_obj = copy.deepcopy(dict(obj))
        parent: Any = result_obj
        for key in path[:-1]:
            parent = parent[key]
        template = dict(parent[path[-1]])
        template["spec"] = pod["spec"]
        annotations = (pod.get("metadata") or {}).get("annotations")
        if annotations != (template.get("metadata") or {}).get("annotations"):
            template["metadata"] = {**(template.get("metadata") or {}), "annotations": annotations}
        parent[path[-1]] = template
    else:
        result_obj = pod
    decisions = mutation.decisions + [d for d in validation.decisions if d.action != "Allow"]
    return AdmissionResult(
        allowed=validation.allowed, patch=diff(dict(obj), result_obj),
        warnings=mutation.warnings + validation.warnings, decisions=decisions,
        message=validation.message, object=result_obj, note=mutation.note or validation.note,
    )
