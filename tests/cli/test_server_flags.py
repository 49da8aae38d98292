"""Bad flags and files given to the long-running commands (webhook, extender, controller, hub): one line
naming the flag or the file's field, exit code 2, before anything serves; never a traceback, a gunicorn
master retrying a bind for five seconds, or a worker that dies on a kubeconfig after the fork.

Real: the commands as subprocesses (`python -m cli.main`), real sockets on 127.0.0.1 (a port held by
this test), real kubeconfig files. Faked: nothing.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import Run, subprocess_run


def _check(run: Run, *needles: str) -> None:
    assert run.code == 2, (run.code, run.err)
    assert "Traceback" not in run.err, run.err
    for needle in needles:
        assert needle in run.err, (needle, run.err)


def _written(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refused_kubeconfig(tmp: Path) -> Path:
    """A kubeconfig that loads, for an API server on a port where nothing listens (127.0.0.1:9): the
    commands start, and what is under test comes before or beside their first request."""
    path = tmp / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                    "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    return path


@pytest.fixture
def cert_dir(real_certs: Path) -> Path:
    """TLS material that loads: the checks under test come before or after it."""
    return real_certs


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 another process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(("args", "needle"), [
    (["--port", "70000"], "argument --port: 70000 is not a port number (1-65535)"),
    (["--port", "0"], "argument --port: 0 is not a port number (1-65535)"),
    (["--port", "http"], "argument --port: 'http' is not a port number"),
    (["--bind", "999.1.1.1"], "argument --bind: '999.1.1.1' is not an IP address or a host name"),
    (["--bind", "a b"], "argument --bind: 'a b' is not an IP address or a host name"),
    (["--workers", "0"], "argument --workers: 0 is below 1"),
    (["--threads", "-3"], "argument --threads: -3 is below 1"),
])
@pytest.mark.parametrize("command", ["webhook", "extender"])
def test_server_flags_out_of_range_are_usage_errors(command: str, args: list[str], needle: str,
                                                    cert_dir: Path) -> None:
    base = ["webhook", "--cert-dir", str(cert_dir), "--no-watch"] if command == "webhook" else ["extender",
                                                                                                "--standalone"]
    _check(subprocess_run(*base, *args, timeout=30), needle)


@pytest.mark.parametrize(("args", "line"), [
    (["webhook", "--port", "70000"],
     "kubeon-gpu webhook: error: argument --port: 70000 is not a port number (1-65535)"),
    (["webhook", "--port", "8443"], "kubeon-gpu webhook: error: the following arguments are required: --cert-dir"),
    (["extender", "--standalone", "--workers", "0"], "kubeon-gpu extender: error: argument --workers: 0 is below 1"),
    (["hub", "serve", "--threads", "0"], "kubeon-gpu hub serve: error: argument --threads: 0 is below 1"),
    (["dry-run", "--example", "-o", "xml"], "kubeon-gpu dry-run: error: argument -o/--output: invalid choice: 'xml'"),
    (["layout", "--bogus"], "kubeon-gpu layout: error: unrecognized arguments: --bogus"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else "")
def test_a_refused_flag_is_one_line_naming_it_not_the_usage(args: list[str], line: str) -> None:
    """docs/cli.md: one line on stderr naming the flag, exit code 2 (argparse printed its usage block first)."""
    run = subprocess_run(*args, timeout=30)
    assert run.code == 2, (run.code, run.err)
    assert run.err.count("\n") == 1 and run.err.startswith(line), run.err


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1", "soon"])
def test_extender_assume_seconds_is_a_finite_positive_period(value: str) -> None:
    _check(subprocess_run("extender", "--standalone", "--assume-seconds", value, timeout=30),
           "argument --assume-seconds:")


def test_a_port_in_use_is_one_line_before_gunicorn_starts(held_port: int, cert_dir: Path) -> None:
    for base in (["extender", "--standalone"], ["webhook", "--cert-dir", str(cert_dir), "--no-watch"]):
        run = subprocess_run(*base, "--bind", "127.0.0.1", "--port", str(held_port), timeout=30)
        _check(run, f"--bind 127.0.0.1 --port {held_port}: cannot listen: Address already in use")
        assert "Booting worker" not in run.err and "Retrying" not in run.err, run.err


def test_an_address_of_no_interface_here_is_one_line(cert_dir: Path) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): bind() refuses it at once, no packet is sent.
    _check(subprocess_run("extender", "--standalone", "--bind", "192.0.2.1", timeout=30),
           "--bind 192.0.2.1 --port 8888: cannot listen: Cannot assign requested address")


@pytest.mark.parametrize(("text", "needle"), [
    ("clusters: 5\n", "clusters: must be a list, not a number"),
    ("- a\n- b\n", "not a kubeconfig: the top level is a list, not a mapping"),
    ("clusters:\n- name: c\n  cluster: {server: 5}\n", "clusters[0].cluster.server: must be a string, not a number"),
    ("users:\n- user: {}\n", "users[0].name: must be a string"),
    ("contexts:\n- name: x\n  context: [1]\n", "contexts[0].context: must be a mapping, not a list"),
    ("clusters:\n- name: c\n  cluster: {insecure-skip-tls-verify: 'yes'}\n",
     "clusters[0].cluster.insecure-skip-tls-verify: must be true or false, not a string"),
    ("users:\n- name: u\n  user: {exec: run}\n", "users[0].user.exec: must be a mapping, not a string"),
    ("current-context: [a]\n", "current-context: must be a string, not a list"),
    ("clusters: [\n", "not valid YAML"),
    (b"\xff\xfe kind: Config\n", "not UTF-8 text"),
])
def test_a_kubeconfig_of_the_wrong_shape_names_the_field(tmp_path: Path, cert_dir: Path, text: str | bytes,
                                                         needle: str) -> None:
    kubeconfig = _written(tmp_path / "kubeconfig", text)
    webhook = subprocess_run("webhook", "--cert-dir", str(cert_dir), "--kubeconfig", str(kubeconfig), timeout=30)
    _check(webhook, f"cannot load Kubernetes configuration ({kubeconfig}): {needle}")
    controller = subprocess_run("controller", "--kubeconfig", str(kubeconfig), timeout=30)
    _check(controller, f"cannot load Kubernetes configuration ({kubeconfig}): {needle}")
    assert len([line for line in controller.err.splitlines() if line.strip()]) == 1, controller.err


def test_a_kubeconfig_in_the_kubeconfig_variable_is_checked_too(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    bad = tmp_path / "bad"
    bad.write_text("users: {u: 1}\n")
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env["KUBECONFIG"] = f"{good}:{bad}"
    result = subprocess.run([sys.executable, "-m", "cli.main", "controller"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{bad}: users: must be a list, not a mapping" in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--health-port", "-1"], "argument --health-port: -1 is not a port number (0-65535, 0: any)"),
    (["--health-port", "65536"], "argument --health-port: 65536 is not a port number"),
    (["--resync-seconds", "0"], "argument --resync-seconds: '0': must be a finite number of seconds above 0"),
    (["--resync-seconds", "nan"], "argument --resync-seconds: 'nan'"),
    (["--renew-seconds", "inf"], "argument --renew-seconds: 'inf'"),
    (["--lease-duration-seconds", "0"], "argument --lease-duration-seconds: 0 is below 1"),
    (["--health-bind", "a b"], "argument --health-bind: 'a b' is not an IP address or a host name"),
])
def test_controller_flags_out_of_range_are_usage_errors(args: list[str], needle: str) -> None:
    _check(subprocess_run("controller", *args, timeout=30), needle)


def test_controller_health_port_in_use_is_one_line(tmp_path: Path, held_port: int) -> None:
    kubeconfig = refused_kubeconfig(tmp_path)
    run = subprocess_run("controller", "--kubeconfig", str(kubeconfig), "--health-bind", "127.0.0.1",
                         "--health-port", str(held_port), timeout=30)
    _check(run, f"--health-bind 127.0.0.1 --health-port {held_port}: cannot listen: Address already in use")


def test_controller_eks_nodegroups_without_a_cluster_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess_run("controller", "--kubeconfig", str(refused_kubeconfig(tmp_path)),
                         "--capacity-provider", "eks-nodegroups", timeout=30)
    _check(run, "--capacity-provider eks-nodegroups needs --eks-cluster (chart capacity.eks.clusterName)")


def test_controller_gke_nodepools_without_its_cluster_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess_run("controller", "--kubeconfig", str(refused_kubeconfig(tmp_path)),
                         "--capacity-provider", "gke-nodepools", "--gke-project", "p", timeout=30)
    _check(run, "--capacity-provider gke-nodepools needs --gke-location, --gke-cluster (chart capacity.gke.*)")


def test_controller_aks_nodepools_without_its_cluster_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess_run("controller", "--kubeconfig", str(refused_kubeconfig(tmp_path)),
                         "--capacity-provider", "aks-nodepools", "--aks-cluster", "c", timeout=30)
    _check(run, "--capacity-provider aks-nodepools needs --aks-subscription-id, --aks-resource-group "
                "(chart capacity.aks.*)")


@pytest.mark.parametrize(("text", "needle"), [
    ("kind: Namespace\nmetadata: {name: a}\n", "no GpuPolicy documents"),
    ("", "no GpuPolicy documents"),
    ("- 1\n", "document 1: not a mapping"),
    ("kind: List\nitems: 3\n", "document 1 (List): items: not a list"),
    ("kind: List\nitems: [3]\n", "document 1 (List): an item is not a mapping"),
    (b"kind: GpuPolicy\nmetadata: {name: caf\xe9}\n", "not UTF-8 text"),
])
def test_webhook_policies_file_that_decides_nothing_is_refused(tmp_path: Path, cert_dir: Path, text: str | bytes,
                                                               needle: str) -> None:
    policies = _written(tmp_path / "policies.yaml", text)
    _check(subprocess_run("webhook", "--cert-dir", str(cert_dir), "--policies", str(policies), timeout=30),
           f"--policies {policies}: {needle}")


def test_hub_workers_below_one_is_a_usage_error() -> None:
    _check(subprocess_run("hub", "serve", "--workers", "0", timeout=30), "argument --workers: 0 is below 1")


@pytest.fixture(scope="module")
def real_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from certs.material import generate

    out = tmp_path_factory.mktemp("tls")
    generate("kubeon-gpu-optimizer-webhook", "kubeon-gpu", out, ip_addresses=["127.0.0.1"])
    return out


def _tls_dir(tmp: Path, crt: bytes, key: bytes) -> Path:
    tmp.mkdir(exist_ok=True)
    (tmp / "tls.crt").write_bytes(crt)
    (tmp / "tls.key").write_bytes(key)
    return tmp


@pytest.mark.parametrize("case", ["cert not PEM", "key not PEM", "key of another pair"])
def test_tls_material_that_does_not_load_names_the_file(tmp_path: Path, real_certs: Path, case: str) -> None:
    crt, key, ca_key = ((real_certs / n).read_bytes() for n in ("tls.crt", "tls.key", "ca.key"))
    pair, needle = {"cert not PEM": ((b"x", key), "tls.crt: not a PEM certificate"),
                    "key not PEM": ((crt, b"y"), "tls.key: not a PEM private key"),
                    "key of another pair": ((crt, ca_key), "KEY_VALUES_MISMATCH")}[case]
    tls = _tls_dir(tmp_path / "tls", *pair)
    _check(subprocess_run("webhook", "--cert-dir", str(tls), "--no-watch", timeout=30), f"--cert-dir {tls}: ", needle)
    _check(subprocess_run("extender", "--standalone", "--cert-dir", str(tls), timeout=30), needle)
    _check(subprocess_run("hub", "serve", "--db", f"sqlite:///{tmp_path / 'hub.db'}", "--cert", str(tls / "tls.crt"),
                          "--key", str(tls / "tls.key"), "--bind", "127.0.0.1:1", timeout=60),
           "--cert/--key: ", needle)


def test_hub_bind_in_use_is_one_line(tmp_path: Path, held_port: int) -> None:
    run = subprocess_run("hub", "serve", "--db", f"sqlite:///{tmp_path / 'hub.db'}", "--bind",
                         f"127.0.0.1:{held_port}", timeout=60)
    _check(run, f"--bind 127.0.0.1:{held_port}: cannot listen: Address already in use")
    assert "Retrying" not in run.err and "Connection in use" not in run.err, run.err


def test_controller_health_server_listens_on_ipv6(tmp_path: Path) -> None:
    """`--health-bind ::` (an IPv6-only cluster's pod address): the health server was IPv4 only and the
    controller ended in a gaierror traceback."""
    import subprocess
    import time

    import requests

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    kubeconfig = refused_kubeconfig(tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "cli.main", "controller", "--kubeconfig", str(kubeconfig),
                                "--health-bind", "::1", "--health-port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=(tmp_path / "log").open("w"))
    try:
        deadline = time.monotonic() + 30
        answer = None
        while answer is None and time.monotonic() < deadline and process.poll() is None:
            try:
                answer = requests.get(f"http://[::1]:{port}/healthz", timeout=2)
            except requests.ConnectionError:
                time.sleep(0.1)
        assert answer is not None and answer.status_code == 200, (tmp_path / "log").read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "Traceback" not in (tmp_path / "log").read_text()


@pytest.mark.parametrize(("flags", "needle"), [
    (["--hub-url", "ftp://hub"], "argument --hub-url: 'ftp://hub' is not an http(s) URL with a host"),
    (["--hub-url", "https://"], "argument --hub-url: 'https://' is not an http(s) URL with a host"),
    (["--prometheus-url", "prometheus:9090"], "argument --prometheus-url: 'prometheus:9090' is not an http(s)"),
    (["--prometheus-url", "http://p:99999"], "the port is not a number from 0 to 65535"),
    (["--hub-ca-file", "NOTPEM"], "not a PEM CA certificate"),
    (["--hub-ca-file", "/nonexistent/ca.crt"], "--hub-ca-file /nonexistent/ca.crt: No such file or directory"),
])
def test_controller_hub_settings_it_cannot_use_are_refused_at_start(tmp_path: Path, flags: list[str],
                                                                    needle: str) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate")
    kubeconfig = refused_kubeconfig(tmp_path)
    args = {"--hub-url": "https://hub.example", "--cluster": "c", "--hub-token-file": str(token)}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        args[flag] = str(bad) if value == "NOTPEM" else value
    run = subprocess_run("controller", "--kubeconfig", str(kubeconfig), *[x for kv in args.items() for x in kv],
                         timeout=30)
    _check(run, needle)


@pytest.mark.parametrize("command", ["webhook", "dry-run"])
def test_a_prometheus_url_that_is_no_url_is_a_usage_error(command: str, cert_dir: Path) -> None:
    base = ["webhook", "--cert-dir", str(cert_dir), "--no-watch"] if command == "webhook" else ["dry-run",
                                                                                                "--example"]
    _check(subprocess_run(*base, "--prometheus-url", "prometheus:9090", timeout=30),
           "argument --prometheus-url: 'prometheus:9090' is not an http(s) URL with a host")


@pytest.mark.parametrize("flag", ["webhook --policies", "hub policy apply -f", "hub serve --admin-token-file"])
def test_a_fifo_or_a_directory_named_as_a_file_is_refused_not_waited_on(tmp_path: Path, cert_dir: Path,
                                                                         flag: str) -> None:
    """A FIFO nothing writes to blocked these commands forever (read_bytes waits for a writer)."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        args = {
            "webhook --policies": ["webhook", "--cert-dir", str(cert_dir), "--no-watch", "--policies", str(path)],
            "hub policy apply -f": ["hub", "--db", f"sqlite:///{tmp_path / 'hub.db'}", "policy", "apply",
                                    "--cluster", "c", "-f", str(path)],
            "hub serve --admin-token-file": ["hub", "serve", "--db", f"sqlite:///{tmp_path / 'hub.db'}",
                                             "--admin-token-file", str(path), "--bind", "127.0.0.1:1"],
        }[flag]
        _check(subprocess_run(*args, timeout=30), f"{path}: not a regular file")
