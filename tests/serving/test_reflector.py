"""Reflector and client configuration against the real kube-apiserver (tests/cluster).

Real: kube-apiserver v1.35 and etcd (lists, watches from a resourceVersion, bookmarks, its watch cache and
the 410 Gone it answers after a restart), kube.config.load_api_client reading a kubeconfig file, the
kubernetes client (CoreV1Api, kube.rest listers, kubernetes.watch.Watch), the Reflector thread. Another
client's writes go straight to kube-apiserver as the admin. The reflector reaches it through
tests/cluster/faultproxy.py, which counts its list and watch requests and makes the wire faults a test
cannot wait for: a dropped watch, watches held back while changes are made (with kube-apiserver
restarted meanwhile, its watch cache starts over above the reflector's resourceVersion: 410 Gone as an
ERROR event; the later relist tests take their 410 from the proxy), a 410 answered as an HTTP status,
garbage lines in a watch stream, and numbers beyond a double's range (kube-apiserver refuses to store
them: only another server or a proxy sends them).

Real Nodes carry what the control plane writes: admission taints a new node `not-ready`, the node
lifecycle controller lifts the taint within seconds (a node without conditions is not NotReady) and the
TTL controller annotates it (`node.alpha.kubernetes.io/ttl`), so a node added while a reflector runs is
ADDED, then MODIFIED twice (`Writer.add` waits for both); trimmed (kube/trim.py), only the taint's
change is told.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kube.config import KubeConfigError, load_api_client
from kube.reflector import Reflector, custom_objects_lister
from kube.trim import node_fields
from tests.cluster.cluster import Cluster, read
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.kubeon import CRDS, apply_objects
from tests.loopback import free_port, wait_for

CLUSTER = {"gpu_operator": False}  # no GPU Operator shim: only the control plane writes Nodes here
NODES = "/api/v1/nodes"
POLICIES = "/apis/gpu.kubeon.io/v1alpha1/gpupolicies"
TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"


def settling(name: str, trimmed: bool = False) -> list[tuple[str, str]]:
    """What a new node's settling is told as: the node lifecycle controller lifting its not-ready taint and
    the TTL controller's annotation (dropped by the trim), in either order."""
    return [("MODIFIED", name)] * (1 if trimmed else 2)


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: Any = "condition") -> Any:
    return wait_for(check, timeout=timeout, what=str(what), interval=0.02)


class Writer:
    """Another client's writes to Nodes, straight to kube-apiserver as the admin; deletes its nodes after."""

    def __init__(self, cluster: Cluster) -> None:
        self.core = cluster.core
        self.made: set[str] = set()

    def add(self, name: str, labels: dict[str, str] | None = None, status: dict[str, Any] | None = None) -> str:
        """Create the node and wait until the control plane has settled it (no taint, the TTL annotation);
        the resourceVersion it then has."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
        if status:
            body["status"] = status
        self.core.create_node(body, _preload_content=False)
        self.made.add(name)
        # kube-controller-manager's controllers settle it within seconds; after a kube-apiserver restart
        # they relist first, which on a loaded machine has taken over 30 s
        settled = eventually(lambda: (node := self.get(name)) and not node["spec"].get("taints")
                             and TTL_ANNOTATION in (node["metadata"].get("annotations") or {}) and node,
                             timeout=120, what=f"node {name} settled by kube-controller-manager")
        return str(settled["metadata"]["resourceVersion"])

    def get(self, name: str) -> dict[str, Any]:
        return read(self.core.read_node(name, _preload_content=False))

    def modify(self, name: str, labels: dict[str, str]) -> str:
        """Replace the node's labels (a PUT of the whole object); the new resourceVersion."""
        node = self.get(name)
        node["metadata"]["labels"] = labels
        return str(read(self.core.replace_node(name, node, _preload_content=False))["metadata"]["resourceVersion"])

    def report(self, name: str, status: dict[str, Any]) -> str:
        """A status write (what a kubelet's report is); the new resourceVersion."""
        node = self.get(name)
        node["status"] = {**node["status"], **status}
        done = self.core.replace_node_status(name, node, _preload_content=False)
        return str(read(done)["metadata"]["resourceVersion"])

    def delete(self, name: str) -> None:
        self.core.delete_node(name, _preload_content=False)
        self.made.discard(name)

    def clean(self) -> None:
        for name in sorted(self.made):
            try:
                self.core.delete_node(name, _preload_content=False)
            except ApiException as error:
                if error.status != 404:
                    raise


class Changes(list[tuple[str, str]]):
    """`on_change` recording (event, node name); `last` is the last object told."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, Any] = {}

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.append((kind, obj["metadata"]["name"]))
        self.last = obj


@pytest.fixture
def proxy(kube_cluster: Cluster, tmp_path: Path) -> Iterator[FaultProxy]:
    with FaultProxy(kube_cluster.plane, tmp_path) as fronting:
        yield fronting


@pytest.fixture
def writer(kube_cluster: Cluster) -> Iterator[Writer]:
    made = Writer(kube_cluster)
    yield made
    made.clean()


@pytest.fixture
def api(proxy: FaultProxy) -> Iterator[client.ApiClient]:
    api_client = load_api_client(str(proxy.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture
def changes() -> Changes:
    return Changes()


@pytest.fixture
def reflector(writer: Writer, api: client.ApiClient, changes: Changes) -> Iterator[Reflector]:
    writer.add("a", {"gpu": "A100"})
    writer.add("b")
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, on_change=changes)
    r.start()
    assert r.wait_for_sync(30)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def policy_crd(kube_cluster: Cluster) -> None:
    """The GpuPolicy CRD from manifests/crd, Established."""
    apply_objects(kube_cluster.api_client, [yaml.safe_load(p.read_text()) for p in CRDS])
    ext = client.ApiextensionsV1Api(kube_cluster.api_client)
    eventually(lambda: any(c.type == "Established" and c.status == "True" for c in
                           ext.read_custom_resource_definition("gpupolicies.gpu.kubeon.io").status.conditions or []))


def test_initial_list_fills_the_cache_as_plain_dicts(reflector: Reflector, changes: Changes) -> None:
    snap = reflector.snapshot()
    assert set(snap) == {"a", "b"}
    assert snap["a"]["metadata"]["labels"] == {"gpu": "A100"}
    # kube-apiserver's typed lists send items without kind/apiVersion: the reflector fills them in
    assert snap["a"]["kind"] == "Node" and snap["a"]["apiVersion"] == "v1"
    assert reflector.has_synced()
    assert sorted(changes) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_applies_added_modified_deleted(proxy: FaultProxy, writer: Writer, reflector: Reflector,
                                              changes: Changes) -> None:
    changes.clear()
    writer.add("c")
    writer.modify("a", {"gpu": "H100"})
    writer.delete("b")
    eventually(lambda: len(changes) >= 5, what=changes)
    assert changes == [("ADDED", "c"), *settling("c"), ("MODIFIED", "a"), ("DELETED", "b")]
    snap = reflector.snapshot()
    assert set(snap) == {"a", "c"}
    assert snap["a"]["metadata"]["labels"]["gpu"] == "H100"
    # where the next watch resumes: the last event's version, or a later one a bookmark brought
    assert reflector.resource_version is not None
    assert int(reflector.resource_version) >= int(changes.last["metadata"]["resourceVersion"])
    assert proxy.lists(NODES) == 1


def test_objects_in_key_order_follow_adds_deletes_and_a_relist(proxy: FaultProxy, writer: Writer,
                                                                reflector: Reflector) -> None:
    """`in_key_order` (the controller's reads, kube/informers.py): the order of a LIST, kept through the
    watch's adds and deletes (a new key lands in its place, not at the end) and rebuilt after a relist."""
    def names() -> list[str]:
        return [obj["metadata"]["name"] for obj in reflector.in_key_order()]
    assert names() == ["a", "b"]
    writer.add("c")
    writer.add("0-first")
    writer.delete("a")
    eventually(lambda: set(reflector.snapshot()) == {"0-first", "b", "c"})
    assert names() == ["0-first", "b", "c"]
    with proxy.holding_watches():
        writer.add("bb")
        proxy.answer_watches(410, NODES)
    eventually(lambda: "bb" in reflector.snapshot(), timeout=60)
    assert names() == ["0-first", "b", "bb", "c"]
    assert proxy.lists(NODES) == 2


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-status"])
def test_410_gone_relists_and_reports_the_missed_changes(
    kube_cluster: Cluster, proxy: FaultProxy, writer: Writer, reflector: Reflector, changes: Changes, as_http: bool
) -> None:
    """Changes no watch sees, then a watch from before them: kube-apiserver, restarted, answers it with an
    ERROR event carrying 410 (its watch cache starts at the version it listed on start); the proxy
    answers 410 as an HTTP status, as other servers do. Either way: relist, and tell what was missed.
    (The one restart of this module: kube-controller-manager's informers back off further after each
    one, and new Nodes then wait for its controllers longer, up to 90 s after the fourth.)"""
    changes.clear()
    with proxy.holding_watches():
        writer.add("missed")
        writer.delete("b")
        if as_http:
            proxy.answer_watches(410, NODES)
        else:
            kube_cluster.plane.restart_apiserver()
    eventually(lambda: set(reflector.snapshot()) == {"a", "missed"}, timeout=60)
    assert sorted(changes) == [("ADDED", "missed"), ("DELETED", "b")]
    assert proxy.lists(NODES) == 2
    assert proxy.http_errors == ([410] if as_http else []), "the relist came by the other path"
    writer.add("after")
    eventually(lambda: "after" in reflector.snapshot())


def test_a_transform_trims_what_the_list_the_watch_and_a_relist_keep(
        proxy: FaultProxy, writer: Writer, api: client.ApiClient) -> None:
    seen: list[tuple[str, dict]] = []
    writer.add("a", {"gpu": "A100"}, status={"images": [{"names": ["x" * 100]}], "allocatable": {"cpu": "8"}})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, obj)))
    r.start()
    try:
        assert r.wait_for_sync(30)
        assert r.snapshot()["a"]["status"] == {"allocatable": {"cpu": "8"}}  # listed
        writer.add("b", status={"images": [{"names": ["y"]}], "allocatable": {"cpu": "4"}})
        writer.modify("a", {"gpu": "H100"})
        writer.report("a", {"images": [{"names": ["z"]}]})  # only what the transform drops: nothing to tell
        eventually(lambda: len(seen) >= 4, what=seen)
        with proxy.holding_watches():
            writer.add("c", status={"images": [{"names": ["w"]}]})
            proxy.answer_watches(410, NODES)  # relist (410 Gone: the test above has it from kube-apiserver)
        eventually(lambda: "c" in r.snapshot(), timeout=60)
        snap = r.snapshot()
        assert all("images" not in obj["status"] for obj in snap.values())
        assert snap["a"]["metadata"]["labels"] == {"gpu": "H100"} and snap["c"]["status"] == {}
        assert all("images" not in obj.get("status", {}) for _, obj in seen)
        assert [(kind, obj["metadata"]["name"]) for kind, obj in seen] == [
            ("ADDED", "a"), ("ADDED", "b"), *settling("b", trimmed=True), ("MODIFIED", "a"), ("ADDED", "c")]
        assert r.relists == 2
    finally:
        r.stop()


def test_with_a_transform_a_change_to_dropped_fields_is_kept_but_not_told(
        proxy: FaultProxy, writer: Writer, api: client.ApiClient) -> None:
    """A kubelet heartbeat changes nothing a trimmed Node keeps: the cache takes its resourceVersion, the
    consumers hear nothing; a label change is told; a relist tells only what changed beyond the version."""
    seen: list[tuple[str, str]] = []
    writer.add("a", {"gpu": "A100"}, status={"conditions": [beat(0)]})
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5, transform=node_fields,
                  on_change=lambda kind, obj: seen.append((kind, gpu_label(obj))))
    r.start()
    try:
        assert r.wait_for_sync(30)
        held = r.snapshot()["a"]
        version = writer.report("a", {"conditions": [beat(1)]})
        eventually(lambda: r.snapshot()["a"]["metadata"]["resourceVersion"] == version)
        assert r.snapshot()["a"] is held  # the version written into the object held: nothing new to collect
        writer.modify("a", {"gpu": "H100"})
        eventually(lambda: len(seen) == 2)
        with proxy.holding_watches():
            version = writer.report("a", {"conditions": [beat(2)]})
            held = r.snapshot()["a"]
            proxy.answer_watches(410, NODES)  # relist: a heartbeat missed, nothing to tell
        eventually(lambda: r.relists == 2, timeout=60)
        assert r.snapshot()["a"] is held and held["metadata"]["resourceVersion"] == version
        writer.add("b")
        eventually(lambda: len(seen) >= 4, what=seen)
        assert seen == [("ADDED", "A100"), ("MODIFIED", "H100"), ("ADDED", ""), ("MODIFIED", "")]  # b settling
        assert r.snapshot()["a"] is held
    finally:
        r.stop()


def gpu_label(obj: dict[str, Any]) -> str:
    return str((obj["metadata"].get("labels") or {}).get("gpu", ""))  # kube-apiserver omits empty labels


def beat(n: int) -> dict[str, str]:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": f"beat {n}"}


def test_dropped_connection_resumes_from_last_resource_version(proxy: FaultProxy, writer: Writer,
                                                               api: client.ApiClient) -> None:
    # a long watch: no timeout's end and no bookmark moves the version between the read and the drop
    writer.add("a")
    with Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=300) as r:
        assert r.wait_for_sync(30)
        settled = writer.add("c")
        eventually(lambda: (c := r.get("c")) and c["metadata"]["resourceVersion"] == settled)
        seen_rv = r.resource_version
        watches = len(proxy.watches(NODES))
        proxy.drop_watches()
        eventually(lambda: len(proxy.watches(NODES)) > watches)
        assert proxy.watches(NODES)[watches] == seen_rv
        writer.add("d")
        eventually(lambda: "d" in r.snapshot())
        assert proxy.lists(NODES) == 1, "a dropped watch must not relist"


def test_bad_events_are_skipped_without_killing_the_thread(proxy: FaultProxy, writer: Writer,
                                                           reflector: Reflector) -> None:
    proxy.inject_line(NODES, "{not json")
    proxy.inject_line(NODES, '{"type": "ADDED", "object": {"kind": "Node"}}')
    proxy.inject_line(NODES, '{"type": "WEIRD", "object": {"metadata": {"name": "x"}}}')
    proxy.inject_line(NODES, '["a", "list"]')  # JSON, but no event (kubernetes' own Watch raised TypeError)
    writer.add("good")
    eventually(lambda: "good" in reflector.snapshot())
    assert "x" not in reflector.snapshot()
    assert proxy.lists(NODES) == 1, "a bad line is skipped, not a reason to relist"


def test_a_raising_on_change_does_not_stop_the_cache(writer: Writer, api: client.ApiClient) -> None:
    def boom(kind: str, obj: dict) -> None:
        raise RuntimeError("consumer bug")

    with Reflector(client.CoreV1Api(api).list_node, on_change=boom, timeout_seconds=5) as r:
        assert r.wait_for_sync(30)
        writer.add("n1")
        writer.add("n2")
        eventually(lambda: {"n1", "n2"} <= set(r.snapshot()))


def test_custom_objects_and_custom_key(kube_cluster: Cluster, policy_crd: None, api: client.ApiClient) -> None:
    objects = kube_cluster.custom
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "share"},
              "spec": {"priority": 3, "packing": {"strategy": "bestfit"}}}  # the CRD's CEL: one kind of rule
    objects.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", policy)
    try:
        lister = custom_objects_lister(api, "gpu.kubeon.io", "v1alpha1", "gpupolicies")
        with Reflector(lister, key=lambda o: "policy:" + o["metadata"]["name"], timeout_seconds=5) as r:
            assert r.wait_for_sync(30)
            assert r.snapshot()["policy:share"]["spec"] == {"priority": 3, "packing": {"strategy": "bestfit"}}
            objects.patch_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "share",
                                                {"spec": {"priority": 9}})
            eventually(lambda: r.get("policy:share")["spec"]["priority"] == 9)
    finally:
        objects.delete_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "share")


def test_unreachable_server_retries_with_backoff_then_syncs(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump({  # nothing listens on the port: connection refused
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "gone", "user": {}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}]}))
    api_client = load_api_client(str(kubeconfig))
    # a first retry in a minute: the thread is waiting for it when the stop comes
    r = Reflector(client.CoreV1Api(api_client).list_node, timeout_seconds=5, backoff_initial=60).start()
    try:
        assert not r.wait_for_sync(0.5)
        assert r._thread is not None and r._thread.is_alive()
    finally:
        r.stop(timeout=20)  # the backoff alone would hold the thread for 60 s
        assert r._thread is not None and not r._thread.is_alive(), "stop did not end the backoff's wait"


def test_stop_ends_a_blocked_watch_promptly(proxy: FaultProxy, writer: Writer, api: client.ApiClient) -> None:
    writer.add("a")
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=300).start()
    assert r.wait_for_sync(30)
    # the watch is open; nothing changes, so it blocks reading
    assert proxy.wait_for_watches(NODES, 1, timeout=30), "the reflector sent no watch"
    r.stop(timeout=20)  # kube-apiserver holds a quiet watch for its timeoutSeconds, 300 s: only the stop ends it
    assert r._thread is not None and not r._thread.is_alive(), "stop left the thread reading the watch"


def test_stop_as_the_watch_is_sent_still_ends_it(proxy: FaultProxy, writer: Writer, api: client.ApiClient) -> None:
    """The stop coming between the watch request and its response (kubernetes' Watch.stop shuts only a
    response it has): one stop in that window left the thread reading a quiet watch for 30 s (about one
    in six tries with the stop sent as the request arrives; CI caught it in the test above)."""
    writer.add("a")
    for attempt in range(20):
        seen = len(proxy.watches(NODES))
        r = Reflector(client.CoreV1Api(api).list_node, name=f"nodes-{attempt}", timeout_seconds=300).start()
        assert r.wait_for_sync(30)
        # stop as soon as the request reaches the proxy (woken by its arrival), before its answer is read
        assert proxy.wait_for_watches(NODES, seen + 1, timeout=30), f"try {attempt}: no watch was sent"
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


def test_load_api_client_leaves_the_global_default_alone(kube_cluster: Cluster) -> None:
    before = client.Configuration.get_default_copy().host
    api_client = load_api_client(str(kube_cluster.kubeconfig))
    assert api_client.configuration.host == kube_cluster.url
    assert client.Configuration.get_default_copy().host == before
    assert client.VersionApi(api_client).get_code().git_version == "v1.35.4"
    api_client.close()


SIZE = "@size@"


def with_size(body: bytes, name: str, literal: str) -> bytes:
    """A list answer with `spec.size` of node `name` written as the JSON number `literal`."""
    listed = json.loads(body)
    for item in listed["items"]:
        if item["metadata"]["name"] == name:
            item["spec"]["size"] = SIZE
    return json.dumps(listed).replace(json.dumps(SIZE), literal).encode()


def test_a_number_orjson_refuses_is_read_as_json_reads_it_in_a_list_and_a_watch_event(
        writer: Writer, proxy: FaultProxy, api: client.ApiClient) -> None:
    """orjson refuses numbers beyond a double's range, which json reads (as infinity): the reflector
    falls back to json instead of dropping the object (a watch event) or failing the list. kube-apiserver
    refuses to store such a number (400: cannot unmarshal number 1e400 into float64), so the proxy writes
    it into the answers, as a server written in another language or a proxy could send it."""
    writer.add("listed")
    proxy.rewrite_lists(NODES, functools.partial(with_size, name="listed", literal="1e400"))
    r = Reflector(client.CoreV1Api(api).list_node, name="nodes", timeout_seconds=5)
    r.start()
    try:
        assert r.wait_for_sync(30)
        assert r.snapshot()["listed"]["spec"]["size"] == float("inf")
        event = {"type": "ADDED", "object": {"kind": "Node", "apiVersion": "v1", "spec": {"size": SIZE},
                                             "metadata": {"name": "watched", "resourceVersion": r.resource_version}}}
        proxy.inject_line(NODES, json.dumps(event).replace(json.dumps(SIZE), "-1e400"))
        eventually(lambda: "watched" in r.snapshot())
        assert r.snapshot()["watched"]["spec"]["size"] == float("-inf")
    finally:
        r.stop()


def test_the_proxy_forwards_what_it_does_not_fault(kube_cluster: Cluster, api: client.ApiClient) -> None:
    """The proxy itself: a request it does not fault is kube-apiserver's answer (a 404 stays a 404)."""
    with pytest.raises(ApiException) as missing:
        client.CoreV1Api(api).read_node("no-such-node")
    assert missing.value.status == 404

