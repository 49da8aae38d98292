"""Request counts kept in the worker and written to prometheus_client's shared files a few times a second.

Why. In multiprocess mode (serving.metrics) every `inc()` and `observe()` is
a locked write into an mmap file that /metrics later sums over the workers.
An admission review the memo answers made five such writes (the request
counter, the latency histogram's bucket and sum, the decision counters):
40,000 of its 280,000 instructions in process (docs/benchmarks/history/dryrun-and-issue16-rounds.md, "Issue 16,
ninth round"). Here a request adds to
in-process sums under one lock, and `flush` writes each labelled child's
total in one write per interval, however many requests it counted.

What it costs. A worker's counts reach /metrics up to `INTERVAL` seconds
late (a thread flushes them while any are pending; the worker answering a
scrape flushes its own first; a worker flushes on exit). Prometheus scrapes
every 15-60 s, so a scrape sees what a write-through counter would have
shown a fraction of a second earlier. Outside multiprocess mode (one
process, the Flask test client) nothing is held back: `count` and `record`
write through, as before.

Histograms: prometheus_client has no call to add many observations at
once, so a flush adds to the child's bucket and sum values directly
(`_buckets`, `_sum`, `_upper_bounds`, the attributes its own `observe`
uses); tests/serving/test_tally.py checks the exposition against
write-through observations, so a release that renames them fails there.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
import time
from typing import Any

INTERVAL = 0.25  # seconds a worker's counts may wait before /metrics sees them


class Tally:
    """Pending increments per prometheus_client child (`count`, `record`); `buffered` False writes
    through."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.buffered = False
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a fork copies the lock and the sums; start clean

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[Any, int] = {}  # counter child -> increments not yet written
        self._observed: dict[Any, tuple[list[int], list[float]]] = {}  # histogram child -> (bucket counts, [sum])
        self._thread: threading.Thread | None = None

    def count(self, children: tuple[Any, ...]) -> None:
        """`child.inc()` for each counter child, held back while buffered."""
        if not self.buffered:
            for child in children:
                child.inc()
            return
        with self._lock:
            counts = self._counts
            for child in children:
                counts[child] = counts.get(child, 0) + 1
        if self._thread is None:
            self._start()

    def record(self, counter: Any, histogram: Any, value: float) -> None:
        """`counter.inc()` and `histogram.observe(value)` (one request), held back while buffered."""
        if not self.buffered:
            counter.inc()
            histogram.observe(value)
            return
        with self._lock:
            self._counts[counter] = self._counts.get(counter, 0) + 1
            self._hold(histogram, value)
        if self._thread is None:
            self._start()

    def observe(self, histogram: Any, value: float) -> None:
        """`histogram.observe(value)`, held back while buffered."""
        if not self.buffered:
            histogram.observe(value)
            return
        with self._lock:
            self._hold(histogram, value)
        if self._thread is None:
            self._start()

    def _hold(self, histogram: Any, value: float) -> None:
        """One observation kept back (call with the lock held)."""
        bounds = histogram._upper_bounds
        pending = self._observed.get(histogram)
        if pending is None:
            pending = self._observed[histogram] = ([0] * len(bounds), [0.0])
        pending[0][bisect.bisect_left(bounds, value)] += 1  # as its observe: the first bound >= value
        pending[1][0] += value

    def flush(self) -> None:
        """Write every pending amount (one write per child and bucket)."""
        with self._lock:
            counts, self._counts = self._counts, {}
            observed, self._observed = self._observed, {}
        for child, amount in counts.items():
            child.inc(amount)
        for child, (buckets, total) in observed.items():
            child._sum.inc(total[0])
            for index, count in enumerate(buckets):
                if count:
                    child._buckets[index].inc(count)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="metrics-tally", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            if self._counts or self._observed:
                self.flush()


TALLY = Tally()  # one per process: every app's metrics in it share one lock and one flushing thread
atexit.register(TALLY.flush)
