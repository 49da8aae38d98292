"""Leader election on a coordination.k8s.io/v1 Lease: only the holder reconciles.

A small loop of our own (see REFERENCE.md, Leases): acquire the Lease when it
is free or expired (leaseTransitions + 1 on a takeover), renew it every few
seconds, and write only with the resourceVersion just read so a race is lost
cleanly (409). A replica that cannot renew before its lease would expire, or
finds another holder, stops acting at once: `is_leader()` turns False and the
`on_lost` callback runs (the command exits the process with a log line, so a
replica never keeps acting on a stale belief).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from kubernetes import client

from controller.sources import Clock
from kube.calls import API_ERRORS, one_line
from kube.leases import LeaseConflict, LeaseRecord, create_lease, get_lease, replace_lease

log = logging.getLogger(__name__)

_RELEASE_ERRORS: tuple[type[Exception], ...] = (LeaseConflict, *API_ERRORS)


def exit_process(reason: str) -> None:
    """Default `on_lost`: log and leave now (no cleanup that could still write)."""
    log.error("leadership lost, exiting reason=%s", reason)
    logging.shutdown()
    os._exit(1)


class LeaderElector:
    """Holds (or waits for) the Lease `namespace/name` as `identity`."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        clock: Clock,
        lease_duration: int = 15,
        renew_interval: float = 5.0,
        on_lost: Callable[[str], None] = exit_process,
        on_acquired: Callable[[], None] | None = None,
    ) -> None:
        if renew_interval >= lease_duration:
            raise ValueError("renew interval must be shorter than the lease duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.clock = clock
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self.on_lost = on_lost
        self.on_acquired = on_acquired
        self._lock = threading.Lock()
        self._leader = False
        self._renewed_at = 0.0
        self._lost = False
        self._standing_by_for: str | None = None  # the holder last logged while this replica waits

    # -- state ---------------------------------------------------------------
    def is_leader(self) -> bool:
        """True while this replica holds an unexpired lease by its own last renewal."""
        with self._lock:
            if not self._leader:
                return False
            if self.clock.now() < self._renewed_at + self.lease_duration:
                return True
        self._lose("lease not renewed before it expired")
        return False

    def _won(self, record: LeaseRecord, took_over: bool) -> None:
        with self._lock:
            was = self._leader
            self._leader = True
            self._renewed_at = record.renew_time or self.clock.now()
        if not was:
            log.info("leadership acquired identity=%s lease=%s/%s transitions=%d takeover=%s",
                     self.identity, self.namespace, self.name, record.transitions, took_over)
            if self.on_acquired:
                self.on_acquired()

    def _lose(self, reason: str) -> None:
        with self._lock:
            if not self._leader:
                return
            self._leader = False
            self._lost = True
        log.warning("leadership lost identity=%s reason=%s", self.identity, reason)
        self.on_lost(reason)

    # -- one attempt -----------------------------------------------------------
    def step(self) -> bool:
        """Acquire, renew or observe once. Returns whether this replica leads afterwards."""
        now = self.clock.now()
        try:
            current = get_lease(self.api, self.namespace, self.name)
            if current is None:
                record = create_lease(self.api, self.namespace, self.name, self.identity,
                                      self.lease_duration, now)
                self._won(record, took_over=False)
                return True
            if current.holder == self.identity:
                if not self._leader and self._lost:
                    return False  # once lost, a replica does not quietly resume
                record = replace_lease(self.api, current, self.identity, self.lease_duration,
                                       current.acquire_time or now, now, current.transitions)
                self._won(record, took_over=False)
                return True
            if self._leader:
                self._lose(f"lease now held by {current.holder}")
                return False
            if current.expired(now) and not self._lost:
                record = replace_lease(self.api, current, self.identity, self.lease_duration,
                                       now, now, current.transitions + 1)
                self._won(record, took_over=True)
                return True
            if current.holder != self._standing_by_for:  # once per holder: why this replica is idle
                self._standing_by_for = current.holder
                log.info("standing by identity=%s lease=%s/%s holder=%s", self.identity, self.namespace,
                         self.name, current.holder or "(released)")
            return False
        except LeaseConflict as exc:
            if self._leader:
                self._lose(str(exc))
            return False
        except API_ERRORS as exc:
            log.warning("lease step failed identity=%s error=%s", self.identity, one_line(exc))
            return self.is_leader()

    def run(self, stop: threading.Event) -> None:
        """Step every `renew_interval` (real seconds) until `stop` or leadership is lost.

        Nothing a step raises ends the loop: a dead lease thread would leave the process up, its
        probes answering, and never leading (an API server down at start did exactly that). An
        unexpected error is logged and the next step tries again; `is_leader` still trips
        `on_lost` once renewals have failed past the lease's expiry."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("lease step failed identity=%s", self.identity)
            if self._lost:
                return
            self.is_leader()  # trips on_lost when renewals kept failing past expiry
            stop.wait(self.renew_interval)

    def release(self) -> None:
        """On clean shutdown, give the lease up so another replica need not wait for expiry.

        As client-go's ReleaseOnCancel: holderIdentity empty, leaseDurationSeconds 1,
        renewTime now (an empty holder counts as free at once). Conditional on the
        resourceVersion read, so a lease someone else already took is left alone.
        Never trips `on_lost` (a shutdown is not a lost lease).
        """
        with self._lock:
            was_leader = self._leader and not self._lost
            self._leader = False
        if not was_leader:
            return
        try:
            current = get_lease(self.api, self.namespace, self.name)
            if current and current.holder == self.identity:
                now = self.clock.now()
                replace_lease(self.api, current, "", 1, current.acquire_time or now, now, current.transitions)
                log.info("lease released identity=%s lease=%s/%s", self.identity, self.namespace, self.name)
        except _RELEASE_ERRORS as exc:
            log.warning("lease release failed error=%s", one_line(exc))

