"""The policy store and its status writer: the GpuPolicies the controller acts on, and what it tells users.

`PolicySync` (controller/policysync.py, first in the reconciler registry)
lists every GpuPolicy and parses it here (`parse_entry`: an invalid one is
kept with its error and gets `Valid=False`, never a crash); without a hub it
logs `policies read count=N` after each full resync (with a hub,
controller/hubsync.py logs `policies synced` when it pulls a set).
`PolicyStore` holds the latest parse; reconcilers publish their
proposals and conditions for a policy into it, and `write_status` writes a
policy's status (effectiveMode, observedGeneration, conditions, proposals)
through the status subresource only when it changed.

Restart safety: proposal states live in the status itself. Until every
reconciler has completed one pass in this process, proposals already in the
status that nobody has re-published are carried over unchanged, so a restart
never wipes (or flaps) them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from controller.recorder import ControllerMetrics
from controller.sources import Clock
from gpupolicy.cluster import hub_cut_off
from gpupolicy.model import Condition, GpuPolicy, GpuPolicyStatus, Mode, PolicyKind, Proposal, parse_policy
from gpupolicy.modes import ALL_COMPONENTS, Component, effective_mode, handlers, handling
from kube.policies import patch_status_entry, write_status

log = logging.getLogger(__name__)

_STATE_ORDER = ("Proposed", "Approved", "Applied", "Dismissed")
RECORD_FIELDS = ("parked", "restarts", "evictions")  # status maps written key by key (kube.policies.patch_status_entry)


@dataclass
class PolicyEntry:
    """One GpuPolicy as last listed: the raw object, and its parse or the reason it failed."""

    name: str
    raw: dict[str, Any]
    policy: GpuPolicy | None
    error: str | None = None

    @property
    def generation(self) -> int | None:
        gen = (self.raw.get("metadata") or {}).get("generation")
        return int(gen) if gen is not None else None

    @property
    def raw_status(self) -> dict[str, Any]:
        return dict(self.raw.get("status") or {})


def parse_entry(obj: dict[str, Any]) -> PolicyEntry:
    """Parse one listed object; validation errors become the entry's error text (field named)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        policy = parse_policy(body)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"{where}: {err['msg']}" if where else err["msg"])
        return PolicyEntry(name, obj, None, "; ".join(parts))
    except (ValueError, TypeError) as exc:  # nothing one policy holds may stop the sync of the others
        return PolicyEntry(name, obj, None, f"not a GpuPolicy ({type(exc).__name__})")
    return PolicyEntry(name, obj, policy)


def previous_proposals(entry: PolicyEntry) -> dict[str, Proposal]:
    """Proposals currently in the object's status, by id (unreadable ones skipped)."""
    found: dict[str, Proposal] = {}
    for item in entry.raw_status.get("proposals") or []:
        try:
            proposal = Proposal.model_validate(item)
        except ValidationError:
            continue
        found[proposal.id] = proposal
    return found


@dataclass
class _Contribution:
    proposals: list[Proposal]
    conditions: list[Condition]


@dataclass
class PolicyStore:
    """Latest parsed GpuPolicies, reconcilers' contributions, and the status writer."""

    _entries: dict[str, PolicyEntry] = field(default_factory=dict)
    _contrib: dict[str, dict[str, _Contribution]] = field(default_factory=dict)
    _expected_sources: set[str] = field(default_factory=set)
    _completed_sources: set[str] = field(default_factory=set)
    _written: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    synced: bool = False

    # -- reading -------------------------------------------------------------
    def replace_all(self, entries: Iterable[PolicyEntry]) -> None:
        """A full resync: the listed set replaces what was known (deleted policies drop out)."""
        with self._lock:
            self._entries = {e.name: e for e in entries}
            for gone in set(self._contrib) - set(self._entries):
                del self._contrib[gone]
            for gone in set(self._written) - set(self._entries):
                del self._written[gone]
            self.synced = True

    def entries(self) -> list[PolicyEntry]:
        with self._lock:
            return list(self._entries.values())

    def get(self, name: str) -> PolicyEntry | None:
        with self._lock:
            return self._entries.get(name)

    def valid(self, kind: PolicyKind | None = None) -> list[GpuPolicy]:
        """Parsed policies (of one kind), highest priority first, then by name."""
        with self._lock:
            found = [e.policy for e in self._entries.values() if e.policy is not None]
        if kind is not None:
            found = [p for p in found if p.spec.kind is kind]
        return sorted(found, key=lambda p: (-p.spec.priority, p.name))

    def previous(self, policy: str) -> dict[str, Proposal]:
        """Proposals currently in the policy's status (states survive restarts there)."""
        entry = self.get(policy)
        return previous_proposals(entry) if entry else {}

    def observe(self, name: str, obj: dict[str, Any]) -> None:
        """The object as the API server answered a write made this pass (so the pass reads its own write)."""
        with self._lock:
            if name in self._entries:
                self._entries[name].raw = obj

    def set_record(self, api: Any, policy: str, field: str, key: str, value: dict[str, Any] | None) -> bool:
        """One key of a record map in the policy's status (None removes it). False when the policy is gone."""
        answer = patch_status_entry(api, policy, field, key, value)
        if answer is None:
            return False
        self.observe(policy, answer)
        return True

    # -- publishing ------------------------------------------------------------
    def expect_sources(self, names: Iterable[str]) -> None:
        """The reconcilers that publish; carry-over of old proposals ends when all completed a pass."""
        with self._lock:
            self._expected_sources = set(names)

    def completed(self, source: str) -> None:
        with self._lock:
            self._completed_sources.add(source)

    def publish(self, policy: str, source: str, proposals: Iterable[Proposal],
                conditions: Iterable[Condition] = ()) -> None:
        """Replace `source`'s proposals and conditions for `policy` (publish [] to clear them)."""
        with self._lock:
            self._contrib.setdefault(policy, {})[source] = _Contribution(list(proposals), list(conditions))

    # -- status ---------------------------------------------------------------
    def desired_status(self, entry: PolicyEntry, default_mode: Mode, prometheus_configured: bool,
                       now: float, components: Iterable[Component] = ALL_COMPONENTS,
                       capacity_provider: str = "karpenter", hub_connected: bool = True,
                       failing: Mapping[Component, str] | None = None) -> dict[str, Any]:
        """The status this controller wants on the policy now (wire form).

        `hub_connected`: False while the hub refuses the cluster's token
        (`gpupolicy.cluster.hub_cut_off`): every policy's effective mode is
        then Recommend with Degraded=True HubDisconnected, as the webhook and
        the extender act on it.

        Ready says whether anything acts on the policy: True (Reconciled) only
        when a running component handles its kind (gpupolicy.modes.HANDLERS);
        otherwise False with NotImplemented or ControllerDisabled, or with
        ExtenderDegraded while the extender fails open (`failing`, set by
        controller/extenderhealth.py).
        """
        previous_conditions = {c.get("type"): c for c in entry.raw_status.get("conditions") or []
                               if isinstance(c, dict)}
        conditions: list[Condition] = []
        status = GpuPolicyStatus(observed_generation=entry.generation)
        if entry.policy is None:
            conditions.append(Condition(type="Valid", status="False", reason="InvalidSpec",
                                        message=entry.error or "invalid"))
            conditions.append(Condition(type="Ready", status="False", reason="InvalidSpec",
                                        message="the policy does not parse; fix the spec"))
            status.proposals = list(previous_proposals(entry).values())
        else:
            eff = effective_mode(entry.policy, default_mode, prometheus_configured, hub_connected)
            status.effective_mode = eff.mode
            status.requested_mode = eff.requested
            conditions.append(Condition(type="Valid", status="True", reason="Parsed", message=""))
            if eff.degraded:
                conditions.append(Condition(type="Degraded", status="True", reason=eff.reason_code,
                                            message=eff.degraded_reason or ""))
            else:
                conditions.append(Condition(type="Degraded", status="False", reason="AsRequested", message=""))
            with self._lock:
                contributions = list(self._contrib.get(entry.name, {}).values())
                carry = not self._expected_sources <= self._completed_sources
            proposals: dict[str, Proposal] = {}
            for contribution in contributions:
                for proposal in contribution.proposals:
                    proposals[proposal.id] = proposal
                conditions.extend(contribution.conditions)
            if carry:
                for pid, proposal in previous_proposals(entry).items():
                    proposals.setdefault(pid, proposal)
            status.proposals = sorted(proposals.values(), key=lambda p: (p.target, p.action))
            handled = handling(entry.policy.spec.kind, components, capacity_provider, failing,
                               handlers(entry.policy))
            if handled.handled:
                message = f"effective mode {eff.mode.value}" + (" (degraded)" if eff.degraded else "")
                conditions.append(Condition(type="Ready", status="True", reason=handled.reason,
                                            message=f"{message}; {handled.message}"))
            else:
                conditions.append(Condition(type="Ready", status="False", reason=handled.reason,
                                            message=handled.message))
        for condition in conditions:
            old = previous_conditions.get(condition.type)
            same = old is not None and old.get("status") == condition.status
            condition.last_transition_time = (
                old.get("lastTransitionTime") if same and old else _rfc3339(now)
            )
            condition.observed_generation = entry.generation
        status.conditions = conditions
        return status.model_dump(by_alias=True, exclude_none=True, mode="json")

    def write_status(self, api: Any, *, default_mode: Mode, prometheus_configured: bool, clock: Clock,
                     is_leader: Callable[[], bool], metrics: ControllerMetrics,
                     components: Iterable[Component] = ALL_COMPONENTS, capacity_provider: str = "karpenter",
                     failing: Mapping[Component, str] | None = None) -> int:
        """Write every policy status that differs from the one on the object. Returns writes made."""
        writes = 0
        entries = self.entries()
        hub_connected = not hub_cut_off(e.raw for e in entries)
        for entry in entries:
            desired = self.desired_status(entry, default_mode, prometheus_configured, clock.now(), components,
                                          capacity_provider, hub_connected, failing)
            with self._lock:
                last = self._written.get(entry.name)
            if _comparable(desired) == _comparable(entry.raw_status) or (
                last is not None and _comparable(desired) == _comparable(last)
            ):
                continue
            if not is_leader():
                return writes
            answer = write_status(api, entry.name, desired)
            writes += 1
            metrics.status_writes.inc()
            with self._lock:
                self._written[entry.name] = desired
                if answer is not None and entry.name in self._entries:
                    self._entries[entry.name].raw = answer
            for state in _STATE_ORDER:
                count = sum(1 for p in desired.get("proposals", []) if p.get("state") == state)
                metrics.proposals.labels(policy=entry.name, state=state).set(count)
        return writes


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    """Status without timestamps, so an unchanged status is not rewritten (and without the record maps,
    which only their reconcilers' own patches write)."""
    copy = {k: v for k, v in status.items() if k not in RECORD_FIELDS}
    copy["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    return copy


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
