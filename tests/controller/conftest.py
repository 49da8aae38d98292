"""Shared fixtures for controller tests.

Real: the Kubernetes control plane (tests/cluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK) with the chart's CRDs, ServiceAccounts and RBAC applied as `helm install` would;
the controller under test authenticates as the chart's ServiceAccount (`Scene.controller`), so every
request it makes is authorized by the chart's ClusterRoles and Roles, and the API server's audit log
says which writes it made (`Scene.writes`). Faked: the clock where a test must reach a time bound
without waiting (`FakeClock`), and, at the frame level, the metrics source (`ScriptedMetrics` answers
range queries from scripted Series; the real Prometheus path is tested with tests/promharness by the
scale-to-zero tests). The scale-to-zero developer's fixtures live in tests/controller/conftest_scale.py
and are imported here when that module exists.

A module runs on one cluster: `CLUSTER = CONTROLLER_CLUSTER` (no optimizer process runs; the test
runs the controller it needs) and asks for `scene` (a fresh namespace; what the test made cluster-wide,
its GpuPolicies, nodes and the controller's Lease, removed after it).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpupolicy.scaling.metrics import Sample, Series
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import NAMESPACE, RELEASE, apply_objects
from tests.cluster.objects import make_node

try:
    from tests.controller.conftest_scale import *  # noqa: F403
except ModuleNotFoundError as exc:  # only a missing conftest_scale is tolerated
    if exc.name != "tests.controller.conftest_scale":
        raise

__all__ = ["FakeClock", "Scene", "ScriptedMetrics", "make_deployment", "make_node", "make_policy"]

REPO = Path(__file__).resolve().parents[2]
POLICY_CRD = REPO / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
KEDA_CRD = REPO / "vendor" / "crds" / "keda.sh_scaledobjects.yaml"
# The chart's setup (CRDs, ServiceAccounts, RBAC, the scheduler's ConfigMap) and no optimizer process.
CONTROLLER_CLUSTER: dict[str, Any] = {"kubeon": True, "kubeon_components": (), "gpu_operator": False}
CONTROLLER_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
LEASE = RELEASE
GROUP, VERSION, PLURAL = "gpu.kubeon.io", "v1alpha1", "gpupolicies"


class FakeClock:
    """A clock tests move by hand (thread-safe)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class ScriptedMetrics:
    """A MetricsSource answering from scripted series: a rule maps a PromQL matcher to series.

    `add(metric, labels, fn, start, end, every)` scripts one series; range queries
    return the series whose metric name appears in the query and whose `pod`
    label matches the query's `pod=~"..."` regex (when present), cut to [start, end].
    """

    def __init__(self) -> None:
        self.series: list[tuple[str, Series]] = []
        self.queries: list[str] = []

    def add(self, metric: str, labels: dict[str, str], value: Callable[[float], float | None],
            start: float, end: float, every: float = 60.0) -> None:
        points: list[tuple[float, float]] = []
        t = start
        while t <= end:
            v = value(t)
            if v is not None:
                points.append((t, float(v)))
            t += every
        self.series.append((metric, Series(dict(labels), points)))

    def _matching(self, promql: str) -> list[tuple[str, Series]]:
        pod_re = re.search(r'pod=~"([^"]+)"', promql)
        ns = re.search(r'namespace="([^"]+)"', promql)
        found = []
        for metric, series in self.series:
            if metric not in promql:
                continue
            if pod_re and not re.fullmatch(pod_re.group(1), series.labels.get("pod", "")):
                continue
            if ns and series.labels.get("namespace") != ns.group(1):
                continue
            found.append((metric, series))
        return found

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        self.queries.append(promql)
        scale = 100.0 if "* 100" in promql or "*100" in promql else 1.0
        out = []
        for _, series in self._matching(promql):
            points = [(t, v * scale) for t, v in series.points if start <= t <= end]
            if points:
                out.append(Series(series.labels, points))
        return out

    def query(self, promql: str) -> list[Sample]:
        self.queries.append(promql)
        return [Sample(s.labels, s.points[-1][1]) for _, s in self._matching(promql) if s.points]


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def scripted_metrics() -> ScriptedMetrics:
    return ScriptedMetrics()


# -- object builders ------------------------------------------------------------------------------
def make_deployment(name: str, namespace: str = "inference", gpus: int = 1, replicas: int = 1,
                    labels: dict[str, str] | None = None, kind: str = "Deployment") -> dict[str, object]:
    """A Deployment (or StatefulSet) whose one container asks `gpus` whole GPUs."""
    pod_labels = {"app": name, **(labels or {})}
    spec: dict[str, object] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {"containers": [{
                "name": "main", "image": "vllm/vllm-openai:latest",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }]},
        },
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def make_policy(name: str, body: dict[str, object], mode: str | None = None,
                approvals: list[str] | None = None, selector: dict[str, object] | None = None) -> dict[str, object]:
    spec: dict[str, object] = {**body, "selector": selector or {"namespaces": ["inference"]}}
    if mode:
        spec["mode"] = mode
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": spec}


# -- the real cluster -----------------------------------------------------------------------------
def wait_established(cluster: Cluster, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until each CRD serves its resource (applying one returns before it does)."""
    ext = client.ApiextensionsV1Api(cluster.api_client)

    def established(name: str) -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in names:
        cluster.wait_for(lambda name=name: established(name), timeout, f"CRD {name} Established")  # type: ignore[misc]


def install_crds(cluster: Cluster, *paths: Path) -> None:
    """Server-side apply CRD files (beyond the chart's own) and wait until they serve."""
    docs = [yaml.safe_load(p.read_text()) for p in paths]
    apply_objects(cluster.api_client, docs)
    wait_established(cluster, [d["metadata"]["name"] for d in docs])


def controller_kubeconfig(cluster: Cluster) -> Path:
    """A kubeconfig with a TokenRequest token of the chart's controller ServiceAccount."""
    assert cluster.kubeon is not None, "the module's CLUSTER must set kubeon=True (the chart's RBAC)"
    path = cluster.root / "kubeon" / f"{RELEASE}.kubeconfig"
    return path if path.exists() else cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)


class Scene:
    """One test's part of the module's cluster.

    `admin` (system:masters) sets the scene; `controller` is the controller's own identity (the chart's
    ServiceAccount). Cluster-scoped objects a test makes (nodes through `node`, GpuPolicies) and the
    controller's Lease go after the test, so the next test's controller starts from an empty cluster.
    """

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.admin = cluster.api_client
        self.kubeconfig = str(controller_kubeconfig(cluster))
        self.controller = config.new_client_from_config(self.kubeconfig)
        self._nodes: list[str] = []
        self._audit_mark = len(cluster.plane.audit_events())

    def node(self, name: str, *args: Any, **kwargs: Any) -> str:
        """A KWOK node (tests/cluster/objects.make_node) named `<namespace>-<name>`; its name."""
        return self.create_node(make_node(f"{self.namespace}-{name}", *args, **kwargs))

    def create_node(self, body: dict[str, Any]) -> str:
        """Create this node (KWOK runs it), removed after the test; its name."""
        self.cluster.create_node(body)
        self._nodes.append(body["metadata"]["name"])
        return str(body["metadata"]["name"])

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create as the admin (a namespaced object without a namespace goes in the scene's)."""
        body = dict(obj)
        if body["kind"] not in ("GpuPolicy", "Node") and not body["metadata"].get("namespace"):
            body["metadata"] = {**body["metadata"], "namespace": self.namespace}
        return self.cluster.create(body)

    def writes(self, user: str = CONTROLLER_USER) -> list[tuple[str, str]]:
        """(verb, request path) of the writes `user` (the controller) made since the scene began, as the
        API server's audit log records them; the verb as HTTP says it (POST, PUT, PATCH, DELETE)."""
        return [(verb, path) for verb, path, _ in self.answered(user)]

    def answered(self, user: str = CONTROLLER_USER) -> list[tuple[str, str, int]]:
        """`writes` with the status code the API server answered each with (201, 409, 429...)."""
        verbs = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE",
                 "deletecollection": "DELETE"}
        events = self.cluster.plane.audit_events()[self._audit_mark:]
        return [(verbs[e["verb"]], e["requestURI"].split("?", 1)[0],
                 int((e.get("responseStatus") or {}).get("code", 0)))
                for e in events if (e.get("user") or {}).get("username") == user]

    def close(self) -> None:
        custom = client.CustomObjectsApi(self.admin)
        for policy in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, policy["metadata"]["name"])
        with contextlib.suppress(ApiException):
            client.CoordinationV1Api(self.admin).delete_namespaced_lease(LEASE, NAMESPACE)
        for name in self._nodes:
            with contextlib.suppress(ApiException):
                self.cluster.core.delete_node(name)
        self.controller.close()


@pytest.fixture
def scene(kube_cluster: Cluster, namespace: str) -> Iterator[Scene]:
    wait_established(kube_cluster, [POLICY_CRD.name.removesuffix(".yaml")])
    made = Scene(kube_cluster, namespace)
    try:
        yield made
    finally:
        made.close()


# -- one fresh cluster per test, for tests written before the module-wide cluster ----------------
class FreshApi:
    """What tests of the retired test API server read from it: `api` (an admin client) and
    `kubeconfig` (its path as a string), now of a real cluster with the chart's setup."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api = cluster.api_client
        self.kubeconfig = str(cluster.kubeconfig)


def _fresh_cluster(namespaces: Iterable[str], crds: Iterable[Path],
                   sets: tuple[str, ...] = ()) -> Iterator[FreshApi]:
    from tests.cluster.fixtures import start_cluster

    cluster = start_cluster(**{**CONTROLLER_CLUSTER, "kubeon_sets": sets})
    try:
        wait_established(cluster, [POLICY_CRD.name.removesuffix(".yaml")])
        if crds:
            install_crds(cluster, *crds)
        for name in namespaces:
            cluster.ensure_namespace(name)
        yield FreshApi(cluster)
    finally:
        cluster.stop()


@pytest.fixture
def frame_api() -> Iterator[FreshApi]:
    """A fresh real cluster (the chart's CRDs and RBAC) with namespaces kubeon-gpu, inference and default."""
    yield from _fresh_cluster(("inference",), ())

