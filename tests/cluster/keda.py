"""Real KEDA (operator and metrics adapter, scripts/upstream.sh builds both) on the loopback cluster.

- CRDs: ScaledObject, ScaledJob, TriggerAuthentication, ClusterTriggerAuthentication from the
  release the binaries were built from.
- The operator runs out of cluster as a ServiceAccount (`keda/keda-operator`, bound to cluster-admin
  as the chart binds its own ClusterRole), so the audit log names its writes; settings as
  cmd/operator/main.go and pkg/util/env_resolver.go read them: KEDA_CLUSTER_OBJECT_NAMESPACE and
  POD_NAMESPACE (else it reads the in-cluster ServiceAccount file and exits), every port on
  127.0.0.1, certificates from --cert-dir, no cert rotation, webhook and APIService patching off.
- The metrics adapter is served to the aggregation layer as `v1beta1.external.metrics.k8s.io`: the
  APIService points at a selector-less Service whose EndpointSlice holds the adapter's address, and
  kube-apiserver runs with `--enable-aggregator-routing=true` (no kube-proxy: it dials the endpoint).
  An endpoint may not be in 127.0.0.0/8, so the harness makes an address of its own
  (`AdapterNetwork`): a veth pair whose peer lives in a network namespace named after this process;
  the adapter listens on the host end (it must also reach kube-apiserver and the operator, which
  listen on 127.0.0.1 only). Deleting the namespace deletes the pair and its address: `stop`
  does, and a later start deletes the namespaces of processes that are gone (a crashed run).
- The adapter asks the operator for metric values over gRPC with mutual TLS (one certificate from
  the cluster CA, both ends); the operator queries the trigger's source (Prometheus) on each ask.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import random
import re
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.control_plane import START_TIMEOUT, ControlPlane
from tests.cluster.kubeon import apply_objects, ensure_namespace, token_kubeconfig
from tests.cluster.pki import write_serving_pair
from tests.cluster.processes import StartError
from tests.loopback import free_port

NAMESPACE = "keda"
OPERATOR_ACCOUNT = "keda-operator"
ADAPTER_SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
# The /30 blocks the harness takes its addresses from; kube-apiserver reaches them without its
# egress-refusing proxy (control_plane.NO_EGRESS), and only them.
SUBNET = ipaddress.ip_network("10.251.0.0/16")
NETNS_PREFIX = "kubeon-keda-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise StartError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftover_networks() -> list[str]:
    """Delete the network namespaces (and with them their veth pairs) of harness processes that are gone."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(re.escape(NETNS_PREFIX) + r"(\d+)-\d+", name)
        if found and not _alive(int(found.group(1))):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    return removed


@dataclass
class AdapterNetwork:
    """An address of the harness's own, outside 127.0.0.0/8, for the adapter's EndpointSlice."""

    host: str = ""
    netns: str = ""

    def create(self) -> AdapterNetwork:
        remove_leftover_networks()
        used = {line.split()[3].split("/")[0] for line in _ip("-o", "-4", "addr").stdout.splitlines()}
        for _ in range(50):
            block = random.randrange(1, SUBNET.num_addresses // 4)
            host = SUBNET.network_address + 4 * block + 1
            if str(host) in used:
                continue
            index = random.randrange(10**3)
            self.netns = f"{NETNS_PREFIX}{os.getpid()}-{index}"
            veth = f"kk{os.getpid()}-{index}"[:15]
            if _ip("netns", "add", self.netns, check=False).returncode != 0:
                continue
            try:
                _ip("link", "add", veth, "type", "veth", "peer", "name", "adapter0", "netns", self.netns)
                _ip("addr", "add", f"{host}/30", "dev", veth)
                _ip("link", "set", veth, "up")
                _ip("-n", self.netns, "addr", "add", f"{host + 1}/30", "dev", "adapter0")
                _ip("-n", self.netns, "link", "set", "adapter0", "up")
            except StartError:
                self.remove()
                raise
            self.host = str(host)
            return self
        raise StartError("no free /30 in 10.251.0.0/16 for the KEDA metrics adapter")

    def remove(self) -> None:
        if self.netns:
            _ip("netns", "delete", self.netns, check=False)
            self.netns = ""


def crds(plane: ControlPlane) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((plane.upstream / "share" / "keda-crds").glob("*.yaml"))]


def _adapter_objects(ca_pem: bytes, address: str, port: int) -> list[dict[str, Any]]:
    """The APIService, its selector-less Service and the EndpointSlice naming the adapter."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port, "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE,
                      "labels": {"kubernetes.io/service-name": ADAPTER_SERVICE}},
         "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "caBundle": base64.b64encode(ca_pem).decode(),
                  "service": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": 443}}},
    ]


def _operator_account(api: client.ApiClient) -> None:
    apply_objects(api, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kubeon-test-keda-operator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": NAMESPACE}]},
    ])


def start_keda(plane: ControlPlane, api: client.ApiClient, network: AdapterNetwork) -> None:
    """Apply the CRDs, start the operator and the adapter, wait for the APIService to be Available."""
    from tests.cluster.karpenter import _wait_established

    docs = crds(plane)
    apply_objects(api, docs)
    _wait_established(api, [d["metadata"]["name"] for d in docs])
    ensure_namespace(api, NAMESPACE)
    _operator_account(api)
    certs = write_serving_pair(plane.root / "keda-certs", plane.root / "pki", ADAPTER_SERVICE,
                               [f"{ADAPTER_SERVICE}.{NAMESPACE}.svc", f"keda-operator.{NAMESPACE}.svc"],
                               ["127.0.0.1", network.host])
    cert_dir = certs["ca_crt"].parent
    kubeconfig = token_kubeconfig(plane, api, OPERATOR_ACCOUNT, NAMESPACE, plane.root / "keda-operator.kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE, "POD_NAMESPACE": NAMESPACE,
           "WATCH_NAMESPACE": ""}
    grpc, health = free_port(), free_port()
    plane.ports["keda-operator-health"] = health
    operator = plane.children.start("keda-operator", [
        plane.bin("keda-operator"), f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{health}", f"--metrics-service-bind-address=127.0.0.1:{grpc}",
        f"--cert-dir={cert_dir}", "--enable-cert-rotation=false", "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false", f"--ca-dir={cert_dir}", "--zap-log-level=info"], env=env)
    plane.children.wait_until(operator, lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200, START_TIMEOUT, "ready KEDA operator")
    port = plane.ports["keda-adapter"] = free_port()
    # The adapter as kube-apiserver's client (delegated authentication and authorization) and as
    # the lister of ScaledObjects: the admin kubeconfig, as the operator's cluster-admin binding allows.
    admin = str(plane.kubeconfig)
    adapter = plane.children.start("keda-adapter", [
        plane.bin("keda-adapter"), f"--secure-port={port}", f"--bind-address={network.host}",
        f"--cert-dir={cert_dir}", f"--tls-cert-file={certs['tls_crt']}", f"--tls-private-key-file={certs['tls_key']}",
        f"--lister-kubeconfig={admin}", f"--authentication-kubeconfig={admin}",
        f"--authorization-kubeconfig={admin}", f"--metrics-service-address=127.0.0.1:{grpc}",
        f"--port={free_port()}", "--zap-log-level=info"], env={**env, "KUBECONFIG": admin})
    apply_objects(api, _adapter_objects(certs["ca_crt"].read_bytes(), network.host, port))
    plane.children.wait_until(adapter, lambda: api_service_available(api), START_TIMEOUT,
                              f"APIService {API_SERVICE} Available")


def api_service_available(api: client.ApiClient) -> bool:
    try:
        obj = client.ApiregistrationV1Api(api).read_api_service(API_SERVICE)
    except ApiException:
        return False
    return any(c.type == "Available" and c.status == "True" for c in (obj.status.conditions or []))


__all__ = ["API_SERVICE", "NAMESPACE", "AdapterNetwork", "api_service_available", "remove_leftover_networks",
           "start_keda"]
