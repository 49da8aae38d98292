"""The webhook's count of pods per shared claim (kube/shares.py) from a real watch.

Real: kube-apiserver v1.35 (with the chart's CRDs) and the `WatchedView` the webhook builds (`with_shares=True`),
its label-selected Reflector on pods listing and watching through the real API; pods created and deleted.
Faked: nothing; no pod is scheduled (the count reads labels and phase only). The tally's clock is a fake
one, so forgetting takes no waiting.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupolicy.dra import SHARED_CLAIM_LABEL
from kube.views import WatchedView
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_pod
from tests.webhook.test_views import eventually

CLUSTER = {"kubeon": True, "kubeon_components": ()}  # the CRDs the view lists GpuPolicies from, no component
CLAIM = "kubeon-ts-llm-0"


@pytest.fixture
def view(kube_cluster: Cluster) -> Iterator[WatchedView]:
    assert kube_cluster.api is not None
    watched = WatchedView(kube_cluster.api, with_shares=True).start()
    eventually(watched.ready, "the caches synced")
    yield watched
    watched.stop()


def shared_pod(name: str, namespace: str, claim: str = CLAIM) -> dict:
    return make_pod(name, namespace, labels={"app": name, SHARED_CLAIM_LABEL: claim}, scheduler_name="nobody")


def test_watched_pods_and_own_admissions_count_once_each(kube_cluster: Cluster, namespace: str,
                                                          view: WatchedView) -> None:
    cluster = kube_cluster
    assert view.shares is not None
    now = [0.0]
    view.shares._clock = lambda: now[0]  # the tally's clock only
    key = (namespace, CLAIM)
    view.note_share(namespace, CLAIM)
    view.note_share(namespace, CLAIM)
    assert view.current().shared_claim_pods.get(key) == 2  # admitted, not yet watched: a burst fills the claim
    rebuilt = view.rebuilds

    cluster.create(shared_pod("a", namespace))  # the watch shows one of them: it takes its admission's place
    eventually(lambda: view.shares is not None and len([p for p in view.shares.reflector.snapshot().values()
                                                         if p["metadata"]["namespace"] == namespace]) == 1,
               "the pod in the watch")
    assert view.current().shared_claim_pods.get(key) == 2
    cluster.create(make_pod("plain", namespace, scheduler_name="nobody"))  # unlabelled: not watched, not counted
    now[0] = 31.0  # the other admission never showed up (a later webhook refused it): forgotten
    view.note_share(namespace, "kubeon-ts-llm-1")  # marks the view for a rebuild
    assert view.current().shared_claim_pods.get(key) == 1

    cluster.kubectl("delete", "pod", "a", "-n", namespace, "--wait=false")
    eventually(lambda: view.current().shared_claim_pods.get(key) is None, "a deleted pod no longer counted")
    assert view.rebuilds == rebuilt  # counts change a copy of the view: no policy, namespace or node re-read
