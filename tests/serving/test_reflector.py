"""Reflector and client configuration against a list/watch server over real HTTP.

Real: kube.config.load_api_client reading a kubeconfig file, the kubernetes
client (CoreV1Api, CustomObjectsApi, kubernetes.watch.Watch), the Reflector
thread, HTTP on loopback. Faked: the API server is tests/serving/fake_kubeapi.py,
a stdlib server speaking the list/watch wire protocol (lists, newline-delimited
watch events, 410 Gone as an ERROR event or an HTTP status).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kube.config import KubeConfigError, load_api_client
from kube.reflector import Reflector, custom_objects_lister
from kube.trim import node_fields
from tests.serving.fake_kubeapi import FakeKubeApi

NODES = "/api/v1/nodes"
POLICIES = "/apis/gpu.kubeon.io/v1alpha1/gpupolicies"


def node(name: str, **labels: str) -> dict:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}}


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    server = FakeKubeApi().start()
    yield server
    server.close()


@pytest.fixture
def api(fake: FakeKubeApi, tmp_path: Path) -> Iterator[client.ApiClient]:
    api_client = load_api_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    yield api_client
    api_client.close()


@pytest.fixture
def changes() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def reflector(fake: FakeKubeApi, api: client.ApiClient, changes: list) -> Iterator[Reflector]:
    fake.add(NODES, node("a", gpu="A100"))
    fake.add(NODES, node("b"))
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5,
                  on_change=lambda kind, obj: changes.append((kind, obj["metadata"]["name"])))
    r.start()
    assert r.wait_for_sync(5)
    yield r
    r.stop()


def test_initial_list_fills_the_cache_as_plain_dicts(reflector: Reflector, changes: list) -> None:
    snap = reflector.snapshot()
    assert set(snap) == {"a", "b"}
    assert snap["a"]["metadata"]["labels"] == {"gpu": "A100"}
    assert snap["a"]["kind"] == "Node" and snap["a"]["apiVersion"] == "v1"
    assert reflector.has_synced()
    assert sorted(changes) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_applies_added_modified_deleted(fake: FakeKubeApi, reflector: Reflector, changes: list) -> None:
    changes.clear()
    fake.add(NODES, node("c"))
    fake.modify(NODES, node("a", gpu="H100"))
    fake.delete(NODES, "b")
    eventually(lambda: len(changes) == 3)
    assert changes == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    snap = reflector.snapshot()
    assert set(snap) == {"a", "c"}
    assert snap["a"]["metadata"]["labels"]["gpu"] == "H100"
    assert reflector.resource_version == str(fake.rv)
    assert fake.list_requests == 1


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-status"])
def test_410_gone_relists_and_reports_the_missed_changes(
    fake: FakeKubeApi, reflector: Reflector, changes: list, as_http: bool
) -> None:
    changes.clear()
    fake.gone_as_http = as_http
    # Changes the watch never sees (history compacted), then expiry.
    fake.add_silently(NODES, node("missed"))
    fake.delete_silently(NODES, "b")
    fake.drop_watches() if as_http else fake.expire()
    if as_http:
        fake.expire()
    eventually(lambda: set(reflector.snapshot()) == {"a", "missed"})
    assert sorted(changes) == [("ADDED", "missed"), ("DELETED", "b")]
    assert fake.list_requests == 2
    fake.add(NODES, node("after"))
    eventually(lambda: "after" in reflector.snapshot())


def test_a_transform_trims_what_the_list_the_watch_and_a_relist_keep(fake: FakeKubeApi,
                                                                      api: client.ApiClient) -> None:
    seen: list[tuple[str, dict]] = []
    fake.add(NODES, {**node("a", gpu="A100"), "status": {"images": ["x" * 100], "allocatable": {"cpu": "8"}}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, obj)))
    r.start()
    try:
        assert r.wait_for_sync(5)
        assert r.snapshot()["a"]["status"] == {"allocatable": {"cpu": "8"}}  # listed
        fake.add(NODES, {**node("b"), "status": {"images": ["y"], "allocatable": {"cpu": "4"}}})
        fake.modify(NODES, {**node("a", gpu="H100"), "status": {"images": ["z"], "allocatable": {"cpu": "8"}}})
        eventually(lambda: len(seen) == 3)
        fake.add_silently(NODES, {**node("c"), "status": {"images": ["w"]}})
        fake.expire()  # relist
        eventually(lambda: "c" in r.snapshot())
        snap = r.snapshot()
        assert all("images" not in obj["status"] for obj in snap.values())
        assert snap["a"]["metadata"]["labels"] == {"gpu": "H100"} and snap["c"]["status"] == {}
        assert all("images" not in obj.get("status", {}) for _, obj in seen)
        assert [kind for kind, _ in seen] == ["ADDED", "ADDED", "MODIFIED", "ADDED"]
    finally:
        r.stop()


def test_with_a_transform_a_change_to_dropped_fields_is_kept_but_not_told(fake: FakeKubeApi,
                                                                           api: client.ApiClient) -> None:
    """A kubelet heartbeat changes nothing a trimmed Node keeps: the cache takes its resourceVersion, the
    consumers hear nothing; a label change is told; a relist tells only what changed beyond the version."""
    seen: list[tuple[str, str]] = []
    fake.add(NODES, {**node("a", gpu="A100"), "status": {"conditions": [{"message": "beat 0"}]}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, obj["metadata"]["labels"].get("gpu", ""))))
    r.start()
    try:
        assert r.wait_for_sync(5)
        held = r.snapshot()["a"]
        fake.modify(NODES, {**node("a", gpu="A100"), "status": {"conditions": [{"message": "beat 1"}]}})
        eventually(lambda: r.resource_version == str(fake.rv))
        assert r.snapshot()["a"]["metadata"]["resourceVersion"] == str(fake.rv)
        assert r.snapshot()["a"] is held  # the version written into the object held: nothing new to collect
        fake.modify(NODES, {**node("a", gpu="H100"), "status": {"conditions": [{"message": "beat 1"}]}})
        eventually(lambda: len(seen) == 2)
        fake.add_silently(NODES, {**node("a", gpu="H100"), "status": {"conditions": [{"message": "beat 2"}]}})
        held = r.snapshot()["a"]
        fake.expire()  # relist: a heartbeat missed, nothing to tell
        fake.add(NODES, node("b"))
        eventually(lambda: "b" in r.snapshot())
        assert seen == [("ADDED", "A100"), ("MODIFIED", "H100"), ("ADDED", "")]
        assert r.snapshot()["a"] is held and held["metadata"]["resourceVersion"] != "" and r.relists == 2
    finally:
        r.stop()


def test_dropped_connection_resumes_from_last_resource_version(
    fake: FakeKubeApi, reflector: Reflector
) -> None:
    fake.add(NODES, node("c"))
    eventually(lambda: "c" in reflector.snapshot())
    seen_rv = reflector.resource_version
    watches = len(fake.watch_requests)
    fake.drop_watches()
    eventually(lambda: len(fake.watch_requests) > watches)
    assert fake.watch_requests[watches] == seen_rv
    fake.add(NODES, node("d"))
    eventually(lambda: "d" in reflector.snapshot())
    assert fake.list_requests == 1, "a dropped watch must not relist"


def test_bad_events_are_skipped_without_killing_the_thread(fake: FakeKubeApi, reflector: Reflector) -> None:
    fake.inject_line(NODES, "{not json")
    fake.inject_line(NODES, '{"type": "ADDED", "object": {"kind": "Node"}}')
    fake.inject_line(NODES, '{"type": "WEIRD", "object": {"metadata": {"name": "x"}}}')
    fake.inject_line(NODES, '["a", "list"]')  # JSON, but no event (kubernetes' own Watch raised TypeError)
    fake.add(NODES, node("good"))
    eventually(lambda: "good" in reflector.snapshot())
    assert "x" not in reflector.snapshot()


def test_a_raising_on_change_does_not_stop_the_cache(fake: FakeKubeApi, api: client.ApiClient) -> None:
    def boom(kind: str, obj: dict) -> None:
        raise RuntimeError("consumer bug")

    with Reflector(client.CoreV1Api(api).list_node, on_change=boom, timeout_seconds=5) as r:
        assert r.wait_for_sync(5)
        fake.add(NODES, node("n1"))
        fake.add(NODES, node("n2"))
        eventually(lambda: {"n1", "n2"} <= set(r.snapshot()))


def test_custom_objects_and_custom_key(fake: FakeKubeApi, api: client.ApiClient) -> None:
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
              "metadata": {"name": "share"}, "spec": {"priority": 3}}
    fake.add(POLICIES, policy)
    lister = custom_objects_lister(api, "gpu.kubeon.io", "v1alpha1", "gpupolicies")
    with Reflector(lister, key=lambda o: "policy:" + o["metadata"]["name"], timeout_seconds=5) as r:
        assert r.wait_for_sync(5)
        assert r.snapshot()["policy:share"]["spec"] == {"priority": 3}
        fake.modify(POLICIES, {**policy, "spec": {"priority": 9}})
        eventually(lambda: r.get("policy:share")["spec"]["priority"] == 9)


def test_unreachable_server_retries_with_backoff_then_syncs(tmp_path: Path) -> None:
    fake = FakeKubeApi()  # bound but not serving yet: connections hang/refuse until start
    api_client = load_api_client(str(fake.write_kubeconfig(tmp_path / "kc")))
    fake.server.server_close()  # port closed: connection refused
    # a first retry in a minute: the thread is waiting for it when the stop comes
    r = Reflector(client.CoreV1Api(api_client).list_node, timeout_seconds=5, backoff_initial=60).start()
    try:
        assert not r.wait_for_sync(0.5)
        assert r._thread is not None and r._thread.is_alive()
    finally:
        r.stop(timeout=20)  # the backoff alone would hold the thread for 60 s
        assert r._thread is not None and not r._thread.is_alive(), "stop did not end the backoff's wait"


def test_stop_ends_a_blocked_watch_promptly(fake: FakeKubeApi, api: client.ApiClient) -> None:
    fake.add(NODES, node("a"))
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=300).start()
    assert r.wait_for_sync(5)
    eventually(lambda: bool(fake.watch_requests))  # the watch is open; nothing changes, so it blocks reading
    r.stop(timeout=20)  # the fake holds a quiet watch for 30 s: only the stop ends it sooner
    assert r._thread is not None and not r._thread.is_alive(), "stop left the thread reading the watch"


def test_stop_as_the_watch_is_sent_still_ends_it(fake: FakeKubeApi, api: client.ApiClient) -> None:
    """The stop coming between the watch request and its response (kubernetes' Watch.stop shuts only a
    response it has): one stop in that window left the thread reading a quiet watch for 30 s (about one
    in six tries with the stop sent as the request arrives; CI caught it in the test above)."""
    fake.add(NODES, node("a"))
    for attempt in range(20):
        seen = len(fake.watch_requests)
        r = Reflector(client.CoreV1Api(api).list_node, name=f"nodes-{attempt}", timeout_seconds=300).start()
        assert r.wait_for_sync(5)
        deadline = time.monotonic() + 5
        while len(fake.watch_requests) == seen and time.monotonic() < deadline:
            time.sleep(0.0005)  # stop as soon as the server has the request, before its answer is read
        r.stop(timeout=5)
        assert r._thread is not None and not r._thread.is_alive(), f"try {attempt}: stop left the watch reading"


def test_load_api_client_names_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_api_client(str(tmp_path / "nope"))


@pytest.mark.parametrize("device", [True, False], ids=["dev-null", "directory"])
def test_load_api_client_names_a_kubeconfig_that_is_not_a_file(tmp_path: Path, device: bool) -> None:
    target = "/dev/null" if device else str(tmp_path)
    with pytest.raises(KubeConfigError, match=f"kubeconfig '{target}' is not a regular file"):
        load_api_client(target)


def test_load_api_client_leaves_the_global_default_alone(fake: FakeKubeApi, tmp_path: Path) -> None:
    before = client.Configuration.get_default_copy().host
    api_client = load_api_client(str(fake.write_kubeconfig(tmp_path / "kc")))
    assert api_client.configuration.host == fake.url
    assert client.Configuration.get_default_copy().host == before


def test_a_number_orjson_refuses_is_read_as_json_reads_it_in_a_list_and_a_watch_event(
        fake: FakeKubeApi, api: client.ApiClient) -> None:
    """orjson refuses numbers beyond a double's range, which json reads (as infinity): the reflector
    falls back to json instead of dropping the object (a watch event) or failing the list."""
    fake.add(NODES, {**node("listed"), "spec": {"size": float("inf")}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5)
    r.start()
    try:
        assert r.wait_for_sync(5)
        assert r.snapshot()["listed"]["spec"]["size"] == float("inf")
        fake.add(NODES, {**node("watched"), "spec": {"size": float("-inf")}})
        eventually(lambda: "watched" in r.snapshot())
        assert r.snapshot()["watched"]["spec"]["size"] == float("-inf")
    finally:
        r.stop()
