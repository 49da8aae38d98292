"""`kubeon-gpu certs patch-cabundle` against the wire-level test API server (tests/kubeapi).

Real: the CLI, the kubernetes client, HTTP, the server's storage and resourceVersion
checks. Nothing is faked beyond the API server being the project's test double.
"""

from __future__ import annotations

import base64
from pathlib import Path

import requests
from kubernetes import client

from cli.main import main
from tests.kubeapi import ApiServer
from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401  (fixture)


def test_patch_keeps_fields_the_client_does_not_model(kube_api: ApiServer, tmp_path: Path) -> None:  # noqa: F811
    api = client.AdmissionregistrationV1Api(kube_api.api_client())
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "kubeon-gpu-optimizer", "annotations": {"keep": "me"}},
        "webhooks": [{
            "name": "pods.gpu.kubeon.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
            "futureField": {"from": "a newer API server"},
        }],
    }
    response = requests.post(f"{kube_api.url}/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                             json=body, timeout=10)
    assert response.status_code == 201, response.text
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--service", "s", "--namespace", "n", "--out", str(out)]) == 0
    assert main(["certs", "patch-cabundle", "--ca-file", str(out / "ca.crt"),
                 "--mutating", "kubeon-gpu-optimizer", "--kubeconfig", kube_api.kubeconfig]) == 0

    raw = api.read_mutating_webhook_configuration("kubeon-gpu-optimizer", _preload_content=False).json()
    hook = raw["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == (out / "ca.crt").read_bytes()
    assert hook["futureField"] == {"from": "a newer API server"}
    assert raw["metadata"]["annotations"] == {"keep": "me"}
