"""The real Kubernetes control plane on 127.0.0.1 for the tests (README.md beside this file)."""

from tests.cluster.cluster import Cluster

__all__ = ["Cluster"]
