"""The real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, the default
kube-scheduler and the KWOK controller, with the flags kwokctl's binary runtime uses
(sigs.k8s.io/kwok pkg/kwokctl/components/*.go), checked against the upstream sources of the versions
in upstream/versions.env.

Differences from kwokctl, each on purpose:
- `--unsafe-no-fsync` on etcd: test data, and fsync dominates its latency on a shared disk.
- no `--admission-control=` on kube-apiserver: that flag empties the admission chain, and the
  webhooks under test must be called.
- `leaderElect: false` on every scheduler: two schedulers must not wait on one Lease.
- an audit log (`--audit-log-path`) of the writes ServiceAccounts make (AUDIT_POLICY): tests ask the
  real API server which requests the optimizer sent (`ControlPlane.audit_events`).
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.pki import write_pki
from tests.cluster.processes import Children, StartError
from tests.cluster.upstream import upstream_dir
from tests.loopback import free_port

START_TIMEOUT = 120.0
# kube-apiserver dials webhooks, Services and aggregated APIs; with no kube-proxy a Service's
# ClusterIP (10.96.0.0/16 here) would be dialled on the host's network. Every dial but loopback goes
# through a proxy on a closed loopback port instead: refused at once, never off the machine. A test
# that routes Services on purpose sets its own HTTPS_PROXY (tests/e2e/egress.py).
NO_EGRESS = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
             "NO_PROXY": "127.0.0.1,localhost,::1"}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Metadata (who, verb, URI, response code) of every write a ServiceAccount makes (the optimizer's
# components authenticate as the chart's); nothing else, so the log stays small.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"],
               "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
              {"level": "None"}],
}


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    with urllib.request.urlopen(url, context=context, timeout=2) as response:
        return bool(response.status == 200)


@dataclass
class ControlPlane:
    """One loopback cluster's core; `start` returns once the API answers and nodes can be created."""

    root: Path
    upstream: Path = field(default_factory=upstream_dir)
    # what the audit log records (default: ServiceAccounts' writes); bench/cluster_scale.py records more
    audit_policy: dict[str, Any] = field(default_factory=lambda: dict(AUDIT_POLICY))
    children: Children = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)
    # extra environment of kube-apiserver, e.g. HTTPS_PROXY: where it dials a webhook's Service
    # (clientConfig.service) through a test's stand-in for the Service network (loopback never proxied)
    apiserver_env: dict[str, str] = field(default_factory=dict)
    # with KEDA (tests/cluster/keda.py): kube-apiserver dials an aggregated API at its Service's endpoint
    # (there is no kube-proxy), and kube-controller-manager takes extra flags (HPA intervals)
    aggregator_routing: bool = False
    controller_manager_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.children = Children(self.root / "logs")
        self.pki = write_pki(self.root / "pki")

    # ------------------------------------------------------------------ files

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def bin(self, name: str) -> str:
        return str(self.upstream / "bin" / name)

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kubeon-test",
            "clusters": [{"name": "kubeon-test", "cluster": {
                "server": self.url, "certificate-authority": str(self.pki["ca_crt"])}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.pki["admin_crt"]), "client-key": str(self.pki["admin_key"])}}],
            "contexts": [{"name": "kubeon-test", "context": {"cluster": "kubeon-test", "user": "admin",
                                                             "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki["ca_crt"]))
        context.load_cert_chain(str(self.pki["admin_crt"]), str(self.pki["admin_key"]))
        return context

    def scheduler_config(self, name: str, extra: dict[str, Any] | None = None) -> Path:
        """A KubeSchedulerConfiguration file; `--kubeconfig` is ignored beside `--config`
        (cmd/kube-scheduler/app/options: ApplyTo), so the path goes in clientConnection."""
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                  "leaderElection": {"leaderElect": False}, **(extra or {})}
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------------ components

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        child = self.children.start("etcd", [
            self.bin("etcd"), "--name=node0", f"--data-dir={self.root / 'etcd'}",
            "--auto-compaction-retention=1", "--quota-backend-bytes=8589934592", "--unsafe-no-fsync",
            f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=node0=http://127.0.0.1:{peer}", "--log-level=warn"])
        self.children.wait_until(child, lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{client}/health", timeout=2).status == 200, START_TIMEOUT, "healthy etcd")

    def apiserver_argv(self) -> list[str]:
        pki = self.pki
        return [
            self.bin("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--etcd-prefix=/registry", "--allow-privileged=true", "--endpoint-reconciler-type=none",
            "--authorization-mode=Node,RBAC", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}", f"--tls-cert-file={pki['admin_crt']}",
            f"--tls-private-key-file={pki['admin_key']}", f"--client-ca-file={pki['ca_crt']}",
            f"--service-account-key-file={pki['admin_key']}",
            f"--service-account-signing-key-file={pki['admin_key']}", f"--service-account-issuer={SA_ISSUER}",
            "--service-cluster-ip-range=10.96.0.0/16",
            f"--proxy-client-cert-file={pki['admin_crt']}", f"--proxy-client-key-file={pki['admin_key']}",
            f"--requestheader-client-ca-file={pki['ca_crt']}", "--requestheader-allowed-names=kubeon-test-admin",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-maxbackup=1",
        ] + (["--enable-aggregator-routing=true"] if self.aggregator_routing else [])

    @property
    def audit_log(self) -> Path:
        return self.root / "logs" / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.root / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(self.audit_policy))
        return path

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The audit log's finished requests (stage ResponseComplete), oldest first; `user` keeps one
        user's (e.g. `system:serviceaccount:kubeon-gpu:kubeon-gpu-optimizer`). kube-apiserver writes an
        event as its response goes out: a caller that must see a request just answered waits for it."""
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:  # the line kube-apiserver is writing right now
                break
        return [e for e in events if e.get("stage") == "ResponseComplete"
                and (user is None or (e.get("user") or {}).get("username") == user)]

    def start_apiserver(self) -> None:
        """Start (or restart, on the same port and etcd) kube-apiserver and wait for /readyz."""
        self.ports.setdefault("apiserver", free_port())
        child = self.children.start("kube-apiserver", self.apiserver_argv(), env={**NO_EGRESS, **self.apiserver_env})
        context = self.ssl_context()
        self.children.wait_until(child, lambda: _https_ok(self.url + "/readyz", context), START_TIMEOUT,
                                 "ready kube-apiserver")

    def _controller_manager(self) -> None:
        port = self.ports["controller-manager"] = free_port()
        child = self.children.start("kube-controller-manager", [
            self.bin("kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--leader-elect=false",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            f"--root-ca-file={self.pki['ca_crt']}", f"--service-account-private-key-file={self.pki['admin_key']}",
            "--node-monitor-grace-period=60s", "--concurrent-gc-syncs=5", *self.controller_manager_args])
        context = ssl.create_default_context(cafile=None)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        self.children.wait_until(child, lambda: _https_ok(f"https://127.0.0.1:{port}/healthz", context),
                                 START_TIMEOUT, "healthy kube-controller-manager")

    def start_scheduler(self, name: str, config: Path) -> int:
        """Start one kube-scheduler process with `config`; wait for its /healthz; return its port."""
        port = self.ports[name] = free_port()
        child = self.children.start(name, [
            self.bin("kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"])
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        self.children.wait_until(child, lambda: _https_ok(f"https://127.0.0.1:{port}/healthz", context),
                                 START_TIMEOUT, f"healthy {name}")
        return port

    def _kwok(self) -> None:
        stages = sorted((self.upstream / "share" / "kwok-stages").glob("*.yaml"))
        config = self.root / "kwok-stages.yaml"
        config.write_text("\n---\n".join(p.read_text() for p in stages))
        port = self.ports["kwok"] = free_port()
        child = self.children.start("kwok", [
            self.bin("kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={config}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--cidr=10.0.0.0/16", "--node-ip=10.0.0.1", "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{port}"])
        self.children.wait_until(child, lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200, START_TIMEOUT, "healthy kwok")

    def _api_ready_for_work(self) -> bool:
        """The default ServiceAccount exists (pods can be created) and kube-system is there."""
        from kubernetes import client, config
        api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        try:
            api.read_namespaced_service_account("default", "default")
            return True
        finally:
            api.api_client.close()

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, api_only: bool = False) -> ControlPlane:
        """Start every component; `api_only`: etcd and kube-apiserver alone (benchmarks that must not
        have the node-lifecycle controller taint nodes no kubelet reports for), with the default
        ServiceAccount made by hand as kube-controller-manager would."""
        began = time.monotonic()
        try:
            self._etcd()
            self.start_apiserver()
            self._write_kubeconfig()
            if api_only:
                self._default_service_account()
            else:
                self._controller_manager()
                self.start_scheduler("kube-scheduler", self.scheduler_config("kube-scheduler"))
                self._kwok()
            self.children.wait_until(self.children.get("kube-apiserver"), self._api_ready_for_work,
                                     START_TIMEOUT, "default ServiceAccount")
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _default_service_account(self) -> None:
        from kubernetes import client, config
        api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        try:
            self.children.wait_until(self.children.get("kube-apiserver"), lambda: api.create_namespaced_service_account(
                "default", {"metadata": {"name": "default"}}) is not None, START_TIMEOUT, "default ServiceAccount")
        finally:
            api.api_client.close()

    def restart_apiserver(self, *, written_meanwhile: bool = False) -> None:
        """Kill kube-apiserver and start it again on the same port and etcd (a fault test).

        `written_meanwhile`: one key written to etcd while it is down, as the
        other writers of a real cluster (leases, events, a second apiserver)
        do. The new watch caches then start past every version a client saw,
        so every watch from before answers 410 Gone; without it, a client
        whose last event was etcd's last write may resume its watch.
        """
        self.children.stop_one(self.children.get("kube-apiserver"), grace=0.1)
        if written_meanwhile:
            self.etcd_put("/kubeon-test/written-while-apiserver-down", str(time.time()))
        self.start_apiserver()

    def etcd_put(self, key: str, value: str) -> None:
        """One key into etcd through its v3 JSON gateway (outside kube-apiserver's /registry prefix)."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                           "value": base64.b64encode(value.encode()).decode()}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports['etcd']}/v3/kv/put", data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            json.loads(response.read())

    def stop(self) -> None:
        self.children.stop()


def scratch_dir(prefix: str = "kubeon-cluster-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove_state(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


__all__ = ["KWOK_ANNOTATION", "ControlPlane", "StartError", "remove_state", "scratch_dir"]
