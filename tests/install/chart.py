"""Running the real helm and kubectl on the chart, and reading what they render.

Not a test module: the builders and lookups the install tests share. Renders
are cached per process (the suite runs under xdist, so once per worker).
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.missing import missing

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = MANIFESTS / "chart" / "kubeon-gpu-optimizer"
CRD_SOURCE = MANIFESTS / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
CHART_CRD = CHART / "crds" / "gpupolicies.gpu.kubeon.io.yaml"
NAMESPACE = "kubeon-gpu"
RELEASE = "kubeon-gpu-optimizer"

# The install guide's `helm upgrade --install ... --set` values (docs/install.md, issue 6).
GUIDE_SET = {
    "cluster": "prod-use1-a",
    "hub.url": "https://acme.kubeon.io",
    "hub.existingSecret": "kubeon-gpu-optimizer-token",
    "defaultMode": "Recommend",
}
PROVIDERS = ("karpenter", "eks-nodegroups", "aks-nodepools", "gke-nodepools")


def tool(name: str) -> str:
    """helm 4 / kubectl 1.35 from .tools/bin (scripts/install-test-deps.sh), else skip."""
    local = REPO / ".tools" / "bin" / name
    if local.exists():
        return str(local)
    missing(f"{name} not found in {local.parent}: run scripts/install-test-deps.sh")
    raise AssertionError  # unreachable: skip raises


def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    return done


def helm_template_cmd(values: dict[str, str] | None = None, *extra: str) -> list[str]:
    cmd = [tool("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for key, value in (values or {}).items():
        cmd += ["--set", f"{key}={value}"]
    return cmd + list(extra)


@functools.lru_cache(maxsize=32)
def _render(items: tuple[tuple[str, str], ...], extra: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    out = run(helm_template_cmd(dict(items), *extra)).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def render(values: dict[str, str] | None = None, *extra: str) -> list[dict[str, Any]]:
    """`helm template` with these --set values: the rendered objects (CRDs included)."""
    return list(_render(tuple(sorted((values or {}).items())), tuple(extra)))


def load_dir(path: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for file in sorted(path.glob("*.yaml")):
        if file.name == "kustomization.yaml":
            continue
        docs += [doc for doc in yaml.safe_load_all(file.read_text()) if doc]
    return docs


def find(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(docs: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every pod template the chart renders."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def container(deployment: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def rule_triples(rules: Iterable[dict[str, Any]], with_names: bool = False) -> set[tuple[str, ...]]:
    """Expand RBAC rules into (apiGroup, resource, verb[, resourceName]) tuples for set comparison."""
    triples: set[tuple[str, ...]] = set()
    for rule in rules:
        names = rule.get("resourceNames") or ["*"]
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    for name in names:
                        triples.add((group, resource, verb, name) if with_names else (group, resource, verb))
    return triples


