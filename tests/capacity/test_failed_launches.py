"""Which launches count as failed (gpupolicy/capacity/failed_launches.py): a claim gone, or being deleted,
before its node registered, unless the controller removed it; and for how long its type is left out."""

from __future__ import annotations

from gpupolicy.capacity.failed_launches import TTL, FailedLaunches
from gpupolicy.capacity.provider import CapacityNode


def claim(name: str, kind: str = "g6.xlarge", node: str | None = None, deleting: bool = False) -> CapacityNode:
    return CapacityNode(claim=name, node=node, pool="gpu", instance_type=kind, gpus=1, product="NVIDIA-L4",
                        price_per_hour=1.0, deleting=deleting)


def test_a_claim_gone_or_deleted_before_its_node_failed_its_launch() -> None:
    failed = FailedLaunches()
    failed.launched("a", "g6.xlarge")
    assert failed.observe([claim("b", "g5.xlarge")], 10.0) == [("a", "g6.xlarge")]  # a is gone
    assert failed.observe([claim("b", "g5.xlarge", deleting=True)], 20.0) == [("b", "g5.xlarge")]
    assert failed.unavailable(20.0) == {"g6.xlarge": 10.0, "g5.xlarge": 20.0}
    assert failed.unavailable(10.0 + TTL) == {"g5.xlarge": 20.0}, "a type is left out for TTL seconds"
    assert failed.unavailable(20.0 + TTL) == {}


def test_a_claim_that_registered_or_that_the_controller_removed_is_no_failure() -> None:
    failed = FailedLaunches()
    failed.launched("up", "g6.xlarge")
    failed.launched("undone", "g5.xlarge")
    assert failed.observe([claim("up", node="node-1"), claim("undone")], 0.0) == []
    failed.forget("undone")  # an undone replacement's claim, deleted by the controller
    assert failed.observe([], 5.0) == []  # "up" gone after it registered (consolidated): no failure either
    assert failed.unavailable(5.0) == {}
