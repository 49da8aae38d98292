"""Watched objects a derived state left out: one warning line each, and `kubeon_gpu_objects_ignored_total`.

Every state built from what the watches deliver (the extender's node model
and typical mix, the policy view the webhook and the extender answer from)
either represents an object exactly (amounts beyond the model's bound
saturated: the pod then fits nowhere, which is the truth) or leaves it out,
so that one bad object affects only the answers about itself (issue 37: one
pod asking `cpu: 10P` made every later /filter fail until a restart). What
is left out is said here, once per object and problem: a warning naming the
object and the field, and a count by reason (`malformed`: a missing field,
a wrong type, not a quantity; `out-of-range`: a negative amount, more GPUs
than a node can have; `invalid-policy`: a GpuPolicy the model refuses).
The same object left out again for the same problem (a status update) is
neither logged nor counted again; once it is read, or deleted, it is
forgotten.

The counter lives in the registry of the app that serves /metrics, which is
made after gunicorn's fork (serving.metrics): `export` attaches it and adds
what was counted before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

METRIC = "kubeon_gpu_objects_ignored"  # exposed as kubeon_gpu_objects_ignored_total{reason}
REMEMBERED = 10_000  # objects left out kept in mind (oldest forgotten first: pending pods send no delete)


class IgnoredObjects:
    """The objects left out now, by (kind, key), and how many times one was left out, by reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: dict[tuple[str, str], str] = {}  # (kind, key) -> the problem it was left out for
        self.counts: dict[str, int] = {}
        self._counter: Counter | None = None

    def export(self, registry: CollectorRegistry) -> None:
        """Count into `registry` from now on, starting from what was counted so far."""
        counter = Counter(METRIC, "Watched objects left out of a derived state (logged once each), by reason.",
                          ["reason"], registry=registry)
        with self._lock:
            for reason, count in self.counts.items():
                counter.labels(reason).inc(count)
            self._counter = counter

    def left_out(self, kind: str, key: str, reason: str, problem: str) -> None:
        """`kind` `key` is not in the state because of `problem`: logged and counted unless already said."""
        with self._lock:
            if self._now.get((kind, key)) == problem:
                return
            self._now.pop((kind, key), None)
            self._now[(kind, key)] = problem
            if len(self._now) > REMEMBERED:
                del self._now[next(iter(self._now))]
            self.counts[reason] = self.counts.get(reason, 0) + 1
            if self._counter is not None:
                self._counter.labels(reason).inc()
        log.warning("%s %s left out (%s): %s", kind, key, reason, problem)

    def taken(self, kind: str, key: str) -> None:
        """`kind` `key` is read again, or gone: a later problem is new."""
        if self._now:
            with self._lock:
                self._now.pop((kind, key), None)

    def only(self, kind: str, found: Mapping[str, tuple[str, str]]) -> None:
        """The objects of `kind` left out now are `found` (key -> (reason, problem)), for a state rebuilt
        from a whole list: new ones are said, the others forgotten."""
        with self._lock:
            for gone in [k for k in self._now if k[0] == kind and k[1] not in found]:
                del self._now[gone]
        for key, (reason, problem) in found.items():
            self.left_out(kind, key, reason, problem)

    def current(self, kind: str) -> dict[str, str]:
        """The objects of `kind` left out now, with their problem (tests, debugging)."""
        with self._lock:
            return {key: problem for (k, key), problem in self._now.items() if k == kind}
