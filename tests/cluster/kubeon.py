"""The optimizer on the loopback cluster, as the Helm chart renders it.

`helm template` of the chart gives every object; what a pod would be is run as a local process:
- RBAC, ServiceAccounts, the scheduler's ConfigMap: applied as rendered.
- Each Deployment (webhook, extender, controller): `python -m cli.main` with the container's args,
  the ports and cert dir made local, authenticated with a TokenRequest token of the Deployment's
  ServiceAccount, so the chart's ClusterRoles and Roles are exactly what it may do.
- The second kube-scheduler: the real binary with the rendered KubeSchedulerConfiguration, its
  extender's urlPrefix pointed at the local extender, as the chart's ServiceAccount.
- The webhook configurations: as rendered, `clientConfig.service` made `clientConfig.url` on
  127.0.0.1 with the caBundle of the webhook's certificate (kube-apiserver dials it directly).
"""

from __future__ import annotations

import base64
import copy
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from tests.cluster.control_plane import START_TIMEOUT, ControlPlane
from tests.cluster.processes import StartError
from tests.loopback import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart" / "kubeon-gpu-optimizer"
CRDS = sorted((REPO / "manifests" / "crd").glob("*.yaml"))
RELEASE = "kubeon-gpu-optimizer"
NAMESPACE = "kubeon-gpu"
GPU_OPERATOR_NAMESPACE = "gpu-operator"
SETUP_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
               "PodDisruptionBudget")
TOKEN_SECONDS = 24 * 3600


def helm() -> str:
    tools = REPO / ".tools" / "bin" / "helm"
    return str(tools) if tools.exists() else "helm"


def render_chart(*sets: str) -> list[dict[str, Any]]:
    """`helm template` of the chart, as `helm upgrade --install` would create it."""
    args = [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for value in sets:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise StartError(f"helm template failed:\n{done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def apply_objects(api: client.ApiClient, docs: Iterable[dict[str, Any]]) -> None:
    """Server-side apply each object (field manager kubeon-test), as `kubectl apply --server-side`."""
    dyn = dynamic.DynamicClient(api)
    for doc in docs:
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = doc["metadata"].get("namespace") if resource.namespaced else None
        resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=namespace,
                                   field_manager="kubeon-test", force_conflicts=True)


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


def token_kubeconfig(plane: ControlPlane, api: client.ApiClient, service_account: str, namespace: str,
                     path: Path) -> Path:
    """A kubeconfig that authenticates as `namespace/service_account` with a TokenRequest token."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[], expiration_seconds=TOKEN_SECONDS))
    token = client.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, request)
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": service_account,
        "clusters": [{"name": "kubeon-test", "cluster": {
            "server": plane.url, "certificate-authority": str(plane.pki["ca_crt"])}}],
        "users": [{"name": service_account, "user": {"token": token.status.token}}],
        "contexts": [{"name": service_account, "context": {"cluster": "kubeon-test", "user": service_account,
                                                            "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _container_args(docs: list[dict[str, Any]], deployment: str) -> list[str]:
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == deployment:
            return list(doc["spec"]["template"]["spec"]["containers"][0].get("args") or [])
    raise StartError(f"the chart renders no Deployment {deployment}")


def _container_env(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == deployment:
            env = doc["spec"]["template"]["spec"]["containers"][0].get("env") or []
            return {e["name"]: str(e["value"]) for e in env if "value" in e}
    return {}


def _localised(args: list[str], replace: dict[str, str]) -> list[str]:
    """The chart's args with `--flag=value` pairs replaced (and added where the chart has none)."""
    out = [a for a in args if a.split("=", 1)[0] not in replace]
    return out + [f"{flag}={value}" if value else flag for flag, value in replace.items()]


def webhook_configurations(docs: list[dict[str, Any]], base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The chart's webhook configurations with clientConfig.url on `base_url` and the caBundle."""
    out = []
    for doc in docs:
        if doc["kind"] not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        for hook in doc["webhooks"]:
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"]["url"] = base_url + (service.get("path") or "/")
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
        out.append(doc)
    return out


def scheduler_configuration(docs: list[dict[str, Any]], extender_url: str) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration, its extender pointed at `extender_url`."""
    for doc in docs:
        if doc["kind"] == "ConfigMap" and "config.yaml" in (doc.get("data") or {}):
            config = yaml.safe_load(doc["data"]["config.yaml"])
            if config.get("kind") == "KubeSchedulerConfiguration":
                for extender in config.get("extenders") or []:
                    extender["urlPrefix"] = extender_url
                return dict(config)
    raise StartError("the chart renders no KubeSchedulerConfiguration")


class Kubeon:
    """Webhook, extender, second scheduler and controller of one cluster; `start` after the plane's."""

    COMPONENTS = ("webhook", "extender", "scheduler", "controller")

    def __init__(self, plane: ControlPlane, sets: tuple[str, ...] = (),
                 components: tuple[str, ...] = COMPONENTS, args: dict[str, list[str]] | None = None) -> None:
        """`sets`: helm --set values; `components`: which of COMPONENTS run; `args`: extra
        `--flag=value` per component, over the chart's (e.g. {"controller": ["--resync-seconds=1"]})."""
        self.plane = plane
        self.sets = ("certificates.mode=external", *sets)
        unknown = set(components) - set(self.COMPONENTS)
        if unknown:
            raise ValueError(f"unknown kubeon components {sorted(unknown)}; choose from {self.COMPONENTS}")
        self.components = components
        self.args = args or {}
        self.root = plane.root / "kubeon"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports: dict[str, int] = {}
        self.docs: list[dict[str, Any]] = []

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['webhook']}"

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['extender']}"

    @property
    def scheduler_name(self) -> str:
        return str(scheduler_configuration(self.docs, "")["profiles"][0]["schedulerName"])

    def _serve(self, name: str, argv: list[str], health: str, env: dict[str, str] | None = None,
               verify: str | None = None) -> None:
        import ssl
        context = ssl.create_default_context(cafile=verify) if verify else None
        child = self.plane.children.start(name, [sys.executable, "-m", "cli.main", *argv], cwd=REPO,
                                          env={"PYTHONUNBUFFERED": "1", **(env or {})})
        self.plane.children.wait_until(child, lambda: urllib.request.urlopen(
            health, timeout=2, context=context).status == 200, START_TIMEOUT, f"healthy {name}")

    def setup(self, api: client.ApiClient) -> None:
        """Namespaces, CRDs, RBAC and the TLS material: what `helm install` creates before pods run."""
        self.docs = render_chart(*self.sets)
        for namespace in (NAMESPACE, GPU_OPERATOR_NAMESPACE):
            ensure_namespace(api, namespace)
        apply_objects(api, [yaml.safe_load(p.read_text()) for p in CRDS])
        apply_objects(api, [d for d in self.docs if d["kind"] in SETUP_KINDS])
        tls = self.root / "tls"
        done = subprocess.run([sys.executable, "-m", "cli.main", "certs", "generate", "--service",
                               f"{RELEASE}-webhook", "--namespace", NAMESPACE, "--out", str(tls),
                               "--ip", "127.0.0.1"], cwd=REPO, capture_output=True, text=True, timeout=60,
                              check=False)
        if done.returncode != 0:
            raise StartError(f"kubeon-gpu certs generate failed:\n{done.stderr}")
        self.tls = tls

    def kubeconfig_of(self, api: client.ApiClient, service_account: str) -> Path:
        return token_kubeconfig(self.plane, api, service_account, NAMESPACE,
                                self.root / f"{service_account}.kubeconfig")

    def start(self, api: client.ApiClient) -> None:
        self.setup(api)
        if "extender" not in self.components and "scheduler" in self.components:
            raise ValueError("the second scheduler needs the extender")
        for name in self.COMPONENTS:
            if name in self.components:
                getattr(self, f"start_{name}")(api)

    def _extra(self, name: str) -> dict[str, str]:
        return dict(a.split("=", 1) if "=" in a else (a, "") for a in self.args.get(name, []))

    def stop_component(self, name: str) -> None:
        """Stop one running component (webhook, extender, kubeon-gpu-scheduler, controller)."""
        self.plane.children.stop_one(self.plane.children.get(name))

    def start_webhook(self, api: client.ApiClient) -> None:
        port = self.ports["webhook"] = free_port()
        args = _localised(_container_args(self.docs, f"{RELEASE}-webhook"), {
            "--cert-dir": str(self.tls), "--port": str(port), "--bind": "127.0.0.1", "--workers": "1",
            "--kubeconfig": str(self.kubeconfig_of(api, f"{RELEASE}-webhook")), **self._extra("webhook")})
        self._serve("webhook", args, f"{self.webhook_url}/readyz", verify=str(self.tls / "ca.crt"))
        apply_objects(api, webhook_configurations(self.docs, self.webhook_url, (self.tls / "ca.crt").read_bytes()))

    def start_extender(self, api: client.ApiClient, port: int | None = None) -> None:
        """Start the extender; `port`: the one it had (the scheduler's urlPrefix names it), to restart it."""
        port = self.ports["extender"] = port or free_port()
        args = _localised(_container_args(self.docs, f"{RELEASE}-extender"), {
            "--port": str(port), "--bind": "127.0.0.1",
            "--kubeconfig": str(self.kubeconfig_of(api, f"{RELEASE}-extender")), **self._extra("extender")})
        self._serve("extender", args, f"{self.extender_url}/readyz")

    def start_scheduler(self, api: client.ApiClient, extender_url: str | None = None) -> None:
        """`extender_url`: where the scheduler calls the extender (default: the extender itself;
        a test may put a recording proxy in between)."""
        config = scheduler_configuration(self.docs, extender_url or self.extender_url)
        config["clientConnection"] = {"kubeconfig": str(self.kubeconfig_of(api, "kubeon-gpu-scheduler"))}
        config["leaderElection"] = {"leaderElect": False}
        path = self.root / "kubeon-gpu-scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        self.plane.start_scheduler("kubeon-gpu-scheduler", path)

    def start_controller(self, api: client.ApiClient, identity: str = "kubeon-test-controller") -> None:
        port = self.ports["controller"] = free_port()
        chart_args = _container_args(self.docs, RELEASE)
        local = {"--extender-url": self.extender_url} if any(a.startswith("--extender-url") for a in chart_args) \
            and "extender" in self.ports else {}
        args = _localised(chart_args, {
            **local, "--health-port": str(port), "--health-bind": "127.0.0.1", "--identity": identity,
            "--kubeconfig": str(self.kubeconfig_of(api, RELEASE)), **self._extra("controller")})
        env = {**_container_env(self.docs, RELEASE), "POD_NAME": identity}
        self._serve("controller", args, f"http://127.0.0.1:{port}/healthz", env=env)

    def health(self, name: str) -> bool:
        try:
            url = {"extender": f"{self.extender_url}/readyz"}.get(name, "")
            return bool(url) and urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False
