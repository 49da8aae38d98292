"""Before any test: the compiled admission core is not older than its source (tests/native.py)."""

from __future__ import annotations

import pytest

from tests.native import REBUILD, stale


def pytest_configure(config: pytest.Config) -> None:
    changed = stale()
    if changed:
        raise pytest.UsageError(f"{', '.join(changed)} changed since compiled: the tests would run the old "
                                f"code. Compile again: {REBUILD}")
