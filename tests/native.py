"""The admission core's compiled modules (setup.py, pyproject.toml `[tool.kubeon] native`) and their sources.

An editable install compiles them in place, beside their sources; Python then
imports the compiled one. After an edit (or a checkout) the source is newer
than what runs, and every admission test would test the old code: `stale`
finds that, and tests/conftest.py stops the run before any test.
"""

from __future__ import annotations

import tomllib
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REBUILD = "pip install -e . (or delete the compiled modules to run pure Python: find . -name '*.so' -delete)"


def native_sources(root: Path = REPO) -> list[Path]:
    """The sources setup.py compiles."""
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["kubeon"]["native"]
    return [root / name for name in listed]


def compiled_beside(source: Path) -> list[Path]:
    """The compiled modules of `source` in its directory that this interpreter would import instead."""
    return [p for p in (source.with_suffix(suffix) for suffix in EXTENSION_SUFFIXES) if p.is_file()]


def stale(root: Path = REPO) -> list[str]:
    """Sources changed since their compiled module was built, as paths relative to `root`."""
    out = []
    for source in native_sources(root):
        for built in compiled_beside(source):
            if source.stat().st_mtime > built.stat().st_mtime:
                out.append(str(source.relative_to(root)))
                break
    return out
