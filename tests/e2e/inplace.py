"""Run a pod's container as a local process: the part of a kubelet the test cluster lacks.

The chart's images run `kubeon-gpu <args>`; here the same arguments, taken from the pod the
workload stand-in created from the chart's Deployment, run as `python -m cli.main <args>`:
secret volumes become directories holding the secret's items, emptyDirs empty directories (paths
in args rewritten to them), `--port`/`--*-port` get free local ports bound to 127.0.0.1, env
values and `fieldRef: metadata.name` are passed, and `--kubeconfig` points at the test
cluster (in place of the in-cluster service account). The process output is the pod's log
(`api.logs`), so `kubectl logs` shows what the real component printed.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Process, start_process
from tests.kubeapi.cluster import Cluster
from tests.loopback import free_port

_BIND_FLAG = {"webhook": "--bind", "extender": "--bind", "controller": "--health-bind"}


def run_in_place(cluster: Cluster, pod: dict[str, Any], workdir: Path, health_path: str = "/readyz",
                 health_port_flag: str = "--health-port", tls: bool = False,
                 network: dict[str, str] | None = None) -> tuple[Process, dict[str, int]]:
    """Start the pod's first container; returns the process and its ports by flag name.
    `network`: environment of the node's network (egress proxy, trusted CAs), not the pod's."""
    meta, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    root = workdir / meta["name"]
    mounts = _volumes(cluster, meta["namespace"], spec, container, root)
    args, ports = [], {}
    for arg in container.get("args") or []:
        flag, _, value = arg.partition("=")
        if re.fullmatch(r"--(\w+-)?port", flag) and value.isdigit():
            ports[flag] = free_port()
            arg = f"{flag}={ports[flag]}"
        for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                arg = f"{flag}={local}{value[len(mount_path):]}"
                break
        args.append(arg)
    command = args[0] if args else ""
    if command in _BIND_FLAG:
        args += [_BIND_FLAG[command], "127.0.0.1"]
    args += ["--kubeconfig", cluster.kubeconfig]
    env = dict(network or {})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = meta["name"]
    port = ports.get(health_port_flag) or ports.get("--port")
    scheme = "https" if tls else "http"
    process = start_process(meta["name"], args, f"{scheme}://127.0.0.1:{port}{health_path}", root,
                            verify=False, env=env)  # kubelet probes do not verify TLS either
    cluster.api.logs.write(meta["namespace"], meta["name"], process.log)
    return process, ports


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
