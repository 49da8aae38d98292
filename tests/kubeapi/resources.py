"""The table of resource types the double serves, and the CRD-driven entries.

Adding a plain resource type (stored, listed, watched, nothing more) is one
`_r(...)` line in BUILTIN. Behaviour beyond storage (binding, eviction,
scale, namespace cleanup, CRD registration) lives in the registry and keys off
`Resource.key`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Resource:
    """One served resource type at one group/version."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    custom: bool = False
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)
    scale_paths: dict[str, str] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key: one per group/resource, shared by all versions (no conversion)."""
        return f"{self.group}/{self.plural}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _r(group: str, version: str, plural: str, kind: str, namespaced: bool = True,
       short: tuple[str, ...] = (), sub: tuple[str, ...] = (), cat: tuple[str, ...] = ()) -> Resource:
    return Resource(group, version, plural, kind, namespaced, short, sub, cat)


ALL = ("all",)
BUILTIN: tuple[Resource, ...] = (
    _r("", "v1", "namespaces", "Namespace", False, ("ns",), ("status", "finalize")),
    _r("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    _r("", "v1", "pods", "Pod", True, ("po",), ("status", "binding", "eviction", "log"), ALL),
    _r("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    _r("", "v1", "secrets", "Secret"),
    _r("", "v1", "services", "Service", True, ("svc",), ("status",), ALL),
    _r("", "v1", "endpoints", "Endpoints", True, ("ep",)),
    _r("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    _r("", "v1", "events", "Event", True, ("ev",)),
    _r("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), ("status",)),
    _r("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), ("status",)),
    _r("", "v1", "limitranges", "LimitRange", True, ("limits",)),
    _r("events.k8s.io", "v1", "events", "Event", True, ("ev",)),
    _r("coordination.k8s.io", "v1", "leases", "Lease"),
    _r("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("status", "scale"), ALL),
    _r("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), ("status", "scale"), ALL),
    _r("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), ("status", "scale"), ALL),
    _r("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("status",), ALL),
    _r("apps", "v1", "controllerrevisions", "ControllerRevision"),
    _r("batch", "v1", "jobs", "Job", True, (), ("status",), ALL),
    _r("batch", "v1", "cronjobs", "CronJob", True, ("cj",), ("status",), ALL),
    _r("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), ("status",)),
    _r("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",)),
    _r("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    _r("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
       ("crd", "crds"), ("status",)),
    _r("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
       False),
    _r("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
       "ValidatingWebhookConfiguration", False),
    _r("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _r("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _r("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _r("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
)

# Group preference order for discovery and for kubectl's short-name resolution
# (`kubectl get events` resolves to the core group first, as on a real server).
GROUP_ORDER = ("", "apps", "events.k8s.io", "autoscaling", "batch", "policy", "rbac.authorization.k8s.io",
               "coordination.k8s.io", "scheduling.k8s.io", "apiextensions.k8s.io",
               "admissionregistration.k8s.io")


def from_crd(crd: dict[str, Any]) -> list[Resource]:
    """The served versions of a CustomResourceDefinition, as Resource entries."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for ver in spec.get("versions") or []:
        if not ver.get("served", True):
            continue
        subs = ver.get("subresources") or {}
        schema = (ver.get("schema") or {}).get("openAPIV3Schema")
        out.append(Resource(
            group=spec["group"], version=ver["name"], plural=names["plural"], kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()),
            subresources=tuple(s for s in ("status", "scale") if s in subs),
            categories=tuple(names.get("categories") or ()),
            schema=schema, custom=True,
            printer_columns=tuple(ver.get("additionalPrinterColumns") or ()),
            scale_paths=subs.get("scale"),
        ))
    return out


class Catalog:
    """The resource types currently served: the builtins plus installed CRDs (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_gvr: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.plural): r for r in BUILTIN}
        self._crds: dict[str, list[Resource]] = {}

    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        with self._lock:
            return self._by_gvr.get((group, version, plural))

    def all(self) -> list[Resource]:
        with self._lock:
            return list(self._by_gvr.values())

    def by_key(self, key: str) -> list[Resource]:
        with self._lock:
            return [r for r in self._by_gvr.values() if r.key == key]

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (the first is the preferred one)."""
        with self._lock:
            out: dict[str, list[str]] = {}
            for g, v, _ in self._by_gvr:
                if v not in out.setdefault(g, []):
                    out[g].append(v)
        for versions in out.values():
            versions.sort(key=_version_priority)
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def register_crd(self, name: str, resources: list[Resource]) -> None:
        with self._lock:
            for old in self._crds.pop(name, []):
                self._by_gvr.pop((old.group, old.version, old.plural), None)
            self._crds[name] = resources
            for r in resources:
                self._by_gvr[(r.group, r.version, r.plural)] = r

    def unregister_crd(self, name: str) -> None:
        self.register_crd(name, [])
        with self._lock:
            self._crds.pop(name, None)


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, then higher numbers first."""
    import re

    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0)
    major, stage, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor)
