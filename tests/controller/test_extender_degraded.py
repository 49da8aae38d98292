"""Issue 37: while the extender fails open, the policies it serves say so; once it recovers, they say that too.

kube-scheduler ignores a failing extender (the chart's `ignorable: true`):
pods are placed, unpacked, with HTTP 200 everywhere. The controller reads the
extender's counters through its Service (`--extender-url`) and sets
`Ready=False, ExtenderDegraded` on the packing and typeFit policies.

Real: kube-apiserver v1.35.4 (tests/cluster, `frame_api`) with the GpuPolicy CRD, the
controller frame (`controller.command.build`: policy sync, the status writer,
`controller.extenderhealth.ExtenderHealth` reading /metrics over HTTP), the
extender's Flask app with its service and node model served on loopback by
werkzeug, and its /filter and /prioritize asked over HTTP as kube-scheduler
does. Faked: the clock, and the extender's failure: its node model raises
(a core bug, as the OverflowError of the issue was) until the test lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client
from werkzeug.serving import make_server

from controller.command import ControllerProcess, build
from controller.extenderhealth import ExtenderHealth
from controller.policysync import PolicySync
from gpupolicy.modes import parse_components
from tests.cluster.objects import make_node
from tests.controller.conftest import FakeClock, make_policy
from tests.extender.payloads import Harness, args, wire_pod

A100 = "NVIDIA-A100-SXM4-80GB"
NAMES = ["a100-0", "a100-1"]


class Extender:
    """The real extender app on 127.0.0.1, whose node model fails while `broken` is set."""

    def __init__(self) -> None:
        self.harness = Harness([make_node(n, A100, 8) for n in NAMES])
        self.broken = False
        cache = self.harness.cache
        fresh_state = cache.fresh_state

        def maybe_failing(forget: str | None = None) -> Any:
            if self.broken:
                raise OverflowError("Python int too large to convert to C long")
            return fresh_state(forget)

        cache.fresh_state = maybe_failing  # type: ignore[method-assign]
        self.server = make_server("127.0.0.1", 0, self.harness.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def schedule(self, pods: int) -> list[str]:
        """kube-scheduler's calls for `pods` GPU pods: /filter, then /prioritize of what passed; the errors."""
        errors = []
        for i in range(pods):
            pod = wire_pod(f"p{i}", "inference", gpus=1)
            answer = requests.post(f"{self.url}/filter", json=args(pod, NAMES), timeout=10).json()
            errors.append(answer["Error"])
            if answer["NodeNames"]:
                requests.post(f"{self.url}/prioritize", json=args(pod, answer["NodeNames"]), timeout=10)
        return errors

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def extender() -> Iterator[Extender]:
    e = Extender()
    yield e
    e.stop()


def ready(api: client.ApiClient, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")


def controller(api: client.ApiClient, clock: FakeClock, url: str) -> ControllerProcess:
    r = build(api, identity="one", clock=clock, reconcilers=[PolicySync(), ExtenderHealth()],
              components=parse_components("webhook,extender"), extender_url=url, on_lost=pytest.fail)
    r.elector.step()
    return r


def one_pass(r: ControllerProcess, clock: FakeClock) -> None:
    """A reconcile pass 10 s on (within the lease, renewed first)."""
    clock.advance(10)
    r.elector.step()
    r.runner.run_all()


def test_the_policies_the_extender_serves_say_when_it_fails_and_when_it_recovers(frame_api: Any,
                                                                                extender: Extender) -> None:
    api, clock = frame_api.api, FakeClock()
    policies = client.CustomObjectsApi(api)
    for name, body in (("pack", {"packing": {"strategy": "bestfit"}}), ("fit", {"typeFit": {"allowedModels": [A100]}}),
                       ("guard", {"guardrail": {"maxGpusPerPod": 4}})):
        policies.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", make_policy(name, body))
    r = controller(api, clock, extender.url)

    assert extender.schedule(12) == [""] * 12
    one_pass(r, clock)
    assert (ready(api, "pack")["status"], ready(api, "pack")["reason"]) == ("True", "Reconciled")
    healthy_since = ready(api, "pack")["lastTransitionTime"]

    extender.broken = True  # every /filter now answers an internal error, which kube-scheduler ignores
    assert set(extender.schedule(12)) == {"kubeon-gpu extender internal error (OverflowError)"}
    one_pass(r, clock)
    for name in ("pack", "fit"):
        condition = ready(api, name)
        assert (condition["status"], condition["reason"]) == ("False", "ExtenderDegraded"), condition
        assert condition["message"].startswith("the extender failed 12 of its last 12 answers (100%, threshold 10%)")
    assert (ready(api, "guard")["status"], ready(api, "guard")["reason"]) == ("True", "Reconciled")  # webhook's
    metrics = requests.get(f"{extender.url}/metrics", timeout=10).text
    assert 'kubeon_extender_internal_errors_total{cause="OverflowError",verb="filter"} 12.0' in metrics

    one_pass(r, clock)  # a quiet window (no pod scheduled): the verdict stands
    assert ready(api, "pack")["reason"] == "ExtenderDegraded"

    extender.broken = False
    assert extender.schedule(12) == [""] * 12
    one_pass(r, clock)
    recovered = ready(api, "pack")
    assert (recovered["status"], recovered["reason"]) == ("True", "Reconciled")
    assert recovered["lastTransitionTime"] != healthy_since and ready(api, "fit")["status"] == "True"

    extender.stop()  # kube-scheduler cannot reach it either: placement goes on without it
    one_pass(r, clock)
    gone = ready(api, "pack")
    assert (gone["status"], gone["reason"]) == ("False", "ExtenderDegraded")
    assert gone["message"].startswith(f"the extender cannot be read (GET {extender.url}/metrics: ConnectionError)")


def test_without_an_extender_url_nothing_is_read(frame_api: Any) -> None:
    api, clock = frame_api.api, FakeClock()
    client.CustomObjectsApi(api).create_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", make_policy("pack", {"packing": {"strategy": "bestfit"}}))
    r = build(api, identity="one", clock=clock, reconcilers=[PolicySync(), ExtenderHealth()],
              components=parse_components("webhook,extender"), on_lost=pytest.fail)
    r.elector.step()
    r.runner.run_all()
    assert (ready(api, "pack")["status"], ready(api, "pack")["reason"]) == ("True", "Reconciled")
