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
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from cli.dryrun import read_all
from cli.sources import Problem, example_sources, expand
from gpupolicy.admission.shape import object_shape_error
from gpupolicy.capacity.layout import MIG, LayoutPlan, NodeTarget, plan_layout, read_demand, read_nodes
from gpupolicy.capacity.timeslicing import config_text
from gpupolicy.model import GpuPolicy, Mode
from gpupolicy.names import dns_label_problem, dns_name_problem
from gpupolicy.proposals import decide_state

EXAMPLE_FILES = ("policies.yaml", "nodes.yaml", "pods.yaml")
MIG_STEPS = ["cordon", "set nvidia.com/mig.config", "wait for nvidia.com/mig.config.state=success", "uncordon"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", metavar="FILE", help="Node documents with GPU labels (YAML)")
    parser.add_argument("--pods", metavar="FILE", help="GPU Pod documents, pending and bound (YAML)")
    parser.add_argument("--policies", metavar="FILE", help="GpuPolicy documents (YAML)")
    parser.add_argument("--example", action="store_true", help="run the embedded example set")
    parser.add_argument("--default-mode", choices=[m.value for m in Mode], default=Mode.RECOMMEND.value,
                        help="mode for policies that set none (the install's defaultMode)")
    parser.add_argument("--configmap", default="gpu-operator/time-slicing-config", metavar="NS/NAME",
                        help="the time-slicing ConfigMap (install values gpuOperator.*)")


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


def render(plan: LayoutPlan, policies: list[GpuPolicy], default_mode: Mode, configmap: str) -> dict[str, Any]:
    namespace, _, name = configmap.partition("/")
    by_name = {p.name: p for p in policies}
    nodes = []
    for target in plan.targets:
        entry = _node_entry(target, by_name[target.policy], default_mode)
        nodes.append({k: v for k, v in entry.items() if v is not None})
    return {
        "configMap": {"namespace": namespace, "name": name,
                      "add": {key: config_text(replicas) for key, replicas in sorted(plan.keys().items())}},
        "nodes": nodes,
        "matchedOnCurrentLayout": plan.matched,
        "unserved": [{"pod": pod, "reason": why} for pod, why in plan.unserved],
    }


def run(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    if args.example:
        sources = example_sources(EXAMPLE_FILES)
    elif not (args.nodes and args.pods and args.policies):
        problems.append(Problem("layout", 0, "give --nodes FILE, --pods FILE and --policies FILE, or --example"))
        sources = []
    else:
        sources, problems = expand([args.nodes, args.pods, args.policies], "-f")
    configmap = configmap_problem(args.configmap)
    if configmap:
        problems.append(Problem("--configmap", 0, f"{args.configmap[:120]!r}: {configmap}"))
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
    plan = plan_layout(read_nodes(context.nodes, pods, {}, view.catalog), read_demand(pods, policies, view.catalog))
    sys.stdout.write(yaml.dump(render(plan, policies, default_mode, args.configmap), Dumper=_Dumper,
                               sort_keys=False))
    return 0


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap keys' text) as literal blocks, as in a ConfigMap manifest."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)
