"""/mutate routes CPU-only pods that tolerate the GPU taint, as the webhook's command line configures it.

Real: `kubeon-gpu webhook`'s own argument parser and static view
(`--policies FILE`, `--route-cpu-pods-on-gpu-nodes`), the Flask app from
webhook.app.create_app, the decision core; kube-apiserver-shaped
AdmissionReviews; patches applied with jsonpatch. Faked: no TLS/gunicorn.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from kube.views import StaticView
from tests.webhook.payloads import SHARE, api_pod, review
from webhook.app import create_app
from webhook.command import add_arguments, load_static_view

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def client_for(tmp_path: Path, *flags: str) -> Any:
    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump(SHARE))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--cert-dir", str(tmp_path), "--policies", str(policies),
                              "--prometheus-url", "http://prometheus:9090", *flags])  # sharing acts
    return create_app(StaticView(load_static_view(args))).test_client()


def cpu_only_pod(tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """A Deployment's CPU-only pod as the API server sends it (defaults applied)."""
    pod = api_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": "4Gi"},
                                                 "requests": {"memory": "4Gi", "cpu": "2"}}
    pod["spec"]["tolerations"] += tolerations
    return pod


def mutated(client: Any, pod: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/mutate", json=review(pod)).get_json()["response"]
    assert resp["allowed"] is True
    patch = json.loads(base64.b64decode(resp["patch"])) if resp.get("patch") else []
    return jsonpatch.apply_patch(pod, patch)


def test_a_tolerating_cpu_only_pod_is_routed_by_default(tmp_path: Path) -> None:
    after = mutated(client_for(tmp_path), cpu_only_pod([GPU_TOLERATION]))
    assert after["spec"]["schedulerName"] == "kubeon-gpu-scheduler"
    assert after["spec"]["containers"] == cpu_only_pod([])["spec"]["containers"]


@pytest.mark.parametrize("tolerations", [[], [GPU_TOLERATION]], ids=["not-tolerating", "tolerating"])
def test_switched_off_cpu_only_pods_keep_the_default_scheduler(tmp_path: Path, tolerations: list) -> None:
    client = client_for(tmp_path, "--route-cpu-pods-on-gpu-nodes=false")
    assert mutated(client, cpu_only_pod(tolerations))["spec"]["schedulerName"] == "default-scheduler"
    assert mutated(client, api_pod())["spec"]["schedulerName"] == "kubeon-gpu-scheduler"  # GPU pods still are


def test_a_pod_not_tolerating_the_taint_is_never_routed(tmp_path: Path) -> None:
    assert mutated(client_for(tmp_path), cpu_only_pod([]))["spec"]["schedulerName"] == "default-scheduler"
