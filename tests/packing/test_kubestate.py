"""The consolidation's packing state kept between passes (gpupolicy/packing/kubestate.StateMemo) against the
state built anew from the same objects (kubemodel.state_from_kubernetes), through a run of cluster changes.

Real: kubemodel's parsing and the engine's state. Faked: the API objects are literal dicts shaped like
`kubectl get -o json` output, each with a uid and a resourceVersion as the API server gives them."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np

from gpupolicy.packing.kubemodel import state_from_kubernetes
from gpupolicy.packing.kubestate import StateMemo
from gpupolicy.packing.nodemodel import NodeState
from tests.cluster.objects import make_node, make_pod

LOAD = ("cpu_free", "mem_free", "gpu_free", "mig_held", "mig_free", "shared_free", "full_count", "max_partial",
        "gpu_free_total", "schedulable")


def same(a: NodeState, b: NodeState) -> bool:
    return a.names == b.names and all(np.array_equal(getattr(a, k), getattr(b, k)) for k in LOAD)


class World:
    """Nodes of three kinds and pods bound to them; every change gives the object a new resourceVersion and,
    as a watch cache does (kube/reflector.py), is a new object: the ones held are never changed."""

    def __init__(self) -> None:
        self.rng, self.version = random.Random(7), 0
        self.nodes = [self.stamp(make_node(f"a100-{i}", gpus=8)) for i in range(6)]
        self.nodes += [self.stamp(make_node(f"ts-{i}", "NVIDIA-L4", gpus=1, shared_replicas=4)) for i in range(3)]
        self.nodes += [self.stamp(make_node(f"mig-{i}", gpus=1, mig={"1g.10gb": 7})) for i in range(2)]
        self.pods: list[dict[str, Any]] = []
        for i in range(40):
            self.add_pod(i)

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def add_pod(self, i: int) -> None:
        node = self.rng.choice(self.nodes)["metadata"]["name"]
        kind = node.split("-")[0]
        if kind == "ts":
            pod = make_pod(f"p{i}", "ml", gpus=1, gpu_resource="nvidia.com/gpu.shared", cpu="1")
        elif kind == "mig":
            pod = make_pod(f"p{i}", "ml", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb", cpu="1")
        else:
            pod = make_pod(f"p{i}", "ml", gpus=self.rng.choice([0, 1, 2]), cpu="2")
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        self.pods.append(self.stamp(pod))

    def changed(self, objs: list[dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
        """A copy of `obj` that takes its place in `objs`, for the caller to change (then `stamp`)."""
        new = copy.deepcopy(obj)
        objs[next(i for i, o in enumerate(objs) if o is obj)] = new
        return new

    def change(self, step: int) -> str:
        """One change of the kinds a cluster makes between two passes; returns what it was."""
        what = self.rng.choice(["add", "delete", "finish", "annotate", "cordon", "unreadable", "node-gone"])
        if what == "add" or not self.pods:
            self.add_pod(1000 + step)
        elif what == "delete":
            self.pods.remove(self.rng.choice(self.pods))
        elif what == "finish":
            pod = copy.deepcopy(self.rng.choice(self.pods))
            pod["status"]["phase"] = "Succeeded"
            self.pods = [self.stamp(pod) if p["metadata"]["uid"] == pod["metadata"]["uid"] else p for p in self.pods]
        elif what == "annotate":
            pod = self.changed(self.pods, self.rng.choice(self.pods))
            pod["metadata"]["annotations"] = {"note": str(step)}
            self.stamp(pod)
        elif what == "cordon":
            node = self.changed(self.nodes, self.rng.choice(self.nodes))
            node["spec"]["unschedulable"] = not node["spec"].get("unschedulable", False)
            self.stamp(node)
        elif what == "unreadable":
            pod = self.changed(self.pods, self.rng.choice(self.pods))
            pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
            self.stamp(pod)
        elif len(self.nodes) > 4:
            self.nodes.remove(self.rng.choice(self.nodes))
        return what


def test_the_kept_state_is_the_state_built_anew_after_every_change() -> None:
    world, memo = World(), StateMemo()
    for step in range(120):
        kept_problems: dict[str, str] = {}
        new_problems: dict[str, str] = {}
        kept = memo.state(world.nodes, world.pods, kept_problems)
        assert same(kept, state_from_kubernetes(world.nodes, world.pods, new_problems)), f"step {step}"
        assert kept_problems == new_problems, f"step {step}"
        world.change(step)
    assert memo.builds < 20, "only a change of the node list builds anew"


def test_a_pass_where_one_pod_changed_recomputes_one_row_and_hands_out_a_copy() -> None:
    world, memo = World(), StateMemo()
    first = memo.state(world.nodes, world.pods)
    updates = memo.row_updates
    assert updates == len(world.nodes)
    again = memo.state(world.nodes, world.pods)
    assert memo.row_updates == updates and memo.builds == 1, "nothing changed: nothing recomputed"
    world.changed(world.pods, world.pods[0])["metadata"]["annotations"] = {"note": "x"}
    world.stamp(world.pods[0])
    memo.state(world.nodes, world.pods)
    assert memo.row_updates == updates + 1
    first.cpu_free[:] = 0  # a caller's copy is its own (the consolidation planner moves pods on it)
    assert same(memo.state(world.nodes, world.pods), again)


def test_a_version_written_into_a_held_pod_or_a_relisted_copy_of_it_recomputes_nothing() -> None:
    """The watch cache writes a new resourceVersion into the object it holds when nothing it keeps changed,
    and a relist (after a 410) brings new objects of the same versions: neither is a change of the row."""
    world, memo = World(), StateMemo()
    memo.state(world.nodes, world.pods)
    updates = memo.row_updates
    world.pods = [copy.deepcopy(p) for p in world.pods]  # relisted
    memo.state(world.nodes, world.pods)
    world.stamp(world.pods[0])  # in place: only the version is new
    memo.state(world.nodes, world.pods)
    assert memo.row_updates == updates
    world.changed(world.pods, world.pods[1])["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    world.stamp(world.pods[1])
    assert same(memo.state(world.nodes, world.pods), state_from_kubernetes(world.nodes, world.pods))
    assert memo.row_updates == updates + 1
