"""Underused: a busy candidate whose GPU utilisation stayed below `underused_below_percent` for the whole
window, and whose pods all re-place on the other nodes. Dearest node first; each next candidate re-places
around the moves already planned, so several may go in one call.

No usage figure (the window not covered, no Prometheus): no candidate.
"""

from __future__ import annotations

from gpupolicy.capacity.disruption.inputs import UNDERUSED
from gpupolicy.capacity.disruption.planning import Planning
from gpupolicy.capacity.disruption.replay import replace_on_copy


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds / 60:g}min"


class Underused:
    name = UNDERUSED
    ends_pass = False

    def plan(self, run: Planning) -> None:
        ask = run.ask
        usage, below = ask.usage_percent, ask.rules.underused_below_percent
        underused = [n for n in run.busy() if (u := usage.get(n)) is not None and u < below]
        for n in sorted(underused, key=lambda n: (-ask.price_per_hour[n], n)):
            if run.room() <= 0 or not run.may_simulate():
                return
            run.trials += 1
            done = replace_on_copy(run.base, [n], ask.pods_on[n], run.strategy, run.ctx, run.refused([n]))
            if done is not None:
                run.add([n], UNDERUSED, done[0], f", GPU util {usage[n]:.0f}% for {_hours(ask.rules.window_seconds)}")
                run.base = done[1]
