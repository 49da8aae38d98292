"""`kubeon-gpu certs` through the real CLI dispatcher (cli.main.main).

Real: argument parsing, certificate generation, the kubernetes client's
AdmissionregistrationV1Api over HTTP on loopback, and the wire-level test API
server (tests/kubeapi) storing the webhook configurations and JSON-patching them,
a failed resourceVersion `test` answered 422 as kube-apiserver answers it. Its
`hooks.race_reads` makes another writer come first after a read, to force conflicts.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cli.main import main
from tests.kubeapi import ApiServer

MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kubeon-gpu-optimizer"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kubeon-gpu-optimizer"


def webhook_config(kind: str, hooks: list[str]) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": "kubeon-gpu-optimizer"},
        "webhooks": [{
            "name": h, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "kubeon-gpu-optimizer-webhook", "namespace": "kubeon-gpu",
                                         "path": "/mutate"}},
        } for h in hooks],
    }


def stored(server: ApiServer, path: str) -> dict:
    """The configuration at `path` as the server stores it (read in-process: a GET would count as a read)."""
    plural, name = path.split("/")[-2:]
    res = server.catalog.lookup("admissionregistration.k8s.io", "v1", plural)
    assert res is not None
    obj = server.store.get(res.key, "", name)
    assert obj is not None, path
    return obj


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer.start() as api:
        for path, config in [
            (MWC, webhook_config("MutatingWebhookConfiguration", ["a.gpu.kubeon.io", "b.gpu.kubeon.io"])),
            (VWC, webhook_config("ValidatingWebhookConfiguration", ["v.gpu.kubeon.io"])),
        ]:
            created = requests.post(api.url + path.rsplit("/", 1)[0], json=config, timeout=10)
            assert created.status_code == 201, created.text
        yield api


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
    server: ApiServer, ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.hooks.race_reads(2)  # the first two read-then-patch rounds lose the race
    rc = main(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"), "--mutating",
               "kubeon-gpu-optimizer", "--validating", "kubeon-gpu-optimizer", "--kubeconfig", server.kubeconfig])
    assert rc == 0, capsys.readouterr().err
    expected = base64.b64encode((ca_dir / "ca.crt").read_bytes()).decode()
    for path, count in [(MWC, 2), (VWC, 1)]:
        hooks = stored(server, path)["webhooks"]
        assert [h["clientConfig"]["caBundle"] for h in hooks] == [expected] * count
        assert hooks[0]["clientConfig"]["service"]["path"] == "/mutate", "other fields are kept"
    # two conflicts, then one PATCH per configuration
    assert len([w for w in server.writes if w[0] in ("PUT", "PATCH") and w[1] in (MWC, VWC)]) == 4
    assert "patched caBundle into 2 webhook(s)" in capsys.readouterr().out
    json.dumps([stored(server, MWC), stored(server, VWC)])  # stored objects are plain JSON


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
    server: ApiServer, ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run_err(["certs", "patch-cabundle", "--ca-file", str(ca_dir / "ca.crt"), "--mutating", "other",
                   "--kubeconfig", server.kubeconfig], capsys)
    assert "MutatingWebhookConfiguration other not found" in err


def test_patch_names_an_unreachable_server(ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kc"
    with ApiServer.start() as gone:
        kubeconfig.write_text(Path(gone.kubeconfig).read_text())  # the server stops: its port is closed
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
