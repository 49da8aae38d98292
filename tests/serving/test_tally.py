"""serving.tally: request counts held in the worker and written a few times a second.

Real: prometheus_client's counters and histograms on a registry, read back as
its exposition would show them; the flushing thread. Faked: nothing (the
multiprocess files are prometheus_client's own; tests/serving/test_server.py
reads them through gunicorn workers).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from serving.metrics import LATENCY_BUCKETS
from serving.tally import Tally

SECONDS = [0.0004, 0.0005, 0.0007, 0.002, 0.0031, 0.04, 0.9, 1.0, 7.5, 0.0]


def _metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    return (Counter("reqs_total", "r", ["route"], registry=registry),
            Histogram("lat_seconds", "l", ["route"], buckets=LATENCY_BUCKETS, registry=registry))


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def test_a_flush_shows_what_writing_through_shows() -> None:
    held, through = CollectorRegistry(), CollectorRegistry()
    (held_counter, held_hist), (counter, hist) = _metrics(held), _metrics(through)
    tally, direct = Tally(interval=3600), Tally()
    tally.buffered = True
    for route in ("/mutate", "/validate"):
        for seconds in SECONDS:
            tally.record(held_counter.labels(route), held_hist.labels(route), seconds)
            direct.record(counter.labels(route), hist.labels(route), seconds)
        tally.count((held_counter.labels(route), held_counter.labels(route)))
        direct.count((counter.labels(route), counter.labels(route)))
    assert _samples(held)[("reqs_total", (("route", "/mutate"),))] == 0  # held back
    tally.flush()
    assert _samples(held) == _samples(through)
    assert _samples(held)[("lat_seconds_bucket", (("le", "0.0005"), ("route", "/mutate")))] == 3  # le: <= bound
    assert _samples(held)[("reqs_total", (("route", "/validate"),))] == len(SECONDS) + 2
    tally.flush()  # nothing pending: nothing added twice
    assert _samples(held) == _samples(through)


def test_the_thread_writes_pending_counts_within_the_interval() -> None:
    registry = CollectorRegistry()
    counter, hist = _metrics(registry)
    tally = Tally(interval=0.05)
    tally.buffered = True
    tally.record(counter.labels("/filter"), hist.labels("/filter"), 0.003)
    deadline = time.monotonic() + 10
    while registry.get_sample_value("reqs_total", {"route": "/filter"}) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert registry.get_sample_value("reqs_total", {"route": "/filter"}) == 1
    assert registry.get_sample_value("lat_seconds_count", {"route": "/filter"}) == 1
    assert registry.get_sample_value("lat_seconds_sum", {"route": "/filter"}) == 0.003


def test_outside_multiprocess_mode_nothing_is_held_back() -> None:
    registry = CollectorRegistry()
    counter, hist = _metrics(registry)
    tally = Tally(interval=3600)
    tally.record(counter.labels("/mutate"), hist.labels("/mutate"), 0.01)
    tally.count((counter.labels("/mutate"),))
    assert registry.get_sample_value("reqs_total", {"route": "/mutate"}) == 2
    assert registry.get_sample_value("lat_seconds_bucket", {"route": "/mutate", "le": "0.01"}) == 1
