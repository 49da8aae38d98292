"""Instructions a command runs, counted by valgrind's callgrind (Debian package `valgrind`).

The count does not move with the machine's load or speed, which on a shared
VM move a timed run by more than the changes the benchmarks are meant to
show; the benchmarks run each command twice (with more and less work) and
take the difference, so what starting costs cancels.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


def instructions_of(command: list[str], cwd: Path | None = None) -> int:
    """Every instruction `command` runs (not its children), with the same dict and set layouts every run."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
                         capture_output=True, text=True, cwd=cwd, env=env)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(command)}: exit {out.returncode}, no count from callgrind: {out.stderr[-500:]}")
    return int(found.group(1))
