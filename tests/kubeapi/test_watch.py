"""Watch fidelity: events after a resourceVersion, selector transitions, 410 Gone, timeouts.

Real: the double over HTTP, the official client's `kubernetes.watch.Watch`, and
raw chunked streams read with `requests`. Faked: nothing. The documented
behaviour checked: a watch from resourceVersion N delivers every later change
in order; without a resourceVersion it starts with ADDED for current objects;
a compacted resourceVersion yields an ERROR event carrying a 410 Expired Status.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from kubernetes import client, watch

from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


def stream(api: ApiServer, path: str) -> list[dict]:
    with requests.get(api.url + path, stream=True, timeout=10) as resp:
        assert resp.status_code == 200
        assert resp.headers["Transfer-Encoding"] == "chunked"
        return [json.loads(line) for line in resp.iter_lines() if line]


def test_watch_from_resource_version_sees_later_events_in_order(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    first = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    rv = first.metadata.resource_version
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    core.delete_namespaced_config_map("a", "default")
    events = stream(api, f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


def test_watch_without_resource_version_starts_with_current_objects(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "x"}})
    started = time.monotonic()
    events = stream(api, "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1")
    assert time.monotonic() - started >= 0.9  # timeoutSeconds is honoured, not cut short
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "x")]


def test_label_selected_watch_reports_objects_entering_and_leaving(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", {"metadata": {"name": "s"}})
    core.patch_namespaced_config_map("s", "default", {"metadata": {"labels": {"pick": "yes"}}})
    core.patch_namespaced_config_map("s", "default", {"data": {"a": "1"}})
    core.patch_namespaced_config_map("s", "default", {"metadata": {"labels": {"pick": "no"}}})
    events = stream(api, f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
                         f"&labelSelector=pick%3Dyes&timeoutSeconds=1")
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_compacted_resource_version_gives_410_expired(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    rv = core.create_namespaced_config_map("default", {"metadata": {"name": "old"}}).metadata.resource_version
    core.create_namespaced_config_map("default", {"metadata": {"name": "new"}})
    api.compact()
    events = stream(api, f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    w = watch.Watch()
    with pytest.raises(client.ApiException) as err:
        for _ in w.stream(core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=1):
            pass
    assert err.value.status == 410


def test_bounded_history_expires_old_versions() -> None:
    with ApiServer.start(history=5) as api:
        core = client.CoreV1Api(api.api_client())
        rv = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(8):
            core.create_namespaced_config_map("default", {"metadata": {"name": f"c{i}"}})
        events = stream(api, f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"
                             f"&timeoutSeconds=1")
        assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_official_client_watch_streams_concurrently_with_writes(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    rv = core.list_namespaced_pod("default").metadata.resource_version

    def writer() -> None:
        time.sleep(0.2)
        core.create_namespaced_pod("default", {"metadata": {"name": "w"},
                                               "spec": {"containers": [{"name": "c", "image": "x"}]}})
        core.patch_namespaced_pod("w", "default", {"metadata": {"labels": {"a": "b"}}})
        core.delete_namespaced_pod("w", "default")

    second = client.CoreV1Api(api.api_client())
    other = list(watch.Watch().stream(second.list_node, timeout_seconds=1, allow_watch_bookmarks=True))
    assert other == []
    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=3):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    thread.join()
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


def test_stop_ends_open_watches() -> None:
    """A watch that would stay open for an hour ends when the server stops (not at its timeout)."""
    api = ApiServer.start()
    opened = threading.Event()
    ended: list[str] = []

    def watcher() -> None:
        with requests.get(api.url + "/api/v1/pods?watch=true&timeoutSeconds=3600", stream=True,
                          timeout=(5, 3600)) as resp:
            assert resp.status_code == 200
            opened.set()  # the headers are in: the stream is open
            try:
                for _ in resp.iter_lines():
                    pass
                ended.append("closed")
            except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError):
                ended.append("reset")

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    assert opened.wait(timeout=30), "the watch did not open"
    api.stop()
    thread.join(timeout=30)
    assert not thread.is_alive(), "stop() left the watch open"
    assert ended, "the watcher failed before the stream ended"
