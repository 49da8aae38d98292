"""Fixtures every test may use: the real loopback cluster (tests/cluster/fixtures.py)."""

from typing import Any

pytest_plugins = ["tests.cluster.fixtures"]


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Tests marked `first` (the suite's longest) go to the front: pytest-xdist hands tests out in
    collection order, and a seven-minute test that starts when the other workers are nearly done is the
    suite's whole tail (scripts/test.sh). A stable sort: every other test keeps its order."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)
