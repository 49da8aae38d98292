"""Run a pod's container as a local process: the part of a kubelet the loopback cluster lacks.

KWOK marks a pod Running without running anything. For the optimizer's own pods a test can do
what a kubelet would: the chart's images run `kubeon-gpu <args>`; here the same arguments, taken
from the pod kube-controller-manager created from the chart's Deployment, run as
`python -m cli.main <args>`: secret volumes become directories holding the secret's items (read
from the API server), emptyDirs empty directories (paths in args rewritten to them),
`--port`/`--*-port` get free local ports bound to 127.0.0.1, env values and
`fieldRef: metadata.name` are passed, and `--kubeconfig` carries a TokenRequest token of the pod's
ServiceAccount (what the kubelet would mount), so the chart's RBAC is what the process may do.
The process output is its log file (`Child.log`), what `kubectl logs` would show with a kubelet.
"""

from __future__ import annotations

import base64
import re
import ssl
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.cluster.cluster import Cluster
from tests.cluster.control_plane import START_TIMEOUT
from tests.cluster.kubeon import REPO, token_kubeconfig
from tests.cluster.processes import Child
from tests.loopback import free_port

_BIND_FLAG = {"webhook": "--bind", "extender": "--bind", "controller": "--health-bind"}


def run_in_place(cluster: Cluster, pod: dict[str, Any], workdir: Path, health_path: str = "/readyz",
                 health_port_flag: str = "--health-port", tls: bool = False,
                 network: dict[str, str] | None = None) -> tuple[Child, dict[str, int]]:
    """Start the pod's first container; returns the process and its local ports by container port.
    `network`: environment of the node's network (egress proxy, trusted CAs), not the pod's."""
    meta, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    root = workdir / meta["name"]
    mounts = _volumes(cluster, meta["namespace"], spec, container, root)
    args, ports, flags = [], {}, {}
    for arg in container.get("args") or []:
        flag, _, value = arg.partition("=")
        if re.fullmatch(r"--(\w+-)?port", flag) and value.isdigit():
            ports[int(value)] = flags[flag] = free_port()
            arg = f"{flag}={flags[flag]}"
        for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                arg = f"{flag}={local}{value[len(mount_path):]}"
                break
        args.append(arg)
    command = args[0] if args else ""
    if command in _BIND_FLAG:
        args += [_BIND_FLAG[command], "127.0.0.1"]
    account = spec.get("serviceAccountName") or "default"
    kubeconfig = token_kubeconfig(cluster.plane, cluster.api_client, account, meta["namespace"], root / "kubeconfig")
    args += ["--kubeconfig", str(kubeconfig)]
    env = {"PYTHONUNBUFFERED": "1", **(network or {})}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = meta["name"]
    port = flags.get(health_port_flag) or flags.get("--port")
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}{health_path}"
    child = cluster.plane.children.start(meta["name"], [sys.executable, "-m", "cli.main", *args], env=env, cwd=REPO)
    cluster.plane.children.wait_until(child, lambda: _probe(url), START_TIMEOUT, f"healthy {url}")
    return child, ports


def _probe(url: str) -> bool:
    """A kubelet-style probe: HTTP(S) GET, 200 wanted, the serving certificate not verified."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=context) as response:  # loopback only
        return bool(response.status == 200)


def _volumes(cluster: Cluster, namespace: str, spec: dict[str, Any], container: dict[str, Any],
             root: Path) -> dict[str, Path]:
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    out: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"]) or {}
        local = root / "volumes" / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            secret = cluster.core.read_namespaced_secret(volume["secret"]["secretName"], namespace).data or {}
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in secret]
            for item in items:
                (local / item["path"]).write_bytes(base64.b64decode(secret[item["key"]]))
        out[mount["mountPath"]] = local
    return out
