"""Instance types whose launch failed lately, kept out of new launches for a while. Pure.

A NodeClaim names one instance type (gpupolicy/capacity/nodepool.py) and a
stable name, so a launch Karpenter gives up on (it deletes the claim at once
on an insufficient-capacity error from the cloud, or when its node has not
registered in time) came back every pass as the same claim of the same type:
GPU types run out often, and the pending pods never got a node of another
type. Karpenter itself keeps such offerings out of its launches for three
minutes (its unavailable-offerings cache); so does this: a claim seen
launching (no node yet) that is gone, or being deleted, before its node
registered marks its type failed for `TTL` seconds, unless the controller
removed it itself (`forget`). The state is the process's, as Karpenter's cache
is: a new leader starts with none, and at worst tries a failed type once more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpupolicy.capacity.provider import CapacityNode

TTL = 180.0  # seconds, Karpenter's UnavailableOfferingsTTL


@dataclass
class FailedLaunches:
    ttl: float = TTL
    _launching: dict[str, str] = field(default_factory=dict)  # claim -> its instance type, while it launches
    _failed: dict[str, float] = field(default_factory=dict)  # instance type -> when a launch of it failed
    _removed: set[str] = field(default_factory=set)  # claims the controller deleted itself

    def observe(self, claims: Iterable[CapacityNode], now: float) -> list[tuple[str, str]]:
        """Read the provider's claims of this pass; (claim, instance type) of the launches found failed."""
        present = {c.claim: c for c in claims}
        failed = []
        for name, kind in list(self._launching.items()):
            claim = present.get(name)
            if claim is not None and claim.launching:
                continue
            del self._launching[name]
            if (claim is None or (claim.deleting and claim.node is None)) and name not in self._removed:
                self._failed[kind] = now
                failed.append((name, kind))
        self._launching.update({c.claim: c.instance_type for c in present.values() if c.launching})
        self._removed &= set(present)
        return failed

    def launched(self, claim: str, instance_type: str) -> None:
        """The controller asked for `claim` (seen launching from now on, before any pass lists it)."""
        self._launching[claim] = instance_type

    def forget(self, claim: str) -> None:
        """The controller removes `claim` itself (an undone replacement): no failed launch."""
        self._removed.add(claim)

    def unavailable(self, now: float) -> dict[str, float]:
        """Instance types a launch of which failed within `ttl`, with when."""
        for kind, at in list(self._failed.items()):
            if now - at >= self.ttl:
                del self._failed[kind]
        return dict(self._failed)
