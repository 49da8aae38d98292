"""`kubeon-gpu dry-run`: what the optimizer would do to pods and workloads, offline.

`-f FILE` holds Pods, Deployments, StatefulSets, Jobs or CronJobs (several YAML
documents or a List); `--policies FILE` GpuPolicies (and optionally Namespace
objects, for namespaceSelector); `--nodes FILE` Nodes with GFD labels. Any of
these kinds may also sit in any file. `--example` runs the embedded example
set (gpupolicy/examples/). Output: a readable summary (default for --example),
or the /dry-run answer per object as YAML (default for -f) or JSON. Bad input:
one line naming the file and field, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

import gpupolicy.admission.dryrun
from gpupolicy.admission.dryrun import DryRunError, dry_run, parse_policies
from gpupolicy.admission.mutate import AdmissionResult
from gpupolicy.cluster import ClusterView, node_from_object
from gpupolicy.model import GpuPolicy, Mode

EXAMPLE_FILES = ("policies.yaml", "nodes.yaml", "workloads.yaml")


class InputError(Exception):
    """A file the dry-run cannot use; the message names the file (and field)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", metavar="FILE", help="pods/workloads to evaluate (YAML)")
    parser.add_argument("--policies", metavar="FILE", help="GpuPolicy documents (YAML)")
    parser.add_argument("--nodes", metavar="FILE", help="Node documents with GPU labels (YAML)")
    parser.add_argument("-o", "--output", choices=("text", "yaml", "json"),
                        help="text summary, or the full answer as yaml or json")
    parser.add_argument("--example", action="store_true",
                        help="run the embedded example set (as an install with prometheus.url set)")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode for policies that set none (the install's defaultMode)")
    parser.add_argument("--metrics", action="store_true",
                        help="evaluate as an install with prometheus.url set; without it sharing and "
                             "scaleToZero policies stay Recommend, as they do in the cluster")


def _documents(text: str, source: str) -> list[dict[str, Any]]:
    try:
        loaded = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{source}:{where} not valid YAML") from exc
    docs: list[dict[str, Any]] = []
    for i, doc in enumerate(loaded):
        if not isinstance(doc, dict):
            raise InputError(f"{source}: document {i + 1} is not a Kubernetes object")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            docs.extend(item for item in doc["items"] if isinstance(item, dict))
        else:
            docs.append(doc)
    return docs


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc


class Inputs:
    """Everything read from the files, sorted by kind, remembering which file each came from."""

    def __init__(self) -> None:
        self.objects: list[tuple[str, dict[str, Any]]] = []
        self.policies: list[tuple[str, dict[str, Any]]] = []
        self.nodes: list[dict[str, Any]] = []
        self.namespaces: dict[str, dict[str, str]] = {}

    def add(self, docs: Iterable[dict[str, Any]], source: str) -> None:
        for doc in docs:
            kind = doc.get("kind")
            if kind == "GpuPolicy":
                self.policies.append((source, doc))
            elif kind == "Node":
                self.nodes.append(doc)
            elif kind == "Namespace":
                meta = doc.get("metadata") or {}
                self.namespaces[str(meta.get("name", ""))] = {
                    str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            else:
                self.objects.append((source, doc))

    def view(self, default_mode: Mode, metrics: bool = False) -> ClusterView:
        policies = []
        for source, doc in self.policies:
            name = (doc.get("metadata") or {}).get("name", "?")
            try:
                policies.extend(parse_policies([doc]))
            except DryRunError as exc:
                field = str(exc).split(".", 1)[1] if "." in str(exc) else str(exc)
                raise InputError(f"{source}: GpuPolicy {name}: {field}") from exc
        return ClusterView(policies=tuple(policies), namespace_labels=self.namespaces,
                           nodes=tuple(node_from_object(n) for n in self.nodes), default_mode=default_mode,
                           metrics_configured=metrics)


def _title(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')} {meta.get('namespace') or 'default'}/{meta.get('name', '?')}"


def _policy_mode(policy: GpuPolicy, view: ClusterView) -> str:
    eff = view.mode_of(policy)
    return f"{policy.name} ({eff.mode}" + (f"; {eff.degraded_reason})" if eff.degraded else ")")


def render_text(answers: list[tuple[dict[str, Any], AdmissionResult]], view: ClusterView) -> str:
    """A summary a newcomer can read: per object, each policy's decision and the warnings."""
    lines = [f"Policies: {', '.join(_policy_mode(p, view) for p in view.policies)}"
             if view.policies else "Policies: none (nothing will change)"]
    if view.nodes:
        lines.append("Nodes: " + ", ".join(f"{n.name} ({n.gpu_product or 'no GPU label'})" for n in view.nodes))
    for obj, result in answers:
        lines.append("")
        verdict = "allowed" if result.allowed else f"DENIED: {result.message}"
        changed = f"{len(result.patch)} patch operations" if result.patch else "unchanged"
        lines.append(f"{_title(obj)}: {verdict}, {changed}")
        if result.note and not result.decisions:
            lines.append(f"  - {result.note}")
        for d in result.decisions:
            state = "applied" if d.applied else "not applied"
            lines.append(f"  - {d.policy} [{d.mode}] {d.action}, {state}: {d.reason}")
        for warning in result.warnings:
            lines.append(f"  ! warning: {warning}")
        for op in result.patch:
            value = "" if "value" not in op else " " + json.dumps(op["value"], separators=(",", ":"))
            if len(value) > 90:
                value = value[:87] + "..."
            lines.append(f"    {op['op']:7} {op['path']}{value}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        inputs = Inputs()
        if args.example:
            folder = Path(gpupolicy.admission.dryrun.__file__).parent.parent / "examples"
            for name in EXAMPLE_FILES:
                inputs.add(_documents((folder / name).read_text(encoding="utf-8"), f"example {name}"), name)
        elif not args.filename:
            raise InputError("give -f FILE (pods or workloads) or --example")
        for path in (args.filename, args.policies, args.nodes):
            if path:
                inputs.add(_documents(_read(path), path), path)
        view = inputs.view(Mode(args.default_mode), args.metrics or args.example)
        answers = []
        for source, obj in inputs.objects:
            try:
                answers.append((obj, dry_run(obj, view)))
            except DryRunError as exc:
                raise InputError(f"{source}: {_title(obj)}: {exc}") from exc
        if not answers:
            raise InputError(f"{args.filename or 'example'}: no Pod or workload to evaluate")
    except InputError as exc:
        print(f"kubeon-gpu dry-run: {exc}", file=sys.stderr)
        return 2
    output = args.output or ("text" if args.example else "yaml")
    if output == "text":
        sys.stdout.write(render_text(answers, view))
    elif output == "json":
        wires = [r.to_wire() for _, r in answers]
        sys.stdout.write(json.dumps(wires[0] if len(wires) == 1 else wires, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all([r.to_wire() for _, r in answers], sort_keys=False))
    return 0
