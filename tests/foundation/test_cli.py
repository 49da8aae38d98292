"""The `kubeon-gpu` entry point as a user runs it (a real subprocess)."""

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_subcommand() -> None:
    result = run("--help")
    assert result.returncode == 0
    for name in ("webhook", "extender", "controller", "dry-run", "simulate", "certs"):
        assert name in result.stdout


def test_unknown_command_is_a_clear_error() -> None:
    result = run("frobnicate")
    assert result.returncode == 2
    assert "unknown command 'frobnicate'" in result.stderr
    assert "Traceback" not in result.stderr
