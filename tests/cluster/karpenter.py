"""Real Karpenter (core, with its KWOK cloud provider) on the loopback cluster.

- CRDs: NodePool, NodeClaim, NodeOverlay and KWOKNodeClass from the Karpenter module the binary was
  built from (scripts/upstream.sh copies them; the KWOKNodeClass file is a symlink in the chart,
  which module zips drop, so it comes from kwok/apis/crds). The KWOKNodeClass CRD defaults its
  Ready condition, which is what makes a NodePool Ready (no controller sets it).
- Instance types: one per row of vendor/openb/instances.csv (or another catalog of the same columns,
  e.g. the controller's gpupolicy/capacity/data/aws-gpu-instances.csv: `Cluster(karpenter_instances=...)`),
  with its GPUs as `nvidia.com/gpu`, its CPU, memory and on-demand price, in one zone; the provider
  turns them into NodeClaims and KWOK nodes whose allocatable carries the GPUs.
- Settings by environment, as its chart sets them (pkg/operator/options): no leader election,
  metrics and health on free loopback-chosen ports, short batching windows for tests; LOG_LEVEL info,
  or KUBEON_KARPENTER_LOG_LEVEL (debug: each consolidation candidate and abandoned command).
"""

from __future__ import annotations

import csv
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.cluster.control_plane import START_TIMEOUT, ControlPlane
from tests.cluster.kubeon import apply_objects
from tests.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
# Karpenter's provisioning batch windows here: shorter than its defaults (1 s, 10 s) for test speed; the
# model of Karpenter is given the same when it is calibrated against this one (bench/capacity_live.py)
BATCH_IDLE_SECONDS = 0.5
BATCH_MAX_SECONDS = 2.0
# what the KWOK provider reserves on every node it makes (kwok/cloudprovider/helpers.go, KubeReserved):
# a node's allocatable is its type's CPU and memory less these
KWOK_RESERVED_CPU_MILLI = 100
KWOK_RESERVED_MEMORY_MIB = 10
INSTANCES = REPO / "vendor" / "openb" / "instances.csv"
NODE_CLASS = "default"
ZONE = "test-zone-a"


def instance_types(csv_path: Path = INSTANCES) -> list[dict[str, Any]]:
    """The KWOK provider's instance-type JSON (kwok/cloudprovider/helpers.go InstanceTypeOptions)."""
    out = []
    with open(csv_path, newline="") as fh:
        for row in csv.DictReader(fh):
            resources = {"cpu": f"{int(row['cpu_milli'])}m", "memory": f"{int(row['memory_mib'])}Mi",
                         "pods": "110", "ephemeral-storage": "200Gi"}
            if int(row["gpus"]) > 0:
                resources["nvidia.com/gpu"] = row["gpus"]
            out.append({"name": row["instance_type"], "architecture": "amd64", "operatingSystems": ["linux"],
                        "resources": resources, "offerings": [{
                            "Price": float(row["price_per_hour"]), "Available": True, "Requirements": [
                                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]}]}]})
    return out


def node_class(registration_delay: str = "1s") -> dict[str, Any]:
    return {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
            "metadata": {"name": NODE_CLASS}, "spec": {"nodeRegistrationDelay": registration_delay}}


def node_class_ref() -> dict[str, str]:
    return {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS}


def start_karpenter(plane: ControlPlane, api: client.ApiClient, registration_delay: str = "1s",
                    instances: Path = INSTANCES) -> None:
    crds = sorted((plane.upstream / "share" / "karpenter-crds").glob("*.yaml"))
    apply_objects(api, [yaml.safe_load(p.read_text()) for p in crds])
    _wait_established(api, [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crds])
    apply_objects(api, [node_class(registration_delay)])
    types = plane.root / "karpenter-instance-types.json"
    types.write_text(json.dumps(instance_types(instances), indent=1))
    metrics, health = free_port(), free_port()
    plane.ports["karpenter-health"] = health
    child = plane.children.start("karpenter", [plane.bin("karpenter-kwok")], env={
        "KUBECONFIG": str(plane.kubeconfig), "DISABLE_LEADER_ELECTION": "true",
        "INSTANCE_TYPES_FILE_PATH": str(types), "METRICS_PORT": str(metrics), "HEALTH_PROBE_PORT": str(health),
        "SYSTEM_NAMESPACE": "kube-system", "BATCH_MAX_DURATION": f"{BATCH_MAX_SECONDS:g}s",
        "BATCH_IDLE_DURATION": f"{BATCH_IDLE_SECONDS:g}s",
        "LOG_LEVEL": os.environ.get("KUBEON_KARPENTER_LOG_LEVEL", "info")})
    plane.children.wait_until(child, lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200, START_TIMEOUT, "ready Karpenter")


def _wait_established(api: client.ApiClient, names: list[str], timeout: float = 30.0) -> None:
    import time
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout}s")
            time.sleep(0.1)
