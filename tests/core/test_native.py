"""The admission core runs compiled where it was built (setup.py), and a stale build stops the tests.

Real: the modules as Python imports them, pyproject.toml's list, files with
their modification times. Faked: nothing.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import pytest

from tests.missing import missing
from tests.native import REPO, native_sources, stale
from webhook.command import admission_core


def _module(source: Path) -> str:
    return ".".join(source.relative_to(REPO).with_suffix("").parts)


def test_the_admission_core_runs_compiled() -> None:
    modules = [importlib.import_module(_module(source)) for source in native_sources()]
    pure = [m.__name__ for m in modules if str(m.__file__).endswith(".py")]
    if len(pure) == len(modules):
        assert admission_core() == "pure Python"
        if os.environ.get("KUBEON_PURE_PYTHON", "") not in ("", "0"):
            pytest.skip("KUBEON_PURE_PYTHON is set: the admission core runs pure Python by choice")
        missing("the admission core is not compiled: install a C compiler and the Python headers "
                "(Debian: gcc python3-dev), then pip install -e .")
    assert not pure, f"compiled in part only: {pure} run pure Python"
    assert admission_core() == "compiled"


def test_a_source_newer_than_its_compiled_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.kubeon]\nnative = ["pkg/a.py", "pkg/b.py", "pkg/c.py"]\n')
    from importlib.machinery import EXTENSION_SUFFIXES

    then = time.time() - 100
    for name, source_at, built_at in (("a", then, then + 10), ("b", then + 10, then), ("c", then, None)):
        source = tmp_path / "pkg" / f"{name}.py"
        source.write_text("")
        os.utime(source, (source_at, source_at))
        if built_at is not None:
            built = source.with_suffix(EXTENSION_SUFFIXES[0])
            built.write_bytes(b"")
            os.utime(built, (built_at, built_at))
    assert stale(tmp_path) == ["pkg/b.py"]  # a: built after its edit; c: never built (pure Python)

