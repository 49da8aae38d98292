"""The reconcile runner: one loop per concern, each on its period plus wake-ups from watches.

Reconcilers are small objects behind one protocol, listed in one ordered
registry (`RECONCILERS`). The runner acts only while this replica holds the
lease; after each pass it lets the policy store write the policy statuses
that changed, so a proposal published by any reconciler reaches the cluster
in the same pass. A reconciler that raises is logged and retried on its next
period; it never stops the others. A reconciler that cannot be imported or
built is a broken install, not a concern to skip: `load_reconcilers` raises
`ReconcilerLoadError` and the process exits non-zero (controller/command.py).

Garbage collection. The process holds the cluster (every Pod and Node, kube/informers.py) and what the
passes remember of it, and the interpreter's full collections walked all of it from inside whichever
pass allocated at the wrong moment: 0.45 s of CPU at 5,000 nodes / 50,000 pods on a quiet machine,
collecting nothing, and up to 2.5 s a pass in the loaded cluster of bench/cluster_scale.py, which made a
layout pass (period 20 s) take over 10 s (issue 47). While `run_forever` runs, the oldest generation is
collected between passes instead, at most every `FULL_COLLECTION_SECONDS`; the first such collection
also freezes what survived it (the synced caches, the start-up state) out of later ones. The young
generations are collected as always.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from controller.context import ControllerContext
from gpupolicy.packing.kubemodel import parsing
from kube.calls import API_ERRORS, one_line
from kube.stoppable import Stopping

__all__ = ["RECONCILERS", "ReconcileRunner", "Reconciler", "ReconcilerLoadError", "Stopping", "load_reconcilers"]

log = logging.getLogger(__name__)

FULL_COLLECTION_SECONDS = 60.0  # the oldest generation is collected between passes at most this often (module doc)
NEVER = 1 << 30  # young collections before a full one the interpreter would start itself: never, in practice


@runtime_checkable
class Reconciler(Protocol):
    """One concern of the controller (policy sync, right-sizing, scale to zero, ...)."""

    name: str
    period_seconds: float

    def reconcile(self, ctx: ControllerContext) -> None:
        """One pass. Idempotent; safe to repeat after a crash at any point; checks
        `ctx.is_leader()` before each write."""
        ...


# The ordered registry: (module, class). Each class is constructed with no arguments.
# Order within one runner tick:
#   1. policies     - lists and parses GpuPolicies; everything below reads them.
#   1b. claim-templates - `via: DRA` sharing policies: the ResourceClaimTemplates rewritten pods name,
#                     early so a pod waits on its claim as little as possible.
#   2. rightsizing  - sharing policies: proposals from memory/utilisation history.
#   3. layout       - sharing policies: node layouts (time-slicing keys, MIG) for the
#                     pods waiting on slices; after right-sizing, whose rewrites make them.
#   4. scaletozero  - parks idle workloads / wakes them; after right-sizing so a
#                     restart for a new size never races a scale to zero in one tick
#                     (scale to zero reads the replicas right-sizing left).
#   5. autoscale    - KEDA ScaledObjects; last, it must see which targets scale
#                     to zero manages (paused-replicas) before generating triggers.
#   6. capacity     - capacity policies: the NodePool, NodeClaims for pending shared-GPU
#                     pods, drains; after layout, so an empty node the layout re-lays
#                     for waiting pods is counted before any new node is asked for.
#   7. extender-health - reads the extender's counters: packing and typeFit policies say
#                     Ready=False ExtenderDegraded while it fails open; writes nothing
#                     but the verdict the status writer reads, so its place is free.
RECONCILERS: tuple[tuple[str, str], ...] = (
    ("controller.policysync", "PolicySync"),
    ("controller.claimtemplates", "ClaimTemplateReconciler"),
    ("controller.rightsizing", "RightSizingReconciler"),
    ("controller.layout", "LayoutReconciler"),
    ("controller.scaletozero", "ScaleToZeroReconciler"),
    ("controller.autoscale", "AutoscaleReconciler"),
    ("controller.capacity.reconciler", "CapacityReconciler"),
    ("controller.extenderhealth", "ExtenderHealth"),
)


class ReconcilerLoadError(RuntimeError):
    """A registered reconciler that cannot be imported or constructed."""


def load_reconcilers(
    periods: Mapping[str, float] | None = None,
    registry: Iterable[tuple[str, str]] = RECONCILERS,
) -> list[Reconciler]:
    """Instantiate the registry in order; `periods` overrides `period_seconds` by reconciler name.

    Raises `ReconcilerLoadError` naming the module when one fails to import or build: a controller
    silently missing a concern would leave its policies unserved while reporting healthy.
    """
    loaded: list[Reconciler] = []
    for module_name, class_name in registry:
        try:
            reconciler = getattr(importlib.import_module(module_name), class_name)()
        except Exception as exc:
            raise ReconcilerLoadError(f"reconciler {module_name}.{class_name} cannot be loaded: "
                                      f"{type(exc).__name__}: {exc}") from exc
        if periods and reconciler.name in periods:
            reconciler.period_seconds = float(periods[reconciler.name])
        loaded.append(reconciler)
    return loaded


@dataclass
class ReconcileRunner:
    """Runs due reconcilers while leader; `trigger` makes them due now (watch events)."""

    ctx: ControllerContext
    reconcilers: list[Reconciler]
    _due: dict[str, float] = field(default_factory=dict)
    _periodic: dict[str, float] = field(default_factory=dict)  # when each is due by its period alone
    _wake: threading.Event = field(default_factory=threading.Event)
    passes: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.ctx.policies.expect_sources(r.name for r in self.reconcilers)

    def trigger(self, name: str | None = None) -> None:
        """Make one reconciler (or all) due at once; safe from other threads."""
        for reconciler in self.reconcilers:
            if name is None or reconciler.name == name:
                self._due[reconciler.name] = 0.0
        self._wake.set()

    def due_at(self, name: str, when: float) -> None:
        """Make `name` due at `when` (clock seconds), never later than its period makes it (a batch of watch
        events moves it on each event, controller/pendingbatch.py); safe from other threads."""
        if any(r.name == name for r in self.reconcilers):
            self._due[name] = min(when, self._periodic.get(name, when))
            self._wake.set()

    def policies_changed(self) -> None:
        """A GpuPolicy's spec changed in the cluster: every reconciler that reads them is due at once. Not
        the hub poll (`wakes_on_policy_change = False`): its own writes change the specs, and the hub is
        read at its interval, so a sync would otherwise set off a second poll."""
        for reconciler in self.reconcilers:
            if getattr(reconciler, "wakes_on_policy_change", True):
                self._due[reconciler.name] = 0.0
        self._wake.set()

    def run_due(self) -> int:
        """Run every reconciler whose time has come, in registry order. Returns how many ran."""
        ran = 0
        for reconciler in self.reconcilers:
            if self._stop.is_set() or not self.ctx.lease_held():  # a SIGTERM stops between reconcilers
                return ran
            if not self.ctx.is_leader() and not getattr(reconciler, "runs_while_paused", False):
                continue  # writers paused (hub disconnected): only the hub poll runs
            now = self.ctx.clock.now()
            if self._due.get(reconciler.name, 0.0) > now:
                continue
            started, cpu = time.monotonic(), time.thread_time()
            self._run_one(reconciler)
            self.ctx.recorder.metrics.pass_seconds.labels(reconciler.name).observe(time.monotonic() - started)
            self.ctx.recorder.metrics.pass_cpu_seconds.labels(reconciler.name).observe(time.thread_time() - cpu)
            self._due[reconciler.name] = self._periodic[reconciler.name] = now + reconciler.period_seconds
            ran += 1
        return ran

    def run_all(self) -> None:
        """One pass of every reconciler regardless of period (tests, startup)."""
        self.trigger()
        self.run_due()

    def _run_one(self, reconciler: Reconciler) -> None:
        try:
            with parsing(self.ctx.parse_memo):
                reconciler.reconcile(self.ctx)
            self.ctx.policies.completed(reconciler.name)
        except Stopping:
            return
        except API_ERRORS as exc:  # the API server away or saying no (a restart, RBAC not yet warm): a line
            log.warning("reconcile failed reconciler=%s: %s", reconciler.name, one_line(exc))
            self.ctx.recorder.reconcile_error(reconciler.name)
        except Exception:
            log.exception("reconcile failed reconciler=%s", reconciler.name)
            self.ctx.recorder.reconcile_error(reconciler.name)
        self.passes[reconciler.name] = self.passes.get(reconciler.name, 0) + 1
        if self.ctx.is_leader() and not self._stop.is_set():
            try:
                self.ctx.write_status()
            except Stopping:
                return
            except API_ERRORS as exc:
                log.warning("policy status write failed: %s", one_line(exc))
                self.ctx.recorder.reconcile_error("status")
            except Exception:
                log.exception("policy status write failed")
                self.ctx.recorder.reconcile_error("status")

    def next_wait(self) -> float:
        """Seconds until the next reconciler is due (clock-based; at least 0.05)."""
        if not self.reconcilers:
            return 1.0
        now = self.ctx.clock.now()
        soonest = min(self._due.get(r.name, 0.0) for r in self.reconcilers)
        return max(0.05, min(soonest - now, 5.0))

    def wake(self) -> None:
        """Interrupt the current wait (shutdown, or a trigger) without making anything due."""
        self._wake.set()

    def run_forever(self, stop: threading.Event, idle_poll: float = 0.5) -> None:
        """Loop until `stop` is set; idles (polling leadership) while not leader.

        Whoever sets `stop` should call `wake()` too, so the loop leaves its wait
        at once instead of after up to five seconds (prompt SIGTERM handling).
        """
        self._stop = stop
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], NEVER)  # full collections between passes (module doc)
        collected: float | None = None
        try:
            while not stop.is_set():
                if self.ctx.lease_held():
                    ran = self.run_due()
                    if ran and (collected is None or time.monotonic() - collected >= FULL_COLLECTION_SECONDS):
                        self._collect(first=collected is None)
                        collected = time.monotonic()
                    wait = self.next_wait()
                else:
                    wait = idle_poll
                if stop.is_set():
                    return
                self._wake.wait(wait)
                self._wake.clear()
        finally:
            gc.set_threshold(*thresholds)

    @staticmethod
    def _collect(first: bool) -> None:
        """A full collection between passes; the first also freezes what survives it (module doc)."""
        started, cpu = time.monotonic(), time.process_time()
        found = gc.collect()
        if first:
            gc.freeze()
        log.debug("full collection between passes: %d unreachable, %.3f s (%.3f s CPU)%s", found,
                  time.monotonic() - started, time.process_time() - cpu, ", the rest frozen" if first else "")
