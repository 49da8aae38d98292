"""examples/ is what the README and the tests use, and what `kubeon-gpu dry-run --example` reads.

Real: the files, the README's commands run through a shell from the
repository root, and a wheel built from a copy of the source tree, installed
into a directory of its own and run from elsewhere (no editable install, no
source tree on the path). Faked: nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cli.helpers import EXAMPLES, ROOT

PACKAGED = ROOT / "gpupolicy" / "examples"


def test_packaged_copy_equals_examples() -> None:
    """gpupolicy/examples/ (package data) is a copy of examples/ (the source): same files, same bytes."""
    source = {p.name: p.read_bytes() for p in EXAMPLES.glob("*.yaml")}
    packaged = {p.name: p.read_bytes() for p in PACKAGED.glob("*.yaml")}
    assert {"pod.yaml", "policies.yaml", "nodes.yaml", "workloads.yaml"} <= set(source)
    assert packaged == source, "copy examples/*.yaml to gpupolicy/examples/"


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if "kubeon-gpu dry-run" in line and "examples/" in line]


def test_readme_names_the_examples() -> None:
    commands = readme_commands()
    assert any(c.startswith("kubeon-gpu dry-run -f examples/") for c in commands), commands
    assert any(c.startswith("cat examples/pod.yaml | kubeon-gpu dry-run -f -") for c in commands), commands


@pytest.mark.parametrize("command", readme_commands())
def test_readme_dry_run_commands_work_from_the_repository(tmp_path: Path, command: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "kubeon-gpu"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m cli.main \"$@\"\n")
    launcher.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "allowed" in result.stdout


def test_example_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    """`pip install .` then `kubeon-gpu dry-run --example`: the examples travel as package data."""
    tree = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gpupolicy", "webhook", "extender", "controller", "certs", "serving", "simulator", "kube", "cli"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        assert "gpupolicy/examples/workloads.yaml" in archive.namelist()
        archive.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, "-m", "cli.main", "dry-run", "--example"], cwd=elsewhere,
                            env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Deployment inference/llm-small: allowed" in result.stdout
    assert str(site) in subprocess.run([sys.executable, "-c", "import cli; print(cli.__file__)"], cwd=elsewhere,
                                       env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                                       text=True).stdout
