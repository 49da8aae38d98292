"""Fixtures for the scale-to-zero, autoscale and metrics-source tests (imported by conftest.py).

Real: Prometheus (/usr/bin/prometheus, started per test on a free loopback
port, history backfilled with promtool) scraping a scripted DCGM exporter
(tests/promharness). Skipped with the reason when the binary is absent.
`scale_context` is the frame's context on a real API server (tests/cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.missing import missing
from tests.promharness import DcgmExporter, PrometheusServer, available


@pytest.fixture
def dcgm_exporter() -> Iterator[DcgmExporter]:
    exporter = DcgmExporter()
    yield exporter
    exporter.stop()


@pytest.fixture
def prometheus_factory(dcgm_exporter: DcgmExporter) -> Iterator[Callable[..., PrometheusServer]]:
    """start(history=seconds) -> a running Prometheus scraping `dcgm_exporter` (script it first)."""
    reason = available()
    if reason:
        missing(reason)
    started: list[PrometheusServer] = []

    def start(history: float = 0.0, step: float = 1.0, wait_scrape: bool = True) -> PrometheusServer:
        server = PrometheusServer(dcgm_exporter, history=history, step=step, wait_scrape=wait_scrape)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# -- a real cluster with the GpuPolicy and KEDA CRDs, and a frame context on it ----------------------
_REPO = Path(__file__).resolve().parents[2]
KEDA_CRD = _REPO / "vendor" / "crds" / "keda.sh_scaledobjects.yaml"
SCALE_NAMESPACES = ("research", "ml")


@pytest.fixture
def scale_api() -> Iterator[Any]:
    """A fresh real cluster (the chart's CRDs and RBAC, the KEDA CRD) with namespaces research and ml."""
    from tests.controller.conftest import _fresh_cluster

    yield from _fresh_cluster(SCALE_NAMESPACES, (KEDA_CRD,))


@pytest.fixture
def keda_scale_api() -> Iterator[Any]:
    """As `scale_api`, the chart rendered with keda.enabled=true (its ScaledObject rules), and
    `.controller_api`: a client as the chart's controller ServiceAccount."""
    from kubernetes import config

    from tests.cluster.kubeon import RELEASE
    from tests.controller.conftest import _fresh_cluster

    for fresh in _fresh_cluster(SCALE_NAMESPACES, (KEDA_CRD,), ("keda.enabled=true",)):
        kubeon = fresh.cluster.kubeon
        fresh.controller_api = config.new_client_from_config(str(kubeon.kubeconfig_of(fresh.api, RELEASE)))
        try:
            yield fresh
        finally:
            fresh.controller_api.close()


_CACHES: list[Any] = []  # the cluster caches scale_context started: stopped after each test


@pytest.fixture(autouse=True)
def stop_scale_caches() -> Iterator[None]:
    yield
    while _CACHES:
        _CACHES.pop().stop()


def scale_context(api: Any, admin: Any, prometheus_url: str | None, *, clock: Any = None, keda: bool = True) -> Any:
    """The frame's ControllerContext on `api` (leader), with the real Prometheus metrics source, reading
    the cluster through a CaughtUpCache (`admin` lists what it must have caught up with).

    `keda`: as `--keda` (chart keda.enabled=true): these tests drive KEDA ScaledObjects."""
    from controller.context import ControllerContext, SystemClock
    from controller.metrics_source import from_url
    from controller.policies import PolicyStore
    from controller.recorder import ControllerMetrics, Recorder
    from gpupolicy.model import Mode
    from tests.cluster.cache import CaughtUpCache

    clock = clock or SystemClock()
    cache = CaughtUpCache(api, admin).start()
    _CACHES.append(cache)
    return ControllerContext(
        api=api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND, prometheus_url=prometheus_url,
        metrics=from_url(prometheus_url), clock=clock, recorder=Recorder(api, ControllerMetrics(), clock, "test"),
        policies=PolicyStore(), is_leader=lambda: True, keda=keda, cache=cache,
    )
