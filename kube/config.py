"""Where the Kubernetes client gets its connection settings.

One function, `load_api_client`, decides between an explicit kubeconfig, the
in-cluster service account and the user's default kubeconfig, and returns a
fresh `ApiClient` built on its own `Configuration`. It never mutates the
kubernetes package's global default configuration, so two clients (a test
API server and a real cluster, or two test servers under xdist) can coexist
in one process.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException


class KubeConfigError(RuntimeError):
    """No usable connection settings: the message says which source failed and why."""


def _default_kubeconfig() -> str:
    # KUBECONFIG may list several files (colon-separated); the kubernetes loader
    # accepts that form too, so hand it over unchanged.
    return os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> client.Configuration:
    """Build a fresh `Configuration`.

    Order: the explicit `kubeconfig` path; else in-cluster when
    KUBERNETES_SERVICE_HOST is set; else $KUBECONFIG or ~/.kube/config.
    """
    cfg = client.Configuration()
    try:
        if kubeconfig:
            if not Path(kubeconfig).is_file():
                raise KubeConfigError(f"kubeconfig {kubeconfig!r} does not exist")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            path = _default_kubeconfig()
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=cfg)
    except ConfigException as exc:
        source = kubeconfig or ("in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "default")
        raise KubeConfigError(f"cannot load Kubernetes configuration ({source}): {exc}") from exc
    return cfg


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A new `ApiClient` for the cluster chosen by `load_configuration`.

    The caller owns it (close it with `.close()` when done); API classes take
    it explicitly: `CoreV1Api(load_api_client())`.
    """
    return client.ApiClient(configuration=load_configuration(kubeconfig, context))
