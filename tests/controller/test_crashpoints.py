"""The one crash-injection variable, KUBEON_GPU_CRASH_AT=<reconciler>:<checkpoint>: which reconciler it arms.

Real: controller/crashpoints.py's parsing. Faked: the environment (a dict); the exit itself is exercised by
tests/controller/test_capacity_crash_process.py and test_scale_crash_process.py with real processes.
"""

from __future__ import annotations

import pytest

from controller.crashpoints import CRASH_ENV, crash_point, from_env, no_checkpoint

CHECKPOINTS = ("cordoned", "evicted")


@pytest.mark.parametrize("value", ["", "scaletozero:parked", "evicted", "capacity:nope"],
                         ids=["unset", "another-reconciler", "no-reconciler", "unknown-checkpoint"])
def test_the_variable_arms_nothing_unless_it_names_a_checkpoint_of_this_reconciler(value: str) -> None:
    assert from_env("capacity", CHECKPOINTS, {CRASH_ENV: value}) is no_checkpoint


def test_the_variable_arms_the_named_checkpoint_of_this_reconciler() -> None:
    hook = from_env("capacity", CHECKPOINTS, {CRASH_ENV: crash_point("capacity", "evicted")})
    assert hook is not no_checkpoint
    hook("cordoned")  # another checkpoint of the same reconciler: the process goes on
