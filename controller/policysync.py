"""Reconciler 1: list and parse every GpuPolicy into the policy store.

`PolicySync` (first in the reconciler registry) lists every GpuPolicy, parses
it with the pydantic model (`policies.parse_entry`: an invalid one is kept
with its error and gets `Valid=False`, never a crash) and logs `policies
synced count=N` after each full resync.
"""

from __future__ import annotations

import logging

from controller.context import ControllerContext
from controller.policies import parse_entry
from kube.policies import list_policies

log = logging.getLogger(__name__)


class PolicySync:
    """Reconciler 1: list + parse every GpuPolicy, publish into the store, log the count."""

    name = "policies"

    def __init__(self, period_seconds: float = 60.0) -> None:
        self.period_seconds = period_seconds

    def reconcile(self, ctx: ControllerContext) -> None:
        items, _ = list_policies(ctx.api)
        entries = [parse_entry(obj) for obj in items]
        ctx.policies.replace_all(entries)
        invalid = [e for e in entries if e.policy is None]
        for entry in invalid:
            log.warning("policy invalid name=%s error=%s", entry.name, entry.error)
        ctx.recorder.metrics.policies.labels(valid="true").set(len(entries) - len(invalid))
        ctx.recorder.metrics.policies.labels(valid="false").set(len(invalid))
        log.info("policies synced count=%d invalid=%d", len(entries), len(invalid))
