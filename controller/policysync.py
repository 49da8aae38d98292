"""Reconciler 1: list and parse every GpuPolicy into the policy store.

`PolicySync` (first in the reconciler registry) lists every GpuPolicy, parses
it with the pydantic model (`policies.parse_entry`: an invalid one is kept
with its error and gets `Valid=False`, never a crash) and logs `policies
read count=N` after each full resync (with a hub, controller/hubsync.py
logs `policies synced` when it pulls a set). Each invalid policy gets one
Warning Event per error.
"""

from __future__ import annotations

import logging

from controller.context import ControllerContext
from controller.policies import PolicyEntry, parse_entry
from gpupolicy.model import API_VERSION, KIND
from kube.events import ObjectRef
from kube.policies import list_policies

log = logging.getLogger(__name__)


class PolicySync:
    """Reconciler 1: list + parse every GpuPolicy, publish into the store, log the count."""

    name = "policies"

    def __init__(self, period_seconds: float = 60.0) -> None:
        self.period_seconds = period_seconds
        self._reported: dict[str, tuple[str | None, str | None]] = {}  # name -> (uid, error) last evented

    def reconcile(self, ctx: ControllerContext) -> None:
        items, _ = list_policies(ctx.api)
        entries = [parse_entry(obj) for obj in items]
        ctx.policies.replace_all(entries)
        invalid = [e for e in entries if e.policy is None]
        for entry in invalid:
            log.warning("policy invalid name=%s error=%s", entry.name, entry.error)
        self._report(ctx, invalid)
        ctx.recorder.metrics.policies.labels(valid="true").set(len(entries) - len(invalid))
        ctx.recorder.metrics.policies.labels(valid="false").set(len(invalid))
        if ctx.hub_configured:  # the hub sync logs `policies synced` when it pulls a set
            log.debug("policies read count=%d invalid=%d", len(entries), len(invalid))
        else:
            log.info("policies read count=%d invalid=%d: no hub.url, the GpuPolicy objects in the cluster are "
                     "the source of truth", len(entries), len(invalid))

    def _report(self, ctx: ControllerContext, invalid: list[PolicyEntry]) -> None:
        """A Warning Event on each invalid policy, once per error (not once per resync); the leader only.

        The policy is skipped (its status says Valid=False); the Event is what
        `kubectl describe gpupolicy` and event-based alerting show.
        """
        current = {e.name for e in invalid}
        for gone in set(self._reported) - current:
            del self._reported[gone]
        if not ctx.is_leader():
            return
        for entry in invalid:
            uid = (entry.raw.get("metadata") or {}).get("uid")
            if self._reported.get(entry.name) == (uid, entry.error):
                continue
            ref = ObjectRef(API_VERSION, KIND, entry.name, None, uid)
            ctx.recorder.warning(ref, "InvalidSpec", f"policy skipped, fix the spec: {entry.error}")
            self._reported[entry.name] = (uid, entry.error)
