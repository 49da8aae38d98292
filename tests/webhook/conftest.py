"""Fixtures for webhook tests: a static ClusterView with the example policies and a Flask app."""

from __future__ import annotations

import pytest

from gpupolicy.cluster import ClusterView, NodeInfo
from gpupolicy.model import parse_policy
from tests.webhook.payloads import POLICIES
from webhook.app import create_app
from webhook.views import StaticView

NODES = (NodeInfo("gpu-a100-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/gpu": "8"}),)


def example_view() -> ClusterView:
    return ClusterView(policies=tuple(parse_policy(p) for p in POLICIES), nodes=NODES, metrics_configured=True)


@pytest.fixture
def app():
    return create_app(StaticView(example_view()))


@pytest.fixture
def client(app):
    return app.test_client()
