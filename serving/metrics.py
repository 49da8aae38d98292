"""Request metrics for the Flask apps, aggregated over gunicorn's worker processes.

Each gunicorn worker is its own process with its own counters, and a scrape
reaches just one of them. prometheus-client's multiprocess mode fixes that:
`serving.server.serve` points PROMETHEUS_MULTIPROC_DIR at a fresh directory
before the workers fork, every worker writes its samples to mmap files there,
and `/metrics` answers with a `MultiProcessCollector` that sums all of them.
Outside `serve()` (Flask test client, one process) `/metrics` falls back to
the app's own registry.

Rule for callers: create metrics after the fork (in the app factory) or make
them labelled (children are created on first `.labels()`); an unlabelled
metric created at import time in the master keeps per-process values. A
value read from the process's own state at scrape (a custom collector, a
`Gauge.set_function`) has no multiprocess file: register such collectors in
the `live` registry given to `instrument`, which `/metrics` appends as the
answering worker sees it (a `set_function` gauge would be exposed from its
never-written file: always 0).
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

from serving.tally import TALLY

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Handlers are short CPU-bound JSON transforms (0.1-3 ms): resolve well below 10 ms, and 10-25 ms (where the
# extender's p99 in a loaded cluster fell, issue 47) in steps of 5.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.5, 1.0)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def _process_id() -> int:
    """This process's id, kept up to date across forks: prometheus_client's default asks the kernel
    (a getpid system call) on every increment, five times per admission request."""
    return _PID[0]


def use_multiprocess_values() -> None:
    """Make metrics created from now on write to the multiprocess directory.

    prometheus-client picks its value class when it is first imported; if that
    happened in the gunicorn master before serve() set the directory, workers
    must re-pick after the fork (serve() calls this in post_fork). In
    multiprocess mode the values identify their process by `_process_id`, and the request counts are
    written a few times a second rather than on every request (serving.tally)."""
    TALLY.buffered = multiprocess_enabled()
    if multiprocess_enabled():
        values.ValueClass = values.MultiProcessValue(process_identifier=_process_id)  # type: ignore[no-untyped-call]
    else:
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


class RequestMetrics:
    """Requests by route and status, and their latency."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "kubeon",
                 live: CollectorRegistry | None = None, cpu: bool = False) -> None:
        self.registry = registry
        self.live = live
        # `cpu`: also the CPU time of the thread answering (by route): beside the latency, how much of a slow
        # answer was the server's own work and how much waiting (a lock, the GIL, a busy machine)
        self.cpu = Histogram(f"{prefix}_http_request_cpu_seconds", "CPU time of the thread answering an HTTP request.",
                             ["route"], buckets=LATENCY_BUCKETS, registry=registry) if cpu else None
        self._cpu_children: dict[str, Any] = {}
        self.requests = Counter(
            f"{prefix}_http_requests_total", "HTTP requests by route and status code.",
            ["route", "status"], registry=registry)
        self.latency = Histogram(
            f"{prefix}_http_request_duration_seconds", "Time to answer an HTTP request.",
            ["route", "status"], buckets=LATENCY_BUCKETS, registry=registry)
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def record(self, route: str, status: int, seconds: float) -> None:
        """Count and time one request. The labelled children are looked up once per (route, status):
        prometheus_client's `.labels()` costs more than the increment itself (measured beside the
        multiprocess-mode write in docs/benchmarks/history/admission.md)."""
        key = (route, status)
        children = self._children.get(key)
        if children is None:
            labels = (route, str(status))
            children = self._children[key] = (self.requests.labels(*labels), self.latency.labels(*labels))
        TALLY.record(children[0], children[1], seconds)

    def record_cpu(self, route: str, seconds: float) -> None:
        assert self.cpu is not None
        child = self._cpu_children.get(route)
        if child is None:
            child = self._cpu_children[route] = self.cpu.labels(route)
        TALLY.observe(child, seconds)

    def exposition(self) -> bytes:
        TALLY.flush()  # this worker's counts; the others' are at most serving.tally.INTERVAL late
        live = generate_latest(self.live) if self.live is not None else b""
        if multiprocess_enabled():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry) + live
        return generate_latest(self.registry) + live


def instrument(app: Flask, *, prefix: str = "kubeon", registry: CollectorRegistry | None = None,
               metrics_path: str = "/metrics", live: CollectorRegistry | None = None, cpu: bool = False
               ) -> RequestMetrics:
    """Count and time every request of `app` and serve `metrics_path` (with `live`'s collectors, read from
    the answering process at scrape: module doc).

    The route label is the URL rule (`/mutate`), never the raw path, so label
    values stay bounded; unmatched paths are labelled `<unmatched>`."""
    metrics = RequestMetrics(registry or CollectorRegistry(), prefix, live, cpu)

    @app.before_request
    def _start() -> None:
        g.kubeon_started = time.perf_counter()
        if cpu:
            g.kubeon_cpu = time.thread_time()

    @app.after_request
    def _record(response: Response) -> Response:
        started = g.get("kubeon_started")
        if started is not None:
            route = request.url_rule.rule if request.url_rule is not None else "<unmatched>"
            metrics.record(route, response.status_code, time.perf_counter() - started)
            if cpu:
                metrics.record_cpu(route, time.thread_time() - g.kubeon_cpu)
        return response

    def metrics_view() -> Response:
        return Response(metrics.exposition(), mimetype=CONTENT_TYPE_LATEST)

    app.add_url_rule(metrics_path, "metrics", metrics_view, methods=["GET"])
    return metrics
