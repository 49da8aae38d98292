"""Fixtures for webhook tests: a static ClusterView with the example policies and a Flask app."""

from __future__ import annotations

import pytest

from gpupolicy.cluster import ClusterView, NodeInfo
from gpupolicy.model import parse_policy
from kube.views import StaticView
from tests.core.builders import slice_offers
from tests.webhook.payloads import POLICIES
from webhook.app import create_app

# A node whose layout already offers every slice of its product: these tests are about the webhook,
# not the layout gate (tests/core/test_layout_gate.py is).
NODES = (NodeInfo("gpu-a100-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                  slice_offers("NVIDIA-A100-SXM4-80GB")),)


def example_view() -> ClusterView:
    return ClusterView(policies=tuple(parse_policy(p) for p in POLICIES), nodes=NODES, metrics_configured=True)


@pytest.fixture
def app():
    return create_app(StaticView(example_view()))


@pytest.fixture
def client(app):
    return app.test_client()
