"""The scheduler stand-in: fit, taints, selectors, binding, events, and the extender wire format.

Real: the test API server (through the `kubernetes` client over HTTP), the
scheduler loop, the binding subresource, Events, and a small Flask extender
served over real HTTP on 127.0.0.1 that records what it receives. Faked: the
extender's decisions (scripted per test), no kubelet or workload loops
unless a test steps them; the cluster is driven with `step()`, not threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node, make_pod
from tests.kubeapi.scheduler import ALL_SCHEDULERS, Extender, ExtenderConfig, ExtenderError


class ExtenderDouble:
    """A scripted extender on a real HTTP port: `filter_fn(args) -> result`, `scores {node: 0..10}`."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.filter_fn: Callable[[dict[str, Any]], Any] = lambda args: {"NodeNames": args["NodeNames"]}
        self.scores: dict[str, int] = {}
        self.status = 200
        app = Flask("extender-double")

        @app.post("/ext/filter")
        def filter_view() -> Any:
            args = request.get_json()
            self.received.append(("filter", args))
            return jsonify(self.filter_fn(args)), self.status

        @app.post("/ext/prioritize")
        def prioritize_view() -> Any:
            args = request.get_json()
            self.received.append(("prioritize", args))
            names = args["NodeNames"] or [n["metadata"]["name"] for n in args["Nodes"]["items"]]
            return jsonify([{"Host": n, "Score": self.scores.get(n, 0)} for n in names]), self.status

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/ext"

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def extender() -> Iterator[ExtenderDouble]:
    double = ExtenderDouble()
    yield double
    double.close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    nodes = [make_node("gpu-a", gpus=2), make_node("gpu-b", gpus=2), make_node("cpu-c", None, 0, cpu="8")]
    with Cluster(nodes=nodes, background=False, karpenter=False) as running:
        yield running


def node_of(cluster: Cluster, name: str, namespace: str = "default") -> str | None:
    pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
    return pods[name]["spec"].get("nodeName")


# ---------------------------------------------------------------- wire format, no API server

def test_filter_sends_capitalised_extender_args_with_node_names_only(extender: ExtenderDouble) -> None:
    extender.filter_fn = lambda args: {"NodeNames": ["b"], "FailedNodes": {"a": "no MIG slice"}, "Error": ""}
    client = Extender(ExtenderConfig(extender.url))
    passed, failed = client.filter(make_pod("p", gpus=1), [make_node("a"), make_node("b")])
    verb, args = extender.received[0]
    assert verb == "filter"
    assert set(args) == {"Pod", "Nodes", "NodeNames"}
    assert args["Nodes"] is None and args["NodeNames"] == ["a", "b"]
    assert args["Pod"]["metadata"]["name"] == "p"
    assert (passed, failed) == (["b"], {"a": "no MIG slice"})


def test_without_node_cache_the_full_node_list_is_sent(extender: ExtenderDouble) -> None:
    extender.filter_fn = lambda args: {"Nodes": {"items": args["Nodes"]["items"][1:]}}
    client = Extender(ExtenderConfig(extender.url, node_cache_capable=False))
    passed, failed = client.filter(make_pod("p"), [make_node("a"), make_node("b")])
    args = extender.received[0][1]
    assert args["NodeNames"] is None and [n["metadata"]["name"] for n in args["Nodes"]["items"]] == ["a", "b"]
    assert passed == ["b"] and "a" in failed


def test_extender_may_not_add_nodes_it_was_not_sent(extender: ExtenderDouble) -> None:
    extender.filter_fn = lambda args: {"NodeNames": ["a", "intruder"]}
    passed, _ = Extender(ExtenderConfig(extender.url)).filter(make_pod("p"), [make_node("a")])
    assert passed == ["a"]


def test_prioritize_is_weighted_and_clamped(extender: ExtenderDouble) -> None:
    extender.scores = {"a": 3, "b": 99}
    client = Extender(ExtenderConfig(extender.url, weight=2))
    scores = client.prioritize(make_pod("p"), [make_node("a"), make_node("b")])
    assert scores == {"a": 3 * 2 * 10, "b": 10 * 2 * 10}


@pytest.mark.parametrize("status, result", [(500, {}), (200, {"Error": "boom"})], ids=["http-500", "error-field"])
def test_extender_errors_raise(extender: ExtenderDouble, status: int, result: dict) -> None:
    extender.status = status
    extender.filter_fn = lambda args: result
    with pytest.raises(ExtenderError):
        Extender(ExtenderConfig(extender.url)).filter(make_pod("p"), [make_node("a")])


def test_managed_resources_select_the_pods_sent() -> None:
    config = ExtenderConfig("http://unused", managed_resources=("nvidia.com/gpu",))
    assert config.interested_in(make_pod("p", gpus=1))
    assert not config.interested_in(make_pod("p"))


# ---------------------------------------------------------------- through the API server

def test_pods_bind_by_fit_in_node_name_order_and_count_earlier_placements(cluster: Cluster) -> None:
    for i in range(3):
        cluster.create(make_pod(f"g{i}", gpus=1))
    cluster.create(make_pod("big", gpus=3))
    cluster.create(make_pod("cpu", cpu="6"))
    placements = {p.name: p for p in cluster.scheduler.schedule_once()}
    assert [node_of(cluster, f"g{i}") for i in range(3)] == ["gpu-a", "gpu-a", "gpu-b"]
    assert node_of(cluster, "cpu") == "cpu-c"  # no scoring of its own: name order among fitting nodes
    assert node_of(cluster, "big") is None
    assert placements["big"].node is None
    failed = cluster.events(reason="FailedScheduling")
    assert [e["involvedObject"]["name"] for e in failed] == ["big"]
    assert failed[0]["message"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert failed[0]["type"] == "Warning"
    scheduled = {e["involvedObject"]["name"]: e["message"] for e in cluster.events(reason="Scheduled")}
    assert scheduled["g2"] == "Successfully assigned default/g2 to gpu-b"


def test_bound_pods_keep_their_capacity_across_passes(cluster: Cluster) -> None:
    cluster.create(make_pod("first", gpus=2))
    cluster.scheduler.schedule_once()
    cluster.create(make_pod("second", gpus=2))
    cluster.create(make_pod("third", gpus=1))
    cluster.scheduler.schedule_once()
    assert (node_of(cluster, "first"), node_of(cluster, "second"), node_of(cluster, "third")) == (
        "gpu-a", "gpu-b", None)


def test_failed_scheduling_is_recorded_once_per_reason(cluster: Cluster) -> None:
    cluster.create(make_pod("huge", gpus=8))
    for _ in range(3):
        cluster.scheduler.schedule_once()
    assert len(cluster.events(reason="FailedScheduling")) == 1


def test_taints_selectors_affinity_and_cordon(cluster: Cluster) -> None:
    cluster.core.patch_node("gpu-a", {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}},
                            _content_type="application/merge-patch+json", _preload_content=False)
    cluster.core.patch_node("gpu-b", {"spec": {"unschedulable": True}},
                            _content_type="application/merge-patch+json", _preload_content=False)
    cluster.create(make_pod("intolerant", gpus=1))
    cluster.create(make_pod("tolerant", gpus=1,
                            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]))
    cluster.create(make_pod("selected", node_selector={"kubernetes.io/hostname": "gpu-a"},
                            tolerations=[{"operator": "Exists"}]))
    cluster.create(make_pod("nowhere", node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"}))
    cluster.scheduler.schedule_once()
    assert node_of(cluster, "intolerant") is None
    assert node_of(cluster, "tolerant") == "gpu-a"
    assert node_of(cluster, "selected") == "gpu-a"
    assert node_of(cluster, "nowhere") is None
    messages = {e["involvedObject"]["name"]: e["message"] for e in cluster.events(reason="FailedScheduling")}
    assert messages["intolerant"] == ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
                                      "1 node(s) had untolerated taint {nvidia.com/gpu}, 1 node(s) were unschedulable.")


def test_only_pods_of_the_scheduler_name_are_placed(cluster: Cluster) -> None:
    cluster.create(make_pod("mine", gpus=1))
    cluster.create(make_pod("default-one", scheduler_name=None))
    cluster.scheduler.schedule_once()
    assert node_of(cluster, "mine") == "gpu-a"
    assert node_of(cluster, "default-one") is None
    cluster.scheduler.scheduler_name = ALL_SCHEDULERS
    cluster.scheduler.schedule_once()
    assert node_of(cluster, "default-one") == "cpu-c"


def test_extender_filters_and_prioritises_over_http(cluster: Cluster, extender: ExtenderDouble) -> None:
    extender.filter_fn = lambda args: {"NodeNames": [n for n in args["NodeNames"] if n != "gpu-a"],
                                       "FailedNodes": {"gpu-a": "fragmented"}}
    cluster.use_extenders([ExtenderConfig(extender.url, weight=1, managed_resources=("nvidia.com/gpu",))])
    cluster.create(make_pod("gpu-pod", gpus=1))
    cluster.create(make_pod("cpu-pod"))
    cluster.scheduler.schedule_once()
    assert node_of(cluster, "gpu-pod") == "gpu-b"
    assert node_of(cluster, "cpu-pod") == "cpu-c"  # not a managed resource: never sent to the extender
    sent = [(verb, args["Pod"]["metadata"]["name"], args["NodeNames"]) for verb, args in extender.received]
    assert sent == [("filter", "gpu-pod", ["gpu-a", "gpu-b"]), ("prioritize", "gpu-pod", ["gpu-b"])]
    assert extender.received[0][1]["Pod"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_extender_scores_beat_name_order(cluster: Cluster, extender: ExtenderDouble) -> None:
    extender.scores = {"gpu-a": 2, "gpu-b": 9}
    cluster.use_extenders([ExtenderConfig(extender.url)])
    cluster.create(make_pod("p", gpus=1))
    placement = cluster.scheduler.schedule_once()[0]
    assert placement.node == "gpu-b"
    assert placement.scores == {"gpu-a": 20, "gpu-b": 90}


@pytest.mark.parametrize("ignorable, expected", [(False, None), (True, "gpu-a")], ids=["fatal", "ignorable"])
def test_extender_failure(cluster: Cluster, extender: ExtenderDouble, ignorable: bool, expected: str | None) -> None:
    extender.status = 503
    cluster.use_extenders([ExtenderConfig(extender.url, ignorable=ignorable)])
    cluster.create(make_pod("p", gpus=1))
    placement = cluster.scheduler.schedule_once()[0]
    assert placement.node == expected
    if not ignorable:
        assert "HTTP 503" in placement.message


def test_background_mode_binds_without_stepping() -> None:
    with Cluster(nodes=[make_node("gpu-a", gpus=1)], karpenter=False) as running:
        running.create(make_pod("p", gpus=1))
        running.wait_for(lambda: running.pods(bound=True, ready=True), message="p bound and Ready")
