"""Where the upstream binaries are: `scripts/upstream.sh` builds them once per machine (cached by
version outside the checkout) and prints the folder; this asks it once per process.

KUBEON_UPSTREAM_DIR names a folder made earlier by that script and skips the call (benchmarks and
`python -m tests.cluster` in a hurry). Without Go, a test that needs the cluster skips locally and
fails in CI (tests/missing.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 3600


class UpstreamMissing(RuntimeError):
    """The binaries could not be found or built; the message says why."""


@functools.cache
def upstream_dir() -> Path:
    given = os.environ.get("KUBEON_UPSTREAM_DIR")
    if given:
        path = Path(given)
        if not (path / ".complete").exists():
            raise UpstreamMissing(f"KUBEON_UPSTREAM_DIR={given} is not a finished scripts/upstream.sh build")
        return path
    if shutil.which("go") is None:
        raise UpstreamMissing("Go >= 1.25 is not installed: scripts/upstream.sh builds the real control plane")
    done = subprocess.run(["bash", str(REPO / "scripts" / "upstream.sh")], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise UpstreamMissing(f"scripts/upstream.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(lines[-1])
