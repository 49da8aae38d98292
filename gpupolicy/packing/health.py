"""Is a component failing open? The extender's error ratio between two readings of its counters. Pure.

kube-scheduler treats the extender as `ignorable`: when it answers an
internal error, pods are still placed, only no longer packed, and nothing
else tells. The controller reads the extender's counters
(`kubeon_extender_decisions_total`: every /filter and /prioritize answer by
outcome, `outcome="error"` the answers it gave up on) at each pass; this
decides from two readings whether the extender is degraded, and the
policies it serves then say `Ready=False, ExtenderDegraded`
(`gpupolicy.modes.handling`). Rules:

- The window is what the counters grew by since the last reading (from zero
  after a restart of the extender, whose counters start again, and at the
  first reading: the extender's life so far).
- Degraded when the window holds at least `MIN_ANSWERS` answers and the
  share of errors is at least the threshold; recovered when a window of at
  least `MIN_ANSWERS` answers is below it. A quieter window says nothing new:
  the verdict stands (an extender poisoned while no pod was scheduled is
  still poisoned), except that an extender that could not be read and now
  can is no longer degraded for that.
- Unreadable (the Service does not answer): degraded, since kube-scheduler
  cannot reach it either and places pods without it.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_ANSWERS = 10  # answers in a window before its error ratio counts
DEFAULT_ERROR_RATIO = 0.1


@dataclass(frozen=True)
class Answers:
    """Cumulative counts read from the extender: /filter and /prioritize answers, and those that failed."""

    total: float
    errors: float


@dataclass(frozen=True)
class Health:
    """The verdict: `degraded` with the message a policy's Ready condition shows; `reading` is the baseline of
    the next window (the last reading that worked; None before any)."""

    degraded: bool
    message: str
    reading: Answers | None
    unreachable: bool = False


HEALTHY = Health(False, "", None)


def judge(previous: Health, now: Answers | None, problem: str = "", threshold: float = DEFAULT_ERROR_RATIO,
          min_answers: int = MIN_ANSWERS) -> Health:
    """The health after a reading `now` (None: unreadable, `problem` says why), given the previous verdict."""
    if now is None:
        return Health(True, f"the extender cannot be read ({problem}): kube-scheduler places pods without it "
                            "(ignorable), so they are not packed", previous.reading, unreachable=True)
    base = previous.reading
    if base is None or now.total < base.total or now.errors < base.errors:  # first reading, or a restart
        base = Answers(0.0, 0.0)
    answered, failed = now.total - base.total, now.errors - base.errors
    if answered < min_answers:
        stays = previous.degraded and not previous.unreachable
        return Health(stays, previous.message if stays else "", now)
    ratio = failed / answered
    if ratio >= threshold:
        return Health(True, f"the extender failed {failed:.0f} of its last {answered:.0f} answers "
                            f"({ratio:.0%}, threshold {threshold:.0%}): kube-scheduler places those pods "
                            "without it (ignorable), so they are not packed; see the extender's log", now)
    return Health(False, "", now)
