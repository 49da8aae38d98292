"""The shipped scheduler profile lets packing decide: kube-scheduler's scoring around the real extender.

Real: the chart's KubeSchedulerConfiguration (manifests/rendered/scheduler.yaml,
kept identical to `helm template` by tests/install/test_manifests.py), read by
the kube-scheduler emulation (simulator/kubescheduler.py: upstream v1.35
NodeResourcesFit LeastAllocated, BalancedAllocation, TaintToleration,
NodeAffinity, extender weighting, seeded random ties), and the extender's
Flask app with its node model, called over its HTTP handlers. Faked: no API
server; the extender's cache is fed the Node and Pod objects a watch would
deliver, and the emulation's node arrays are fed the same pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from cli.livereplay import HttpExtender, ReplayApi, load_scheduler_config
from extender.app import create_app
from extender.cache import ClusterCache
from extender.service import ExtenderService
from kube.views import StaticView
from simulator.kubescheduler import ClusterScores, Profile, schedule_one
from tests.cluster.objects import make_node, make_pod

A100 = "NVIDIA-A100-SXM4-80GB"


def running(name: str, node: str, annotations: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod = make_pod(name, "work", annotations=annotations, **spec)
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def pending(name: str, annotations: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod = make_pod(name, "work", annotations=annotations, **spec)
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["status"] = {"phase": "Pending"}
    return pod


class Scheduled:
    """The extender (real app over its handlers) and kube-scheduler's scoring of one profile."""

    def __init__(self, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]],
                 config: Mapping[str, Any]) -> None:
        self.cache = ClusterCache(clock=lambda: 0.0)
        for node in nodes:
            self.cache.on_node("ADDED", node)
        self.cluster = ClusterScores(nodes)
        for pod in pods:
            self.cache.on_pod("ADDED", pod)
            self.cluster.add(pod, pod["spec"]["nodeName"])
        self.service = ExtenderService(self.cache, StaticView())
        self.client = create_app(self.service).test_client()
        self.profile = Profile.from_config(config)
        self.extenders = [(spec, HttpExtender(self.client, spec)) for spec in self.profile.extenders]

    def place(self, pod: dict[str, Any], seed: int = 0) -> str | None:
        return schedule_one(self.cluster, pod, self.profile, self.extenders, np.random.default_rng(seed)).node

    def extender_scores(self, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
        return self.extenders[0][1].prioritize(pod, names)


def shipped() -> dict[str, Any]:
    return load_scheduler_config()


def before_this_issue() -> dict[str, Any]:
    """The profile the chart shipped before: extender weight 5, nothing else set."""
    config = copy.deepcopy(shipped())
    config["extenders"][0]["weight"] = 5
    config["profiles"] = [{"schedulerName": config["profiles"][0]["schedulerName"]}]
    return config


def whole_gpu_case() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    nodes = [make_node("fuller", A100, 8), make_node("emptier", A100, 8)]
    busy = [running(f"busy-{i}", "fuller", gpus=1, cpu="11", memory="120Gi") for i in range(7)]
    return nodes, busy, pending("p", gpus=1, cpu="2", memory="8Gi")


def time_sliced_case() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    nodes = [make_node("fuller", A100, 2, shared_replicas=4), make_node("emptier", A100, 2, shared_replicas=4)]
    share = {"gpu.kubeon.io/gpu-share": "500"}
    busy = [running("half", "fuller", annotations={**share, "gpu.kubeon.io/gpu-index": "0"}, gpus=1,
                    gpu_resource="nvidia.com/gpu.shared", cpu="40", memory="600Gi")]
    return nodes, busy, pending("p", annotations=share, gpus=1, gpu_resource="nvidia.com/gpu.shared")


def mig_case() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    nodes = [make_node("fuller", A100, 1, mig={"1g.10gb": 7}), make_node("emptier", A100, 1, mig={"1g.10gb": 7})]
    busy = [running(f"slice-{i}", "fuller", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb", cpu="12",
                    memory="150Gi") for i in range(6)]
    return nodes, busy, pending("p", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb")


CASES = {"whole-gpu": whole_gpu_case, "time-sliced": time_sliced_case, "mig": mig_case}


@pytest.mark.parametrize("case", list(CASES))
def test_the_node_the_extender_prefers_wins_against_an_emptier_one(case: str) -> None:
    nodes, busy, pod = CASES[case]()
    live = Scheduled(nodes, busy, shipped())
    scores = live.extender_scores(pod, ["fuller", "emptier"])
    assert scores["fuller"] > scores["emptier"], scores  # the extender prefers the fuller node
    assert {live.place(pod, seed) for seed in range(8)} == {"fuller"}


@pytest.mark.parametrize("case", list(CASES))
def test_the_profile_before_this_issue_let_spreading_overrule_the_extender(case: str) -> None:
    """The arithmetic docs/designs/extender.md states: a one-point lead x 5 x 10 loses to 200 points of spread."""
    nodes, busy, pod = CASES[case]()
    live = Scheduled(nodes, busy, before_this_issue())
    assert live.place(pod) == "emptier"


def test_a_mig_pod_takes_the_cut_gpu_in_use_and_bind_records_it() -> None:
    """Per GPU, not by count alone: "cut" has 2 A100s cut all-1g.10gb with 4 slices held on GPU 0 (10
    devices free), "untouched" one A100 cut alike and empty (7 free). Fewest devices left would start
    the untouched node (6 left against 9); the extender sends the slice to GPU 0 of "cut", which
    kube-scheduler follows though its spreading plugins prefer the emptier node, and the bind verb
    records that GPU on the pod."""
    slice_ = {"gpus": 1, "gpu_resource": "nvidia.com/mig-1g.10gb"}
    nodes = [make_node("cut", A100, 2, mig={"1g.10gb": 7}), make_node("untouched", A100, 1, mig={"1g.10gb": 7})]
    busy = [running(f"slice-{i}", "cut", annotations={"gpu.kubeon.io/gpu-index": "0"}, cpu="20",
                    memory="200Gi", **slice_) for i in range(4)]
    for seed in range(8):
        live = Scheduled(nodes, busy, shipped())
        api = ReplayApi(live.cache)
        live.service.binder = api
        pod = pending("p", annotations={"team": "ml"}, **slice_)
        api.pods["work/p"] = pod  # the API object the bind verb annotates and binds
        scores = live.extender_scores(pod, ["cut", "untouched"])
        assert scores["cut"] > scores["untouched"], scores
        cycle = schedule_one(live.cluster, pod, live.profile, live.extenders, np.random.default_rng(seed))
        assert cycle.node == "cut" and cycle.bound_by is not None
        assert cycle.bound_by.bind(pod, "cut") == ""
        assert pod["metadata"]["annotations"]["gpu.kubeon.io/gpu-index"] == "0"
        with live.cache.lock:
            state = live.cache.fresh_state()
        assert state.gpu_free[state.index["cut"]].tolist()[:2] == [285, 1000]  # 1000 * (7 - 5) // 7


def test_identical_nodes_get_equal_extender_scores() -> None:
    nodes = [make_node(f"same-{i}", A100, 8) for i in range(3)]
    live = Scheduled(nodes, [], shipped())
    scores = live.extender_scores(pending("p", gpus=1), ["same-0", "same-1", "same-2"])
    assert set(scores.values()) == {10}


def test_the_next_pod_follows_the_identical_node_kube_scheduler_took() -> None:
    """Identical empty nodes all get 10 and kube-scheduler takes one at random; the extender's tie
    order then sends the next pod to that node. (With the row order alone it went to another empty
    node, and GPU pods spread one per node: the CI replay's seed 44 fell from 97.16 to 94.22.)"""
    nodes = [make_node(f"same-{i}", A100, 8) for i in range(4)]
    shape = {"gpus": 1, "cpu": "2", "memory": "8Gi"}
    taken = set()
    for seed in range(6):
        live = Scheduled(nodes, [], shipped())
        node = live.place(pending("a", **shape), seed)
        assert node is not None
        bound = running("a", node, **shape)
        live.cache.on_pod("ADDED", bound)
        live.cluster.add(bound, node)
        taken.add(node)
        assert live.place(pending("b", **shape), seed + 100) == node
    assert len(taken) > 1  # kube-scheduler did choose among the identical nodes


def test_gpu_pods_do_not_follow_cpu_only_pods() -> None:
    """A node running only a CPU-only pod (the default-scheduler spreads those over the emptiest
    nodes) is not ahead in the tie order: following them spread GPU pods after them."""
    nodes = [make_node(f"same-{i}", A100, 8) for i in range(4)]
    busy = [running("agent", "same-2", cpu="100m", memory="128Mi")]
    for seed in range(6):
        live = Scheduled(nodes, busy, shipped())
        assert live.place(pending("p", gpus=1, cpu="2", memory="8Gi"), seed) != "same-2"


def test_a_pod_the_extender_cannot_place_still_schedules_when_stock_filters_allow() -> None:
    """Nodes outside the extender's model: it answers Error, and the ignorable extender is skipped."""
    nodes = [make_node("gpu-0", A100, 8)]
    live = Scheduled([], [], shipped())  # the extender's model knows no node (not synced yet)
    live.cluster = ClusterScores(nodes)
    assert live.profile.extenders[0].ignorable
    assert live.place(pending("p", gpus=1)) == "gpu-0"


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def with_managed_resources() -> dict[str, Any]:
    """The profile as shipped before CPU-only pods were routed: the extender asked about GPU pods only."""
    config = copy.deepcopy(shipped())
    config["extenders"][0]["managedResources"] = [{"name": r, "ignoredByScheduler": False}
                                                  for r in ("nvidia.com/gpu", "nvidia.com/gpu.shared")]
    return config


def test_a_cpu_only_pod_routed_to_the_profile_is_packed_by_the_extender() -> None:
    """The webhook routes CPU-only pods that tolerate the GPU taint here (admission.mutate.routes_cpu_pod),
    and the extender is asked about them too: its engine puts the pod beside GPU work and keeps the empty
    GPU node whole for a pod that needs all of it. Stock scoring (the default-scheduler, or this profile
    when the extender was asked about GPU pods only) spreads it onto the empty node."""
    nodes = [make_node("used", A100, 8, gpu_taint=True), make_node("empty", A100, 8, gpu_taint=True)]
    busy = [running(f"gpu-{i}", "used", gpus=1, cpu="8", memory="64Gi", tolerations=[GPU_TOLERATION])
            for i in range(4)]
    pod = pending("cpu-only", cpu="12", memory="48Gi", tolerations=[GPU_TOLERATION])
    live = Scheduled(nodes, busy, shipped())
    scores = live.extender_scores(pod, ["used", "empty"])
    assert scores["used"] > scores["empty"], scores
    assert {live.place(pod, seed) for seed in range(8)} == {"used"}
    assert live.extenders[0][1].calls["filter"] >= 8  # asked on every cycle
    before = Scheduled(nodes, busy, with_managed_resources())
    assert {before.place(pod, seed) for seed in range(8)} == {"empty"}
    assert before.extenders[0][1].calls == {"filter": 0, "prioritize": 0, "bind": 0}
    default = Profile()  # the cluster's default-scheduler: no extender
    assert {schedule_one(live.cluster, pod, default, [], np.random.default_rng(s)).node for s in range(8)} == {"empty"}


def test_a_cpu_only_pod_the_gpu_nodes_cannot_take_goes_where_the_stock_filters_allow() -> None:
    """A pod asking for more CPU than any GPU node has left is placed on the CPU node the extender also knows."""
    nodes = [make_node("gpu", A100, 8, gpu_taint=True, cpu="16"), make_node("cpu", None, 0, cpu="64")]
    live = Scheduled(nodes, [], shipped())
    pod = pending("wide", cpu="32", memory="8Gi", tolerations=[GPU_TOLERATION])
    assert live.place(pod) == "cpu"


def test_a_cpu_only_pod_routed_to_the_profile_uses_a_node_without_gpus_first() -> None:
    """A CPU-only pod that fits a node without GPUs goes there, not onto the CPU and memory of a GPU node
    holding GPU work (which the next GPU pods there need). The engine once scored the GPU node 10 and the
    CPU node 9 (equal fragment change, and the tie order put nodes holding GPU work first)."""
    nodes = [make_node("gpu", A100, 8, gpu_taint=True), make_node("cpu", None, 0, cpu="64", memory="256Gi")]
    busy = [running(f"gpu-{i}", "gpu", gpus=1, cpu="8", memory="64Gi", tolerations=[GPU_TOLERATION])
            for i in range(4)]
    pod = pending("cpu-only", cpu="4", memory="16Gi", tolerations=[GPU_TOLERATION])
    live = Scheduled(nodes, busy, shipped())
    scores = live.extender_scores(pod, ["gpu", "cpu"])
    assert scores["cpu"] > scores["gpu"], scores
    assert {live.place(pod, seed) for seed in range(8)} == {"cpu"}


def test_a_cpu_only_pod_too_big_for_the_nodes_without_gpus_still_packs_the_gpu_nodes() -> None:
    """Nodes without GPUs come first only when they fit: otherwise the engine's packing order among the GPU
    nodes holds as before (beside GPU work, keeping the empty GPU node whole)."""
    nodes = [make_node("used", A100, 8, gpu_taint=True), make_node("empty", A100, 8, gpu_taint=True),
             make_node("cpu", None, 0, cpu="8", memory="32Gi")]
    busy = [running(f"gpu-{i}", "used", gpus=1, cpu="8", memory="64Gi", tolerations=[GPU_TOLERATION])
            for i in range(4)]
    pod = pending("cpu-only", cpu="12", memory="48Gi", tolerations=[GPU_TOLERATION])
    live = Scheduled(nodes, busy, shipped())
    scores = live.extender_scores(pod, ["used", "empty", "cpu"])
    assert scores["used"] > scores["empty"], scores
    assert {live.place(pod, seed) for seed in range(8)} == {"used"}


@pytest.mark.parametrize("text", ["kind: ConfigMap\ndata: [1, 2]\n",
                                  "kind: ConfigMap\ndata:\n  config.yaml: 'a: !!int x'\n", "kind: [\n"],
                         ids=["data-a-list", "unreadable-inner", "not-yaml"])
def test_a_scheduler_config_that_is_no_config_is_a_profile_error(tmp_path: Any, text: str) -> None:
    from simulator.kubescheduler import ProfileError

    path = tmp_path / "scheduler.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=str(path)):
        load_scheduler_config(path)


@pytest.mark.parametrize(("body", "field"), [
    ("profiles: 5", "profiles: not a list"),
    ("profiles: [5]", "profiles[0]: not a mapping"),
    ("profiles: [{plugins: [1]}]", "profiles[0].plugins: not a mapping"),
    ("profiles: [{plugins: {score: {enabled: [{name: NodeResourcesFit, weight: abc}]}}}]",
     "profiles[0].plugins.score.enabled[0].weight: 'abc' is not an integer"),
    ("profiles: [{plugins: {score: {disabled: [{name: 7}]}}}]", "profiles[0].plugins.score.disabled[0].name: 7"),
    ("profiles: [{pluginConfig: {name: NodeResourcesFit}}]", "profiles[0].pluginConfig: not a list"),
    ("profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {resources: [{name: cpu, "
     "weight: [1]}]}}}]}]", "profiles[0].pluginConfig[0].args.scoringStrategy.resources[0].weight: [1]"),
    ("profiles: [{pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: RequestedToCapacityRatio, "
     "requestedToCapacityRatio: {shape: [{utilization: x}]}}}}]}]",
     "profiles[0].pluginConfig[0].args.scoringStrategy.requestedToCapacityRatio.shape[0].utilization: 'x'"),
    ("profiles: [{percentageOfNodesToScore: '50'}]", "profiles[0].percentageOfNodesToScore: '50' is not an integer"),
    ("extenders: {urlPrefix: x}", "extenders: not a list"),
    ("extenders: [{urlPrefix: 5}]", "extenders[0].urlPrefix: 5 is not a string"),
    ("extenders: [{urlPrefix: 'http://e', weight: abc}]", "extenders[0].weight: 'abc' is not an integer"),
    ("extenders: [{urlPrefix: 'http://e', ignorable: 'yes'}]", "extenders[0].ignorable: 'yes' is not true or false"),
    ("extenders: [{urlPrefix: 'http://e', managedResources: [{name: [1]}]}]",
     "extenders[0].managedResources[0].name: [1] is not a string"),
])
def test_a_scheduler_config_field_of_the_wrong_type_is_named(tmp_path: Any, body: str, field: str) -> None:
    """`simulate --through-extender --scheduler-config`: one line naming the file and the field, exit 2
    (these were TypeError and AttributeError tracebacks, or a bare "invalid literal for int()")."""
    from tests.cli.helpers import subprocess_run

    path = tmp_path / "scheduler.yaml"
    path.write_text(f"apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n{body}\n")
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,16000,65536,2,T4\n")
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\np1,1000,2048,1,500,,LS,Running,0,1,0\n")
    run = subprocess_run("simulate", "--through-extender", "--nodes", str(nodes), "--pods", str(pods),
                         "--scheduler-config", str(path), timeout=60)
    assert run.code == 2 and "Traceback" not in run.err, run.err
    (line,) = run.err.strip().splitlines()
    assert line.startswith(f"error: --scheduler-config {path}: {field}"), line
