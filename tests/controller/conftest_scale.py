"""Fixtures for the scale-to-zero, autoscale and metrics-source tests (imported by conftest.py).

Real: Prometheus (/usr/bin/prometheus, started per test on a free loopback
port, history backfilled with promtool) scraping a scripted DCGM exporter
(tests/promharness). Skipped with the reason when the binary is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

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
        pytest.skip(reason)
    started: list[PrometheusServer] = []

    def start(history: float = 0.0, step: float = 1.0, wait_scrape: bool = True) -> PrometheusServer:
        server = PrometheusServer(dcgm_exporter, history=history, step=step, wait_scrape=wait_scrape)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
