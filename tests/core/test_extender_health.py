"""When the extender counts as failing open (gpupolicy/packing/health.py): its error ratio between two readings. Pure.

Real: `gpupolicy.packing.health.judge` and `gpupolicy.modes.handling`; nothing faked (plain values in, verdicts
out). tests/controller/test_extender_degraded.py has the same rules through the controller and a real
extender over HTTP.
"""

from __future__ import annotations

import pytest

from gpupolicy.model import PolicyKind
from gpupolicy.modes import Component, handling
from gpupolicy.packing.health import HEALTHY, Answers, Health, judge


def after(*readings: Answers | None) -> Health:
    health = HEALTHY
    for reading in readings:
        health = judge(health, reading, "refused")
    return health


@pytest.mark.parametrize(("readings", "degraded"), [
    pytest.param([Answers(100, 9)], False, id="below-the-threshold"),
    pytest.param([Answers(100, 10)], True, id="at-the-threshold"),
    pytest.param([Answers(9, 9)], False, id="too-few-answers-to-tell"),
    pytest.param([Answers(100, 50), Answers(105, 50)], True, id="a-quiet-window-keeps-the-verdict"),
    pytest.param([Answers(100, 50), Answers(200, 50)], False, id="a-healthy-window-clears-it"),
    pytest.param([Answers(100, 0), Answers(130, 30)], True, id="only-the-window-counts"),
    pytest.param([Answers(1000, 0), Answers(20, 20)], True, id="a-restarted-extender-counts-from-zero"),
    pytest.param([None], True, id="unreadable"),
    pytest.param([None, Answers(3, 0)], False, id="readable-again-with-few-answers"),
    pytest.param([Answers(100, 50), None, Answers(103, 50)], False, id="unreachable-replaced-the-old-verdict"),
])
def test_judge(readings: list[Answers | None], degraded: bool) -> None:
    assert after(*readings).degraded is degraded


def test_the_message_says_how_many_failed_and_what_it_means() -> None:
    health = after(Answers(40, 10))
    assert health.message.startswith("the extender failed 10 of its last 40 answers (25%, threshold 10%)")
    assert "not packed" in health.message
    assert after(None).message.startswith("the extender cannot be read (refused)")


@pytest.mark.parametrize(("kind", "ready", "reason"), [
    (PolicyKind.PACKING, False, "ExtenderDegraded"),
    (PolicyKind.TYPE_FIT, False, "ExtenderDegraded"),
    (PolicyKind.SHARING, True, "Reconciled"),
    (PolicyKind.GUARDRAIL, True, "Reconciled"),
])
def test_a_failing_extender_takes_only_its_own_kinds_out_of_ready(kind: PolicyKind, ready: bool, reason: str) -> None:
    handled = handling(kind, failing={Component.EXTENDER: "the extender failed"})
    assert (handled.handled, handled.reason) == (ready, reason)
    assert not ready or "the extender failed" not in handled.message
