"""The end-to-end harness itself: how tests/cluster/kubeon.py rewires the chart for loopback.

Real: `helm template` of the chart. What the optimizer does once wired is tested in
test_real_cluster.py (the second scheduler calling the extender, the controller's Lease and
/metrics) and the other e2e modules.
"""

from __future__ import annotations

import base64

from tests.cluster.kubeon import render_chart, scheduler_configuration, webhook_configurations


def test_chart_webhooks_are_pointed_at_the_local_url_with_the_ca() -> None:
    docs = render_chart("certificates.mode=external")
    configs = webhook_configurations(docs, "https://127.0.0.1:9", b"PEM")
    assert {c["kind"] for c in configs} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    hooks = [hook for config in configs for hook in config["webhooks"]]
    assert {h["clientConfig"]["url"] for h in hooks} == {"https://127.0.0.1:9/mutate", "https://127.0.0.1:9/validate"}
    assert all("service" not in h["clientConfig"] for h in hooks)
    assert all(base64.b64decode(h["clientConfig"]["caBundle"]) == b"PEM" for h in hooks)
    # everything else as the chart renders it: its failurePolicy (Ignore by default), not one forced for tests
    assert all(h["failurePolicy"] == "Ignore" for h in hooks)


def test_chart_scheduler_config_is_pointed_at_the_local_extender() -> None:
    config = scheduler_configuration(render_chart("certificates.mode=external"), "http://127.0.0.1:9")
    assert config["profiles"][0]["schedulerName"] == "kubeon-gpu-scheduler"
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:9"
    assert extender["nodeCacheCapable"] is True
    assert "managedResources" not in extender  # the extender is asked about every pod the profile schedules
    assert extender["weight"] >= 1
