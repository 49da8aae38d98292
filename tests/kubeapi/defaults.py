"""What kube-apiserver fills in or refuses for built-in types before storing them.

Only the defaults and checks the project's code can observe are here:
namespace label and phase, pod schedulerName/restartPolicy/priority, the
DefaultTolerationSeconds admission plugin's two tolerations, pod status reset
to Pending with a QoS class, workload replicas/strategy, object name syntax,
pod spec immutability on update and a Deployment's selector matching its
template. Everything else in a built-in object is stored as sent (no schema).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.kubeapi.resources import Resource
from tests.kubeapi.selectors import match_label_selector

Cause = tuple[str, str, str]
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Tolerations the DefaultTolerationSeconds admission plugin adds to every pod.
DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
]
# Name syntax per storage key; anything else is an RFC 1123 subdomain.
_LABEL_NAMED = {"/namespaces", "/services"}
_FREE_NAMED = {"rbac.authorization.k8s.io/roles", "rbac.authorization.k8s.io/rolebindings",
               "rbac.authorization.k8s.io/clusterroles", "rbac.authorization.k8s.io/clusterrolebindings"}


def on_create(res: Resource, obj: dict[str, Any]) -> None:
    """Defaults and status reset applied to a new object (in place)."""
    key = res.key
    spec = obj.setdefault("spec", {}) if key in _WITH_SPEC else obj.get("spec")
    if key == "/namespaces":
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    elif key == "/pods" and isinstance(spec, dict):
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("priority", 0)
        spec.setdefault("securityContext", {})
        tolerations = spec.setdefault("tolerations", [])
        for tol in DEFAULT_TOLERATIONS:
            if not any(t.get("key") == tol["key"] and t.get("effect", "NoExecute") == "NoExecute"
                       for t in tolerations):
                tolerations.append(copy.deepcopy(tol))
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}
    elif key in ("apps/deployments", "apps/statefulsets", "apps/replicasets") and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        if key == "apps/deployments":
            if not (spec.get("strategy") or {}).get("type"):
                spec["strategy"] = {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
            spec.setdefault("progressDeadlineSeconds", 600)
        if key == "apps/statefulsets":
            spec.setdefault("podManagementPolicy", "OrderedReady")
            if not (spec.get("updateStrategy") or {}).get("type"):
                spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    elif key == "/services" and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
    elif key == "/secrets":
        obj.setdefault("type", "Opaque")
    if res.has_status and key not in ("/nodes", "/namespaces", "/pods"):
        if res.custom:
            obj.pop("status", None)  # CRs with a status subresource drop status on create
        else:
            obj["status"] = {}  # zero values (protobuf.zero_values) fill what Go writes without omitempty
_WITH_SPEC = {"/pods", "apps/deployments", "apps/statefulsets", "apps/replicasets", "/services"}


def qos_class(spec: dict[str, Any]) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    requests_any, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            requests_any = True
        for r in ("cpu", "memory"):
            if r not in lim or req.get(r, lim[r]) != lim[r]:
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def validate(res: Resource, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Checks kube-apiserver makes on built-in objects that the project can trip over."""
    errs: list[Cause] = []
    name = obj["metadata"].get("name", "")
    if res.key not in _FREE_NAMED and name:
        pattern = _LABEL if res.key in _LABEL_NAMED else _SUBDOMAIN
        if not pattern.match(name) or len(name) > (63 if pattern is _LABEL else 253):
            what = "RFC 1123 label" if pattern is _LABEL else "RFC 1123 subdomain"
            errs.append(("metadata.name", "FieldValueInvalid",
                         f'Invalid value: "{name}": a lowercase {what} must consist of lower case alphanumeric '
                         f"characters, '-' or '.', and must start and end with an alphanumeric character"))
    spec = obj.get("spec") or {}
    if res.key == "/pods":
        if not spec.get("containers"):
            errs.append(("spec.containers", "FieldValueRequired", "Required value"))
        if old is not None:
            errs += _pod_update(old.get("spec") or {}, spec)
    if res.key in ("apps/deployments", "apps/statefulsets", "apps/replicasets"):
        selector = spec.get("selector")
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not selector:
            errs.append(("spec.selector", "FieldValueRequired", "Required value"))
        elif not match_label_selector(selector, labels):
            errs.append(("spec.template.metadata.labels", "FieldValueInvalid",
                         f"Invalid value: {labels}: `selector` does not match template `labels`"))
        if isinstance(spec.get("replicas"), int) and spec["replicas"] < 0:
            errs.append(("spec.replicas", "FieldValueInvalid",
                         f"Invalid value: {spec['replicas']}: must be greater than or equal to 0"))
    return errs


def _pod_update(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Pod spec is immutable except a few fields (ValidatePodUpdate)."""
    def mutable_view(spec: dict[str, Any]) -> dict[str, Any]:
        view = copy.deepcopy(spec)
        for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations", "schedulingGates"):
            view.pop(key, None)
        for group in ("containers", "initContainers"):
            for c in view.get(group) or []:
                c.pop("image", None)
        return view

    if mutable_view(old) != mutable_view(new):
        return [("spec", "FieldValueForbidden",
                 "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                 "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                 "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                 "(allow it to be set to 1 if it was previously negative)")]
    old_tols = old.get("tolerations") or []
    if any(t not in (new.get("tolerations") or []) for t in old_tols):
        return [("spec.tolerations", "FieldValueForbidden", "Forbidden: existing toleration can not be modified "
                 "except its tolerationSeconds")]
    return []
