"""The test hooks (hooks.py) do what they say, over HTTP, and change nothing while unused.

Real: the double over HTTP, raw chunked watch streams read with `requests`. Faked: nothing. Why here:
tests of clients (tests/serving/test_reflector.py, tests/certs/test_command.py) lean on these controls
to reach paths a real server takes only by chance; each must be exact, or those tests pass for nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import requests

from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.registry import Options
from tests.kubeapi.server import ApiServer
from tests.loopback import wait_for

NODES = "/api/v1/nodes"
CMS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


def add_node(api: ApiServer, name: str) -> str:
    res = api.catalog.lookup("", "v1", "nodes")
    assert res is not None
    return str(api.registry.create(res, "", {"metadata": {"name": name}}, Options())["metadata"]["resourceVersion"])


class Watch:
    """A raw watch read on a thread: its lines, and whether the stream ended."""

    def __init__(self, api: ApiServer, path: str, rv: str) -> None:
        self.lines: list[bytes] = []
        self.ended = threading.Event()
        self._resp = requests.get(f"{api.url}{path}?watch=true&resourceVersion={rv}&timeoutSeconds=60",
                                  stream=True, timeout=(5, 60))
        self.status = self._resp.status_code
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._resp.iter_lines():
                if line:
                    self.lines.append(line)
        finally:
            self.ended.set()

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def watches(api: ApiServer) -> Iterator[list[Watch]]:
    """Watches a test opened; ended by the server first (closing a response a thread is reading blocks)."""
    opened: list[Watch] = []
    yield opened
    api.hooks.drop_watches()
    for w in opened:
        assert w.ended.wait(5), "a watch outlived drop_watches()"
        w._resp.close()


def open_watch(api: ApiServer, watches: list[Watch], path: str, rv: str) -> Watch:
    count = len(api.hooks.watches(path))
    w = Watch(api, path, rv)
    watches.append(w)
    assert api.hooks.wait_for_watches(path, count + 1, timeout=5)
    return w


def test_requests_are_counted_and_a_watch_request_is_seen_on_arrival(api: ApiServer, watches: list[Watch]) -> None:
    rv = requests.get(api.url + NODES, timeout=10).json()["metadata"]["resourceVersion"]
    requests.get(api.url + CMS, timeout=10)
    assert api.hooks.lists(NODES) == 1 and api.hooks.lists(CMS) == 1 and api.hooks.watches(NODES) == []
    assert not api.hooks.wait_for_watches(NODES, 1, timeout=0.05)
    open_watch(api, watches, NODES, rv)
    assert api.hooks.watches(NODES) == [rv] and api.hooks.lists(NODES) == 1


def test_drop_ends_open_watches_cleanly_and_expire_sends_410(api: ApiServer, watches: list[Watch]) -> None:
    rv = add_node(api, "a")
    dropped = open_watch(api, watches, NODES, rv)
    api.hooks.drop_watches()
    assert dropped.ended.wait(5) and dropped.lines == []  # no ERROR event: a closed connection
    kept = open_watch(api, watches, NODES, rv)  # a later watch is not dropped, and resumes from rv
    add_node(api, "b")
    wait_for(lambda: kept.lines, timeout=5, what="the ADDED event", interval=0.01)  # read before the expiry
    api.hooks.expire_watches()
    assert kept.ended.wait(5)
    events = kept.events()
    assert [e["type"] for e in events] == ["ADDED", "ERROR"]
    assert events[1]["object"]["code"] == 410 and events[1]["object"]["reason"] == "Expired"
    assert api.hooks.http_410s == 0  # the ERROR event is the default


def test_gone_as_http_answers_a_compacted_watch_with_a_410_status(api: ApiServer, watches: list[Watch]) -> None:
    rv = add_node(api, "a")
    add_node(api, "b")
    api.compact()
    api.hooks.gone_as_http = True
    resp = requests.get(f"{api.url}{NODES}?watch=true&resourceVersion={rv}", timeout=10)
    assert resp.status_code == 410
    assert resp.json()["kind"] == "Status" and resp.json()["reason"] == "Expired"
    assert api.hooks.http_410s == 1
    current = requests.get(api.url + NODES, timeout=10).json()["metadata"]["resourceVersion"]
    assert open_watch(api, watches, NODES, current).status == 200  # an unexpired watch is served


def test_injected_lines_arrive_in_order_with_events(api: ApiServer, watches: list[Watch]) -> None:
    rv = add_node(api, "a")
    w = open_watch(api, watches, NODES, rv)
    api.hooks.inject_line(NODES, "{not json")
    add_node(api, "b")
    api.hooks.inject_line(CMS, "elsewhere")  # another collection's streams only
    api.hooks.drop_watches()
    assert w.ended.wait(5)
    assert w.lines[0] == b"{not json" and json.loads(w.lines[1])["object"]["metadata"]["name"] == "b"
    assert len(w.lines) == 2
    with pytest.raises(ValueError, match="not a collection path"):
        api.hooks.inject_line("/api/v1/nodes/a", "x")


def test_race_reads_makes_the_next_conditional_writes_conflict(api: ApiServer) -> None:
    url = f"{api.url}{CMS}/c"
    assert requests.post(api.url + CMS, json={"metadata": {"name": "c"}}, timeout=10).status_code == 201
    api.hooks.race_reads(2, path=f"{CMS}/other")  # another object's reads are not raced
    api.hooks.race_reads(1)
    codes = []
    for _ in range(2):
        obj = requests.get(url, timeout=10).json()
        obj["data"] = {"k": "v"}
        codes.append(requests.put(url, json=obj, timeout=10).status_code)
    assert codes == [409, 200]
    assert requests.get(url, timeout=10).json()["data"] == {"k": "v"}


def test_paused_writes_compacted_away_reach_no_watch(api: ApiServer, watches: list[Watch]) -> None:
    rv = add_node(api, "a")
    w = open_watch(api, watches, NODES, rv)
    with api.hooks.paused():
        add_node(api, "unseen")
        api.hooks.expire_watches()
    assert w.ended.wait(5)
    assert [e["type"] for e in w.events()] == ["ERROR"]


def test_bare_list_items_drop_kind_for_built_ins_only(api: ApiServer) -> None:
    add_node(api, "a")
    assert requests.get(api.url + NODES, timeout=10).json()["items"][0]["kind"] == "Node"  # off by default
    api.hooks.bare_list_items = True
    listed = requests.get(api.url + NODES, timeout=10).json()
    assert "kind" not in listed["items"][0] and "apiVersion" not in listed["items"][0]
    assert listed["kind"] == "NodeList" and listed["items"][0]["metadata"]["name"] == "a"
