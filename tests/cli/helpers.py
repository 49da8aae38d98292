"""Running `kubeon-gpu` as a user does: in-process through cli.main.main, or as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROG = "kubeon-gpu dry-run: "


@dataclass
class Run:
    code: int
    out: str
    err: str

    def errors(self) -> list[str]:
        """stderr lines that are problems (not notes)."""
        return [line for line in self.err.splitlines() if line.startswith(PROG) and not line.startswith(PROG + "note:")]

    def notes(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith(PROG + "note:")]


WITHOUT_METRICS = ("needs GPU metrics and no --prometheus-url is configured; --metrics (or --prometheus-url URL) "
                   "evaluates it as an install with prometheus.url set")
# The example policies a dry-run without --metrics enforces below the mode they request, as each entry says.
LOWERED = {
    "share-inference": {"policy": "share-inference", "requested": "Automatic", "enforced": "Recommend",
                        "reason": f"sharing {WITHOUT_METRICS}"},
    "share-batch": {"policy": "share-batch", "requested": "Approve", "enforced": "Recommend",
                    "reason": f"sharing {WITHOUT_METRICS}"},
}


def with_lowered(answers: list[dict]) -> list[dict]:
    """The core's answers for the example policies, each with the policies of its decisions that a dry-run
    without --metrics enforces below their mode (LOWERED), as `kubeon-gpu dry-run` writes them."""
    for answer in answers:
        names = dict.fromkeys(d["policy"] for d in answer["decisions"])
        lowered = [LOWERED[name] for name in names if name in LOWERED]
        if lowered:
            answer["enforcedBelowRequested"] = lowered
    return answers


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    code = main(["dry-run", *args])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def subprocess_run(*args: str, stdin: bytes | None = None, timeout: float = 60) -> Run:
    result = subprocess.run([sys.executable, "-m", "cli.main", *args], input=stdin, capture_output=True,
                            timeout=timeout, cwd=ROOT)
    return Run(result.returncode, result.stdout.decode(), result.stderr.decode())
