"""A wire-level Kubernetes API server for tests (see README.md for what it does and does not do)."""

from tests.kubeapi.server import ApiServer

__all__ = ["ApiServer"]
