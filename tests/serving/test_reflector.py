"""Reflector and client configuration against the wire-level test API server (tests/kubeapi).

Real: kube.config.load_api_client reading the server's kubeconfig file, the kubernetes client
(CoreV1Api, kube.rest listers, kubernetes.watch.Watch), the Reflector thread, HTTP on loopback, the
server's lists, watches, resourceVersions and 410 Gone. Driven by the server's test hooks
(tests/kubeapi/hooks.py): changes no watch sees (written with watches paused, then compacted away),
expired or dropped watches, 410 answered as an HTTP status, garbage lines in a watch stream, and
counts of the list and watch requests the reflector made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kube.config import KubeConfigError, load_api_client
from kube.reflector import Reflector, custom_objects_lister
from kube.trim import node_fields
from tests.kubeapi import ApiServer
from tests.kubeapi.registry import Options
from tests.kubeapi.resources import Resource
from tests.loopback import wait_for

NODES = "/api/v1/nodes"
POLICIES = "/apis/gpu.kubeon.io/v1alpha1/gpupolicies"
POLICY_CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"


def node(name: str, **labels: str) -> dict:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}}


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    wait_for(check, timeout=timeout, what="condition", interval=0.02)


class Writer:
    """Another client's writes, made in-process through the server's registry (its API rules, without HTTP).

    In-process so they can be made inside `hooks.paused()` (an HTTP write would wait for the lock it holds),
    and so a number JSON over HTTP refuses (infinity) can be stored, as the orjson test needs. A modify is a
    replace of the main resource, then of the status subresource when the object carries a status: the main
    resource ignores status, as on a real server.
    """

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def _res(self, path: str) -> Resource:
        parts = [p for p in path.split("/") if p]
        group, version, plural = ("", parts[1], parts[2]) if parts[0] == "api" else (parts[1], parts[2], parts[3])
        res = self.api.catalog.lookup(group, version, plural)
        assert res is not None, path
        return res

    def add(self, path: str, obj: dict[str, Any]) -> None:
        self.api.registry.create(self._res(path), "", json.loads(json.dumps(obj)), Options())

    def modify(self, path: str, obj: dict[str, Any]) -> None:
        res, name = self._res(path), obj["metadata"]["name"]
        for sub in ("", "status") if "status" in obj and "status" in res.subresources else ("",):
            body = json.loads(json.dumps(obj))
            body["metadata"]["resourceVersion"] = self.api.registry.get(res, "", name)["metadata"]["resourceVersion"]
            self.api.registry.update(res, "", name, body, Options(), sub)

    def delete(self, path: str, name: str) -> None:
        self.api.registry.delete(self._res(path), "", name, None, Options())


@pytest.fixture
def server() -> Iterator[ApiServer]:
    with ApiServer.start(crd_files=[POLICY_CRD]) as api:
        api.hooks.bare_list_items = True  # list items without kind/apiVersion, as kube-apiserver sends them
        yield api


@pytest.fixture
def writer(server: ApiServer) -> Writer:
    return Writer(server)


@pytest.fixture
def api(server: ApiServer) -> Iterator[client.ApiClient]:
    api_client = load_api_client(server.kubeconfig)
    yield api_client
    api_client.close()


@pytest.fixture
def changes() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def reflector(writer: Writer, api: client.ApiClient, changes: list) -> Iterator[Reflector]:
    writer.add(NODES, node("a", gpu="A100"))
    writer.add(NODES, node("b"))
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


def test_watch_applies_added_modified_deleted(server: ApiServer, writer: Writer, reflector: Reflector,
                                              changes: list) -> None:
    changes.clear()
    writer.add(NODES, node("c"))
    writer.modify(NODES, node("a", gpu="H100"))
    writer.delete(NODES, "b")
    eventually(lambda: len(changes) == 3)
    assert changes == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    snap = reflector.snapshot()
    assert set(snap) == {"a", "c"}
    assert snap["a"]["metadata"]["labels"]["gpu"] == "H100"
    assert reflector.resource_version == str(server.store.revision)
    assert server.hooks.lists(NODES) == 1


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-status"])
def test_410_gone_relists_and_reports_the_missed_changes(
    server: ApiServer, writer: Writer, reflector: Reflector, changes: list, as_http: bool
) -> None:
    changes.clear()
    server.hooks.gone_as_http = as_http
    # Changes the watch never sees (history compacted), then expiry.
    with server.hooks.paused():
        writer.add(NODES, node("missed"))
        writer.delete(NODES, "b")
        server.hooks.drop_watches() if as_http else server.hooks.expire_watches()
        if as_http:
            server.hooks.expire_watches()
    eventually(lambda: set(reflector.snapshot()) == {"a", "missed"})
    assert sorted(changes) == [("ADDED", "missed"), ("DELETED", "b")]
    assert server.hooks.lists(NODES) == 2
    assert server.hooks.http_410s == (1 if as_http else 0), "the relist came by the other path"
    writer.add(NODES, node("after"))
    eventually(lambda: "after" in reflector.snapshot())


def test_a_transform_trims_what_the_list_the_watch_and_a_relist_keep(server: ApiServer, writer: Writer,
                                                                      api: client.ApiClient) -> None:
    seen: list[tuple[str, dict]] = []
    writer.add(NODES, {**node("a", gpu="A100"), "status": {"images": ["x" * 100], "allocatable": {"cpu": "8"}}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, obj)))
    r.start()
    try:
        assert r.wait_for_sync(5)
        assert r.snapshot()["a"]["status"] == {"allocatable": {"cpu": "8"}}  # listed
        writer.add(NODES, {**node("b"), "status": {"images": ["y"], "allocatable": {"cpu": "4"}}})
        writer.modify(NODES, {**node("a", gpu="H100"), "status": {"images": ["z"], "allocatable": {"cpu": "8"}}})
        eventually(lambda: len(seen) == 3)
        with server.hooks.paused():
            writer.add(NODES, {**node("c"), "status": {"images": ["w"]}})
            server.hooks.expire_watches()  # relist
        eventually(lambda: "c" in r.snapshot())
        snap = r.snapshot()
        assert all("images" not in obj["status"] for obj in snap.values())
        assert snap["a"]["metadata"]["labels"] == {"gpu": "H100"} and snap["c"]["status"] == {}
        assert all("images" not in obj.get("status", {}) for _, obj in seen)
        assert [kind for kind, _ in seen] == ["ADDED", "ADDED", "MODIFIED", "ADDED"]
    finally:
        r.stop()


def test_with_a_transform_a_change_to_dropped_fields_is_kept_but_not_told(server: ApiServer, writer: Writer,
                                                                           api: client.ApiClient) -> None:
    """A kubelet heartbeat changes nothing a trimmed Node keeps: the cache takes its resourceVersion, the
    consumers hear nothing; a label change is told; a relist tells only what changed beyond the version."""
    seen: list[tuple[str, str]] = []
    writer.add(NODES, {**node("a", gpu="A100"), "status": {"conditions": [{"message": "beat 0"}]}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, obj["metadata"]["labels"].get("gpu", ""))))
    r.start()
    try:
        assert r.wait_for_sync(5)
        held = r.snapshot()["a"]
        beat_rv = server.store.revision
        writer.modify(NODES, {**node("a", gpu="A100"), "status": {"conditions": [{"message": "beat 1"}]}})
        assert server.store.revision > beat_rv, "the heartbeat must be a write the watch sees"
        eventually(lambda: r.resource_version == str(server.store.revision))
        assert r.snapshot()["a"]["metadata"]["resourceVersion"] == str(server.store.revision)
        assert r.snapshot()["a"] is held  # the version written into the object held: nothing new to collect
        writer.modify(NODES, {**node("a", gpu="H100"), "status": {"conditions": [{"message": "beat 1"}]}})
        eventually(lambda: len(seen) == 2)
        with server.hooks.paused():
            writer.modify(NODES, {**node("a", gpu="H100"), "status": {"conditions": [{"message": "beat 2"}]}})
            held = r.snapshot()["a"]
            server.hooks.expire_watches()  # relist: a heartbeat missed, nothing to tell
        writer.add(NODES, node("b"))
        eventually(lambda: "b" in r.snapshot())
        assert seen == [("ADDED", "A100"), ("MODIFIED", "H100"), ("ADDED", "")]
        assert r.snapshot()["a"] is held and held["metadata"]["resourceVersion"] != "" and r.relists == 2
    finally:
        r.stop()


def test_dropped_connection_resumes_from_last_resource_version(
    server: ApiServer, writer: Writer, reflector: Reflector
) -> None:
    writer.add(NODES, node("c"))
    eventually(lambda: "c" in reflector.snapshot())
    seen_rv = reflector.resource_version
    watches = len(server.hooks.watches(NODES))
    server.hooks.drop_watches()
    eventually(lambda: len(server.hooks.watches(NODES)) > watches)
    assert server.hooks.watches(NODES)[watches] == seen_rv
    writer.add(NODES, node("d"))
    eventually(lambda: "d" in reflector.snapshot())
    assert server.hooks.lists(NODES) == 1, "a dropped watch must not relist"


def test_bad_events_are_skipped_without_killing_the_thread(server: ApiServer, writer: Writer,
                                                           reflector: Reflector) -> None:
    server.hooks.inject_line(NODES, "{not json")
    server.hooks.inject_line(NODES, '{"type": "ADDED", "object": {"kind": "Node"}}')
    server.hooks.inject_line(NODES, '{"type": "WEIRD", "object": {"metadata": {"name": "x"}}}')
    server.hooks.inject_line(NODES, '["a", "list"]')  # JSON, but no event (kubernetes' own Watch raised TypeError)
    writer.add(NODES, node("good"))
    eventually(lambda: "good" in reflector.snapshot())
    assert "x" not in reflector.snapshot()


def test_a_raising_on_change_does_not_stop_the_cache(writer: Writer, api: client.ApiClient) -> None:
    def boom(kind: str, obj: dict) -> None:
        raise RuntimeError("consumer bug")

    with Reflector(client.CoreV1Api(api).list_node, on_change=boom, timeout_seconds=5) as r:
        assert r.wait_for_sync(5)
        writer.add(NODES, node("n1"))
        writer.add(NODES, node("n2"))
        eventually(lambda: {"n1", "n2"} <= set(r.snapshot()))


def test_custom_objects_and_custom_key(writer: Writer, api: client.ApiClient) -> None:
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
              "metadata": {"name": "share"}, "spec": {"priority": 3}}
    writer.add(POLICIES, policy)
    lister = custom_objects_lister(api, "gpu.kubeon.io", "v1alpha1", "gpupolicies")
    with Reflector(lister, key=lambda o: "policy:" + o["metadata"]["name"], timeout_seconds=5) as r:
        assert r.wait_for_sync(5)
        assert r.snapshot()["policy:share"]["spec"] == {"priority": 3}
        writer.modify(POLICIES, {**policy, "spec": {"priority": 9}})
        eventually(lambda: r.get("policy:share")["spec"]["priority"] == 9)


def test_unreachable_server_retries_with_backoff_then_syncs(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    with ApiServer.start() as gone:
        kubeconfig.write_text(Path(gone.kubeconfig).read_text())
    api_client = load_api_client(str(kubeconfig))  # the server stopped, its port closed: connection refused
    # a first retry in a minute: the thread is waiting for it when the stop comes
    r = Reflector(client.CoreV1Api(api_client).list_node, timeout_seconds=5, backoff_initial=60).start()
    try:
        assert not r.wait_for_sync(0.5)
        assert r._thread is not None and r._thread.is_alive()
    finally:
        r.stop(timeout=20)  # the backoff alone would hold the thread for 60 s
        assert r._thread is not None and not r._thread.is_alive(), "stop did not end the backoff's wait"


def test_stop_ends_a_blocked_watch_promptly(server: ApiServer, writer: Writer, api: client.ApiClient) -> None:
    writer.add(NODES, node("a"))
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=300).start()
    assert r.wait_for_sync(5)
    # the watch is open; nothing changes, so it blocks reading
    assert server.hooks.wait_for_watches(NODES, 1, timeout=5), "the reflector sent no watch"
    r.stop(timeout=20)  # the server holds a quiet watch for its timeoutSeconds, 300 s: only the stop ends it sooner
    assert r._thread is not None and not r._thread.is_alive(), "stop left the thread reading the watch"


def test_stop_as_the_watch_is_sent_still_ends_it(server: ApiServer, writer: Writer, api: client.ApiClient) -> None:
    """The stop coming between the watch request and its response (kubernetes' Watch.stop shuts only a
    response it has): one stop in that window left the thread reading a quiet watch for 30 s (about one
    in six tries with the stop sent as the request arrives; CI caught it in the test above)."""
    writer.add(NODES, node("a"))
    for attempt in range(20):
        seen = len(server.hooks.watches(NODES))
        r = Reflector(client.CoreV1Api(api).list_node, name=f"nodes-{attempt}", timeout_seconds=300).start()
        assert r.wait_for_sync(5)
        # stop as soon as the server has the request (woken by its arrival), before its answer is read
        assert server.hooks.wait_for_watches(NODES, seen + 1, timeout=5), f"try {attempt}: no watch was sent"
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


def test_load_api_client_leaves_the_global_default_alone(server: ApiServer) -> None:
    before = client.Configuration.get_default_copy().host
    api_client = load_api_client(server.kubeconfig)
    assert api_client.configuration.host == server.url
    assert client.Configuration.get_default_copy().host == before


def test_a_number_orjson_refuses_is_read_as_json_reads_it_in_a_list_and_a_watch_event(
        writer: Writer, api: client.ApiClient) -> None:
    """orjson refuses numbers beyond a double's range, which json reads (as infinity): the reflector
    falls back to json instead of dropping the object (a watch event) or failing the list."""
    writer.add(NODES, {**node("listed"), "spec": {"size": float("inf")}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5)
    r.start()
    try:
        assert r.wait_for_sync(5)
        assert r.snapshot()["listed"]["spec"]["size"] == float("inf")
        writer.add(NODES, {**node("watched"), "spec": {"size": float("-inf")}})
        eventually(lambda: "watched" in r.snapshot())
        assert r.snapshot()["watched"]["spec"]["size"] == float("-inf")
    finally:
        r.stop()
