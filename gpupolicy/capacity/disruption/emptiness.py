"""Emptiness: a candidate with no pods for `empty_grace_seconds` is deleted without a drain.

The "remove the GPU node when the GPU job ends" ask; Karpenter's emptiness.go.
"""

from __future__ import annotations

from gpupolicy.capacity.disruption.inputs import EMPTY
from gpupolicy.capacity.disruption.planning import Planning


class Emptiness:
    name = EMPTY
    ends_pass = False  # every empty node may go in one call, up to the budget

    def plan(self, run: Planning) -> None:
        ask = run.ask
        for n in run.eligible:
            if run.room() <= 0:
                return
            if not ask.pods_on.get(n) and ask.now - ask.empty_since.get(n, ask.now) >= ask.rules.empty_grace_seconds:
                run.add([n], EMPTY, {}, " (empty)")
