"""The controller's capacity and layout passes at a cluster's size, without a cluster: their CPU per pass.

    python bench/controller_pass.py [--nodes 5000] [--pods 50000] [--passes 5] [--churn 50]

The nodes and pods are bench/cluster_scale.py's (`Workload`: the openb node list's mix in scaled copies,
GPU pods of the default trace's shapes to `--gpu-fill` of the GPUs, then small agent pods), as the
controller's watch cache would hold them; its GpuPolicies too (one of each kind, Automatic). The passes
run the controller's own reconcilers on a ControllerContext whose cluster cache is that list of objects.
Stand-ins, for what a pass writes and nothing else: the capacity provider (Karpenter's NodePool and
NodeClaims: taken as in shape, none launched before), the time-slicing ConfigMap (read empty, patches
taken), node patches (taken). Between two passes `--churn` pods end and as many of the same shapes start
on the same nodes (new uids and resourceVersions), as bench/cluster_scale.py's churn does.

It prints, per reconciler, the CPU seconds of the first pass (cold) and the median of the others, beside
the reconciler's period (the limit: a pass must end well within it) and, for the capacity pass, the same
passes with the consolidation's state built anew every pass (`--no-memo`: what StateMemo saves). The last
line is one JSON object. Bad arguments: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cluster_replay import NAMESPACE  # noqa: E402
from bench.cluster_scale import PERIODS, Workload, policies  # noqa: E402
from controller import layout as layout_module  # noqa: E402
from controller.capacity.reconciler import CapacityReconciler  # noqa: E402
from controller.context import ControllerContext  # noqa: E402
from controller.layout import LayoutReconciler  # noqa: E402
from controller.policies import PolicyEntry, PolicyStore  # noqa: E402
from controller.recorder import ControllerMetrics, Recorder  # noqa: E402
from gpupolicy.model import Mode, parse_policy  # noqa: E402
from gpupolicy.packing.kubemodel import parsing  # noqa: E402
from gpupolicy.packing.kubestate import StateMemo  # noqa: E402


class Objects:
    """The controller's cluster cache (kube/informers.py ClusterCache's reads) over lists of objects."""

    relists = 0

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.node_list, self.pod_list = nodes, pods

    def nodes(self) -> list[dict[str, Any]]:
        return self.node_list

    def pods(self, namespace: str | None = None, labels: Any = None) -> list[dict[str, Any]]:
        """As the watch cache answers (kube/reflector.py `in_key_order`): a new list, in key order (`churn`
        keeps `pod_list` in it)."""
        return [p for p in self.pod_list if namespace is None or p["metadata"]["namespace"] == namespace]

    def budgets(self) -> list[dict[str, Any]]:
        return []

    def slices(self) -> list[dict[str, Any]]:
        return []

    def workloads(self) -> list[dict[str, Any]]:
        return []

    def wait_for_sync(self) -> None:
        return None

    def wrote(self, obj: Any) -> None:
        return None


class Provider:
    """Stands for Karpenter (kube/karpenter.py KarpenterProvider): the NodePool in shape, no NodeClaim yet."""

    name, whole_gpus = "karpenter", False

    def groups(self, pool: str | None = None) -> None:
        return None

    def pool_in_shape(self, policy: str, spec: Any) -> bool:
        return True

    def ensure_pool(self, policy: str, spec: Any) -> str:
        return ""

    def nodes(self, pool: str | None = None) -> list[Any]:
        return []

    def add(self, policy: str, spec: Any, new: Any) -> str:
        return str(new.name)

    def remove(self, claim: str) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        return self.t


def objects(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    work = Workload(args)
    nodes = work.node_objects()
    for i, node in enumerate(nodes):
        node["metadata"].update(uid=f"node-{i}", resourceVersion=str(i + 1))
    pods = []
    for i, (pod, node_name) in enumerate(work.place()):
        pod["metadata"].update(uid=f"pod-{i}", resourceVersion=str(10**7 + i), namespace=NAMESPACE,
                               creationTimestamp="2026-12-06T10:00:00Z")
        pod["spec"]["nodeName"] = node_name or nodes[i % len(nodes)]["metadata"]["name"]
        pod["status"] = {"phase": "Running", "startTime": "2026-12-06T10:00:05Z"}
        pods.append(pod)
    # in key order, as a watch cache holds what its first LIST returned
    return sorted(nodes, key=lambda n: n["metadata"]["name"]), sorted(pods, key=lambda p: p["metadata"]["name"])


def churn(pods: list[dict[str, Any]], count: int, step: int) -> None:
    """`count` pods end and as many of the same shapes start on the same nodes (`pods` stays in name order)."""
    for k in range(count):
        i = (step * 7919 + k * 104729) % len(pods)
        new = copy.deepcopy(pods.pop(i))
        new["metadata"].update(name=f"churn-{step}-{k}", uid=f"churn-{step}-{k}", resourceVersion=f"9{step}{k:05d}")
        bisect.insort(pods, new, key=lambda p: p["metadata"]["name"])


def passes(args: argparse.Namespace, memo: bool) -> dict[str, list[float]]:
    nodes, pods = objects(args)
    store = PolicyStore()
    store.replace_all([PolicyEntry(o["metadata"]["name"], o, parse_policy(o)) for o in policies(NAMESPACE, True)])
    clock = Clock()
    ctx = ControllerContext(api=None, namespace="kubeon-gpu", default_mode=Mode.AUTOMATIC, prometheus_url=None,
                            metrics=None, clock=clock, recorder=Recorder(None, ControllerMetrics(), clock),
                            policies=store, is_leader=lambda: True, cache=Objects(nodes, pods))  # type: ignore[arg-type]
    ctx.patch_node = lambda name, patch: {}  # type: ignore[method-assign]
    empty = {"metadata": {"name": "time-slicing-config", "resourceVersion": "1"}, "data": {}}
    layout_module.kl.read_configmap = lambda *a, **k: empty  # type: ignore[assignment]
    layout_module.kl.patch_configmap = lambda *a, **k: empty  # type: ignore[assignment]
    capacity = CapacityReconciler(provider_factory=lambda c, products: Provider())  # type: ignore[arg-type,return-value]
    reconcilers = [capacity, LayoutReconciler()]
    cpu: dict[str, list[float]] = {r.name: [] for r in reconcilers}
    for step in range(args.passes):
        if not memo:
            capacity.states = StateMemo()  # what the pass did before the state was kept: built anew
        for reconciler in reconcilers:
            started = time.thread_time()
            with parsing(ctx.parse_memo):
                reconciler.reconcile(ctx)
            cpu[reconciler.name].append(time.thread_time() - started)
        churn(pods, args.churn, step)
        clock.t += 10.0
    return cpu


def summary(cpu: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {name: {"first_cpu_s": round(values[0], 3), "cpu_s": round(statistics.median(values[1:]), 3),
                   "period_s": PERIODS[name]} for name, values in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--churn", type=int, default=50, help="pods replaced between two passes")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    for flag, value in (("--nodes", args.nodes), ("--pods", args.pods), ("--passes", args.passes - 1)):
        if value <= 0:
            print(f"error: {flag} must be above {0 if flag != '--passes' else 1}", file=sys.stderr)
            return 2
    if args.churn < 0:
        print(f"error: --churn must be 0 or more, got {args.churn}", file=sys.stderr)
        return 2
    args.gpu_fill, args.scheduled_share = 0.8, 0.0
    kept, anew = summary(passes(args, memo=True)), summary(passes(args, memo=False))
    for name, row in kept.items():
        print(f"{name}: first pass {row['first_cpu_s']} s CPU, then {row['cpu_s']} s a pass "
              f"(period {row['period_s']:.0f} s: {row['cpu_s'] / row['period_s']:.2f} of it)", file=sys.stderr)
    ratio = kept["capacity"]["cpu_s"] / anew["capacity"]["cpu_s"]
    print(f"capacity, state built anew every pass: {anew['capacity']['cpu_s']} s ({ratio:.2f}x kept)",
          file=sys.stderr)
    print(json.dumps({"nodes": args.nodes, "pods": args.pods, "churn_per_pass": args.churn, "passes": kept,
                      "capacity_state_built_anew_cpu_s": anew["capacity"]["cpu_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
