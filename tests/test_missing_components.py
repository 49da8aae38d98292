"""A test whose real component is missing skips locally and fails under CI (tests/missing.py).

Real: a pytest subprocess on a one-test module, with and without CI=true.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = "from tests.missing import missing\n\ndef test_needs_it():\n    missing('the widget is not installed')\n"


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-rsf", str(probe)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_skips_without_ci(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout


def test_fails_in_ci(tmp_path: Path) -> None:
    done = _run(tmp_path, "true")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert "missing in CI: the widget is not installed" in done.stdout
