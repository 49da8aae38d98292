"""A `via: DRA` sharing policy needs the webhook and the controller (its claim templates): Ready says so."""

from __future__ import annotations

from gpupolicy.model import GpuPolicy, parse_policy
from gpupolicy.modes import Component, handlers, handling


def sharing(via: str) -> GpuPolicy:
    return parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "s"},
                         "spec": {"sharing": {"strategy": "MIG", "via": via, "gpuModels": ["NVIDIA-H200"]}}})


def test_dra_sharing_is_not_ready_without_the_controller() -> None:
    policy = sharing("DRA")
    assert handlers(policy) == {Component.WEBHOOK, Component.CONTROLLER}
    webhook_only = handling(policy.spec.kind, {Component.WEBHOOK}, needed=handlers(policy))
    assert not webhook_only.handled and webhook_only.reason == "ControllerDisabled"
    assert "this install does not run the controller" in webhook_only.message
    assert handling(policy.spec.kind, {Component.WEBHOOK, Component.CONTROLLER},
                    needed=handlers(policy)).handled


def test_device_plugin_sharing_needs_the_webhook_only() -> None:
    policy = sharing("DevicePlugin")
    assert handling(policy.spec.kind, {Component.WEBHOOK}, needed=handlers(policy)).handled
