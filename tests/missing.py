"""A real component a test needs is missing: skip on a developer's machine, fail in CI.

A skipped real-component test is a hole CI cannot see (GUIDE.md, "Truth rules"):
`.ci/run` sets `CI=true`, and there every such test fails instead, naming what is
missing. Locally, without `CI`, it skips with the same message so a partial setup
still runs the rest.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Fail under CI, skip otherwise; `reason` says what is missing and how to get it."""
    if in_ci():
        pytest.fail(f"missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)
