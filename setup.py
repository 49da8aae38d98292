"""The build: the admission core compiled to C with mypyc where a C compiler is at hand, pure Python otherwise.

Why (docs/designs/webhook.md, "Compiled admission core"): every Pod CREATE in
the cluster waits on /mutate and /validate. After the Python-level trims of
issue 16, a review of a pod that differs in what the decision reads ran
~642,000 instructions in process against the bare server's ~130,000;
`mutate_pod` and the shape check were 350,000 of them. Compiled, the same
code runs ~485,000 (`mutate_pod` -28%, the shape check -57%), the same
source and the same tests: mypyc compiles the type-checked modules as they
are, and nothing imports it at run time.

Compiled: the modules listed in pyproject.toml's `[tool.kubeon] native`
(the pod decision behind /mutate and /validate). Nothing else gained when
compiled (the review envelope, the memo, the quantity parser, validation:
within 2%), so nothing else is.

Pure Python instead when `KUBEON_PURE_PYTHON=1`, or when this machine has
no C compiler or no Python headers (say so, and go on: the same code runs,
slower). The tests check that they run the compiled modules, and that none
is older than its source (tests/conftest.py): an edited module left beside
its old compiled one would otherwise test the old code.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent
NATIVE: list[str] = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["kubeon"]["native"]


def _why_pure() -> str:
    """Why the build stays pure Python ("" when it can compile)."""
    if os.environ.get("KUBEON_PURE_PYTHON", "") not in ("", "0"):
        return "KUBEON_PURE_PYTHON is set"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        return f"no C compiler ({compiler.split()[0]})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Debian: python3-dev)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed"
    return ""


def ext_modules() -> list[Any]:
    why = _why_pure()
    if why:
        print(f"kubeon-gpu-optimizer: the admission core stays pure Python: {why}", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    # No config file: the project's [tool.mypy] loads the pydantic plugin, which the isolated build
    # environment does not have; modules it cannot find are Any to the compiler, as they are to mypy.
    return mypycify(["--config-file=", "--ignore-missing-imports", "--python-version=3.11", *NATIVE],
                    opt_level="3", group_name="kubeon_native")


setup(ext_modules=ext_modules())
