"""controller/metrics_source.py against a real Prometheus scraping a scripted DCGM exporter.

Real: /usr/bin/prometheus (history backfilled with promtool, then live 1 s
scrapes), prometheus-api-client, the DCGM label set, the real H200 trace.
Faked: the GPUs (the exporter serves scripted values).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from controller.metrics_source import PrometheusMetricsSource, gpu_host, wake_value, workload_utilization
from gpupolicy.scaling import scaletozero as core
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels, replay

UTIL = "DCGM_FI_DEV_GPU_UTIL"


def test_per_workload_max_over_pods_mig_and_both_host_labels(
    dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    ns = "research"
    dcgm_exporter.put(UTIL, gpu_labels(namespace=ns, pod="llm-7d9f6c8b5-x2b4z", gpu=0), constant(3))
    dcgm_exporter.put(UTIL, gpu_labels(namespace=ns, pod="llm-7d9f6c8b5-q5w7v", gpu=1, host_label="hostname"),
                      constant(4))
    # Another deployment whose name starts the same, and the same name in another namespace: not ours.
    dcgm_exporter.put(UTIL, gpu_labels(namespace=ns, pod="llm-big-7d9f6c8b5-x2b4z"), constant(90))
    dcgm_exporter.put(UTIL, gpu_labels(namespace="other", pod="llm-7d9f6c8b5-x2b4z"), constant(90))
    # A MIG slice of a StatefulSet: no GPU_UTIL, GR_ENGINE_ACTIVE as a ratio.
    dcgm_exporter.put("DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                      gpu_labels(namespace=ns, pod="trainer-0", mig_profile="1g.18gb", mig_id=3), constant(0.42))
    prom = prometheus_factory(history=120, wait_scrape=False)
    source = PrometheusMetricsSource(prom.url)
    now = time.time()
    points = workload_utilization(source, "Deployment", ns, "llm", start=now - 60, end=now, step=2)
    assert len(points) >= 29
    assert {v for _, v in points} == {4.0}
    mig = workload_utilization(source, "StatefulSet", ns, "trainer", start=now - 60, end=now, step=2)
    assert mig and abs(mig[-1][1] - 42.0) < 1e-6
    hosts = {gpu_host(s.labels) for s in source.query(f'{UTIL}{{namespace="{ns}"}}')}
    assert hosts == {"gpu-node-1"}
    assert core.assess_idle(points, threshold=5, window=60, now=now, max_gap=6).idle


def test_holes_are_visible_and_no_data_is_empty(
    dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    start = time.time() - 120
    # Absent for 20 s in the middle of the window: a plain range query would carry the last value over it.
    dcgm_exporter.put(UTIL, gpu_labels(namespace="ml", pod="infer-7d9f6c8b5-x2b4z"),
                      lambda t: None if start + 70 <= t < start + 90 else 0.0)
    prom = prometheus_factory(history=120, wait_scrape=False)
    source = PrometheusMetricsSource(prom.url)
    now = time.time()
    points = workload_utilization(source, "Deployment", "ml", "infer", start=now - 60, end=now, step=2)
    verdict = core.assess_idle(points, threshold=5, window=60, now=now, max_gap=6)
    assert verdict.reason is core.Reason.GAP, verdict
    assert workload_utilization(source, "Deployment", "ml", "absent", start=now - 60, end=now, step=2) == []
    assert wake_value(source, "sum(nothing_here)") is None


def test_real_h200_bursty_trace_is_busy_and_idle_trace_is_idle(
    dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    origin = time.time() - 300
    dcgm_exporter.put(UTIL, gpu_labels(namespace="ml", pod="bursty-7d9f6c8b5-x2b4z"), replay("bursty", origin))
    dcgm_exporter.put(UTIL, gpu_labels(namespace="ml", pod="quiet-7d9f6c8b5-x2b4z"), replay("idle", origin))
    prom = prometheus_factory(history=180, wait_scrape=False)
    source = PrometheusMetricsSource(prom.url)
    now = time.time()
    bursty = workload_utilization(source, "Deployment", "ml", "bursty", start=now - 60, end=now, step=2)
    assert any(v == 0 for _, v in bursty) and max(v for _, v in bursty) >= 40
    assert core.assess_idle(bursty, threshold=5, window=60, now=now, max_gap=6).reason is core.Reason.BUSY
    quiet = workload_utilization(source, "Deployment", "ml", "quiet", start=now - 60, end=now, step=2)
    assert core.assess_idle(quiet, threshold=5, window=60, now=now, max_gap=6).idle


def test_live_scrape_reaches_wake_query(
    dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    labels = {"service": "llm"}
    dcgm_exporter.put("queue_depth", labels, constant(0))
    prom = prometheus_factory()
    source = PrometheusMetricsSource(prom.url)
    assert wake_value(source, 'sum(queue_depth{service="llm"})') == 0
    dcgm_exporter.put("queue_depth", labels, constant(7))
    prom.wait_for('queue_depth{service="llm"} == 7')
    assert wake_value(source, 'sum(queue_depth{service="llm"})') == 7
