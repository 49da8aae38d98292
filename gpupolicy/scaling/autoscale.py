"""GPU-utilisation autoscaling as a KEDA ScaledObject, and the per-workload DCGM query text. Pure.

The optimizer does not autoscale by itself: for a policy with
`scaleToZero.autoscale: {targetUtilizationPercent, min, max}` it writes the
KEDA ScaledObject that does (seed 002's pattern), or shows it as the
proposal in Recommend. This module builds that object; the controller
creates, compares and updates it.

The PromQL text lives here because two callers must agree on it: the
scale-to-zero reconciler reads the workload's utilisation with it, and the
ScaledObject's prometheus trigger hands it to KEDA.

Why `metricType: Value` with an average: KEDA's prometheus scaler feeds an
External metric to the HPA. With the default `AverageValue` the HPA treats
the query's result as a total and wants ceil(result / threshold) replicas,
which for an average is wrong (80% average over 4 pods would ask for 2).
With `Value` the HPA computes ceil(replicas * average / target): the same
rule as CPU utilisation targets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from gpupolicy.model import AutoscaleSpec, GpuPolicy
from gpupolicy.scaling.scaletozero import selects

KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_KIND = "ScaledObject"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubeon-gpu-optimizer"
POLICY_LABEL = "gpu.kubeon.io/policy"
TARGET_LABEL = "gpu.kubeon.io/target"

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"

# pod-template-hash and the ReplicaSet's pod suffix use this alphabet (k8s.io/apimachinery rand).
_HASH = "[bcdfghjklmnpqrstvwxz2456789]"


def pod_regex(kind: str, name: str) -> str:
    """A PromQL (RE2, fully anchored) regex for the pod names a workload's pods get.

    Deployment pods are `<name>-<pod-template-hash>-<5 chars>`; StatefulSet
    pods `<name>-<ordinal>`. Two fixed segments keep `llm` from matching
    `llm-big`'s pods. Pure.
    """
    base = re.escape(name)
    if kind == "StatefulSet":
        return f"{base}-[0-9]+"
    return f"{base}-{_HASH}{{1,10}}-{_HASH}{{5}}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def workload_matcher(kind: str, namespace: str, name: str, extra: str = "") -> str:
    """The label matcher `{namespace="..", pod=~".."}` for a workload's pods (pure)."""
    parts = [f"namespace={_quote(namespace)}", f"pod=~{_quote(pod_regex(kind, name))}"]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


def utilization_expr(kind: str, namespace: str, name: str, *, window: str | None = None) -> str:
    """Per-GPU utilisation (%) of a workload's pods: whole GPUs and MIG slices together.

    GPU_UTIL is not reported for MIG instances, so MIG series
    (GPU_I_PROFILE set) use GR_ENGINE_ACTIVE (0..1) * 100. With `window`,
    each series is its max over that window (so a hole in the samples shows
    as a missing point, not as a value carried over by the lookback). Pure.
    """
    whole = f"{GPU_UTIL}{workload_matcher(kind, namespace, name)}"
    mig = f"{GR_ENGINE_ACTIVE}{workload_matcher(kind, namespace, name, 'GPU_I_PROFILE!=' + _quote(''))}"
    if window:
        whole = f"max_over_time({whole}[{window}])"
        mig = f"max_over_time({mig}[{window}])"
    return f"({whole} or ({mig} * 100))"


def workload_max_utilization_query(kind: str, namespace: str, name: str, window: str) -> str:
    """The workload's utilisation for scale to zero: max over its pods' GPUs (pure)."""
    return f"max({utilization_expr(kind, namespace, name, window=window)})"


def workload_avg_utilization_query(kind: str, namespace: str, name: str) -> str:
    """The workload's utilisation for autoscaling: average over its pods' GPUs (pure)."""
    return f"avg({utilization_expr(kind, namespace, name)})"


def scaled_object_name(workload_name: str) -> str:
    return f"kubeon-gpu-{workload_name}"[:253]


def scaled_object(
    *,
    policy_name: str,
    kind: str,
    namespace: str,
    name: str,
    spec: AutoscaleSpec,
    server_address: str,
) -> dict[str, Any]:
    """The KEDA ScaledObject autoscaling `kind/namespace/name` on GPU utilisation (pure).

    Labelled with the policy that owns it so the controller can find, update
    and delete what it made (a GpuPolicy is cluster-wide, so an
    ownerReference from a namespaced object cannot point at it).

    `restoreToOriginalReplicaCount`: when the policy goes and we delete the
    object, KEDA puts back the replica count the workload had when KEDA took
    it over (its status.originalReplicaCount); without it the workload stays
    at whatever KEDA's HPA last set (found on real KEDA v2.20.2).
    """
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": KEDA_KIND,
        "metadata": {
            "name": scaled_object_name(name),
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                POLICY_LABEL: policy_name,
                TARGET_LABEL: f"{kind}.{name}"[:63],
            },
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
            "minReplicaCount": spec.min,
            "maxReplicaCount": spec.max,
            "advanced": {"restoreToOriginalReplicaCount": True},
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "gpu-utilization",
                    "metricType": "Value",
                    "metadata": {
                        "serverAddress": server_address,
                        "query": workload_avg_utilization_query(kind, namespace, name),
                        "threshold": str(spec.target_utilization_percent),
                    },
                }
            ],
        },
    }


def differs(desired: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """True when the live object's spec or our labels differ from what we want (pure).

    Fields the API server or KEDA add (status, defaults we did not set) are
    not differences: only the keys we set are compared.
    """

    def covers(want: Any, have: Any) -> bool:
        if isinstance(want, Mapping):
            return isinstance(have, Mapping) and all(covers(v, have.get(k)) for k, v in want.items())
        if isinstance(want, list):
            return (
                isinstance(have, list)
                and len(want) == len(have)
                and all(covers(w, h) for w, h in zip(want, have, strict=True))
            )
        return bool(want == have)

    labels = desired.get("metadata", {}).get("labels", {})
    have_labels = (current.get("metadata") or {}).get("labels") or {}
    return not (covers(desired.get("spec"), current.get("spec")) and covers(labels, have_labels))


UNSET_SERVER = "http://prometheus.invalid:9090"  # serverAddress shown when no Prometheus URL is known
WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def offers(obj: Mapping[str, Any], policies: Iterable[GpuPolicy],
           server_address: str = UNSET_SERVER) -> list[dict[str, str]]:
    """The ScaledObject a ScaleToZero policy with `autoscale` wants for this workload, as the
    recommendation the controller offers while KEDA writes are off (pure).

    The same claim as the controller's: the first ScaleToZero policy (highest priority, then name)
    that selects the workload owns it; [] when that policy has no `autoscale`, or none selects it.
    Each offer: `policy`, `name` (the ScaledObject's) and `yaml` (to `kubectl apply -f -`).
    """
    kind = obj.get("kind")
    meta = obj.get("metadata") or {}
    if kind not in WORKLOAD_KINDS or not isinstance(meta, Mapping):
        return []
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    ordered = sorted((p for p in policies if p.spec.scale_to_zero is not None),
                     key=lambda p: (-p.spec.priority, p.name))
    for policy in ordered:
        spec = policy.spec.scale_to_zero
        assert spec is not None
        if not selects(spec, namespace, labels or {}):
            continue
        if spec.autoscale is None:
            return []
        desired = scaled_object(policy_name=policy.name, kind=str(kind), namespace=namespace, name=name,
                                spec=spec.autoscale, server_address=server_address)
        return [{"policy": policy.name, "name": desired["metadata"]["name"], "yaml": scaled_object_yaml(desired)}]
    return []


def targets(scaled_object_obj: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) a ScaledObject scales; kind defaults to Deployment like KEDA's (pure)."""
    ref = (scaled_object_obj.get("spec") or {}).get("scaleTargetRef") or {}
    return str(ref.get("kind") or "Deployment"), str(ref.get("name") or "")


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def scaled_object_yaml(obj: Mapping[str, Any]) -> str:
    """The ScaledObject as YAML to `kubectl apply -f -` (offered when the controller may not write it)."""
    return yaml.dump(dict(obj), Dumper=_NoAliases, sort_keys=False, default_flow_style=False)
