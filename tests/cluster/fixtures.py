"""pytest fixtures for the real loopback cluster (registered for every test by tests/conftest.py).

- `kube_cluster` (module scope): one cluster per test module, so a module's tests share it and no
  module sees another's cluster-scoped objects (nodes, GpuPolicies, webhook configurations). Its
  shape comes from the module's `CLUSTER` dict: `Cluster(**CLUSTER)`, e.g.
  `CLUSTER = {"kubeon": True, "karpenter": True}`. A cluster starts in about 4 s (10 s with the
  optimizer); the binaries are built once per machine by scripts/upstream.sh.
- `namespace`: a fresh namespace per test, deleted after it.

Without Go or a finished build the tests skip locally and fail in CI (tests/missing.py).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.cluster import Cluster
from tests.cluster.processes import StartError
from tests.cluster.upstream import UpstreamMissing, upstream_dir
from tests.missing import missing


def start_cluster(**options: object) -> Cluster:
    """A started Cluster, or the test skipped (locally) / failed (CI) naming what is missing."""
    try:
        upstream_dir()
    except UpstreamMissing as error:
        missing(str(error))
    for attempt in range(3):
        try:
            return Cluster(**options).start()  # type: ignore[arg-type]
        except StartError as error:
            # A free port is chosen before the component binds it: another worker's process may take
            # it in between. That, and only that, is worth a second try.
            if "address already in use" not in str(error).lower() or attempt == 2:
                pytest.fail(f"the loopback cluster did not start: {error}", pytrace=False)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster = start_cluster(**getattr(request.module, "CLUSTER", {}))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(kube_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = kube_cluster.ensure_namespace(f"{base}-{uuid.uuid4().hex[:5]}")
    yield name
    kube_cluster.delete_namespace(name)
