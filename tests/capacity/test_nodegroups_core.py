"""Which node group a new node goes to, and a group's instances as capacity nodes (gpupolicy/capacity/nodegroups.py).

Pure: plain NodeGroup values in, a choice or CapacityNodes out. The cloud calls are
tests/controller/test_eks_nodegroups_cluster.py's (moto over HTTP, the loopback cluster).
"""

from __future__ import annotations

import pytest

from gpupolicy.capacity.nodegroups import (
    MAX_NODES_LABEL,
    MIN_NODES_LABEL,
    GroupInstance,
    NodeGroup,
    choose,
    group_nodes,
    label_bounds,
    servable,
    serves,
    why_full,
)

MIG = {"nvidia.com/mig.config": "all-1g.10gb"}
PRODUCTS = {"g6.xlarge": ("NVIDIA-L4", 1, 0.8), "p4de.24xlarge": ("NVIDIA-A100-SXM4-80GB", 8, 41.0)}


def make_group(name: str, instance_type: str = "g6.xlarge", *, labels: dict[str, str] | None = None,
               min_size: int = 0, max_size: int = 4, desired: int = 0,
               instances: tuple[GroupInstance, ...] = ()) -> NodeGroup:
    return NodeGroup(name=name, pool="gpu", instance_types=(instance_type,), labels=labels or {},
                     min_size=min_size, max_size=max_size, desired=desired, instances=instances, scaler=f"asg-{name}")


def make_instance(iid: str, state: str = "InService", instance_type: str = "g6.xlarge") -> GroupInstance:
    return GroupInstance(id=iid, provider_id=f"aws:///us-east-1a/{iid}", instance_type=instance_type, state=state)


@pytest.mark.parametrize(("labels", "boot", "expected"), [
    pytest.param({}, {}, True, id="whole-group-whole-node"),
    pytest.param({"nvidia.com/mig.config": "all-disabled"}, {}, True, id="mig-disabled-is-whole"),
    pytest.param(MIG, {}, False, id="mig-group-no-whole-node"),
    pytest.param(MIG, MIG, True, id="mig-group-its-layout"),
    pytest.param({"nvidia.com/mig.config": "all-3g.40gb"}, MIG, False, id="mig-group-other-layout"),
    pytest.param({}, MIG, False, id="whole-group-no-mig-node"),
])
def test_a_group_serves_its_type_booting_its_layout(labels: dict[str, str], boot: dict[str, str],
                                                   expected: bool) -> None:
    assert serves(make_group("g", labels=labels), "g6.xlarge", boot) is expected
    assert serves(make_group("g", labels=labels), "g5.xlarge", boot) is False


def test_the_group_with_most_room_left_is_chosen_counting_this_passs_asks() -> None:
    a, b = make_group("a", max_size=3, desired=1), make_group("b", max_size=4, desired=1)
    assert choose([a, b], "g6.xlarge", {}, {}) == b
    assert choose([a, b], "g6.xlarge", {}, {"b": 2}) == a  # b: 1 left, a: 2 left
    assert choose([a, b], "g6.xlarge", {}, {"a": 2, "b": 3}) is None
    assert servable([a, b], {}, {"a": 2, "b": 3}) == set()
    assert servable([a, b], {}, {}) == {"g6.xlarge"}


def test_why_full_names_the_full_groups_or_the_missing_layout() -> None:
    full = make_group("l4", max_size=2, desired=2)
    assert why_full([full], {}) == "node group l4 (g6.xlarge) at its max size 2"
    assert why_full([full, make_group("l4b")], {}) == ""
    assert why_full([full], MIG) == "no node group of the pool boots MIG all-1g.10gb"


def test_instances_are_nodes_by_provider_id_and_unlaunched_desired_size_is_launching() -> None:
    group = make_group("l4", min_size=1, desired=4, instances=(
        make_instance("i-1"), make_instance("i-2", "Pending"), make_instance("i-3", "Terminating")))
    nodes = group_nodes([group], {"aws:///us-east-1a/i-1": "node-1"}, PRODUCTS)
    by = {n.claim: n for n in nodes}
    assert list(by) == ["i-1", "i-2", "i-3", "l4/launching-0", "l4/launching-1"]
    assert by["i-1"].node == "node-1" and not by["i-1"].launching and by["i-1"].price_per_hour == 0.8
    assert by["i-2"].launching and by["i-3"].deleting and not by["i-3"].launching
    assert by["l4/launching-0"].launching and by["l4/launching-0"].gpus == 1
    assert all(n.removable for n in nodes)


def test_a_group_at_its_min_size_has_no_removable_node() -> None:
    group = make_group("l4", min_size=1, desired=1, instances=(make_instance("i-1"),))
    [node] = group_nodes([group], {"aws:///us-east-1a/i-1": "node-1"}, PRODUCTS)
    assert node.removable is False


# -- node pools' bounds from node labels (GKE, AKS) ---------------------------------------------------
@pytest.mark.parametrize(("labels", "autoscaling", "expected"), [
    ({MAX_NODES_LABEL: "4"}, False, (0, 4)),
    ({MAX_NODES_LABEL: "4", MIN_NODES_LABEL: "1"}, False, (1, 4)),
    ({}, False, f"node pool l4 left out: no node label {MAX_NODES_LABEL}"),
    ({MAX_NODES_LABEL: "four"}, False, f"node label {MAX_NODES_LABEL}='four' is not a whole number"),
    ({MAX_NODES_LABEL: "-1"}, False, "is not a whole number"),
    ({MAX_NODES_LABEL: "1", MIN_NODES_LABEL: "2"}, False, f"{MIN_NODES_LABEL}=2 is above {MAX_NODES_LABEL}=1"),
    ({MAX_NODES_LABEL: "4"}, True, "node pool l4 left out: its cluster autoscaler is on"),
])
def test_label_bounds_or_why_the_pool_is_left_out(labels: dict[str, str], autoscaling: bool,
                                                 expected: tuple[int, int] | str) -> None:
    got = label_bounds("node pool", "l4", labels, autoscaling)
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert isinstance(got, str) and expected in got, got
