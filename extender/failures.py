"""The extender's own failures, made visible: counted by verb and cause, logged at most once a minute each.

The chart marks the extender `ignorable: true`, so when /filter answers an
internal error (or /prioritize scores every host 0) kube-scheduler carries on
without it: pods are still placed, only no longer packed, with HTTP 200
everywhere. Issue 37 found a cluster in that state for thousands of requests
with nothing a user would notice. So each such answer is counted in
`kubeon_extender_internal_errors_total{verb,cause}` (`cause`: the exception's
class, a closed set in practice) beside `kubeon_extender_decisions_total`'s
`outcome="error"`, which the controller reads to set `Ready=False,
ExtenderDegraded` on the policies the extender serves (docs/designs/extender.md,
"When the extender fails"). The traceback is logged once per verb and cause a
minute, with how many went unlogged since: a failure on every request must not
flood the log, and must not vanish from it either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from serving.tally import TALLY

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 60.0


class InternalErrors:
    """`failed(verb, exc)`: count one internal error; log its traceback unless this cause was logged lately."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic,
                 every: float = LOG_EVERY_SECONDS) -> None:
        self.counter = Counter("kubeon_extender_internal_errors",
                               "Answers the extender gave up on (filter Error, prioritize all zeros), by cause.",
                               ["verb", "cause"], registry=registry)
        self._clock = clock
        self._every = every
        self._lock = threading.Lock()
        self._logged: dict[tuple[str, str], float] = {}  # (verb, cause) -> when last logged
        self._unlogged: dict[tuple[str, str], int] = {}

    def failed(self, verb: str, exc: BaseException) -> str:
        """Count and maybe log one failure of `verb`; returns the cause (the exception's class name)."""
        cause = type(exc).__name__
        key = (verb, cause)
        TALLY.count((self.counter.labels(verb, cause),))
        now = self._clock()
        with self._lock:
            last = self._logged.get(key)
            if last is not None and now - last < self._every:
                self._unlogged[key] = self._unlogged.get(key, 0) + 1
                return cause
            self._logged[key] = now
            skipped = self._unlogged.pop(key, 0)
        log.error("/%s failed (%s): answered without the extender's opinion, kube-scheduler places the pod "
                  "unpacked%s", verb, cause, f"; {skipped} more since the last report" if skipped else "",
                  exc_info=exc)
        return cause
