"""AdmissionReview payloads shaped as kube-apiserver sends them (k8s.io/api/admission/v1).

The Pod is what a webhook really receives for a Deployment's pod on CREATE:
generateName and no name, the namespace only in the request, API defaults
already applied (schedulerName default-scheduler, requests copied from
limits, DefaultTolerationSeconds tolerations, service-account volume).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

USER_INFO = {
    "username": "system:serviceaccount:kube-system:replicaset-controller",
    "uid": "4f6b3a1e-2f5e-4a83-9a9e-0d6c1b2a7e11",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
}


def api_pod(gpus: str = "1", *, resource: str = "nvidia.com/gpu", annotations: dict | None = None,
            labels: dict | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "generateName": "llm-5f7b9c6d8-",
        "creationTimestamp": None,
        "labels": {"app": "llm", "pod-template-hash": "5f7b9c6d8", **(labels or {})},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llm-5f7b9c6d8",
                             "uid": "0b9f5c1e-7d1a-4c2b-8e3f-5a6b7c8d9e0f", "controller": True,
                             "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                           "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}], "defaultMode": 420}}],
            "containers": [{
                "name": "server",
                "image": "vllm/vllm-openai:v0.6.3",
                "resources": {"limits": {resource: gpus, "memory": "16Gi"},
                              "requests": {resource: gpus, "memory": "16Gi", "cpu": "2"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def review(obj: Any, *, namespace: str = "inference", operation: str = "CREATE", group: str = "",
           version: str = "v1", kind: str = "Pod", resource: str = "pods", name: str = "",
           old: Any = None, uid: str | None = None) -> dict[str, Any]:
    """An AdmissionReview request exactly as the API server posts it."""
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    options_kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk, "resource": gvr, "requestKind": copy.deepcopy(gvk), "requestResource": copy.deepcopy(gvr),
        "name": name, "operation": operation, "userInfo": USER_INFO,
        "object": obj, "oldObject": old, "dryRun": False,
        "options": {"kind": options_kind.get(operation, "CreateOptions"), "apiVersion": "meta.k8s.io/v1"},
    }
    if namespace:
        request["namespace"] = namespace
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def policy_review(policy: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return review(policy, namespace="", operation=operation, group="gpu.kubeon.io", version="v1alpha1",
                  kind="GpuPolicy", resource="gpupolicies", name=policy["metadata"]["name"])


SHARE = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "share-inference"},
         "spec": {"mode": "Automatic", "priority": 10, "selector": {"namespaces": ["inference"]},
                  "schedulerName": "kubeon-gpu-scheduler",
                  "sharing": {"strategy": "MIG", "migProfile": "auto", "gpuMemory": "8Gi"}}}
NOTEBOOKS = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "notebooks"},
             "spec": {"mode": "Recommend", "selector": {"namespaces": ["research"]},
                      "sharing": {"strategy": "TimeSlicing"}}}
GUARD = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "max-two"},
         "spec": {"mode": "Automatic", "selector": {"namespaces": ["training"]},
                  "guardrail": {"maxGpusPerPod": 2}}}
POLICIES = [SHARE, NOTEBOOKS, GUARD]
