"""GPU metrics from Prometheus (dcgm-exporter's series), through prometheus-api-client.

`PrometheusMetricsSource` is the production `MetricsSource` (controller/context.py):
it speaks to `--prometheus-url` and returns the core's plain `Series`/`Sample`.
The functions below it ask the questions scale to zero needs, against any
`MetricsSource` (the tests' scripted one too):

- `workload_utilization`: the workload's GPU utilisation over a window, max
  over its pods' GPUs, one point per step. Each point is the max of the raw
  samples in its step (`max_over_time(..[step])`), so a hole in the samples
  is a missing point. A plain range query would hide holes: Prometheus
  carries the last sample forward for up to 5 minutes (lookback delta).
- `wake_value`: the wake query's value (sum over its result vector).

Series are found by `namespace` and a `pod` name regex of the workload's
pods (gpupolicy/scaling/autoscale.py), as dcgm-exporter labels them in Kubernetes
mode. MIG slices report `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0..1) instead of
`DCGM_FI_DEV_GPU_UTIL`; the query takes both. The node label is `Hostname`
on older exporters and `hostname` on newer ones: `gpu_host` reads either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from controller.sources import MetricsSource
from gpupolicy.scaling.autoscale import workload_max_utilization_query
from gpupolicy.scaling.metrics import Sample, Series

HOST_LABELS = ("Hostname", "hostname")
MAX_POINTS = 10_000  # Prometheus refuses > 11,000 points per series


class MetricsError(RuntimeError):
    """Prometheus answered with an error or could not be reached."""


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


class PrometheusMetricsSource:
    """MetricsSource over the Prometheus HTTP API (`--prometheus-url`)."""

    def __init__(self, url: str, *, timeout: float = 10.0, headers: Mapping[str, str] | None = None,
                 disable_ssl: bool = False) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        # One quick retry, not the client's default 3 with 1 s backoff (~6 s per failing query):
        # a reconcile pass must not stall on a Prometheus outage; the next pass asks again.
        retry = Retry(total=1, backoff_factor=0.1, status_forcelist=(429, 502, 503, 504),
                      allowed_methods=("GET", "POST"))
        self._client = PrometheusConnect(
            url=self.url, headers=dict(headers or {}), disable_ssl=disable_ssl, timeout=math.ceil(timeout),
            retry=retry,
        )

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        # prometheus-api-client rounds start/end to whole seconds; the params override keeps them exact.
        try:
            result = self._client.custom_query_range(
                promql,
                start_time=datetime.fromtimestamp(start, tz=UTC),
                end_time=datetime.fromtimestamp(end, tz=UTC),
                step=_step_text(step),
                params={"start": f"{start:.3f}", "end": f"{end:.3f}"},
            )
        except Exception as exc:  # the client raises several types (requests, its own)
            raise MetricsError(f"query_range {promql!r}: {exc}") from exc
        series: list[Series] = []
        for item in result or []:
            points = [(float(t), v) for t, raw in item.get("values") or [] if (v := _float(raw)) is not None]
            series.append(Series(dict(item.get("metric") or {}), points))
        return series

    def query(self, promql: str) -> list[Sample]:
        try:
            result = self._client.custom_query(promql)
        except Exception as exc:
            raise MetricsError(f"query {promql!r}: {exc}") from exc
        samples: list[Sample] = []
        for item in result or []:
            value = item.get("value") or [0, "NaN"]
            number = _float(value[1])
            if number is not None:
                samples.append(Sample(dict(item.get("metric") or {}), number))
        return samples


def _step_text(step: float) -> str:
    """A Prometheus duration for a step (whole milliseconds)."""
    return f"{max(1, round(step * 1000))}ms"


def gpu_host(labels: Mapping[str, str]) -> str | None:
    """The node a DCGM series came from (`Hostname`, or `hostname` on newer exporters)."""
    for name in HOST_LABELS:
        if labels.get(name):
            return labels[name]
    return None


def workload_utilization(
    source: MetricsSource, kind: str, namespace: str, name: str, *, start: float, end: float, step: float,
) -> list[tuple[float, float]]:
    """The workload's GPU utilisation (%) in [start, end]: max over its pods' GPUs per step.

    Points are in time order; a step with no raw sample has no point.
    """
    step = max(step, (end - start) / MAX_POINTS)
    promql = workload_max_utilization_query(kind, namespace, name, _step_text(step))
    merged: dict[float, float] = {}
    for series in source.query_range(promql, start, end, step):
        for t, v in series.points:
            merged[t] = max(v, merged.get(t, v))
    return sorted(merged.items())


def wake_value(source: MetricsSource, promql: str) -> float | None:
    """The wake query's value: the sum over its result vector; None when it returned nothing."""
    samples = source.query(promql)
    if not samples:
        return None
    return sum(s.value for s in samples)


def from_url(url: str | None) -> PrometheusMetricsSource | None:
    """The source for `--prometheus-url` (None when not configured)."""
    return PrometheusMetricsSource(url) if url else None
