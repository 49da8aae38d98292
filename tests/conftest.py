"""Fixtures every test may use: the real loopback cluster (tests/cluster/fixtures.py)."""

pytest_plugins = ["tests.cluster.fixtures"]
