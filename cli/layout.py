"""`kubeon-gpu layout`: the sharing layout the controller would plan, offline, as YAML.

`--nodes FILE` (Nodes with GFD and GPU Operator labels), `--pods FILE` (the
GPU pods: pending ones are the demand, bound ones show which nodes are busy)
and `--policies FILE` (GpuPolicies) go through the controller's own planner
(gpupolicy/capacity/layout.py). The answer: the time-slicing ConfigMap keys
to add, each node change with its labels, steps and reason, whether the
policy's mode lets it apply (what Approve would do: approve `Node/<name>`),
and the pods no node change can serve. `--example` runs the embedded
examples (examples/, packaged as gpupolicy/examples/). Files are read as
`kubeon-gpu dry-run` reads them (cli/sources.py); bad input: one line per
problem naming the file, document and field, exit status 2.

`-o kubernetes` writes the same plan as objects a user reviews and applies
by hand (`kubectl apply --server-side`): the time-slicing ConfigMap as it
must look after the change (the one `--configmap-file` gives, with the
plan's keys merged in; without it, only the keys to add, which server-side
apply merges into the ConfigMap there) and one Node per node change with the
labels it sets; what apply cannot do (a MIG change's cordon and uncordon, a
label to remove) is said in comments, with the command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from cli.dryrun import read_all
from cli.sources import Document, Problem, example_sources, expand
from gpupolicy.admission.shape import object_shape_error
from gpupolicy.capacity.layout import MIG, LayoutPlan, NodeTarget, plan_layout, read_demand, read_nodes
from gpupolicy.capacity.timeslicing import key_replicas, plan_configmap
from gpupolicy.catalog import MIG_STATE_LABEL
from gpupolicy.k8s.names import dns_label_problem, dns_name_problem
from gpupolicy.model import GpuPolicy, Mode
from gpupolicy.proposals import decide_state

EXAMPLE_FILES = ("policies.yaml", "nodes.yaml", "pods.yaml")
MIG_STEPS = ["cordon", "set nvidia.com/mig.config", "wait for nvidia.com/mig.config.state=success", "uncordon"]
DEFAULT_CONFIGMAP = "gpu-operator/time-slicing-config"
FIELD_MANAGER = "kubeon-gpu-layout"
# What a ConfigMap read back from the API server carries that an applied one must not.
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", metavar="FILE", help="Node documents with GPU labels (YAML)")
    parser.add_argument("--pods", metavar="FILE", help="GPU Pod documents, pending and bound (YAML)")
    parser.add_argument("--policies", metavar="FILE", help="GpuPolicy documents (YAML)")
    parser.add_argument("--example", action="store_true", help="run the embedded example set")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode for policies that set none (the install's defaultMode)")
    parser.add_argument("--configmap", default=None, metavar="NS/NAME",
                        help="the time-slicing ConfigMap (install values gpuOperator.*; default: the one "
                             f"--configmap-file holds, else {DEFAULT_CONFIGMAP})")
    parser.add_argument("--configmap-file", metavar="FILE",
                        help="that ConfigMap as it is now (kubectl get configmap -n NS NAME -o yaml): the keys it "
                             "holds are not added again, and -o kubernetes writes it whole, the plan's keys merged in")
    parser.add_argument("-o", "--output", choices=("plan", "kubernetes"), default="plan",
                        help="plan: the plan as YAML (the default); kubernetes: the ConfigMap and Node objects to "
                             f"review and apply (kubectl apply --server-side --force-conflicts "
                             f"--field-manager={FIELD_MANAGER} -f FILE)")


def _node_entry(target: NodeTarget, policy: GpuPolicy, default_mode: Mode) -> dict[str, Any]:
    mode = policy.effective_mode(default_mode)
    approved = target.target_ref in policy.spec.approvals
    return {
        "name": target.node, "policy": policy.name, "mode": mode.value,
        "applies": decide_state(mode, approved, None).apply,
        "approve": f"add {target.target_ref!r} to spec.approvals" if mode is Mode.APPROVE and not approved else None,
        "from": target.current.describe(), "to": target.target.describe(),
        "labels": target.labels,
        "steps": MIG_STEPS if MIG in (target.target.kind, target.current.kind) else ["set labels"],
        "reason": target.reason,
    }


def configmap_problem(value: str) -> str:
    """Why --configmap cannot name a ConfigMap ("" when it can): NAMESPACE (one DNS label) / NAME (a DNS
    subdomain), as the API server names objects."""
    namespace, slash, name = value.partition("/")
    if not slash:
        return "give NAMESPACE/NAME"
    problem = dns_label_problem(namespace, "a namespace")
    if problem:
        return f"namespace: {problem}"
    problem = dns_name_problem(name, wildcard=False)
    return f"name: {problem}" if problem else ""


def render(plan: LayoutPlan, policies: list[GpuPolicy], default_mode: Mode, configmap: str,
           add: dict[str, str]) -> dict[str, Any]:
    namespace, _, name = configmap.partition("/")
    by_name = {p.name: p for p in policies}
    nodes = []
    for target in plan.targets:
        entry = _node_entry(target, by_name[target.policy], default_mode)
        nodes.append({k: v for k, v in entry.items() if v is not None})
    return {
        "configMap": {"namespace": namespace, "name": name, "add": add},
        "nodes": nodes,
        "matchedOnCurrentLayout": plan.matched,
        "unserved": [{"pod": pod, "reason": why} for pod, why in plan.unserved],
    }


def _document(comments: list[str], obj: dict[str, Any]) -> str:
    return "".join(f"# {line}\n" for line in comments) + yaml.dump(obj, Dumper=_Dumper, sort_keys=False)


def configmap_object(configmap: str, current: dict[str, Any] | None, add: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap as it must look after the change: `current` (read back from the API server: its
    server-set fields dropped) with the keys of `add` merged in, else a ConfigMap holding `add` alone."""
    namespace, _, name = configmap.partition("/")
    if current is None:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                "data": dict(add)}
    meta = {k: v for k, v in (current.get("metadata") or {}).items() if k not in SERVER_FIELDS}
    if LAST_APPLIED in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    meta.update(name=name, namespace=namespace)
    return {**{k: v for k, v in current.items() if k != "status"}, "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta, "data": {**(current.get("data") or {}), **add}}


def kubernetes_objects(plan: LayoutPlan, policies: list[GpuPolicy], default_mode: Mode, configmap: str,
                       current: dict[str, Any] | None, add: dict[str, str]) -> str:
    """The plan as a YAML stream for `kubectl apply --server-side`: the ConfigMap when keys are added, one Node
    per node change (the labels it sets), each with comments saying what it does and what apply cannot do."""
    by_name = {p.name: p for p in policies}
    apply = f"kubectl apply --server-side --force-conflicts --field-manager={FIELD_MANAGER} -f FILE"
    header = ["kubeon-gpu layout: the plan as objects; review them, then apply them with", f"  {apply}",
              "(--force-conflicts: the labels it changes were set by the GPU Operator or the controller)"]
    removals = [f"kubectl label node {t.node} {label}-" for t in plan.targets
                for label, value in t.labels.items() if value is None]
    if removals:
        header += ["Server-side apply removes no label that another manager set; remove these by hand:",
                   *(f"  {command}" for command in removals)]
    documents = []
    if add:
        keys = ", ".join(sorted(add))
        kept = "the rest as --configmap-file gave it" if current is not None else (
            "server-side apply keeps the keys the ConfigMap holds")
        documents.append(([f"ConfigMap {configmap}: adds {keys} ({kept})"],
                          configmap_object(configmap, current, add)))
    for target in plan.targets:
        mode = by_name[target.policy].effective_mode(default_mode)
        comments = [f"Node {target.node}: {target.current.describe()} -> {target.target.describe()} "
                    f"(GpuPolicy {target.policy}, {mode.value})", f"why: {target.reason}"]
        if MIG in (target.target.kind, target.current.kind):
            comments.append(f"MIG, as the controller does it: kubectl cordon {target.node}; apply; wait until its "
                            f"label {MIG_STATE_LABEL} is success; kubectl uncordon {target.node}")
        labels = {label: value for label, value in target.labels.items() if value is not None}
        if labels:
            documents.append((comments, {"apiVersion": "v1", "kind": "Node",
                                         "metadata": {"name": target.node, "labels": labels}}))
    if not documents:
        header.append("nothing to change")
    first = "".join(f"# {line}\n" for line in header)
    return first + "---\n".join(_document(comments, obj) for comments, obj in documents)


def read_configmap_file(path: str) -> tuple[Document | None, list[Problem]]:
    """The one ConfigMap of `path`, or the problems naming file, document and field."""
    sources, problems = expand([path], "--configmap-file")
    if problems:
        return None, problems
    context, others, problems = read_all(sources)
    if context.policies or context.nodes or context.namespaces:
        problems.append(Problem(path, 0, "kind: only a ConfigMap belongs in --configmap-file"))
    found = None
    for doc in others:
        problem = _configmap_problem(doc.obj) if doc.obj.get("kind") == "ConfigMap" else (
            f"kind: {doc.obj.get('kind')}: --configmap-file holds the time-slicing ConfigMap")
        if not problem and found is not None:
            problem = "a second ConfigMap: --configmap-file holds one"
        if problem:
            problems.append(doc.problem(problem))
        else:
            found = doc
    if found is None and not problems:
        problems.append(Problem(path, 0, "no ConfigMap"))
    return found, problems


def _configmap_problem(obj: dict[str, Any]) -> str:
    shape = object_shape_error(obj, "object").removeprefix("object.")
    if shape:
        return shape
    meta = obj.get("metadata") or {}
    for field in ("name", "namespace"):
        if not isinstance(meta.get(field), str) or not meta.get(field):
            return f"metadata.{field}: missing: the ConfigMap as the API server holds it names both"
    data = obj.get("data")
    if data is not None and not isinstance(data, dict):
        return "data: must be a map of strings"
    for key, value in (data or {}).items():
        if not isinstance(value, str):
            return f"data.{key}: must be a string, not {type(value).__name__}"
    return ""


def _named_configmap(args: argparse.Namespace, found: Document | None) -> tuple[str, Problem | None]:
    """NS/NAME of the ConfigMap: --configmap, else the file's, else the default; a problem when the two differ."""
    if found is None:
        return args.configmap or DEFAULT_CONFIGMAP, None
    meta = found.obj["metadata"]
    in_file = f"{meta['namespace']}/{meta['name']}"
    if args.configmap and args.configmap != in_file:
        return args.configmap, found.problem(f"metadata: ConfigMap {in_file} is not the one --configmap names "
                                             f"({args.configmap})")
    return in_file, None


def run(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    if args.example:
        sources = example_sources(EXAMPLE_FILES)
    elif not (args.nodes and args.pods and args.policies):
        problems.append(Problem("layout", 0, "give --nodes FILE, --pods FILE and --policies FILE, or --example"))
        sources = []
    else:
        sources, problems = expand([args.nodes, args.pods, args.policies], "-f")
    if args.configmap is not None and (why := configmap_problem(args.configmap)):
        problems.append(Problem("--configmap", 0, f"{args.configmap[:120]!r}: {why}"))
    found, file_problems = read_configmap_file(args.configmap_file) if args.configmap_file else (None, [])
    problems += file_problems
    configmap, mismatch = _named_configmap(args, found) if not problems else (DEFAULT_CONFIGMAP, None)
    problems += [mismatch] if mismatch else []
    context, others, read_problems = read_all(sources) if not problems else (None, [], [])
    problems += read_problems
    problems += [d.problem(f"kind: {d.obj.get('kind')}: only Pods, Nodes, GpuPolicies and Namespaces are read")
                 for d in others if d.obj.get("kind") != "Pod"]
    # the shape the planner reads, as dry-run checks it (a list where a map belongs, a quantity like "abc")
    problems += [d.problem(shape) for d in others if d.obj.get("kind") == "Pod"
                 and (shape := object_shape_error(d.obj, "object").removeprefix("object."))]
    if problems or context is None:
        for problem in problems:
            print(f"kubeon-gpu layout: {problem}", file=sys.stderr)
        return 2
    default_mode = Mode(args.default_mode)
    view = context.view(default_mode)
    pods = [d.obj for d in others]
    policies = list(view.policies)
    current = found.obj if found is not None else None
    data = (current or {}).get("data") or {}
    plan = plan_layout(read_nodes(context.nodes, pods, key_replicas(data), view.catalog),
                       read_demand(pods, policies, view.catalog))
    add = dict(plan_configmap(data, plan.keys(), set()).add)
    if args.output == "kubernetes":
        sys.stdout.write(kubernetes_objects(plan, policies, default_mode, configmap, current, add))
    else:
        sys.stdout.write(yaml.dump(render(plan, policies, default_mode, configmap, add), Dumper=_Dumper,
                                   sort_keys=False))
    return 0


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap keys' text) as literal blocks, as in a ConfigMap manifest."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)
