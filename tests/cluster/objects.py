"""Builders for the objects a test cluster holds: GPU nodes, pods, workloads, PDBs, NodeClaims.

Nodes carry the labels GPU Feature Discovery (GFD) and the NVIDIA device plugin
put on real nodes, so the webhook, the extender and the controller read them
the way they read a live cluster: `nvidia.com/gpu.product` (model name as GFD
prints it), `.count`, `.memory` (MiB), `nvidia.com/mig.strategy`, and per MIG
profile `nvidia.com/mig-<p>.count|.memory|.product|.slices.gi|.slices.ci`,
with the matching extended resources in capacity and allocatable.

Everything here is pure: builders return plain dicts in wire format (what
`kubectl get -o json` shows), ready to be sent with the `kubernetes` client.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupolicy.catalog import DEFAULT_CATALOG, GPU_RESOURCE, SHARED_GPU_RESOURCE, Catalog

VENDOR = Path(__file__).resolve().parents[2] / "vendor"  # upstream files, copied in (vendor/README.md)
OPENB_NODES_CSV = VENDOR / "openb" / "openb_node_list_gpu_node.csv"
CRD_DIR = VENDOR / "crds"
NODECLAIM_CRD = CRD_DIR / "karpenter.sh_nodeclaims.yaml"
NODEPOOL_CRD = CRD_DIR / "karpenter.sh_nodepools.yaml"
SCALEDOBJECT_CRD = CRD_DIR / "keda.sh_scaledobjects.yaml"

DEFAULT_SCHEDULER = "kubeon-gpu-scheduler"

# openb's model codes -> the product label GFD would print. G1/G2/G3 are
# undisclosed in the trace: they get an explicit made-up product with no MIG.
OPENB_PRODUCTS: dict[str, tuple[str, int]] = {
    "P100": ("Tesla-P100-PCIE-16GB", 16280),
    "T4": ("Tesla-T4", 15360),
    "V100M16": ("Tesla-V100-SXM2-16GB", 16384),
    "V100M32": ("Tesla-V100-SXM2-32GB", 32768),
    "A10": ("NVIDIA-A10", 23028),
    "G1": ("OPENB-G1", 16384),
    "G2": ("OPENB-G2", 16384),
    "G3": ("OPENB-G3", 32768),
}


def gfd_labels(
    product: str,
    gpus: int,
    *,
    memory_mib: int | None = None,
    mig: Mapping[str, int] | None = None,
    shared_replicas: int = 1,
    catalog: Catalog = DEFAULT_CATALOG,
) -> tuple[dict[str, str], dict[str, str]]:
    """GFD labels and device-plugin resources for `gpus` GPUs of `product`.

    `mig` is the layout of *each* GPU (mixed strategy, every GPU partitioned
    alike, as `nvidia.com/mig.config=all-...` does): {"1g.10gb": 7} on 8 GPUs
    advertises 56 `nvidia.com/mig-1g.10gb`. `shared_replicas` > 1 is
    time-slicing with renameByDefault: `nvidia.com/gpu.shared`, product
    suffixed `-SHARED`. Returns (labels, resources). Pure.
    """
    if mig and shared_replicas > 1:
        raise ValueError("one sharing method per node: MIG or time-slicing, not both")
    known = catalog.product(product)
    memory = memory_mib if memory_mib is not None else (known.memory_mib if known else 0)
    labels: dict[str, str] = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product + ("-SHARED" if shared_replicas > 1 else ""),
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.replicas": str(shared_replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if shared_replicas > 1 else "none",
        "nvidia.com/mig.capable": "true" if known and known.mig_capable else "false",
        # GFD prints the cluster's strategy (the GPU Operator's ClusterPolicy mig.strategy) on every node,
        # MIG mode on or off: kubeon's MIG slices need `mixed`, whose per-profile resources it asks for
        "nvidia.com/mig.strategy": "mixed",
    }
    if memory:
        labels["nvidia.com/gpu.memory"] = str(memory)
    resources: dict[str, str] = {}
    if mig:
        if known is None or not known.mig_capable:
            raise ValueError(f"{product} is not MIG capable in the catalog")
        labels["nvidia.com/mig.config"] = "custom"
        labels["nvidia.com/mig.config.state"] = "success"
        used = 0
        for name, per_gpu in mig.items():
            profile = known.profile(name)
            if profile is None:
                raise ValueError(f"{product} has no MIG profile {name!r}")
            if per_gpu > profile.max_instances:
                raise ValueError(f"{name}: at most {profile.max_instances} per {product}")
            used += profile.memory_slices * per_gpu
            resource = profile.resource_name
            labels[f"{resource}.count"] = str(per_gpu * gpus)
            labels[f"{resource}.memory"] = str(profile.memory_mib)
            labels[f"{resource}.product"] = f"{product}-MIG-{profile.name}"
            labels[f"{resource}.replicas"] = "1"
            labels[f"{resource}.slices.gi"] = str(profile.compute_slices)
            labels[f"{resource}.slices.ci"] = str(profile.compute_slices)
            resources[resource] = str(per_gpu * gpus)
        if used > known.memory_slices:
            raise ValueError(f"MIG layout {dict(mig)} needs {used} memory slices, a GPU has {known.memory_slices}")
    elif shared_replicas > 1:
        resources[SHARED_GPU_RESOURCE] = str(gpus * shared_replicas)
    else:
        resources[GPU_RESOURCE] = str(gpus)
    return labels, resources


def make_node(
    name: str,
    product: str | None = "NVIDIA-A100-SXM4-80GB",
    gpus: int = 8,
    *,
    cpu: str = "96",
    memory: str = "1024Gi",
    pods: str = "110",
    mig: Mapping[str, int] | None = None,
    shared_replicas: int = 1,
    gpu_memory_mib: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    gpu_taint: bool = False,
    unschedulable: bool = False,
    instance_type: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
) -> dict[str, Any]:
    """A Ready v1 Node; `product=None` or `gpus=0` makes a CPU-only node.

    `gpu_taint` taints the node with each GPU resource it advertises
    (`<resource>:NoSchedule`), which is what the ExtendedResourceToleration
    admission plugin's tolerations match on EKS and GKE.
    """
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if instance_type:
        node_labels["node.kubernetes.io/instance-type"] = instance_type
    resources: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": pods}
    node_taints = [dict(t) for t in taints]
    if product and gpus > 0:
        gpu_labels, gpu_resources = gfd_labels(
            product, gpus, memory_mib=gpu_memory_mib, mig=mig, shared_replicas=shared_replicas, catalog=catalog
        )
        node_labels.update(gpu_labels)
        resources.update(gpu_resources)
        if gpu_taint:
            node_taints += [{"key": r, "effect": "NoSchedule"} for r in sorted(gpu_resources)]
    node_labels.update(labels or {})
    spec: dict[str, Any] = {}
    if node_taints:
        spec["taints"] = node_taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test cluster node"}],
            "nodeInfo": {"kubeletVersion": "v1.35.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "osImage": "test", "kernelVersion": "6.1.0",
                         "containerRuntimeVersion": "containerd://2.0.0", "machineID": name, "systemUUID": name,
                         "bootID": name},
        },
    }


def nodes_from_openb(
    path: str | Path = OPENB_NODES_CSV,
    *,
    limit: int | None = None,
    names: Iterable[str] | None = None,
    models: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Nodes from the openb node list (`sn,cpu_milli,memory_mib,gpu,model`), optionally a subset.

    `names` keeps those serial numbers, `models` those model codes, `limit`
    the first N rows left after filtering (file order, so subsets are stable).
    """
    wanted_names = set(names) if names is not None else None
    wanted_models = set(models) if models is not None else None
    nodes: list[dict[str, Any]] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if wanted_names is not None and row["sn"] not in wanted_names:
                continue
            if wanted_models is not None and row["model"] not in wanted_models:
                continue
            product, gpu_memory = OPENB_PRODUCTS.get(row["model"], (f"OPENB-{row['model']}", 0))
            nodes.append(make_node(
                row["sn"], product, int(row["gpu"]),
                cpu=f"{int(row['cpu_milli'])}m", memory=f"{int(row['memory_mib'])}Mi",
                gpu_memory_mib=gpu_memory or None, labels={"openb.io/model": row["model"]},
            ))
            if limit is not None and len(nodes) >= limit:
                break
    return nodes


def nodes_from_yaml(source: str | Path) -> list[dict[str, Any]]:
    """Nodes from YAML: full v1 Node documents, or short specs given to `make_node`.

    A short spec is a mapping without `kind`, e.g.
    `{name: a100-0, product: NVIDIA-A100-SXM4-80GB, gpus: 8, mig: {1g.10gb: 7}}`;
    a document may also be a list of them or a v1 List.
    """
    is_path = isinstance(source, Path) or ("\n" not in source and Path(source).is_file())
    text = Path(source).read_text() if is_path else str(source)
    nodes: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(io.StringIO(text)):
        if doc is None:
            continue
        items = doc if isinstance(doc, list) else doc.get("items", [doc]) if doc.get("kind") == "List" else [doc]
        for item in items:
            if item.get("kind") == "Node":
                nodes.append(item)
            else:
                spec = dict(item)
                nodes.append(make_node(spec.pop("name"), **spec))
    return nodes


def resources_of(gpus: int = 0, gpu_resource: str = GPU_RESOURCE, cpu: str = "100m", memory: str = "128Mi",
                 extra: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """A container's `resources`: extended resources get request == limit, as the API requires."""
    requests = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        requests[gpu_resource] = limits[gpu_resource] = str(gpus)
    for key, value in (extra or {}).items():
        requests[key] = limits[key] = value
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def pod_spec(
    *,
    gpus: int = 0,
    gpu_resource: str = GPU_RESOURCE,
    cpu: str = "100m",
    memory: str = "128Mi",
    extra_resources: Mapping[str, str] | None = None,
    scheduler_name: str | None = DEFAULT_SCHEDULER,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    affinity: Mapping[str, Any] | None = None,
    image: str = "registry.k8s.io/pause:3.10",
) -> dict[str, Any]:
    """A one-container pod spec; the default schedulerName is the optimizer's second scheduler."""
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": image,
                        "resources": resources_of(gpus, gpu_resource, cpu, memory, extra_resources)}],
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if affinity:
        spec["affinity"] = dict(affinity)
    return spec


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    **spec_args: Any,
) -> dict[str, Any]:
    """A v1 Pod; keyword arguments go to `pod_spec` (gpus=1, cpu="2", node_selector=...)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {"app": name})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec(**spec_args)}


def required_node_affinity(*expressions: Mapping[str, Any]) -> dict[str, Any]:
    """`affinity` with one required nodeSelectorTerm made of these matchExpressions."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [dict(e) for e in expressions]}]}}}


def _template(app: str, labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None,
              spec_args: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": {"app": app, **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "spec": pod_spec(**spec_args)}


def make_deployment(
    name: str,
    namespace: str = "default",
    replicas: int = 1,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    **spec_args: Any,
) -> dict[str, Any]:
    """An apps/v1 Deployment selecting `app=<name>`; keyword arguments shape its pods (`pod_spec`)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": name, **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": _template(name, labels, pod_annotations, spec_args)},
    }


def make_statefulset(
    name: str,
    namespace: str = "default",
    replicas: int = 1,
    *,
    labels: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    **spec_args: Any,
) -> dict[str, Any]:
    """An apps/v1 StatefulSet selecting `app=<name>` (serviceName = name)."""
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name, **(labels or {})}},
        "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                 "template": _template(name, labels, pod_annotations, spec_args)},
    }


def make_pdb(name: str, namespace: str = "default", *, match_labels: Mapping[str, str],
             min_available: int | str | None = None, max_unavailable: int | str | None = None) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget (give exactly one of min_available / max_unavailable)."""
    spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def make_nodepool(name: str = "gpu", *, instance_types: Sequence[str] = ("p4d.24xlarge",),
                  gpu_limit: int | None = None, taints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A karpenter.sh/v1 NodePool offering these instance types."""
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                          "values": list(instance_types)}],
    }
    if taints:
        template_spec["taints"] = [dict(t) for t in taints]
    spec: dict[str, Any] = {"template": {"spec": template_spec},
                            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "1m"}}
    if gpu_limit is not None:
        spec["limits"] = {GPU_RESOURCE: str(gpu_limit)}
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}


def make_nodeclaim(name: str, instance_type: str = "p4d.24xlarge", *, nodepool: str = "gpu",
                   labels: Mapping[str, str] | None = None,
                   taints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A karpenter.sh/v1 NodeClaim asking for one instance type, as Karpenter creates them."""
    spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [instance_type]},
                         {"key": "karpenter.sh/nodepool", "operator": "In", "values": [nodepool]}],
    }
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": nodepool, **(labels or {})}},
            "spec": spec}
