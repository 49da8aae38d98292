"""The extender's /filter and /prioritize handlers on kube-scheduler wire payloads.

Real: the Flask app from `extender.app.create_app`, `ExtenderService`, the
`ClusterCache` node model and the packing engine; payloads shaped like the
upstream Go types (capitalised ExtenderArgs keys, a full v1.Pod, NodeNames).
Faked: the watch (node and pod events are fed to the cache by hand), the
clock (assumptions expire without sleeping) and the HTTP transport (Flask's
test client; tests/extender/test_server.py goes through gunicorn).
"""

from __future__ import annotations

import pytest

from tests.cluster.objects import make_node, required_node_affinity
from tests.extender.payloads import Harness, args, bound, policy, wire_pod

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def used_pod(name: str, node: str, gpus: int) -> dict:
    return bound(wire_pod(name, gpus=gpus, cpu="1"), node)


def cluster() -> list[dict]:
    return [
        make_node("a100-fresh", A100, 8),
        make_node("a100-used", A100, 8),
        make_node("h100-0", H100, 8),
        make_node("a100-cordoned", A100, 8, unschedulable=True),
        make_node("a100-draining-label", A100, 8, labels={"gpu.kubeon.io/draining": "true"}),
        make_node("a100-draining-taint", A100, 8,
                  taints=[{"key": "gpu.kubeon.io/draining", "value": "true", "effect": "NoSchedule"}]),
        make_node("a100-mig", A100, 2, mig={"1g.10gb": 7}),
        make_node("a100-mig-3g", A100, 2, mig={"3g.40gb": 2}),
        make_node("t4-shared", "Tesla-T4", 2, shared_replicas=4),
        make_node("cpu-0", None, 0),
    ]


NAMES = [n["metadata"]["name"] for n in cluster()]


# ---------------------------------------------------------------- filter

def test_filter_answers_node_names_and_explains_every_rejection() -> None:
    h = Harness(cluster(), [used_pod("busy", "a100-used", 7)])
    result = h.filter(wire_pod("p", gpus=2), NAMES)
    assert result["Nodes"] is None and result["Error"] == ""
    assert result["NodeNames"] == ["a100-fresh", "h100-0"]  # input order, only names that were sent
    assert result["FailedNodes"] == {"a100-used": "kubeon-gpu: not enough fully free GPUs"}
    hopeless = result["FailedAndUnresolvableNodes"]
    for name in ("a100-cordoned", "a100-draining-label", "a100-draining-taint"):
        assert hopeless[name] == "kubeon-gpu: node cordoned or draining"
    for name in ("a100-mig", "a100-mig-3g", "t4-shared", "cpu-0"):
        assert hopeless[name] == "kubeon-gpu: node has no GPUs"  # no whole nvidia.com/gpu there
    assert set(result["NodeNames"]) | set(result["FailedNodes"]) | set(hopeless) == set(NAMES)


@pytest.mark.parametrize(
    ("cpu", "memory", "resolvable", "reason"),
    [
        pytest.param("8", "1Gi", True, "insufficient cpu", id="cpu-equal-to-capacity"),
        pytest.param("8001m", "1Gi", False, "insufficient cpu", id="cpu-over-capacity"),
        pytest.param("1", "64Gi", True, "insufficient memory", id="memory-equal-to-capacity"),
        pytest.param("1", "65537Mi", False, "insufficient memory", id="memory-over-capacity"),
    ],
)
def test_cpu_or_memory_beyond_the_nodes_capacity_is_unresolvable(cpu: str, memory: str, resolvable: bool,
                                                                 reason: str) -> None:
    """kube-scheduler preempts only for FailedNodes: a pod that fits the node's capacity but not what is free
    (another pod holds 1 CPU and 1Gi) may get room by eviction; one asking more than the node has never can, so
    the node is in FailedAndUnresolvableNodes and no pod is evicted in vain. Asking exactly the capacity fits."""
    h = Harness([make_node("small", A100, 8, cpu="8", memory="64Gi")],
                [bound(wire_pod("busy", gpus=1, cpu="1", memory="1Gi"), "small")])
    result = h.filter(wire_pod("p", gpus=1, cpu=cpu, memory=memory), ["small"])
    assert result["NodeNames"] == [] and result["Error"] == ""
    failed = {"small": f"kubeon-gpu: {reason}"}
    assert result["FailedNodes"] == (failed if resolvable else {})
    assert result["FailedAndUnresolvableNodes"] == ({} if resolvable else failed)


def test_cpu_and_memory_that_fit_what_is_free_pass() -> None:
    """The other side of the boundary: what is left after the running pod (7 CPUs, 63Gi) is enough."""
    h = Harness([make_node("small", A100, 8, cpu="8", memory="64Gi")],
                [bound(wire_pod("busy", gpus=1, cpu="1", memory="1Gi"), "small")])
    result = h.filter(wire_pod("p", gpus=1, cpu="7", memory="63Gi"), ["small"])
    assert result["NodeNames"] == ["small"]
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


def test_h100_affinity_never_passes_an_a100_node() -> None:
    h = Harness(cluster())
    pod = wire_pod("h", gpus=1, affinity=required_node_affinity(
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}))
    result = h.filter(pod, NAMES)
    assert result["NodeNames"] == ["h100-0"]
    assert result["FailedAndUnresolvableNodes"]["a100-fresh"] == "kubeon-gpu: GPU model not allowed by the pod"


def test_typefit_policy_restricts_products_only_in_automatic_mode() -> None:
    enforced = Harness(cluster(), policies=[policy("h100-only", {"typeFit": {"allowedModels": [H100]}})])
    assert enforced.filter(wire_pod("p", gpus=1), NAMES)["NodeNames"] == ["h100-0"]
    recommend = Harness(cluster(), policies=[policy("h100-only", {"typeFit": {"allowedModels": [H100]}},
                                                   mode="Recommend")])
    assert recommend.filter(wire_pod("p", gpus=1), NAMES)["NodeNames"] == ["a100-fresh", "a100-used", "h100-0"]


def test_mig_pods_fit_by_free_device_count() -> None:
    # 2 GPUs x 7 1g.10gb = 14 devices; 13 in use leaves one.
    pods = [bound(wire_pod(f"m{i}", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb"), "a100-mig") for i in range(13)]
    h = Harness(cluster(), pods)
    one = wire_pod("one", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb")
    two = wire_pod("two", gpus=2, gpu_resource="nvidia.com/mig-1g.10gb")
    assert h.filter(one, NAMES)["NodeNames"] == ["a100-mig"]
    result = h.filter(two, NAMES)
    assert result["NodeNames"] == []
    msg = "kubeon-gpu: not enough free MIG devices of the requested profile"
    assert result["FailedNodes"]["a100-mig"] == msg  # preemption could free devices
    assert result["FailedAndUnresolvableNodes"]["a100-mig-3g"] == msg  # never has that profile


def test_time_sliced_pods_fit_by_free_replicas() -> None:
    pods = [bound(wire_pod(f"s{i}", gpus=1, gpu_resource="nvidia.com/gpu.shared"), "t4-shared") for i in range(7)]
    h = Harness(cluster(), pods)
    assert h.filter(wire_pod("s", gpus=1, gpu_resource="nvidia.com/gpu.shared"), NAMES)["NodeNames"] == ["t4-shared"]
    result = h.filter(wire_pod("s2", gpus=2, gpu_resource="nvidia.com/gpu.shared"), NAMES)
    assert result["FailedNodes"] == {"t4-shared": "kubeon-gpu: not enough free nvidia.com/gpu.shared replicas"}


def test_unknown_node_names_are_reported_not_dropped() -> None:
    h = Harness(cluster())
    result = h.filter(wire_pod("p", gpus=1), ["a100-fresh", "ghost-1"])
    assert result["NodeNames"] == ["a100-fresh"]
    assert result["FailedNodes"] == {"ghost-1": "kubeon-gpu: node not known to the optimizer"}


def test_filter_with_full_node_list_answers_nodes() -> None:
    nodes = cluster()
    h = Harness(nodes)
    body = {"Pod": wire_pod("p", gpus=8), "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes[:3]},
            "NodeNames": None}
    result = h.client.post("/filter", json=body).get_json()
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a100-fresh", "a100-used", "h100-0"]


# ---------------------------------------------------------------- prioritize

def test_prioritize_is_a_bare_list_of_every_input_node_scoring_0_to_10_when_the_weight_is_unknown() -> None:
    """Not told its weight in kube-scheduler's profile, the extender lists every input host, in input order,
    each once, 0..10: exactly one 10 here, 0 for the infeasible and the unknown."""
    h = Harness(cluster(), [used_pod("busy", "a100-used", 4)])
    names = ["a100-fresh", "a100-used", "h100-0", "a100-cordoned", "ghost"]
    resp = h.client.post("/prioritize", json=args(wire_pod("p", gpus=1), names))
    assert resp.status_code == 200
    body = resp.get_json()
    assert [e["Host"] for e in body] == names and all(set(e) == {"Host", "Score"} for e in body)
    scores = {e["Host"]: e["Score"] for e in body}
    assert all(0 <= s <= 10 for s in scores.values())
    assert list(scores.values()).count(10) == 1
    assert scores["a100-cordoned"] == scores["ghost"] == 0  # infeasible, unknown


@pytest.mark.parametrize(("weight", "reach"), [(71, 1), (121, 0)])
def test_prioritize_lists_only_the_hosts_that_can_still_be_placed_at_a_known_weight(weight: int,
                                                                                    reach: int) -> None:
    """Told its weight, the extender leaves out the hosts too far below the top for kube-scheduler's plugins
    (1,200 at most) to make up: kube-scheduler adds nothing for an unlisted host, the pick is the same."""
    pods = [used_pod("busy", "a100-used", 4)]
    names = ["a100-fresh", "a100-used", "h100-0", "a100-cordoned", "ghost"]
    full = Harness(cluster(), pods).prioritize(wire_pod("p", gpus=1), names)
    h = Harness(cluster(), pods, scheduler_weight=weight)
    body = h.client.post("/prioritize", json=args(wire_pod("p", gpus=1), names)).get_json()
    top = max(full.values())
    assert top == 10
    assert [e["Host"] for e in body] == [n for n in names if full[n] >= top - reach]
    assert {e["Host"]: e["Score"] for e in body} == {n: s for n, s in full.items() if s >= top - reach}
    assert not {"a100-cordoned", "ghost"} & {e["Host"] for e in body}


@pytest.mark.parametrize("strategy", ["bestfit", "default", "fgd", "packing"])
def test_gpu_pod_goes_to_the_partly_used_node_rather_than_a_fresh_one(strategy: str) -> None:
    pols = [policy("pack", {"packing": {"strategy": strategy}})]
    h = Harness(cluster(), [used_pod("busy", "a100-used", 6)], policies=pols)
    assert h.schedule(wire_pod("p", gpus=1), NAMES) == "a100-used"


def test_mig_pod_goes_to_the_partly_used_mig_node() -> None:
    nodes = [*cluster(), make_node("a100-mig-b", A100, 2, mig={"1g.10gb": 7})]
    pods = [bound(wire_pod("m", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb"), "a100-mig-b")]
    h = Harness(nodes, pods)
    names = [n["metadata"]["name"] for n in nodes]
    assert h.schedule(wire_pod("p", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb"), names) == "a100-mig-b"


def test_recommend_packing_policy_does_not_change_placement() -> None:
    # bestfit would pick the used node; Recommend only logs that, the default policy scores.
    nodes = [make_node("a-fresh", A100, 8), make_node("b-used", A100, 8)]
    pods = [used_pod("busy", "b-used", 2)]
    auto = Harness(nodes, pods, policies=[policy("p", {"packing": {"strategy": "bestfit"}})], default_strategy="random")
    rec = Harness(nodes, pods, policies=[policy("p", {"packing": {"strategy": "bestfit"}}, mode="Recommend")],
                  default_strategy="random")
    plain = Harness(nodes, pods, default_strategy="random")
    names = ["a-fresh", "b-used"]
    assert auto.schedule(wire_pod("x", gpus=1), names) == "b-used"
    assert rec.prioritize(wire_pod("x", gpus=1), names) == plain.prioritize(wire_pod("x", gpus=1), names)


def test_back_to_back_pods_do_not_land_on_the_same_free_gpu() -> None:
    h = Harness([make_node("a", A100, 8), make_node("b", A100, 8)], [used_pod("busy", "a", 7)],
                policies=[policy("p", {"packing": {"strategy": "bestfit"}})])
    first, second = wire_pod("first", gpus=1), wire_pod("second", gpus=1)
    assert h.schedule(first, ["a", "b"]) == "a"  # takes the last free GPU of a (assumed there)
    result = h.filter(second, ["a", "b"])
    assert result["NodeNames"] == ["b"]
    assert result["FailedNodes"] == {"a": "kubeon-gpu: not enough fully free GPUs"}
    # one node passed: kube-scheduler binds `second` there without /prioritize, so it is assumed there at once
    assert h.cache.assumed == {"default/first": "a", "default/second": "b"}
    # the watch shows `first` bound: the assumption becomes the real binding, same capacity
    h.cache.on_pod("ADDED", bound(first, "a"))
    assert h.cache.assumed == {"default/second": "b"}
    assert h.filter(second, ["a", "b"])["NodeNames"] == ["b"]


def test_assumptions_expire() -> None:
    h = Harness([make_node("a", A100, 1)])
    assert h.schedule(wire_pod("first", gpus=1), ["a"]) == "a"
    assert h.filter(wire_pod("second", gpus=1), ["a"])["NodeNames"] == []
    h.now += 31  # never bound (e.g. the scheduler chose otherwise and failed): capacity comes back
    assert h.filter(wire_pod("second", gpus=1), ["a"])["NodeNames"] == ["a"]
    assert h.cache.assumed == {"default/second": "a"}  # `first` expired; `second` passed alone: assumed there


def test_deleted_and_finished_pods_give_capacity_back() -> None:
    busy = used_pod("busy", "a", 1)
    h = Harness([make_node("a", A100, 1)], [busy])
    assert h.filter(wire_pod("p", gpus=1), ["a"])["NodeNames"] == []
    done = bound(busy, "a")
    done["status"]["phase"] = "Succeeded"
    h.cache.on_pod("MODIFIED", done)
    assert h.filter(wire_pod("p", gpus=1), ["a"])["NodeNames"] == ["a"]
    h.cache.on_pod("MODIFIED", busy)
    h.cache.on_pod("DELETED", busy)
    assert h.filter(wire_pod("p", gpus=1), ["a"])["NodeNames"] == ["a"]
    assert h.cache.rebuilds == 1  # pod events updated one row, never the whole model


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("path", ["/filter", "/prioritize"])
@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "malformed JSON"),
    (b"", "empty request body"),
    (b"[1, 2]", "body"),
])
def test_protocol_errors_are_400_json(path: str, body: bytes, needle: str) -> None:
    resp = Harness(cluster()).client.post(path, data=body, content_type="application/json")
    assert resp.status_code == 400
    assert needle in resp.get_json()["error"]


@pytest.mark.parametrize(("body", "field"), [
    ({"NodeNames": ["a100-fresh"]}, "Pod: missing"),
    ({"Pod": "x", "NodeNames": ["a"]}, "Pod: expected a v1.Pod object"),
    ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"]}, "Pod.spec: missing"),
    ({"Pod": {"spec": {}}, "NodeNames": ["a"]}, "Pod.metadata.name: missing"),
    ({"Pod": wire_pod("p", gpus=1), "NodeNames": "a100-fresh"}, "NodeNames: expected a list"),
    ({"Pod": wire_pod("p", gpus=1), "NodeNames": [1, 2]}, "NodeNames: expected a list"),
    ({"Pod": wire_pod("p", gpus=1), "NodeNames": None, "Nodes": None}, "NodeNames: missing"),
    ({"Pod": wire_pod("p", gpus=1), "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0].metadata.name"),
    ({"Pod": wire_pod("p", cpu="lots"), "NodeNames": ["a100-fresh"]},
     "Pod.spec.containers[0].resources.requests.cpu: 'lots' is not a quantity"),
])
def test_bad_arguments_are_a_filter_error_and_a_prioritize_400(body: dict, field: str) -> None:
    h = Harness(cluster())
    resp = h.client.post("/filter", json=body)
    assert resp.status_code == 200
    result = resp.get_json()
    assert field in result["Error"] and result["NodeNames"] is None
    resp = h.client.post("/prioritize", json=body)
    assert resp.status_code == 400 and field in resp.get_json()["error"]


def test_handler_time_header_and_metrics() -> None:
    h = Harness(cluster())
    resp = h.client.post("/filter", json=args(wire_pod("p", gpus=1), NAMES))
    assert float(resp.headers["X-Kubeon-Handler-Seconds"]) > 0
    text = h.client.get("/metrics").get_data(as_text=True)
    assert 'kubeon_extender_http_request_duration_seconds_bucket{le="0.005",route="/filter",status="200"}' in text
    assert 'kubeon_extender_decisions_total{outcome="fit",strategy="kubeon",verb="filter"} 1.0' in text


def test_a_hub_disconnected_cluster_gets_a_neutral_extender() -> None:
    """The hub refused the cluster token: every node passes the filter and scores 0, nothing is assumed."""
    from gpupolicy.cluster import view_from_objects

    cut = policy("pack", {"packing": {"strategy": "bestfit"}})
    cut["metadata"]["labels"] = {"gpu.kubeon.io/hub": "Disconnected"}
    from kube.views import StaticView

    h = Harness(cluster(), [used_pod("busy", "a100-used", 7)])
    h.service.source = StaticView(view_from_objects([cut], [])[0])
    result = h.filter(wire_pod("p", gpus=2), NAMES)
    assert result["NodeNames"] == NAMES and result["FailedNodes"] == {} and not result["FailedAndUnresolvableNodes"]
    assert set(h.prioritize(wire_pod("p", gpus=1), NAMES).values()) == {0}


def test_typefit_preferred_models_win_prioritize_and_fall_back_when_full() -> None:
    prefer = {"typeFit": {"preferredModels": [H100]}}
    # a100-used is fuller (the engine's own pick for a 1-GPU pod); the preference puts h100-0 first
    h = Harness(cluster(), [used_pod("busy", "a100-used", 4)], policies=[policy("h100-first", prefer)])
    scores = h.prioritize(wire_pod("p", gpus=1), ["a100-fresh", "a100-used", "h100-0"])
    assert scores["h100-0"] == 10 and scores["a100-used"] == scores["a100-fresh"] == 0
    plain = Harness(cluster(), [used_pod("busy", "a100-used", 4)])
    assert plain.schedule(wire_pod("p", gpus=1), NAMES) != "h100-0"  # without the policy it goes elsewhere
    # the H100 node full: the preference falls back to the other products instead of leaving the pod pending
    full = Harness(cluster(), [used_pod("busy", "a100-used", 4), used_pod("h", "h100-0", 8)],
                   policies=[policy("h100-first", prefer)])
    assert full.schedule(wire_pod("p", gpus=1), NAMES) in ("a100-fresh", "a100-used")
    # Recommend: logged only, the placement is the plain one
    rec = Harness(cluster(), [used_pod("busy", "a100-used", 4)],
                  policies=[policy("h100-first", prefer, mode="Recommend")])
    names = ["a100-fresh", "a100-used", "h100-0"]
    assert rec.prioritize(wire_pod("p", gpus=1), names) == plain.prioritize(wire_pod("p", gpus=1), names)
