"""The README's two commands install into the virtual environment scripts/venv.sh makes, so that
they run on Debian's own python3, which refuses `pip install` outside one (PEP 668).

Real: bash, the python3 on PATH (under scripts/test.sh, that of .venv/), venv and pip; command 1
is run verbatim in a scratch copy of the tracked files (pip fetches what its cache lacks).
Faked: a python3 without the venv module (Debian without python3-venv), in one test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    """The README's first bash block, without comments and blank lines."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _scratch(tmp_path: Path, *paths: str) -> Path:
    """A scratch folder holding `paths` of the checkout (every tracked file when none are named)."""
    root = tmp_path / "scratch"
    names = paths or subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                    check=True).stdout.splitlines()
    for name in names:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


BASH = shutil.which("bash") or "/bin/bash"


def _bash(command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = env or {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return subprocess.run([BASH, "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def test_both_commands_run_in_the_venv_step() -> None:
    first, second = _commands()
    assert first.startswith("bash scripts/venv.sh && .venv/bin/pip install . && "), first
    assert second == "bash scripts/test.sh"
    assert "bash scripts/venv.sh\n" in (REPO / "scripts" / "test.sh").read_text()


def test_the_venv_step_makes_a_virtual_environment_once(tmp_path: Path) -> None:
    root = _scratch(tmp_path, "scripts/venv.sh")
    made = _bash("bash scripts/venv.sh", root)
    assert made.returncode == 0, made.stderr
    python = root / ".venv" / "bin" / "python"
    inside = _bash(f"{python} -c 'import sys; print(sys.prefix != sys.base_prefix)' && {python} -m pip --version",
                   tmp_path)
    assert inside.returncode == 0 and inside.stdout.startswith("True\npip "), inside.stdout + inside.stderr
    config = (root / ".venv" / "pyvenv.cfg").stat().st_mtime_ns
    assert _bash("bash scripts/venv.sh", root).returncode == 0
    assert (root / ".venv" / "pyvenv.cfg").stat().st_mtime_ns == config, "a working .venv is kept"
    python.unlink()
    assert _bash("bash scripts/venv.sh", root).returncode == 0 and python.exists(), "a broken one is made again"


def test_a_python3_without_venv_is_one_line_naming_the_package(tmp_path: Path) -> None:
    root = _scratch(tmp_path, "scripts/venv.sh")
    tools = tmp_path / "bin"  # no apt-get here: the line a user without root reads
    tools.mkdir()
    for tool in ("dirname", "id"):
        (tools / tool).symlink_to(shutil.which(tool) or tool)
    real = sys.executable
    (tools / "python3").write_text('#!/bin/sh\nif [ "$1" = -c ] && [ "${2#*ensurepip}" != "$2" ]; then exit 1; fi\n'
                                   f'exec {real} "$@"\n')
    (tools / "python3").chmod(0o755)
    refused = _bash(f"{BASH} scripts/venv.sh", root, env={"PATH": str(tools)})
    assert refused.returncode == 2 and not (root / ".venv").exists()
    assert refused.stderr == (f"scripts/venv.sh: {tools}/python3 cannot make a virtual environment: install "
                              "python3-venv (sudo apt-get install python3-venv)\n")


@pytest.mark.timeout(900)  # pip installs every dependency from the index: minutes on a loaded machine
def test_command_1_runs_as_written_in_a_scratch_copy(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    first = _commands()[0]
    done = _bash(first, root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Policies: share-inference (Automatic)" in done.stdout, done.stdout[:2000]
    assert (root / ".venv" / "bin" / "kubeon-gpu").exists()


def test_every_file_the_readme_commands_name_is_in_the_repository() -> None:
    """`-f policies.yaml` named a file the repository does not have."""
    text = (REPO / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```bash\n")[1:]]
    named = {token for block in blocks for token in block.split()
             if re.fullmatch(r"[\w.-]+(/[\w.-]+)*\.(yaml|yml|json|csv)", token)}
    assert "examples/policies.yaml" in named, named
    assert sorted(name for name in named if not (REPO / name).exists()) == []
