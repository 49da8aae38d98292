"""Shared fixtures for controller tests.

Real: the test API server (tests/kubeapi) when present. Faked: the clock
(`FakeClock`) and, at the frame level, the metrics source (`ScriptedMetrics`
answers range queries from scripted Series; the real Prometheus path is tested
with tests/promharness by the scale-to-zero tests). The scale-to-zero
developer's fixtures live in tests/controller/conftest_scale.py and are
imported here when that module exists.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest

from gpupolicy.scaling.metrics import Sample, Series

try:
    from tests.controller.conftest_scale import *  # noqa: F403
except ModuleNotFoundError as exc:  # only a missing conftest_scale is tolerated
    if exc.name != "tests.controller.conftest_scale":
        raise


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


# -- the test API server and object builders ---------------------------------------
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
POLICY_CRD = REPO / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"


@pytest.fixture
def frame_api():  # type: ignore[no-untyped-def]
    """A fresh test API server with the GpuPolicy CRD and namespaces kubeon-gpu + inference."""
    from tests.kubeapi import ApiServer

    server = ApiServer.start(crd_files=[str(POLICY_CRD)])
    try:
        api = server.api_client()
        from kubernetes import client

        core = client.CoreV1Api(api)
        for ns in ("kubeon-gpu", "inference", "default"):
            try:
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        server.api = api
        yield server
    finally:
        server.stop()


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


def make_node(name: str, product: str = "NVIDIA-A100-SXM4-80GB", gpus: int = 8) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product,
                                                  "nvidia.com/gpu.count": str(gpus)}},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}}


def make_policy(name: str, body: dict[str, object], mode: str | None = None,
                approvals: list[str] | None = None, selector: dict[str, object] | None = None) -> dict[str, object]:
    spec: dict[str, object] = {**body, "selector": selector or {"namespaces": ["inference"]}}
    if mode:
        spec["mode"] = mode
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": spec}
