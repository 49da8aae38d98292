"""RBAC and pod security of what the chart installs, read from real `helm template` output.

Real: helm 4 renders the chart with the install guide's values; rules are
compared rule by rule with the guide's Permissions section, vendored as
vendor/guide/permissions.yaml, and every container's securityContext is read from the render.
Faked: nothing; no API server evaluates the rules here (the apply test in
test_manifests.py loads them into the test API server).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from tests.install.chart import GUIDE_SET, NAMESPACE, find, helm_template_cmd, one, pod_specs, render, rule_triples, run

GUIDE = Path(__file__).resolve().parents[2] / "vendor" / "guide" / "permissions.yaml"


def _expand(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str]) -> set[tuple[str, ...]]:
    return {(g, r, v) for g in groups for r in resources for v in verbs}


def _rule(rule: dict) -> tuple[frozenset[str], ...]:
    """One RBAC rule as comparable sets (order inside a rule means nothing)."""
    return tuple(frozenset(rule.get(k) or ()) for k in ("apiGroups", "resources", "verbs", "resourceNames"))


def _guide() -> list[dict]:
    return [d for d in yaml.safe_load_all(GUIDE.read_text()) if d]


# The install guide's Permissions section (vendor/guide/permissions.yaml): ClusterRole, scaler Role,
# time-slicing Role.
GUIDE_CLUSTER_ROLE, GUIDE_SCALER, GUIDE_TIME_SLICING = _guide()
SCALER = rule_triples(GUIDE_SCALER["rules"])
# The one named addition to the scaler (docs/install.md, Permissions): with keda.enabled=true, the
# ScaledObjects. Nothing else on workloads: the park record lives in the policy status.
SCALER_KEDA = _expand(["keda.sh"], ["scaledobjects"], ["get", "create", "update", "patch", "delete"])
CONTROLLER_SA = {"kind": "ServiceAccount", "name": "kubeon-gpu-optimizer", "namespace": NAMESPACE}
DELEGATION = {
    ("rbac.authorization.k8s.io", "clusterroles", "bind", "kubeon-gpu-optimizer-scaler"),
    ("rbac.authorization.k8s.io", "rolebindings", "create", "*"),
    ("rbac.authorization.k8s.io", "rolebindings", "list", "*"),
    ("rbac.authorization.k8s.io", "rolebindings", "watch", "*"),
    ("rbac.authorization.k8s.io", "rolebindings", "get", "kubeon-gpu-optimizer-scaler"),
    ("rbac.authorization.k8s.io", "rolebindings", "delete", "kubeon-gpu-optimizer-scaler"),
}

# Named addition 5 (docs/install.md): the ResourceClaimTemplates and shared ResourceClaims `via: DRA` policies'
# pods name (get, create), and the ResourceSlices capacity counts devices in (list, watch).
CLAIM_TEMPLATES = ({("resource.k8s.io", plural, verb, "*") for verb in ("get", "create")
                    for plural in ("resourceclaimtemplates", "resourceclaims")}
                   | {("resource.k8s.io", "resourceslices", verb, "*") for verb in ("list", "watch")})


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(GUIDE_SET)


def _roles_bound_to(docs: list[dict], subject: dict) -> list[tuple[str, dict]]:
    """(binding namespace or '*', role) for every role the chart binds to this subject."""
    bound = []
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace", "*")
        if ref["kind"] == "ClusterRole":
            roles = find(docs, "ClusterRole", ref["name"])
        else:
            roles = [r for r in find(docs, "Role", ref["name"]) if r["metadata"]["namespace"] == scope]
        bound += [(scope, role) for role in roles]
    return bound


def test_cluster_role_is_the_guide_rule_by_rule(docs: list[dict]) -> None:
    """Each rule of the guide's ClusterRole is in the chart's, with the same groups, resources and verbs
    (Karpenter without update), and the chart's has no other rule."""
    role = one(docs, "ClusterRole", "kubeon-gpu-optimizer")
    assert sorted(map(_rule, role["rules"]), key=repr) == sorted(map(_rule, GUIDE_CLUSTER_ROLE["rules"]), key=repr)


def test_time_slicing_role_is_the_guide_rule_by_rule(docs: list[dict]) -> None:
    role = one(docs, "Role", "kubeon-gpu-optimizer-time-slicing")
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert [_rule(r) for r in role["rules"]] == [_rule(r) for r in GUIDE_TIME_SLICING["rules"]]


def test_scaler_role_is_the_guide_rule_by_rule_and_keda_only_behind_its_value(docs: list[dict]) -> None:
    """Workload writes only through deployments/scale and statefulsets/scale (get, patch): no rule on the
    workloads themselves, with or without KEDA."""
    scaler = one(docs, "ClusterRole", "kubeon-gpu-optimizer-scaler")
    assert [_rule(r) for r in scaler["rules"]] == [_rule(r) for r in GUIDE_SCALER["rules"]]
    assert rule_triples(scaler["rules"]) == SCALER, "no KEDA rule unless keda.enabled"
    with_keda = one(render({**GUIDE_SET, "keda.enabled": "true"}), "ClusterRole", "kubeon-gpu-optimizer-scaler")
    assert rule_triples(with_keda["rules"]) == SCALER | SCALER_KEDA
    for role in find(render({**GUIDE_SET, "keda.enabled": "true"}), "ClusterRole") + find(docs, "Role"):
        for group, resource, verb in rule_triples(role["rules"]):
            if group == "apps" and resource in ("deployments", "statefulsets"):
                assert verb in ("get", "list", "watch"), (role["metadata"]["name"], resource, verb)


def test_controller_holds_the_guide_plus_only_named_additions(docs: list[dict]) -> None:
    """Everything bound to the controller: the guide's ClusterRole, the scaler delegation, Leases in its own
    namespace and Events in `default` only (where the API server keeps Events about cluster-scoped objects).
    No KEDA access by default; no Events on workloads' namespaces."""
    grants: dict[str, set[tuple[str, ...]]] = {}
    for scope, role in _roles_bound_to(docs, CONTROLLER_SA):
        grants.setdefault(scope, set()).update(rule_triples(role["rules"], with_names=True))
    cluster = grants.pop("*")
    guide = rule_triples(GUIDE_CLUSTER_ROLE["rules"])
    assert {t[:3] for t in cluster} >= guide
    assert {t for t in cluster if t[:3] not in guide} == DELEGATION | CLAIM_TEMPLATES
    assert grants == {
        NAMESPACE: {("coordination.k8s.io", "leases", "create", "*"),
                    ("coordination.k8s.io", "leases", "get", "kubeon-gpu-optimizer"),
                    ("coordination.k8s.io", "leases", "update", "kubeon-gpu-optimizer")},
        "default": {("", "events", "create", "*"), ("", "events", "patch", "*")},
        "gpu-operator": {("", "configmaps", v, "time-slicing-config") for v in ("get", "patch")},
    }
    keda = {}
    for scope, role in _roles_bound_to(render({**GUIDE_SET, "keda.enabled": "true"}), CONTROLLER_SA):
        keda.setdefault(scope, set()).update(rule_triples(role["rules"], with_names=True))
    assert {t for t in keda["*"] if t[0] == "keda.sh"} == {("keda.sh", "scaledobjects", "list", "*"),
                                                          ("keda.sh", "scaledobjects", "watch", "*")}


def test_time_slicing_role_follows_values() -> None:
    docs = render({"gpuOperator.namespace": "nvidia", "gpuOperator.timeSlicingConfigMap": "ts"})
    role = one(docs, "Role", "kubeon-gpu-optimizer-time-slicing")
    assert role["metadata"]["namespace"] == "nvidia"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": ["get", "patch"], "resourceNames": ["ts"]}]


def test_scaler_role_exists_but_is_bound_nowhere_by_the_chart(docs: list[dict]) -> None:
    one(docs, "ClusterRole", "kubeon-gpu-optimizer-scaler")
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        assert binding["roleRef"]["name"] != "kubeon-gpu-optimizer-scaler", binding["metadata"]["name"]


def test_no_rule_anywhere_grants_secrets_or_wildcards() -> None:
    for values in (GUIDE_SET, {"certificates.mode": "cert-manager"}, {"certificates.mode": "external"}):
        for role in find(render(values), "ClusterRole") + find(render(values), "Role"):
            for group, resource, verb in rule_triples(role["rules"]):
                name = role["metadata"]["name"]
                assert resource != "secrets" and not resource.startswith("secrets/"), name
                assert "*" not in (group, resource, verb), name
                assert verb not in ("escalate", "impersonate"), name


def test_webhook_and_extender_read_what_they_cache_and_the_extender_binds(docs: list[dict]) -> None:
    """The extender is kube-scheduler's binder (bindVerb): its Binding carries the GPU index; no pod patch."""
    read = ("get", "list", "watch")
    webhook = {"kind": "ServiceAccount", "name": "kubeon-gpu-optimizer-webhook", "namespace": NAMESPACE}
    extender = {"kind": "ServiceAccount", "name": "kubeon-gpu-optimizer-extender", "namespace": NAMESPACE}
    assert set().union(*(rule_triples(r["rules"]) for _, r in _roles_bound_to(docs, webhook))) == (
        _expand(["gpu.kubeon.io"], ["gpupolicies"], read) | _expand([""], ["namespaces", "nodes"], read)
        | _expand([""], ["pods"], ("list", "watch")))  # pods per shared claim (a label-selected watch)
    assert set().union(*(rule_triples(r["rules"]) for _, r in _roles_bound_to(docs, extender))) == (
        _expand([""], ["nodes", "pods", "namespaces"], read) | _expand(["gpu.kubeon.io"], ["gpupolicies"], read)
        | _expand(["resource.k8s.io"], ["resourceslices", "resourceclaims"], read)  # DRA devices and allocations
        | _expand([""], ["pods/binding"], ("create",)))


def test_second_scheduler_rbac_matches_upstream_example(docs: list[dict]) -> None:
    subject = {"kind": "ServiceAccount", "name": "kubeon-gpu-scheduler", "namespace": NAMESPACE}
    refs = {(b["kind"], b["metadata"].get("namespace"), b["roleRef"]["kind"], b["roleRef"]["name"])
            for b in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding") if subject in b["subjects"]}
    assert refs == {
        ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
        ("RoleBinding", NAMESPACE, "Role", "kubeon-gpu-scheduler-leader-election"),
    }
    lease = one(docs, "Role", "kubeon-gpu-scheduler-leader-election")
    assert ("coordination.k8s.io", "leases", "update", "kubeon-gpu-scheduler") in \
        rule_triples(lease["rules"], with_names=True)


def test_each_component_runs_as_its_own_service_account(docs: list[dict]) -> None:
    accounts = {name: spec["serviceAccountName"] for name, spec in pod_specs(docs)}
    assert accounts == {
        "kubeon-gpu-optimizer-uninstall": "kubeon-gpu-optimizer",  # pre-delete: the controller's own RBAC
        "kubeon-gpu-optimizer": "kubeon-gpu-optimizer",
        "kubeon-gpu-optimizer-webhook": "kubeon-gpu-optimizer-webhook",
        "kubeon-gpu-optimizer-extender": "kubeon-gpu-optimizer-extender",
        "kubeon-gpu-scheduler": "kubeon-gpu-scheduler",
    }
    assert {sa["metadata"]["name"] for sa in find(docs, "ServiceAccount")} == set(accounts.values())


WRITABLE = {  # the only writable volumes each workload may mount
    "kubeon-gpu-optimizer": {"/tmp"},
    "kubeon-gpu-optimizer-webhook": {"/tmp"},
    "kubeon-gpu-optimizer-extender": {"/tmp"},
    "kubeon-gpu-scheduler": set(),
    "kubeon-gpu-optimizer-uninstall": {"/tmp"},  # the pre-delete hook Job
}


def test_the_values_applied_to_every_pod_reach_every_pod() -> None:
    """values.yaml: nodeSelector, tolerations, priorityClassName and podAnnotations are "applied to every
    pod of the chart", the pre-delete Job's included (a mesh's inject annotation left off it can keep
    `helm uninstall` waiting for the Job)."""
    docs = render({**GUIDE_SET, "nodeSelector.pool": "system", "priorityClassName": "system-critical",
                   "tolerations[0].key": "dedicated", "tolerations[0].operator": "Exists"},
                  "--set-string", "podAnnotations.sidecar\\.istio\\.io/inject=false")
    pods = {doc["metadata"]["name"]: doc["spec"]["template"] for doc in docs
            if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")}
    assert set(pods) == set(WRITABLE)
    for name, template in pods.items():
        assert template["metadata"].get("annotations", {}).get("sidecar.istio.io/inject") == "false", name
        assert template["spec"]["nodeSelector"] == {"pool": "system"}, name
        assert template["spec"]["priorityClassName"] == "system-critical", name
        assert {"key": "dedicated", "operator": "Exists"} in template["spec"]["tolerations"], name


def test_an_annotation_that_is_not_a_string_is_refused() -> None:
    """Annotations are strings: `--set podAnnotations.x=false` makes a boolean, which the API server
    would refuse for every Deployment of the release; the schema refuses it first, naming the value."""
    done = run(helm_template_cmd({**GUIDE_SET, "podAnnotations.sidecar\\.istio\\.io/inject": "false"}),
               check=False)
    assert done.returncode != 0 and "podAnnotations" in done.stderr, done.stderr


@pytest.mark.parametrize("values", [GUIDE_SET, {}], ids=["guide", "defaults"])
def test_every_pod_is_locked_down(values: dict[str, str]) -> None:
    specs = dict(pod_specs(render(values)))
    assert set(specs) == set(WRITABLE)
    for name, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, (name, c["name"])
            assert c.get("resources", {}).get("limits", {}).get("memory"), (name, c["name"])
            writable = {m["mountPath"] for m in c.get("volumeMounts", [])
                        if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]}
            assert writable == WRITABLE[name], (name, c["name"], writable)
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                assert mount.get("readOnly") or "emptyDir" in volume, (name, mount)
                assert "hostPath" not in volume, (name, mount)
