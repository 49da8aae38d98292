"""The controller's memo of parsed pods (kubemodel.ParseMemo): a pod version is parsed once inside
`parsing(memo)`, a new version again, and outside it nothing is remembered."""

from __future__ import annotations

import copy

from gpupolicy.packing.kubemodel import ParseMemo, demand_from_pod, parsing, pod_requests
from tests.cluster.objects import make_pod


def versioned(rv: str, gpus: int = 1) -> dict:
    pod = make_pod("p", "ns", gpus=gpus)
    pod["metadata"].update(uid="u-1", resourceVersion=rv)
    return pod


def test_a_pod_version_is_parsed_once_and_a_new_version_again() -> None:
    memo = ParseMemo()
    with parsing(memo):
        first = demand_from_pod(versioned("10"))
        assert demand_from_pod(copy.deepcopy(versioned("10"))) is first  # the same version: the answer kept
        changed = demand_from_pod(versioned("11", gpus=2))
        assert changed.num_gpu == 2 and first.num_gpu == 1
        assert pod_requests(versioned("11", gpus=2)) is pod_requests(versioned("11", gpus=2))
    assert len(memo.demands) == 2 and len(memo.requests) == 2


def test_outside_a_pass_and_without_a_version_nothing_is_remembered() -> None:
    memo = ParseMemo()
    demand_from_pod(versioned("10"))
    with parsing(memo):
        demand_from_pod(make_pod("no-version", "ns", gpus=1))
    assert not memo.demands and not memo.requests


def test_the_memo_is_emptied_whole_past_its_limit() -> None:
    memo = ParseMemo(limit=2)
    with parsing(memo):
        for rv in ("1", "2", "3"):
            demand_from_pod(versioned(rv))
    assert list(memo.demands) == [("u-1", "3")]
