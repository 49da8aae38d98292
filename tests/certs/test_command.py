"""`kubeon-gpu certs` through the real CLI dispatcher (cli.main.main).

Real: argument parsing, certificate generation, the kubernetes client's
AdmissionregistrationV1Api, and kube-apiserver v1.35 (tests/cluster) storing the webhook
configurations and applying the CLI's JSON patch, a failed resourceVersion `test` op answered 422
by the real server. The conflicts are real too: a proxy in front of the API server
(tests/certs/apiproxy.py) lets another writer change the configuration right after the CLI has
read it, so the CLI's patch meets a newer resourceVersion.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cli.main import main
from tests.certs.apiproxy import ApiProxy
from tests.cluster.cluster import Cluster
from tests.loopback import free_port

CLUSTER = {"gpu_operator": False}
GROUP = "/apis/admissionregistration.k8s.io/v1"


def webhook_config(kind: str, name: str, hooks: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": name},
        "webhooks": [{
            "name": h, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "kubeon-gpu-optimizer-webhook", "namespace": "kubeon-gpu",
                                         "path": "/mutate"}},
        } for h in hooks],
    }


def stored(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    """The configuration as kube-apiserver stores it (read with the admin client, not through the proxy)."""
    api = client.AdmissionregistrationV1Api(cluster.api_client)
    read = (api.read_mutating_webhook_configuration if kind == "MutatingWebhookConfiguration"
            else api.read_validating_webhook_configuration)
    return dict(json.loads(read(name, _preload_content=False).data))


@pytest.fixture
def configs(kube_cluster: Cluster) -> Iterator[str]:
    """A Mutating (2 webhooks) and a Validating (1) configuration, both named after this test."""
    name = f"kubeon-gpu-optimizer-{uuid.uuid4().hex[:6]}"
    kube_cluster.create(webhook_config("MutatingWebhookConfiguration", name, ["a.gpu.kubeon.io", "b.gpu.kubeon.io"]))
    kube_cluster.create(webhook_config("ValidatingWebhookConfiguration", name, ["v.gpu.kubeon.io"]))
    yield name
    kube_cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", name,
                         "--ignore-not-found")


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--service", "s", "--namespace", "n", "--out", str(out)]) == 0
    return out


def run_err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_generate_writes_the_four_files(ca_dir: Path) -> None:
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_patch_cabundle_sets_every_webhook_and_retries_conflicts(
    kube_cluster: Cluster, configs: str, ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutating = f"{GROUP}/mutatingwebhookconfigurations/{configs}"
    races = [2]

    def another_writer_first(method: str, path: str) -> None:
        """The first two reads of the configuration lose the race: someone writes it right after."""
        if method == "GET" and path == mutating and races[0] > 0:
            races[0] -= 1
            kube_cluster.kubectl("annotate", "--overwrite", "mutatingwebhookconfiguration", configs,
                                 f"other-writer=round-{races[0]}")

    proxy = ApiProxy(kube_cluster, another_writer_first)
    try:
        rc = main(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"), "--mutating", configs,
                   "--validating", configs, "--kubeconfig", str(proxy.kubeconfig(tmp_path / "kubeconfig"))])
    finally:
        proxy.close()
    assert rc == 0, capsys.readouterr().err
    expected = base64.b64encode((ca_dir / "ca.crt").read_bytes()).decode()
    for kind, count in [("MutatingWebhookConfiguration", 2), ("ValidatingWebhookConfiguration", 1)]:
        hooks = stored(kube_cluster, kind, configs)["webhooks"]
        assert [h["clientConfig"]["caBundle"] for h in hooks] == [expected] * count
        assert hooks[0]["clientConfig"]["service"]["path"] == "/mutate", "other fields are kept"
    # two patches refused by the real server's resourceVersion test (422), then one PATCH per configuration
    patches = [(path.rsplit("/", 2)[-2], status) for method, path, status in proxy.seen if method == "PATCH"]
    assert patches == [("mutatingwebhookconfigurations", 422), ("mutatingwebhookconfigurations", 422),
                       ("mutatingwebhookconfigurations", 200), ("validatingwebhookconfigurations", 200)], patches
    assert "patched caBundle into 2 webhook(s)" in capsys.readouterr().out


def test_patch_changes_nothing_but_the_ca_bundle(kube_cluster: Cluster, ca_dir: Path) -> None:
    """Only the caBundle paths travel: every other field kube-apiserver holds (annotations,
    selectors, matchConditions, timeouts) is exactly as before."""
    name = f"kubeon-gpu-optimizer-{uuid.uuid4().hex[:6]}"
    body = webhook_config("MutatingWebhookConfiguration", name, ["pods.gpu.kubeon.io"])
    body["metadata"]["annotations"] = {"keep": "me"}
    body["webhooks"][0].update({
        "clientConfig": {"url": "https://127.0.0.1:1/mutate"}, "timeoutSeconds": 7, "reinvocationPolicy": "IfNeeded",
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]},
        "matchConditions": [{"name": "gpu-only", "expression": "has(object.spec)"}]})
    kube_cluster.create(body)
    try:
        before = stored(kube_cluster, "MutatingWebhookConfiguration", name)
        assert main(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"),
                     "--mutating", name, "--kubeconfig", str(kube_cluster.kubeconfig)]) == 0
        after = stored(kube_cluster, "MutatingWebhookConfiguration", name)
    finally:
        kube_cluster.kubectl("delete", "mutatingwebhookconfiguration", name)
    hook = after["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"].pop("caBundle")) == (ca_dir / "ca.crt").read_bytes()
    assert after["webhooks"] == before["webhooks"]
    assert after["metadata"]["annotations"] == {"keep": "me"}
    assert _metadata_without_versions(after) == _metadata_without_versions(before)


def _metadata_without_versions(obj: dict[str, Any]) -> dict[str, Any]:
    meta = copy.deepcopy(obj["metadata"])
    for key in ("resourceVersion", "generation", "managedFields"):
        meta.pop(key, None)
    return meta


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["certs", "generate", "--service", "", "--namespace", "n", "--out", "{tmp}/x"], "--service"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--ip", "nope"], "--ip"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/file"], "not a directory"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--reuse-ca"],
         "--reuse-ca"),
        (["certs", "patch-cabundle", "--ca-file", "{tmp}/missing.crt", "--mutating", "m"], "--ca-file"),
        (["certs", "patch-cabundle", "--ca-file", "{tmp}/file", "--mutating", "m"], "not a PEM certificate"),
        (["certs", "patch-cabundle", "--ca-file", "{tmp}/file"], "--mutating or --validating"),
        (["certs", "patch-cabundle", "--ca-file", "{ca}", "--mutating", "m", "--kubeconfig", "{tmp}/nokc"],
         "does not exist"),
        (["certs"], "choose an action"),
        # the cryptography library refused these with a ValueError traceback, or wrote them unchecked
        (["certs", "generate", "--service", "wébhook", "--namespace", "n", "--out", "{tmp}/x"],
         "--service 'wébhook': not a Kubernetes name"),
        (["certs", "generate", "--service", "s", "--namespace", "Kube_On", "--out", "{tmp}/x"],
         "--namespace 'Kube_On': not a Kubernetes name"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--dns", "*..bad"],
         "--dns '*..bad': label '' is not a DNS label"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--dns", "a" * 64 + ".io"],
         "is not a DNS label"),
        (["certs", "generate", "--service", "s", "--namespace", "n", "--out", "{tmp}/x", "--dns", "dé.example"],
         "--dns 'dé.example'"),
    ],
    ids=["empty-service", "bad-ip", "out-is-file", "reuse-missing-ca", "missing-ca-file", "ca-not-pem",
         "no-target", "missing-kubeconfig", "no-action", "non-ascii-service", "namespace-not-a-label",
         "empty-dns-label", "dns-label-over-63", "non-ascii-dns"],
)
def test_errors_are_one_line_exit_2(
    argv: list[str], expected: str, tmp_path: Path, ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("hello")
    argv = [a.format(tmp=tmp_path, ca=ca_dir / "ca.crt") for a in argv]
    assert expected in run_err(argv, capsys)


def test_patch_names_a_missing_configuration(
    kube_cluster: Cluster, ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run_err(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"), "--mutating", "other",
                   "--kubeconfig", str(kube_cluster.kubeconfig)], capsys)
    assert "MutatingWebhookConfiguration other not found" in err


def test_patch_names_an_unreachable_server(ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kubeconfig whose server is a closed port on 127.0.0.1 (an API server that has gone away)."""
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "gone", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}]}))
    err = run_err(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"), "--validating", "v",
                   "--kubeconfig", str(kubeconfig)], capsys)
    assert "ValidatingWebhookConfiguration v" in err


def test_wildcard_and_plain_dns_names_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cryptography import x509

    from cli.main import main

    assert main(["certs", "generate", "--service", "hook", "--namespace", "kubeon-gpu", "--out", str(tmp_path),
                 "--dns", "*.svc.example.com", "--dns", "localhost"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert {"*.svc.example.com", "localhost", "hook.kubeon-gpu.svc"} <= set(names)


@pytest.mark.parametrize(("ca_crt", "ca_key", "expected"), [
    ("ca.crt", "tls.key", "ca.key is not the key of"),  # the serving key copied over the CA's
    ("tls.crt", "tls.key", "ca.crt is not a CA certificate"),  # the serving pair copied in as the CA
])
def test_reuse_ca_refuses_a_ca_that_cannot_have_issued_what_it_would_issue(
    ca_crt: str, ca_key: str, expected: str, ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both were taken, and the serving cert issued from them did not verify against ca.crt: the
    caBundle patch-cabundle installs would have made kube-apiserver refuse the webhook's TLS."""
    out = tmp_path / "reused"
    out.mkdir()
    (out / "ca.crt").write_bytes((ca_dir / ca_crt).read_bytes())
    (out / "ca.key").write_bytes((ca_dir / ca_key).read_bytes())
    err = run_err(["certs", "generate", "--service", "s", "--namespace", "n", "--out", str(out), "--reuse-ca"], capsys)
    assert f"--reuse-ca: cannot read the CA in {out}:" in err and expected in err, err
    assert not (out / "tls.crt").exists()
