"""Crash injection for process-level tests, shared by the reconcilers that write in steps.

`KUBEON_GPU_CRASH_AT` (scale to zero) or `KUBEON_GPU_CAPACITY_CRASH_AT` (capacity)
naming one of a reconciler's checkpoints makes the process die with
os._exit(137), the code of a SIGKILL, right after that write and before
anything later in the pass (the next write, Events, metrics, the policy
status). Why a process exit and not an exception: only a real exit shows that
a restart converges from what reached the API server (no finally, no status
write, no lease release). Unset (production): inert.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

# Called with a step name after each write; a test raises from it to simulate a crash there.
Checkpoint = Callable[[str], None]
CRASH_EXIT_CODE = 137


def no_checkpoint(_step: str) -> None:
    return None


def from_env(env: str, checkpoints: Sequence[str], environ: Mapping[str, str] | None = None) -> Checkpoint | None:
    """The hook `env` arms, or None when it is unset or names none of `checkpoints`."""
    step = (os.environ if environ is None else environ).get(env, "").strip()
    if step not in checkpoints:
        if step:
            log.error("%s=%r names no checkpoint (one of %s): ignored", env, step, ", ".join(checkpoints))
        return None
    log.warning("test hook armed: %s=%s, the process exits %d after that write", env, step, CRASH_EXIT_CODE)

    def crash(at: str) -> None:
        if at == step:
            log.error("crash injected at checkpoint=%s (%s), exiting %d", at, env, CRASH_EXIT_CODE)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    return crash
