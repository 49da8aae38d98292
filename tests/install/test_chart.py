"""The Helm chart as users install it: real helm 4 lint/template, real Kubernetes schemas.

Real: helm 4 (.tools/bin/helm) rendering manifests/chart/kubeon-gpu-optimizer with
the install guide's --set values and each capacity provider; the values schema
rejecting bad values; every rendered object validated strictly against the
Kubernetes 1.30 and 1.37 OpenAPI schemas (kubernetes-validate); the helm-generated
certificate checked with cryptography. Faked: nothing; no cluster is involved
(lookup returns nothing under `helm template`, as on a first install).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import importlib

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from cli.main import SUBCOMMANDS
from tests.install.chart import (
    CHART,
    CHART_CRD,
    CRD_SOURCE,
    GUIDE_SET,
    NAMESPACE,
    PROVIDERS,
    RELEASE,
    container,
    find,
    helm_template_cmd,
    one,
    render,
    run,
    tool,
)

K8S_VERSIONS = ("1.30.0", "1.37.0")
# Objects of other projects' CRDs: no schema in kubernetes-validate, checked by shape below.
FOREIGN_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


@pytest.fixture(scope="module")
def guide() -> list[dict]:
    return render(GUIDE_SET)


@pytest.fixture(scope="module")
def defaults() -> list[dict]:
    return render()


def test_helm_lint_is_clean() -> None:
    sets = [arg for key, value in GUIDE_SET.items() for arg in ("--set", f"{key}={value}")]
    done = run([tool("helm"), "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *sets])
    assert "0 chart(s) failed" in done.stdout


def test_guide_values_render_the_named_objects(guide: list[dict]) -> None:
    names = {(d["kind"], d["metadata"]["name"]) for d in guide}
    expected = {
        ("Deployment", "kubeon-gpu-optimizer"),
        ("Deployment", "kubeon-gpu-optimizer-webhook"),
        ("Deployment", "kubeon-gpu-optimizer-extender"),
        ("Deployment", "kubeon-gpu-scheduler"),
        ("Service", "kubeon-gpu-optimizer-webhook"),
        ("Service", "kubeon-gpu-optimizer-extender"),
        ("MutatingWebhookConfiguration", "kubeon-gpu-optimizer"),
        ("ValidatingWebhookConfiguration", "kubeon-gpu-optimizer"),
        ("PodDisruptionBudget", "kubeon-gpu-optimizer-webhook"),
        ("CustomResourceDefinition", "gpupolicies.gpu.kubeon.io"),
        ("ClusterRole", "kubeon-gpu-optimizer"),
        ("ConfigMap", "kubeon-gpu-scheduler-config"),
    }
    assert expected <= names, expected - names
    for doc in guide:
        if doc["kind"] in ("Deployment", "Service", "ConfigMap", "ServiceAccount", "Secret", "PodDisruptionBudget"):
            assert doc["metadata"]["namespace"] == NAMESPACE


def test_controller_gets_the_guide_settings_and_the_token_mount(guide: list[dict]) -> None:
    ctl = container(one(guide, "Deployment", "kubeon-gpu-optimizer"))
    args = ctl["args"]
    assert args[0] == "controller"
    for flag in ("--namespace=kubeon-gpu", "--default-mode=Recommend", "--cluster=prod-use1-a",
                 "--hub-url=https://acme.kubeon.io", "--hub-token-file=/var/run/secrets/kubeon/token",
                 "--hub-poll-interval=60s", "--health-port=8080"):
        assert flag in args
    assert not any(a.startswith("--prometheus-url") for a in args), "no prometheus.url by default"
    pod = one(guide, "Deployment", "kubeon-gpu-optimizer")["spec"]["template"]["spec"]
    token = next(v for v in pod["volumes"] if v["name"] == "hub-token")
    assert token["secret"]["secretName"] == "kubeon-gpu-optimizer-token"
    mount = next(m for m in ctl["volumeMounts"] if m["name"] == "hub-token")
    assert mount["mountPath"] == "/var/run/secrets/kubeon" and mount["readOnly"] is True
    assert ctl["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    assert {p["containerPort"] for p in ctl["ports"]} == {8080}


def test_no_hub_secret_means_no_token_mount(defaults: list[dict]) -> None:
    deployment = one(defaults, "Deployment", "kubeon-gpu-optimizer")
    pod = deployment["spec"]["template"]["spec"]
    assert all("secret" not in v for v in pod["volumes"])
    assert not any(a.startswith("--hub-token-file") for a in container(deployment)["args"])


def test_prometheus_url_reaches_the_controller() -> None:
    docs = render({"prometheus.url": "http://prometheus.monitoring:9090"})
    args = container(one(docs, "Deployment", "kubeon-gpu-optimizer"))["args"]
    assert "--prometheus-url=http://prometheus.monitoring:9090" in args


def test_the_controller_reads_the_extender_through_the_service_kube_scheduler_calls(defaults: list[dict]) -> None:
    """Issue 37: --extender-url is the extender Service's own address and port (the one the scheduler profile
    calls), and the controller takes the flag; without the second scheduler there is no extender to read."""
    from controller.command import add_arguments

    service = one(defaults, "Service", "kubeon-gpu-optimizer-extender")
    port = service["spec"]["ports"][0]["port"]
    url = f"http://kubeon-gpu-optimizer-extender.{NAMESPACE}.svc:{port}"
    args = container(one(defaults, "Deployment", "kubeon-gpu-optimizer"))["args"]
    assert f"--extender-url={url}" in args
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(args[1:]).extender_url == url
    scheduler = "\n".join(str(v) for d in defaults if d["kind"] == "ConfigMap" for v in (d.get("data") or {}).values())
    assert f"urlPrefix: {url}" in scheduler
    off = render({"scheduler.enabled": "false"})
    off_args = container(one(off, "Deployment", "kubeon-gpu-optimizer"))["args"]
    assert not any(a.startswith("--extender-url") for a in off_args)


def test_karpenter_provider_renders_and_validates() -> None:
    for doc in render({**GUIDE_SET, "capacity.provider": "karpenter"}):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_provider_the_guide_names_reaches_the_controller(provider: str) -> None:
    """The guide names four; the controller reads the flag and acts through each (tests/controller/
    test_{eks_nodegroups,gke_nodepools,aks_nodepools}_cluster.py)."""
    cloud = {"eks-nodegroups": {"capacity.eks.clusterName": "prod-use1-a"},
             "gke-nodepools": {"capacity.gke.project": "p", "capacity.gke.location": "us-central1-a",
                               "capacity.gke.cluster": "c"},
             "aks-nodepools": {"capacity.aks.subscriptionId": "s", "capacity.aks.resourceGroup": "rg",
                               "capacity.aks.cluster": "c"}}.get(provider, {})
    docs = render({**GUIDE_SET, "capacity.provider": provider, **cloud})
    args = container(one(docs, "Deployment", "kubeon-gpu-optimizer"))["args"]
    assert f"--capacity-provider={provider}" in args
    from controller.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([f"--capacity-provider={provider}"]).capacity_provider == provider


def test_eks_nodegroups_values_reach_the_controller_and_its_service_account() -> None:
    """capacity.eks.*: the cluster and region as flags the controller reads, the IRSA role on the controller's
    ServiceAccount only; RBAC is the same as under Karpenter."""
    docs = render({**GUIDE_SET, "capacity.provider": "eks-nodegroups", "capacity.eks.clusterName": "prod-use1-a",
                   "capacity.eks.region": "us-east-1",
                   "capacity.eks.roleArn": "arn:aws:iam::123456789012:role/kubeon-capacity"})
    args = container(one(docs, "Deployment", "kubeon-gpu-optimizer"))["args"]
    assert {"--eks-cluster=prod-use1-a", "--eks-region=us-east-1"} <= set(args)
    from controller.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args([a for a in args if a.startswith(("--eks-", "--capacity-provider"))])
    assert (parsed.eks_cluster, parsed.eks_region) == ("prod-use1-a", "us-east-1")
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts["kubeon-gpu-optimizer"]["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/kubeon-capacity"}
    assert all("annotations" not in d["metadata"] for n, d in accounts.items() if n != "kubeon-gpu-optimizer")
    karpenter = render({**GUIDE_SET, "capacity.provider": "karpenter"})
    assert [d for d in docs if d["kind"] in ("ClusterRole", "Role")] == \
        [d for d in karpenter if d["kind"] in ("ClusterRole", "Role")]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_eks_nodegroups_without_a_cluster_name_is_refused() -> None:
    done = run(helm_template_cmd({**GUIDE_SET, "capacity.provider": "eks-nodegroups"}), check=False)
    assert done.returncode != 0
    assert "capacity.provider=eks-nodegroups but capacity.eks.clusterName is not set" in done.stderr


def test_gke_nodepools_values_reach_the_controller_and_its_service_account() -> None:
    """capacity.gke.*: project, location and cluster as flags the controller reads, the workload identity
    annotation on the controller's ServiceAccount only; RBAC is the same as under Karpenter."""
    docs = render({**GUIDE_SET, "capacity.provider": "gke-nodepools", "capacity.gke.project": "ml-prod",
                   "capacity.gke.location": "us-central1-a", "capacity.gke.cluster": "gpu-a",
                   "capacity.gke.serviceAccount": "kubeon@ml-prod.iam.gserviceaccount.com"})
    args = container(one(docs, "Deployment", "kubeon-gpu-optimizer"))["args"]
    from controller.command import add_arguments, cloud_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args([a for a in args if a.startswith(("--gke-", "--capacity-provider"))])
    assert cloud_settings(parsed) == {"project": "ml-prod", "location": "us-central1-a", "cluster": "gpu-a"}
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts["kubeon-gpu-optimizer"]["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "kubeon@ml-prod.iam.gserviceaccount.com"}
    assert all("annotations" not in d["metadata"] for n, d in accounts.items() if n != "kubeon-gpu-optimizer")
    karpenter = render({**GUIDE_SET, "capacity.provider": "karpenter"})
    assert [d for d in docs if d["kind"] in ("ClusterRole", "Role")] == \
        [d for d in karpenter if d["kind"] in ("ClusterRole", "Role")]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_gke_nodepools_without_its_cluster_is_refused() -> None:
    done = run(helm_template_cmd({**GUIDE_SET, "capacity.provider": "gke-nodepools", "capacity.gke.project": "p",
                                  "capacity.gke.cluster": "c"}), check=False)
    assert done.returncode != 0
    assert "capacity.provider=gke-nodepools but capacity.gke.location is not set" in done.stderr


def test_aks_nodepools_values_reach_the_controller_its_service_account_and_pod() -> None:
    """capacity.aks.*: subscription, resource group and cluster as flags the controller reads; workload
    identity: the client id on the controller's ServiceAccount and the label its webhook looks for on the pod."""
    docs = render({**GUIDE_SET, "capacity.provider": "aks-nodepools", "capacity.aks.subscriptionId": "sub-1",
                   "capacity.aks.resourceGroup": "rg-gpu", "capacity.aks.cluster": "gpu-a",
                   "capacity.aks.clientId": "11111111-2222-3333-4444-555555555555"})
    deployment = one(docs, "Deployment", "kubeon-gpu-optimizer")
    args = container(deployment)["args"]
    from controller.command import add_arguments, cloud_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args([a for a in args if a.startswith(("--aks-", "--capacity-provider"))])
    assert cloud_settings(parsed) == {"subscription": "sub-1", "resourceGroup": "rg-gpu", "cluster": "gpu-a"}
    assert deployment["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts["kubeon-gpu-optimizer"]["metadata"]["annotations"] == {
        "azure.workload.identity/client-id": "11111111-2222-3333-4444-555555555555"}
    assert all("annotations" not in d["metadata"] for n, d in accounts.items() if n != "kubeon-gpu-optimizer")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_aks_nodepools_without_its_resource_group_is_refused() -> None:
    done = run(helm_template_cmd({**GUIDE_SET, "capacity.provider": "aks-nodepools",
                                  "capacity.aks.subscriptionId": "s", "capacity.aks.cluster": "c"}), check=False)
    assert done.returncode != 0
    assert "capacity.provider=aks-nodepools but capacity.aks.resourceGroup is not set" in done.stderr


def test_burst_enabled_is_refused_and_the_gateway_is_reserved() -> None:
    done = run(helm_template_cmd({**GUIDE_SET, "burst.enabled": "true"}), check=False)
    assert done.returncode != 0 and "burst.enabled=true: this version has no burst gateway" in done.stderr
    render({**GUIDE_SET, "burst.gateway": "10.0.0.5:51820"})  # the guide names it: the schema accepts it


@pytest.mark.parametrize(("change", "message"), [
    ({"cluster": ""}, "hub.url is set but cluster is not"),
    ({"hub.existingSecret": ""}, "hub.url is set but hub.existingSecret is not"),
    ({"hub.pollInterval": "500ms"}, "hub.pollInterval=500ms: must be between 1s and 24h"),
    ({"hub.pollInterval": "0.5s"}, "hub.pollInterval=0.5s: must be between 1s and 24h"),
    ({"hub.pollInterval": "0m"}, "hub.pollInterval=0m: must be between 1s and 24h"),
    ({"hub.pollInterval": "0.01m"}, "hub.pollInterval=0.01m: must be between 1s and 24h"),
    ({"hub.pollInterval": "0m0s"}, "hub.pollInterval=0m0s: must be between 1s and 24h"),
    ({"hub.pollInterval": "24h1s"}, "hub.pollInterval=24h1s: must be between 1s and 24h"),
    ({"hub.pollInterval": "3000000h"}, "hub.pollInterval=3000000h: must be between 1s and 24h"),
])
def test_hub_values_the_controller_would_refuse_are_refused_at_install(change: dict[str, str],
                                                                       message: str) -> None:
    """The controller exits 2 on these (controller.command.hub_settings): helm says why instead of a
    CrashLoopBackOff."""
    done = run(helm_template_cmd({**GUIDE_SET, **change}), check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    from controller.command import add_arguments, hub_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = [f"--hub-url={GUIDE_SET['hub.url']}", f"--cluster={change.get('cluster', 'c')}",
            f"--hub-poll-interval={change.get('hub.pollInterval', '60s')}"]
    if "hub.existingSecret" not in change:
        args.append("--hub-token-file=/var/run/secrets/kubeon/token")
    with pytest.raises(ValueError):
        hub_settings(parser.parse_args(args))


def test_a_private_hub_ca_reaches_the_controller_as_a_file() -> None:
    """hub.caConfigMap: its `ca.crt` mounted read-only and named by --hub-ca-file (a flag the controller
    reads: controller.command.hub_settings)."""
    docs = render({**GUIDE_SET, "hub.caConfigMap": "kubeon-hub-ca"})
    deployment = one(docs, "Deployment", "kubeon-gpu-optimizer")
    assert "--hub-ca-file=/etc/kubeon/hub-ca/ca.crt" in container(deployment)["args"]
    mount = next(m for m in container(deployment)["volumeMounts"] if m["name"] == "hub-ca")
    assert mount == {"name": "hub-ca", "mountPath": "/etc/kubeon/hub-ca", "readOnly": True}
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "hub-ca")
    assert volume["configMap"] == {"name": "kubeon-hub-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    from controller.command import add_arguments, hub_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([a for a in container(deployment)["args"] if a.startswith("--hub") or
                              a.startswith("--cluster")])
    settings = hub_settings(args)
    assert settings is not None and settings.ca_file == "/etc/kubeon/hub-ca/ca.crt"
    assert not any(a.startswith("--hub-ca-file") for a in container(one(render(GUIDE_SET), "Deployment",
                                                                            "kubeon-gpu-optimizer"))["args"])


def test_a_second_extender_replica_is_refused() -> None:
    """The extender's assumptions live in its process: two replicas would each place a pod on the same
    free GPU."""
    done = run(helm_template_cmd({**GUIDE_SET, "extender.replicas": "2"}), check=False)
    assert done.returncode != 0 and "/extender/replicas" in done.stderr, done.stderr


@pytest.mark.parametrize("interval", ["1s", "1500ms", "90s", "1m", "0.02m", "0.5s500ms", "24h", "23h60m"])
def test_hub_poll_intervals_from_a_second_to_a_day_render_and_the_controller_takes_them(interval: str) -> None:
    docs = render({**GUIDE_SET, "hub.pollInterval": interval})
    from controller.command import add_arguments, hub_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = [a for a in container(one(docs, "Deployment", "kubeon-gpu-optimizer"))["args"]
            if a.startswith(("--hub", "--cluster"))]
    assert f"--hub-poll-interval={interval}" in args
    settings = hub_settings(parser.parse_args(args))
    assert settings is not None and 1 <= settings.poll_interval <= 86400


def test_no_value_reaches_the_controller_as_an_unread_setting(guide: list[dict]) -> None:
    """Every env var the chart sets on the controller is one some code reads."""
    env = {e["name"] for e in container(one(guide, "Deployment", "kubeon-gpu-optimizer")).get("env", [])}
    assert not env & {"KUBEON_GPU_CAPACITY_PROVIDER", "KUBEON_GPU_BURST_ENABLED", "KUBEON_GPU_HUB_POLL_INTERVAL"}


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("capacity.provider", "ec2-autoscaling"),
        ("defaultMode", "Yolo"),
        ("webhook.failurePolicy", "Sometimes"),
        ("webhook.timeoutSeconds", "45"),
        ("webhook.replicas", "1"),
        ("certificates.mode", "letsencrypt"),
        ("hub.existingsecret", "typo-in-the-key"),
    ],
)
def test_values_schema_rejects_bad_values(key: str, bad: str) -> None:
    done = run(helm_template_cmd({**GUIDE_SET, key: bad}), check=False)
    assert done.returncode != 0, f"{key}={bad} was accepted"
    assert "schema" in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", ["guide", "defaults", "cert-manager", "external", "no-scheduler"])
def test_every_object_is_valid_kubernetes(variant: str, version: str) -> None:
    values = {
        "guide": GUIDE_SET,
        "defaults": {},
        "cert-manager": {**GUIDE_SET, "certificates.mode": "cert-manager"},
        "external": {"certificates.mode": "external", "certificates.caBundle": "not-really-pem"},
        "no-scheduler": {"scheduler.enabled": "false"},
    }[variant]
    docs = render(values)
    checked = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in FOREIGN_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 20


def test_crd_is_a_copy_of_the_generated_one_and_a_valid_crd(guide: list[dict]) -> None:
    assert CHART_CRD.read_text() == CRD_SOURCE.read_text(), "chart CRD is stale: run manifests/render.sh"
    crd = one(guide, "CustomResourceDefinition", "gpupolicies.gpu.kubeon.io")
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)
    assert crd["spec"]["scope"] == "Cluster"
    assert "gpup" in crd["spec"]["names"].get("shortNames", [])
    served = [v for v in crd["spec"]["versions"] if v["served"]]
    assert served and all(v["schema"]["openAPIV3Schema"]["type"] == "object" for v in served)


def _webhooks(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind, "kubeon-gpu-optimizer")["webhooks"]:
            out[f"{kind}/{hook['name']}"] = hook
    return out


def test_webhook_configurations_follow_the_contract(guide: list[dict]) -> None:
    hooks = _webhooks(guide)
    mutate = hooks["MutatingWebhookConfiguration/pods.mutate.gpu.kubeon.io"]
    assert mutate["clientConfig"]["service"] == {
        "name": "kubeon-gpu-optimizer-webhook", "namespace": NAMESPACE, "path": "/mutate", "port": 443}
    assert mutate["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["pods"], "scope": "Namespaced"}]
    assert mutate["reinvocationPolicy"] == "IfNeeded"
    policies = hooks["ValidatingWebhookConfiguration/gpupolicies.validate.gpu.kubeon.io"]
    assert policies["rules"][0]["resources"] == ["gpupolicies"]
    assert set(policies["rules"][0]["operations"]) == {"CREATE", "UPDATE"}
    assert "objectSelector" not in policies, "a label must not let a policy skip validation"
    pods = hooks["ValidatingWebhookConfiguration/pods.validate.gpu.kubeon.io"]
    assert pods["rules"][0]["resources"] == ["pods"] and pods["rules"][0]["operations"] == ["CREATE"]
    labeller = hooks["MutatingWebhookConfiguration/gpupolicies.mutate.gpu.kubeon.io"]  # the Kind column's label
    assert labeller["rules"] == [{"apiGroups": ["gpu.kubeon.io"], "apiVersions": ["*"],
                                  "operations": ["CREATE", "UPDATE"], "resources": ["gpupolicies"],
                                  "scope": "Cluster"}]
    workloads = hooks["ValidatingWebhookConfiguration/workloads.validate.gpu.kubeon.io"]  # warnings only
    assert workloads["rules"] == [
        {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["deployments", "statefulsets"], "scope": "Namespaced"},
        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["jobs", "cronjobs"], "scope": "Namespaced"}]
    assert workloads["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]
    for name, hook in hooks.items():
        assert hook["sideEffects"] == "None", name
        assert hook["admissionReviewVersions"] == ["v1"], name
        assert hook["failurePolicy"] == "Ignore", name
        assert hook["timeoutSeconds"] == 2, name
        if "mutate" in name:
            assert hook["clientConfig"]["service"]["path"] == "/mutate"
        else:
            assert hook["clientConfig"]["service"]["path"] == "/validate"
        if hook["rules"][0]["resources"] == ["pods"]:
            assert hook["namespaceSelector"]["matchExpressions"] == [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]
            assert hook["objectSelector"]["matchExpressions"] == [
                {"key": "gpu.kubeon.io/skip", "operator": "NotIn", "values": ["true"]}]


def test_failure_policy_and_timeout_come_from_values() -> None:
    docs = render({"webhook.failurePolicy": "Fail", "webhook.timeoutSeconds": "12"})
    for hook in _webhooks(docs).values():
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 12)


def test_release_namespace_is_excluded_wherever_installed() -> None:
    docs = render({}, "--namespace", "gpu-opt")
    hook = _webhooks(docs)["MutatingWebhookConfiguration/pods.mutate.gpu.kubeon.io"]
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "gpu-opt"]


def test_generated_certificate_serves_the_webhook_service(defaults: list[dict]) -> None:
    secret = one(defaults, "Secret", "kubeon-gpu-optimizer-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    sans = set(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName))
    svc = "kubeon-gpu-optimizer-webhook"
    assert {svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc", f"{svc}.{NAMESPACE}.svc.cluster.local"} <= sans
    assert leaf.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    for hook in _webhooks(defaults).values():
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"], "caBundle must be the Secret's CA"
    mounted = one(defaults, "Deployment", "kubeon-gpu-optimizer-webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "certs", "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o440}} in mounted


def test_cert_manager_mode_injects_the_ca(guide: list[dict]) -> None:
    docs = render({**GUIDE_SET, "certificates.mode": "cert-manager"})
    assert not find(docs, "Secret"), "cert-manager owns the Secret"
    cert = one(docs, "Certificate", "kubeon-gpu-optimizer-webhook")
    assert cert["spec"]["secretName"] == "kubeon-gpu-optimizer-webhook-tls"
    issuer = one(docs, "Issuer", cert["spec"]["issuerRef"]["name"])
    assert issuer["spec"] == {"selfSigned": {}}
    assert "kubeon-gpu-optimizer-webhook.kubeon-gpu.svc" in cert["spec"]["dnsNames"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(docs, kind, "kubeon-gpu-optimizer")
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            "kubeon-gpu/kubeon-gpu-optimizer-webhook"
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])


def test_cert_manager_can_use_an_existing_cluster_issuer() -> None:
    docs = render({"certificates.mode": "cert-manager", "certificates.certManager.issuerRef.name": "corp-ca",
                   "certificates.certManager.issuerRef.kind": "ClusterIssuer"})
    assert not find(docs, "Issuer")
    ref = one(docs, "Certificate", "kubeon-gpu-optimizer-webhook")["spec"]["issuerRef"]
    assert ref == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def test_webhook_runs_two_replicas_behind_a_pdb(guide: list[dict]) -> None:
    deployment = one(guide, "Deployment", "kubeon-gpu-optimizer-webhook")
    assert deployment["spec"]["replicas"] >= 2
    args = container(deployment)["args"]
    assert args[:4] == ["webhook", "--cert-dir=/certs", "--port=8443", "--namespace=kubeon-gpu"]
    pdb = one(guide, "PodDisruptionBudget", "kubeon-gpu-optimizer-webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    service = one(guide, "Service", "kubeon-gpu-optimizer-webhook")
    assert service["spec"]["ports"][0]["port"] == 443 and service["spec"]["ports"][0]["targetPort"] == "https"
    assert service["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"]


def test_extender_service(guide: list[dict]) -> None:
    deployment = one(guide, "Deployment", "kubeon-gpu-optimizer-extender")
    assert container(deployment)["args"] == ["extender", "--port=8888", "--default-mode=Recommend",
                                             "--scheduler-weight=131"]
    service = one(guide, "Service", "kubeon-gpu-optimizer-extender")
    assert service["spec"]["ports"][0]["port"] == 8888


def _scheduler_config(docs: list[dict]) -> dict:
    return yaml.safe_load(one(docs, "ConfigMap", "kubeon-gpu-scheduler-config")["data"]["config.yaml"])


def test_second_scheduler_calls_the_extender(guide: list[dict]) -> None:
    config = _scheduler_config(guide)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["kubeon-gpu-scheduler"]
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceName"] == "kubeon-gpu-scheduler"
    assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://kubeon-gpu-optimizer-extender.kubeon-gpu.svc:8888"
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert extender["weight"] > 0 and extender["httpTimeout"] == "5s"
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True
    deployment = one(guide, "Deployment", "kubeon-gpu-scheduler")
    kube_scheduler = container(deployment)
    assert kube_scheduler["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    assert "--config=/etc/kubernetes/kubeon-gpu-scheduler/config.yaml" in kube_scheduler["command"]


def test_the_extender_is_told_the_weight_the_scheduler_profile_gives_it() -> None:
    """scheduler.extenderWeight reaches both the profile and the extender (which lists in /prioritize only
    the hosts that can still be placed at that weight)."""
    for weight in (71, 131, 150):
        docs = render({**GUIDE_SET, "scheduler.extenderWeight": str(weight)})
        assert _scheduler_config(docs)["extenders"][0]["weight"] == weight
        assert _parsed(one(docs, "Deployment", "kubeon-gpu-optimizer-extender")).scheduler_weight == weight


def test_the_extender_is_asked_about_every_pod_the_profile_schedules(guide: list[dict]) -> None:
    """No managedResources (upstream IsInterested: then every pod): the CPU-only pods the webhook routes
    to kubeon-gpu-scheduler are packed by the extender too, not spread by the stock plugins alone."""
    (extender,) = _scheduler_config(guide)["extenders"]
    assert "managedResources" not in extender


def test_routing_cpu_only_pods_is_a_switch_the_webhook_reads() -> None:
    """webhook.routeCpuPodsOnGpuNodes reaches the webhook's own flag, parsed as the webhook parses it."""
    webhook = "kubeon-gpu-optimizer-webhook"
    assert _parsed(one(render(GUIDE_SET), "Deployment", webhook)).route_cpu_pods_on_gpu_nodes == "true"
    off = render({**GUIDE_SET, "webhook.routeCpuPodsOnGpuNodes": "false"})
    assert _parsed(one(off, "Deployment", webhook)).route_cpu_pods_on_gpu_nodes == "false"
    with pytest.raises(AssertionError):
        render({**GUIDE_SET, "webhook.routeCpuPodsOnGpuNodes": "maybe"})


def test_scheduler_image_follows_the_cluster_version_unless_pinned() -> None:
    docs = render({}, "--kube-version", "1.36.2")
    assert container(one(docs, "Deployment", "kubeon-gpu-scheduler"))["image"] == \
        "registry.k8s.io/kube-scheduler:v1.36.0"
    docs = render({"scheduler.image.tag": "v1.36.4"})
    assert container(one(docs, "Deployment", "kubeon-gpu-scheduler"))["image"] == \
        "registry.k8s.io/kube-scheduler:v1.36.4"


def test_scheduler_can_be_switched_off_and_takes_the_extender_with_it() -> None:
    """Only kubeon-gpu-scheduler calls the extender: without it, no extender runs or holds a grant."""
    docs = render({"scheduler.enabled": "false"})
    assert not [d for d in docs if "kubeon-gpu-scheduler" in d["metadata"]["name"]]
    assert not [(d["kind"], d["metadata"]["name"]) for d in docs if "extender" in d["metadata"]["name"]]
    assert {d["kind"] for d in render({}) if d["metadata"]["name"] == "kubeon-gpu-optimizer-extender"} == {
        "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def _extender_writes(docs: list[dict]) -> list[tuple[str, str]]:
    role = one(docs, "ClusterRole", "kubeon-gpu-optimizer-extender")
    return sorted((res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
                  if verb not in ("get", "list", "watch"))


def test_the_extenders_bind_grant_goes_with_the_bind_verb() -> None:
    """scheduler.extenderBinds=false: kube-scheduler binds itself, so the extender holds no write grant."""
    docs = render({})
    assert "bindVerb: bind" in one(docs, "ConfigMap", "kubeon-gpu-scheduler-config")["data"]["config.yaml"]
    assert _extender_writes(docs) == [("pods/binding", "create")]  # the Binding carries the GPU index
    off = render({"scheduler.extenderBinds": "false"})
    assert "bindVerb" not in one(off, "ConfigMap", "kubeon-gpu-scheduler-config")["data"]["config.yaml"]
    assert _extender_writes(off) == []


def test_image_tag_defaults_to_app_version(defaults: list[dict]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    for name in ("kubeon-gpu-optimizer", "kubeon-gpu-optimizer-webhook", "kubeon-gpu-optimizer-extender"):
        image = container(one(defaults, "Deployment", name))["image"]
        assert image.endswith(f":{chart['appVersion']}")


COMPONENTS = {"kubeon-gpu-optimizer": "controller", "kubeon-gpu-optimizer-webhook": "webhook",
              "kubeon-gpu-optimizer-extender": "extender"}


def _parsed(deployment: dict) -> argparse.Namespace:
    """The Deployment's args as the component's own command line parses them (unknown flags fail)."""
    args = container(deployment)["args"]
    module = importlib.import_module(SUBCOMMANDS[args[0]][0])
    parser = argparse.ArgumentParser(prog=args[0], exit_on_error=False)
    module.add_arguments(parser)
    return parser.parse_args(args[1:])


def test_default_mode_and_prometheus_reach_every_component() -> None:
    """defaultMode reaches the controller, the webhook and the extender; prometheus.url every component
    whose effective mode depends on it (the webhook's sharing rewrites, the controller)."""
    docs = render({**GUIDE_SET, "defaultMode": "Automatic", "prometheus.url": "http://prom.monitoring:9090"})
    for name, command in COMPONENTS.items():
        parsed = _parsed(one(docs, "Deployment", name))
        assert parsed.default_mode == "Automatic", name
        if command != "extender":  # packing and typeFit do not depend on metrics
            assert parsed.prometheus_url == "http://prom.monitoring:9090", name
    for name in COMPONENTS:
        parsed = _parsed(one(render(GUIDE_SET), "Deployment", name))
        assert getattr(parsed, "prometheus_url", None) is None, name


def test_controller_knows_which_components_act_on_policies() -> None:
    """Without the second scheduler nothing calls the extender: packing/typeFit policies are not Ready."""
    assert _parsed(one(render(GUIDE_SET), "Deployment", "kubeon-gpu-optimizer")).components == "webhook,extender"
    off = render({**GUIDE_SET, "scheduler.enabled": "false"})
    assert _parsed(one(off, "Deployment", "kubeon-gpu-optimizer")).components == "webhook"


def test_uninstall_runs_a_pre_delete_cleanup_unless_asked_to_keep() -> None:
    """helm uninstall leaves nothing of ours: a pre-delete Job runs `controller --uninstall` as the
    controller's ServiceAccount; uninstall.cleanup=false keeps everything; the kubectl manifests have none."""
    job = one(render(GUIDE_SET), "Job", "kubeon-gpu-optimizer-uninstall")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    parsed = _parsed(job)
    assert parsed.uninstall and parsed.namespace == NAMESPACE and not parsed.keda
    assert _parsed(one(render({**GUIDE_SET, "keda.enabled": "true"}), "Job", "kubeon-gpu-optimizer-uninstall")).keda
    assert not find(render({**GUIDE_SET, "uninstall.cleanup": "false"}), "Job")
    rendered = (CHART.parents[1] / "rendered").glob("*.yaml")
    assert not any("helm.sh/hook" in p.read_text() for p in rendered)


def _notes(values: dict[str, str]) -> str:
    """NOTES.txt as helm prints it after an install (`helm template` does not render it)."""
    cmd = [tool("helm"), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    for key, value in values.items():
        cmd += ["--set", f"{key}={value}"]
    out = run(cmd).stdout
    return out[out.index("NOTES:"):]


def test_the_notes_log_check_finds_the_leader_among_several_replicas() -> None:
    """`kubectl logs deploy/...` reads one pod, maybe a standby that never polls: with more than one
    replica the check reads every controller pod, whose labels the selector matches."""
    assert 'logs deploy/kubeon-gpu-optimizer | grep "policies synced"' in _notes(GUIDE_SET)
    notes = _notes({**GUIDE_SET, "replicas": "2"})
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller"
    assert f'logs -l {selector} --prefix | grep -e "policies synced" -e "standing by"' in notes
    deployment = one(render({**GUIDE_SET, "replicas": "2"}), "Deployment", RELEASE)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in (pair.split("=") for pair in selector.split(",")))
    assert 'grep "policies read"' in _notes({})
