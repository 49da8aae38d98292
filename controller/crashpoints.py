"""Crash injection for process-level tests: one variable for every reconciler that writes in steps.

`KUBEON_GPU_CRASH_AT=<reconciler>:<checkpoint>` (e.g. `capacity:evicted`,
`scaletozero:parked`; each reconciler lists its CHECKPOINTS) makes the
process die with os._exit(137), the code of a SIGKILL, right after that
write and before anything later in the pass (the next write, Events,
metrics, the policy status). Why a process exit and not an exception: only
a real exit shows that a restart converges from what reached the API server
(no finally, no status write, no lease release). Unset (production): inert;
a value naming no checkpoint of that reconciler is logged and ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

# Called with a step name after each write; a test raises from it to simulate a crash there.
Checkpoint = Callable[[str], None]
CRASH_EXIT_CODE = 137
CRASH_ENV = "KUBEON_GPU_CRASH_AT"


def crash_point(reconciler: str, checkpoint: str) -> str:
    """The value of CRASH_ENV that arms `checkpoint` of `reconciler` (what the process tests set)."""
    return f"{reconciler}:{checkpoint}"


def no_checkpoint(_step: str) -> None:
    return None


def from_env(reconciler: str, checkpoints: Sequence[str], environ: Mapping[str, str] | None = None) -> Checkpoint:
    """The hook CRASH_ENV arms for `reconciler`; `no_checkpoint` when unset or meant for another one."""
    value = (os.environ if environ is None else environ).get(CRASH_ENV, "").strip()
    owner, colon, step = value.partition(":")
    if not value or (colon and owner != reconciler):
        return no_checkpoint
    if not colon or step not in checkpoints:
        log.error("%s=%r names no checkpoint of %s (%s): ignored", CRASH_ENV, value, reconciler,
                  ", ".join(crash_point(reconciler, c) for c in checkpoints))
        return no_checkpoint
    log.warning("test hook armed: %s=%s, the process exits %d after that write", CRASH_ENV, value, CRASH_EXIT_CODE)

    def crash(at: str) -> None:
        if at == step:
            log.error("crash injected at checkpoint=%s (%s), exiting %d", at, value, CRASH_EXIT_CODE)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    return crash
