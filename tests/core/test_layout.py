"""The layout planner and the catalog's MIG layouts, against the GPU Operator's own default config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupolicy.capacity.layout import (
    MIG,
    TIME_SLICING,
    WANTED_ANNOTATION,
    current_layout,
    plan_layout,
    read_demand,
    read_nodes,
)
from gpupolicy.capacity.timeslicing import config_key, config_text, key_replicas, plan_configmap, replicas_of
from gpupolicy.catalog import DEFAULT_CATALOG
from tests.cluster.objects import make_node, make_pod
from tests.core.builders import make_policy

VENDORED = Path(__file__).resolve().parents[2] / "vendor" / "crds" / "gpu-operator_default-mig-parted-config.yaml"


def vendored_layouts(pci_id: str, profiles: set[str]) -> dict[str, dict[str, int]]:
    """Layouts of the GPU Operator's default config that apply to a GPU with this PCI id and profiles."""
    doc = yaml.safe_load(VENDORED.read_text())
    configs = yaml.safe_load(doc["data"]["config.yaml"])["mig-configs"]
    found: dict[str, dict[str, int]] = {}
    for name, entries in configs.items():
        for entry in entries:
            device_filter = entry.get("device-filter")
            if device_filter is not None and pci_id not in ([device_filter] if isinstance(device_filter, str)
                                                            else device_filter):
                continue
            devices = entry.get("mig-devices") or {}
            if not entry["mig-enabled"]:
                found[name] = {}
                break
            if devices and all(p in profiles for p in devices):
                found[name] = dict(devices)
                break
    return found


@pytest.mark.parametrize("product", [p for p in DEFAULT_CATALOG.products if p.mig_capable],
                         ids=lambda p: p.product)
def test_catalog_layouts_are_the_operators_defaults(product: Any) -> None:
    assert product.pci_device_ids, "every MIG-capable product names its PCI ids"
    for pci_id in product.pci_device_ids:
        expected = vendored_layouts(pci_id, {p.name for p in product.profiles})
        assert {m.name: dict(m.devices) for m in product.mig_layouts} == expected


SHARE = make_policy("share", sharing={"strategy": "TimeSlicing", "replicas": 4})
MIGP = make_policy("mig", sharing={"strategy": "MIG", "migProfile": "1g.10gb"})


def pending(name: str, resource: str, **kw: Any) -> dict[str, Any]:
    return make_pod(name, "ml", gpus=1, gpu_resource=resource, **kw)


def bound(name: str, node: str, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    pod = pending(name, resource)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], policies: Any = (SHARE, MIGP),
         keys: dict[str, int] | None = None) -> Any:
    return plan_layout(read_nodes(nodes, pods, keys or {}), read_demand(pods, list(policies)))


def test_empty_a100_gets_the_layout_of_its_pending_profile() -> None:
    pods = [pending(f"p{i}", "nvidia.com/mig-1g.10gb") for i in range(7)]
    result = plan([make_node("gpu-7", gpus=1)], pods)
    (target,) = result.targets
    assert (target.node, target.target.kind, target.target.mig) == ("gpu-7", MIG, "all-1g.10gb")
    assert target.reason == "node gpu-7: MIG all-1g.10gb serves 7 pending 1g.10gb pods; node is empty"
    assert target.labels == {"nvidia.com/mig.config": "all-1g.10gb"}
    assert target.policy == "mig" and target.target_ref == "Node/gpu-7"


def test_a_node_with_a_gpu_pod_is_never_changed() -> None:
    pods = [bound("busy", "gpu-0"), pending("p", "nvidia.com/mig-1g.10gb")]
    nodes = [make_node("gpu-0", gpus=1)]
    result = plan(nodes, pods)
    assert result.targets == ()
    assert result.unserved == (("ml/p", "no node without GPU pods can offer nvidia.com/mig-1g.10gb"),)


def test_fewest_changes_one_big_node_over_two_small() -> None:
    pods = [pending(f"p{i}", "nvidia.com/gpu.shared") for i in range(8)]
    nodes = [make_node("small-a", gpus=1), make_node("small-b", gpus=1), make_node("big", gpus=2)]
    result = plan(nodes, pods)
    assert [(t.node, t.target.kind, t.target.replicas) for t in result.targets] == [("big", TIME_SLICING, 4)]
    assert result.keys() == {config_key(4): 4}
    assert result.targets[0].labels == {"nvidia.com/device-plugin.config": config_key(4)}


def test_demand_that_a_node_already_offers_changes_nothing() -> None:
    node = make_node("mig-0", gpus=1, mig={"1g.10gb": 7})
    node["metadata"]["labels"]["nvidia.com/mig.config"] = "all-1g.10gb"
    pods = [pending(f"p{i}", "nvidia.com/mig-1g.10gb") for i in range(7)]
    result = plan([node, make_node("spare", gpus=1)], pods)
    assert result.targets == () and result.matched == 7


def test_mixed_demand_picks_balanced_when_it_serves_more() -> None:
    pods = [pending("a", "nvidia.com/mig-1g.10gb"), pending("b", "nvidia.com/mig-2g.20gb"),
            pending("c", "nvidia.com/mig-3g.40gb")]
    policy = make_policy("mig", sharing={"strategy": "MIG", "gpuMemory": "8Gi"})
    result = plan([make_node("gpu-1", gpus=1)], pods, [policy])
    assert [t.target.mig for t in result.targets] == ["all-balanced"]


def test_wanted_pods_left_whole_count_as_demand() -> None:
    pods = [bound(f"w{i}", "whole-0") for i in range(2)]
    for pod in pods:
        pod["metadata"]["annotations"] = {WANTED_ANNOTATION: "nvidia.com/mig-1g.10gb", "gpu.kubeon.io/policy": "mig"}
    result = plan([make_node("whole-0", gpus=2), make_node("empty", gpus=1)], pods)
    (target,) = result.targets
    assert target.node == "empty" and "2 waiting (2 left on whole GPUs) 1g.10gb pods" in target.reason


def test_product_restrictions_and_pods_without_policy() -> None:
    pods = [pending("h", "nvidia.com/mig-1g.10gb", node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})]
    result = plan([make_node("a100", gpus=1), make_node("h100", "NVIDIA-H100-80GB-HBM3", gpus=1)], pods)
    assert [t.node for t in result.targets] == ["h100"]
    orphan = plan([make_node("a100", gpus=1)], [pending("x", "nvidia.com/mig-1g.10gb")], [SHARE])
    assert orphan.targets == () and orphan.unserved == (("ml/x", "no sharing policy covers nvidia.com/mig-1g.10gb"),)


def test_sliced_empty_node_goes_back_to_whole_for_whole_demand() -> None:
    node = make_node("ts-0", gpus=1, shared_replicas=4)
    node["metadata"]["labels"]["nvidia.com/device-plugin.config"] = config_key(4)
    result = plan([node], [pending("w", "nvidia.com/gpu")], keys={config_key(4): 4})
    (target,) = result.targets
    assert target.target.kind == "whole" and target.labels == {"nvidia.com/device-plugin.config": None}
    assert "(was time-slicing 4 replicas)" in target.reason



@pytest.mark.parametrize("strategy", ["single", "none"])
def test_a_node_whose_plugin_names_no_mig_profile_is_never_relaid_to_mig(strategy: str) -> None:
    """Under the single strategy MIG devices are advertised as nvidia.com/gpu, under none not at all: a MIG
    layout there serves no nvidia.com/mig-* pod, and the re-layout (cordon, drain, repartition) was for
    nothing. The webhook reads the same rule (gpupolicy.cluster.names_mig_per_profile)."""
    node = make_node("gpu-7", gpus=1)
    node["metadata"]["labels"]["nvidia.com/mig.strategy"] = strategy
    result = plan([node], [pending(f"p{i}", "nvidia.com/mig-1g.10gb") for i in range(7)])
    assert result.targets == ()
    assert [pod for pod, _ in result.unserved] == [f"ml/p{i}" for i in range(7)]


def test_an_operators_time_slicing_key_offers_what_the_node_advertises() -> None:
    """A key that is not kubeon's may keep renameByDefault false (shares advertised as nvidia.com/gpu): the
    planner took its label as offering nvidia.com/gpu.shared and told the shared pods they were matched."""
    node = make_node("gpu-0", gpus=1)
    node["metadata"]["labels"]["nvidia.com/device-plugin.config"] = "user-key"
    pods = [pending("p", "nvidia.com/gpu.shared")]
    assert plan([node], pods, keys={"user-key": 4}).matched == 0
    ours = make_node("gpu-0", gpus=1)
    ours["metadata"]["labels"]["nvidia.com/device-plugin.config"] = config_key(4)
    assert plan([ours], pods, keys={config_key(4): 4}).matched == 1

def test_our_key_offers_its_shares_before_gpu_feature_discovery_relabels_the_node() -> None:
    """The device plugin advertises the shares of a new key before GPU Feature Discovery moves
    `nvidia.com/gpu.replicas`; the capacity pass (which reads no ConfigMap) read such a node, half full of
    shared pods, as whole and launched a second node for the pods about to land on it. Our key names its
    replicas (`config_key`)."""
    node = make_node("gpu-0", gpus=1)
    node["metadata"]["labels"]["nvidia.com/device-plugin.config"] = config_key(4)
    node["status"]["allocatable"] = {**node["status"]["allocatable"], "nvidia.com/gpu.shared": "4"}
    pods = [bound("b0", "gpu-0", "nvidia.com/gpu.shared"), bound("b1", "gpu-0", "nvidia.com/gpu.shared"),
            pending("p0", "nvidia.com/gpu.shared"), pending("p1", "nvidia.com/gpu.shared")]
    result = plan([node], pods)
    assert (result.matched, result.unserved, result.targets) == (2, (), ())
    assert current_layout({"nvidia.com/device-plugin.config": "kubeon-ts-r4-00000000"}, {}).kind == "whole", \
        "a key that only looks like ours says nothing"


def test_configmap_keys_are_content_named_and_only_ours_are_removed() -> None:
    assert replicas_of(config_text(4)) == 4
    assert config_key(4) != config_key(8)
    data = {"user-key": config_text(3), config_key(2): config_text(2), config_key(8): config_text(8)}
    change = plan_configmap(data, {config_key(4): 4}, used={config_key(8)})
    assert list(change.add) == [config_key(4)] and change.remove == (config_key(2),)
    assert change.merge_patch()["data"][config_key(2)] is None
    assert key_replicas({**data, "junk": "not: [yaml"}) == {"user-key": 3, config_key(2): 2, config_key(8): 8}
    # a value PyYAML's constructors cannot read (they raise ValueError or KeyError, not a YAML error)
    unreadable = {"int": config_text(3).replace("replicas: 3", "replicas: !!int x"),
                  "bool": "version: v1\nflags: {migStrategy: !!bool maybe}\n"}
    assert "!!int x" in unreadable["int"]
    assert key_replicas({**data, **unreadable}) == {"user-key": 3, config_key(2): 2, config_key(8): 8}
    # an operator's keys of other shapes, and one nested past what the parser is given (libyaml crashed)
    shapes = {f"shape-{n}": text for n, text in enumerate([
        "sharing: {timeSlicing: 5}", "sharing: {timeSlicing: {resources: 5}}", "sharing: {timeSlicing: [1]}",
        "sharing: 5", "sharing: {timeSlicing: {resources: [5, {name: 7}]}}", "- 1", "[" * 50_000 + "]" * 50_000])}
    assert key_replicas({**data, **shapes}) == {"user-key": 3, config_key(2): 2, config_key(8): 8}
