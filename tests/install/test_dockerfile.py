"""The image recipe: parsed, since `docker build` cannot run on this machine.

Real: the checked-in Dockerfile, .dockerignore and pyproject.toml, read by a
small Dockerfile parser (line continuations, comments, ARG defaults in FROM,
JSON exec form). Faked: no image is built; what a build would reject (a COPY
of a missing or ignored file, a missing package) is checked on the tree.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field

import pytest

from tests.install.chart import REPO

DOCKERFILE = REPO / "Dockerfile"
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "cargo", "rustc", "clang")


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), rest.split()[0])
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede FROM, got {keyword}"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.split("/")[0] == p for p in patterns)


def _copy_sources(args: str) -> list[str]:
    words = [w for w in shlex.split(args) if not w.startswith("--")]
    if words and words[0].startswith("["):
        words = json.loads(args[args.index("["):])
    return words[:-1]


def test_parser_reads_continuations_and_args() -> None:
    args, parsed = parse('ARG B=img:1.2.3\n# c\nFROM ${B} AS one\nRUN a \\\n  && b\nFROM one\nUSER 7\n')
    assert args == {"B": "img:1.2.3"}
    assert [(s.image, s.name) for s in parsed] == [("img:1.2.3", "one"), ("one", None)]
    assert parsed[0].all("RUN") == ["a  && b"]


def test_multi_stage_with_pinned_bases(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "build and runtime stages"
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.image in names:
            continue
        assert "@sha256:" in stage.image or re.search(r":\d+\.\d+\.\d+-[a-z]+-[a-z]+$", stage.image), (
            f"base image {stage.image!r} must pin an exact version (and ideally a digest)")
        assert not stage.image.endswith(":latest")


def test_runs_as_non_root_with_the_cli_as_entrypoint(stages: list[Stage]) -> None:
    final = stages[-1]
    users = final.all("USER")
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) == 65532, "numeric non-root user (runAsNonRoot can check it)"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["kubeon-gpu"] and "kubeon-gpu" in scripts


def test_final_stage_has_no_build_tools(stages: list[Stage]) -> None:
    final = stages[-1]
    for run in final.all("RUN"):
        assert "apt-get install" not in run and "apk add" not in run, run
        assert not any(re.search(rf"\b{re.escape(t)}\b", run) for t in BUILD_TOOLS), run
        assert "pip wheel" not in run and "--no-index" in run, "install only the built wheels"
    assert not [c for c in final.all("COPY") if "--from" not in c], "no sources in the runtime stage"


def test_copied_files_exist_and_are_not_ignored(stages: list[Stage]) -> None:
    copied: set[str] = set()
    for stage in stages:
        for args in stage.all("COPY") + stage.all("ADD"):
            if "--from" in args:
                continue
            for source in _copy_sources(args):
                assert (REPO / source).exists(), f"COPY source {source} does not exist"
                assert not _ignored(source.rstrip("/")), f"COPY source {source} is excluded by .dockerignore"
                copied.add(source.rstrip("/"))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"packages missing from the image: {packages - copied}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
