"""`kubeon-gpu` itself: --version, and help text for every option of every subcommand.

Real: the parsers the subcommands build (cli.main.parser_for imports each
module) and the entry point as a subprocess. Faked: nothing.
"""

from __future__ import annotations

import argparse
import tomllib

import pytest

from cli.main import SUBCOMMANDS, parser_for
from tests.cli.helpers import ROOT, subprocess_run


def options(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.Action]]:
    """Every option and positional of a parser and of its sub-parsers (certs generate/patch-cabundle)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += options(sub, f"{prefix}{name} ")
            continue
        found.append((prefix + (action.option_strings[-1] if action.option_strings else action.dest), action))
    return found


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_option_has_help(command: str) -> None:
    missing = [name for name, action in options(parser_for(command))
               if not action.help or action.help == argparse.SUPPRESS]
    assert missing == [], f"kubeon-gpu {command}: options without help: {missing}"


def test_version_is_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    run = subprocess_run("--version")
    assert run.code == 0 and run.out.strip() == f"kubeon-gpu {version}"


def test_top_level_help_and_unknown_option() -> None:
    assert "--version" in subprocess_run("--help").out
    bad = subprocess_run("--frobnicate")
    assert bad.code == 2 and "Traceback" not in bad.err


def test_simulate_help_explains_every_output_key() -> None:
    from simulator.replay import ReplayResult

    text = subprocess_run("simulate", "--help").out
    keys = ReplayResult("p", 1, 2, 90.0, 91.0, 1.0).summary()
    for key in keys:
        assert f"\n  {key} " in text, key
    assert "larger than the trace's row count" in text
    assert "vendor/openb/openb_node_list_gpu_node.csv" in text


def test_dry_run_help_documents_shape_and_exit_status() -> None:
    text = " ".join(subprocess_run("dry-run", "--help").out.split())
    assert "one entry per Pod or workload evaluated" in text
    assert "exit status: 0" in text and "2 some input unusable" in text
    assert "'-': standard input" in text
