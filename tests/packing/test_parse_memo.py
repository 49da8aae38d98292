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


def test_a_version_no_pass_reads_for_its_age_is_dropped_and_one_read_meanwhile_is_kept() -> None:
    """Versions come and go with every pod event: a memo that kept each until its limit grew by hundreds of
    megabytes in a long-running controller. A pass that reads a version carries it into the new tables."""
    now = [0.0]
    memo = ParseMemo(age_seconds=60.0, clock=lambda: now[0])
    read, gone = versioned("1"), make_pod("q", "ns", gpus=2)
    gone["metadata"].update(uid="u-2", resourceVersion="7")
    with parsing(memo):
        kept = demand_from_pod(read)
        demand_from_pod(gone)
    for _ in range(2):  # two passes, an age apart: `read` read in each, `gone` deleted from the cluster
        now[0] += 60.0
        with parsing(memo):
            assert demand_from_pod(copy.deepcopy(read)) is kept  # carried over, not parsed again
    assert list(memo.demands) == [("u-1", "1")]
    assert memo.carried("demands", ("u-2", "7")) is None


def test_the_object_held_answers_even_after_its_version_is_written_in_place() -> None:
    """A watch cache keeps an object whose trimmed content did not change and writes the new
    resourceVersion into it (kube/reflector.py): its reading is the one kept, found by the object itself."""
    memo = ParseMemo()
    held = versioned("10")
    with parsing(memo):
        first = demand_from_pod(held)
        held["metadata"]["resourceVersion"] = "12"  # the reflector's in-place write
        assert demand_from_pod(held) is first
        assert ("u-1", "12") not in memo.demands  # found by the object, not parsed again under the new version
        assert demand_from_pod(versioned("13", gpus=2)).num_gpu == 2  # a new object: read by its version
