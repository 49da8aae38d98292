"""Dry-run: what the webhook would do to a Pod or a workload, without admitting anything.

A workload (Deployment, StatefulSet, Job, CronJob, ...) is evaluated through its
pod template with the workload itself as the owner, then the mutated template
is put back so the patch is relative to the submitted object
(`/spec/template/spec/containers/0/...`). Mutation runs first, then the
guardrails on the mutated pod, as the API server runs mutating before
validating webhooks. Pure: the CLI and POST /dry-run parse their input and
call `dry_run`.

`workload_warnings` is the same evaluation for the validating webhook: a
workload's CREATE/UPDATE is answered with the warnings its pods would get,
never a patch or a denial (pods are mutated and checked when they are
created, where the owner resolution and approvals apply).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupolicy.admission.claims import named_templates, policy_templates
from gpupolicy.admission.mutate import Action, AdmissionResult, mutate_pod, out_of_scope, short_warning, validate_pod
from gpupolicy.admission.patch import diff
from gpupolicy.admission.rewrite import CONTAINER_LISTS, is_gpu_resource
from gpupolicy.admission.shape import TEMPLATE_PATHS
from gpupolicy.admission.sharedclaims import is_shared_claim_of, shared_claim
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG, Catalog
from gpupolicy.cluster import ClusterView, node_from_object
from gpupolicy.dra import SHARED_CLAIM_LABEL
from gpupolicy.k8s.quantity import shown
from gpupolicy.model import GpuPolicy

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


def pod_template(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template of a workload object (None for other kinds or a missing template)."""
    path = TEMPLATE_PATHS.get(str(obj.get("kind")))
    template = _dig(obj, path) if path else None
    return template if isinstance(template, Mapping) else None


def template_asks_for_gpu(template: Mapping[str, Any]) -> bool:
    """Does any container of a pod template name a GPU resource? Key lookups only, no quantity parsing.

    The admission fast path: a workload that asks for no GPU is answered
    before anything else is read (most workloads in a cluster).
    """
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for key in CONTAINER_LISTS:
        containers = spec.get(key)
        if not isinstance(containers, list):
            continue
        for container in containers:
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for section in ("limits", "requests"):
                values = resources.get(section)
                if isinstance(values, Mapping) and any(is_gpu_resource(str(name)) for name in values):
                    return True
    return False


def _template_pod(obj: Mapping[str, Any], template: Mapping[str, Any], ns: str) -> tuple[dict[str, Any], str]:
    """The pod a workload's template stands for, and the workload as its owner (`Kind/ns/name`)."""
    metadata = obj.get("metadata") or {}
    owner = f"{obj.get('kind')}/{ns}/{metadata.get('name', '') if isinstance(metadata, Mapping) else ''}"
    pod_metadata: dict[str, Any] = {**(template.get("metadata") or {}), "namespace": ns}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": template.get("spec") or {}}
    return pod, owner


def workload_warnings(obj: Mapping[str, Any], view: ClusterView, namespace: str | None = None) -> AdmissionResult:
    """What a workload's pods would be told, as warnings on the workload itself; always allowed, no patch.

    Mutation then guardrails on the mutated template pod, with the workload as
    owner (as `dry_run`); a guardrail denial of the pods becomes a warning.
    The caller has checked the kind and the template's shape.
    """
    template = pod_template(obj)
    if template is None:
        return AdmissionResult(object=obj, note="no pod template")
    metadata = obj.get("metadata")
    ns = namespace or str((metadata if isinstance(metadata, Mapping) else {}).get("namespace") or "default")
    pod, owner = _template_pod(obj, template, ns)
    mutation = mutate_pod(pod, view, ns, owner)
    validation = validate_pod(mutation.object, view, ns, owner)
    warnings = mutation.warnings + validation.warnings
    if not validation.allowed:
        warnings.append(short_warning(f"kubeon-gpu: pods would be denied: {validation.message}"))
    decisions = mutation.decisions + [d for d in validation.decisions if d.action != "Allow"]
    return AdmissionResult(warnings=warnings, decisions=decisions, object=obj,
                           note=mutation.note or validation.note)


def dry_run(obj: Any, view: ClusterView, namespace: str | None = None) -> AdmissionResult:
    """Evaluate a Pod or workload; raises DryRunError for objects it cannot read."""
    if not isinstance(obj, Mapping):
        raise DryRunError("object: must be a Kubernetes object")
    kind = obj.get("kind")
    if kind not in SUPPORTED_KINDS:
        raise DryRunError(f"object.kind: {shown(kind)} is not one of {', '.join(SUPPORTED_KINDS)}")
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise DryRunError("object.metadata: must be an object")
    ns = namespace or str(metadata.get("namespace") or "default")
    if kind == "Pod":
        skipped = out_of_scope(obj, ns, view)
        if skipped:  # most of a cluster export: no GPU asked, nothing to mutate, validate or diff
            return AdmissionResult(object=obj, note=skipped)
        return _combine(obj, mutate_pod(obj, view, ns), view, ns, None, ())
    path = TEMPLATE_PATHS[str(kind)]
    template = _dig(obj, path)
    if not isinstance(template, Mapping):
        raise DryRunError(f"object.{'.'.join(path)}: missing pod template")
    pod, owner = _template_pod(obj, template, ns)
    skipped = out_of_scope(pod, ns, view) if template.get("spec") else ""
    if skipped:  # the answer mutate + validate + diff give an out-of-scope pod (whose template has a
        # spec: without one the slow path writes `spec: {}` into the object it shows), without them
        return AdmissionResult(object=obj, note=skipped)
    return _combine(obj, mutate_pod(pod, view, ns, owner, with_patch=False), view, ns, owner, path)


def _combine(
    obj: Mapping[str, Any], mutation: AdmissionResult, view: ClusterView, ns: str, owner: str | None,
    path: tuple[str, ...],
) -> AdmissionResult:
    """Run guardrails on the mutated pod and express everything relative to the submitted object."""
    pod = mutation.object
    validation = validate_pod(pod, view, ns, owner)
    if path:
        # Copy only the levels down to the template (the rest stays shared, so `diff` skips it by
        # identity): a deep copy of the whole workload was slower and recursed past Python's limit
        # on objects nested a few hundred levels deep (issue 15).
        result_obj = dict(obj)
        parent: Any = result_obj
        for key in path[:-1]:
            parent[key] = dict(parent[key])
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
    # a Pod's patch is the mutation's own (the same diff of the same two objects); a workload's is
    # worked out against the workload
    patch = diff(dict(obj), result_obj) if path else mutation.patch
    return AdmissionResult(
        allowed=validation.allowed, patch=patch,
        warnings=mutation.warnings + validation.warnings, decisions=decisions,
        message=validation.message, object=result_obj, note=mutation.note or validation.note,
    )


CLAIM_TEMPLATE_NOTE = ("the controller creates this ResourceClaimTemplate when a pod names it, owned by the "
                       "policy (docs/designs/dra.md)")
SHARED_CLAIM_NOTE = ("the controller creates this ResourceClaim when a pod names it, owned by the policy; the pods "
                     "naming it share its one GPU (docs/designs/dra.md)")


def claim_templates(obj: Mapping[str, Any], result: AdmissionResult, view: ClusterView,
                    namespace: str | None = None) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates and shared ResourceClaims a rewritten Pod or workload names (`via: DRA`
    policies that applied), as the controller would create them in its namespace; the dry-run shows each as
    an entry of its own."""
    policies = {d.policy for d in result.decisions if d.action == Action.USE_CLAIM and d.applied}
    if not policies:
        return []
    mutated = result.object
    path = TEMPLATE_PATHS.get(str(obj.get("kind")), ())
    pod = _dig(mutated, path) if path else mutated
    annotations = _dig(pod, ("metadata", "annotations")) or {}
    shared = str((_dig(pod, ("metadata", "labels")) or {}).get(SHARED_CLAIM_LABEL) or "")
    ns = namespace or str(_dig(obj, ("metadata", "namespace")) or "default")
    found: list[dict[str, Any]] = []
    for policy in view.policies:
        if policy.name in policies and policy.spec.sharing is not None:
            if shared and is_shared_claim_of(policy.name, shared):
                found.append(shared_claim(shared, ns, policy.spec.sharing, view.catalog, policy.name))
            known = policy_templates(policy.spec.sharing, view.catalog)
            found += [t.object(ns, policy.name) for t in named_templates(annotations, known)]
    return found
