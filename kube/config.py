"""Where the Kubernetes client gets its connection settings.

One function, `load_api_client`, decides between an explicit kubeconfig, the
in-cluster service account and the user's default kubeconfig, and returns a
fresh `ApiClient` built on its own `Configuration`. It never mutates the
kubernetes package's global default configuration, so two clients (a test
API server and a real cluster, or two test servers under xdist) can coexist
in one process.

A kubeconfig that cannot be used is one `KubeConfigError` whatever is wrong
with it: the kubernetes loader lets decode errors, YAML errors and wrong
types (`clusters: 5`, `server: 5`) out as bare TypeErrors and AttributeErrors,
so the file is read and its shape checked here first, as kubectl's loader
checks it (`check_kubeconfig`), and the message names the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import ENV_KUBECONFIG_PATH_SEPARATOR

from gpupolicy.yamlload import describe_error, safe_load


class KubeConfigError(RuntimeError):
    """No usable connection settings: the message says which source failed and why."""


# What the kubernetes loader raises on a file it cannot read beyond ConfigException (a decode error, a
# YAML error, a wrong type deep in a field that the shape check does not know); all are the file's fault.
_LOADER_ERRORS = (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError,
                  yaml.YAMLError)

# client-go's kubeconfig schema (clientcmd/api/v1): the fields the loader reads, by type.
_STRING, _BOOL, _MAP = (str, "a string"), (bool, "true or false"), (dict, "a mapping")
_FIELDS: dict[str, dict[str, tuple[type, str]]] = {
    "cluster": {**dict.fromkeys(("server", "certificate-authority", "certificate-authority-data",
                                 "tls-server-name", "proxy-url"), _STRING),
                **dict.fromkeys(("insecure-skip-tls-verify", "disable-compression"), _BOOL)},
    "context": dict.fromkeys(("cluster", "user", "namespace"), _STRING),
    "user": {**dict.fromkeys(("token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
                              "client-key-data", "username", "password", "as", "as-uid"), _STRING),
             **dict.fromkeys(("exec", "auth-provider"), _MAP)},
}
_SECTIONS = (("clusters", "cluster"), ("contexts", "context"), ("users", "user"))


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def check_kubeconfig(data: Any) -> str:
    """Why `data` (a parsed kubeconfig) is not one kubectl would read, naming the field; "" when it is."""
    if data is None:
        return ""  # empty: the kubernetes loader says so in its own words
    if not isinstance(data, dict):
        return f"not a kubeconfig: the top level is {_type_name(data)}, not a mapping"
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        return f"current-context: must be a string, not {_type_name(current)}"
    for section, inner in _SECTIONS:
        entries = data.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"{section}: must be a list, not {_type_name(entries)}"
        for i, entry in enumerate(entries):
            where = f"{section}[{i}]"
            if not isinstance(entry, dict):
                return f"{where}: must be a mapping, not {_type_name(entry)}"
            if not isinstance(entry.get("name"), str):
                return f"{where}.name: must be a string" + (
                    "" if "name" not in entry else f", not {_type_name(entry['name'])}")
            body = entry.get(inner)
            if body is None:
                continue
            if not isinstance(body, dict):
                return f"{where}.{inner}: must be a mapping, not {_type_name(body)}"
            for key, (kind, wanted) in _FIELDS[inner].items():
                value = body.get(key)
                if value is not None and not isinstance(value, kind):
                    return f"{where}.{inner}.{key}: must be {wanted}, not {_type_name(value)}"
    return ""


def read_kubeconfig(path: str) -> str:
    """Why the kubeconfig file at `path` cannot be used (one line, naming the field); "" when it can."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        return exc.strerror or str(exc)
    except UnicodeDecodeError:
        return "not UTF-8 text (a kubeconfig is YAML)"
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        return describe_error(exc)
    return check_kubeconfig(data)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, yaml.YAMLError):
        return describe_error(exc)
    text = " ".join(str(exc).split())
    return text if isinstance(exc, (ConfigException, OSError)) else f"{type(exc).__name__}: {text}"


def _default_kubeconfig() -> str:
    # KUBECONFIG may list several files (colon-separated); the kubernetes loader
    # accepts that form too, so hand it over unchanged.
    return os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def _check_files(paths: str, source: str) -> None:
    """Raise KubeConfigError for the first of the (existing) files in `paths` that is not a usable kubeconfig."""
    for path in paths.split(ENV_KUBECONFIG_PATH_SEPARATOR):
        path = os.path.expanduser(path)
        if path and os.path.exists(path):
            problem = read_kubeconfig(path)
            if problem:
                where = "" if path == source else f"{path}: "
                raise KubeConfigError(f"cannot load Kubernetes configuration ({source}): {where}{problem}")


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> client.Configuration:
    """Build a fresh `Configuration`.

    Order: the explicit `kubeconfig` path; else in-cluster when
    KUBERNETES_SERVICE_HOST is set; else $KUBECONFIG or ~/.kube/config.
    KubeConfigError, one line naming the source (the file) and what is wrong, for anything unusable.
    """
    cfg = client.Configuration()
    if kubeconfig:
        path = Path(kubeconfig)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            raise KubeConfigError(f"kubeconfig {kubeconfig!r} {what}")
        source = kubeconfig
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = "in-cluster"
    else:
        source = _default_kubeconfig()
    try:
        if kubeconfig:
            _check_files(kubeconfig, source)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg)
        elif source == "in-cluster":
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            _check_files(source, source)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source, context=context, client_configuration=cfg)
    except _LOADER_ERRORS as exc:
        raise KubeConfigError(f"cannot load Kubernetes configuration ({source}): {_one_line(exc)}") from exc
    return cfg


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A new `ApiClient` for the cluster chosen by `load_configuration`.

    The caller owns it (close it with `.close()` when done); API classes take
    it explicitly: `CoreV1Api(load_api_client())`.
    """
    return client.ApiClient(configuration=load_configuration(kubeconfig, context))
