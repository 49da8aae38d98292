"""Capacity for pods that claim their GPU through DRA (issue 42): Karpenter cannot provision for claims
(karpenter #1231, #3228); the controller launches a NodeClaim whose devices would satisfy them.

Real: as tests/controller/test_capacity_cluster.py (kube-apiserver, kube-controller-manager making each
pod's ResourceClaim from its template, Karpenter v1.9.0 with KWOK launching our NodeClaim, the chart's
second kube-scheduler, whose DynamicResources plugin allocates the claims, calling our extender, the
controller's passes in this process as the chart's ServiceAccount). Shims: the GPU Operator (GFD labels,
MIG manager) and the NVIDIA DRA driver's plugin (tests/cluster/dra_driver.py `DraDriver`), which publishes
a launched node's ResourceSlice from its GPU labels once the MIG manager applied its layout. The pods are
written as the webhook's `via: DRA` rewrite leaves them (docs/designs/dra.md, "Pod"; the rewrite itself:
tests/e2e/test_dra.py), their ResourceClaimTemplate as the controller's claim-templates reconciler makes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpupolicy.admission.claims import POD_CLAIM_PREFIX, TEMPLATE_ANNOTATION, policy_templates
from gpupolicy.admission.sharedclaims import shared_claim
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.dra import SHARED_CLAIM_LABEL, shared_claim_name
from gpupolicy.model import parse_policy
from tests.cluster.cluster import Cluster
from tests.cluster.dra_driver import DraDriver, device_classes
from tests.cluster.objects import make_pod
from tests.controller.test_capacity_cluster import (  # noqa: F401 (the fixtures, used by name)
    CLUSTER,
    POOL_LABEL,
    TOLERATE_GPU,
    World,
    capacity_policy,
    make_world,
    sharing_policy,
    time_slicing_config,
)
from tests.e2e.test_dra import allocated_device, get

A100 = "NVIDIA-A100-SXM4-80GB"
TEMPLATE = "kubeon-mig-1g.10gb"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def dra(kube_cluster: Cluster) -> Iterator[Callable[[World], DraDriver]]:
    """The driver's DeviceClasses, and its plugin on the nodes of a test's pool."""
    for obj in device_classes():
        try:
            kube_cluster.create(obj)
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise
    started: list[DraDriver] = []

    def start(world: World) -> DraDriver:
        driver = DraDriver(kube_cluster.api_client, f"{POOL_LABEL}={world.scoped('gpu')}").start()
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.stop()


def claim_pod(world: World, name: str, policy: str) -> dict[str, Any]:
    """A pod as the webhook rewrote it: `nvidia.com/gpu` gone, its GPU claimed through the template."""
    claim = f"{POD_CLAIM_PREFIX}0"
    pod = make_pod(name, world.ns, tolerations=TOLERATE_GPU, annotations={
        TEMPLATE_ANNOTATION: TEMPLATE, "gpu.kubeon.io/policy": policy})
    pod["spec"]["resourceClaims"] = [{"name": claim, "resourceClaimTemplateName": TEMPLATE}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": claim}]
    return pod


def test_pending_claim_pods_get_one_nodeclaim_and_are_allocated_on_its_devices(
        make_world: Any, dra: Callable[[World], DraDriver]) -> None:  # noqa: F811 (the fixture imported above)
    world = make_world()
    sharing = sharing_policy("dra", "MIG", via="DRA", gpuModels=[A100])
    world.create_policy(sharing)
    world.create_policy(capacity_policy(models=[A100]))
    dra(world)
    policy = world.scoped("dra")
    spec = parse_policy({**sharing, "metadata": {"name": policy}}).spec.sharing
    assert spec is not None
    world.create(policy_templates(spec, DEFAULT_CATALOG)[TEMPLATE].object(world.ns, policy))
    for i in range(3):
        world.create(claim_pod(world, f"c{i}", policy))
    world.pending(3)

    world.rounds(3)  # a burst: one launch, counted once while it boots
    [(name, claim)] = world.claims().items()
    assert claim["spec"]["requirements"][0]["values"] == ["p4de.24xlarge"]
    assert claim["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    pods = world.until(lambda: (found := world.cluster.pods(world.ns, ready=True)) and len(found) == 3 and found,
                       "the 3 claim pods running on the new node")
    node = world.node_name(name)
    for pod in pods:
        device = allocated_device(world.cluster, pod)
        assert pod["spec"]["nodeName"] == device["node"] == node
        assert device["attributes"]["profile"] == {"string": "1g.10gb"}
    world.create(claim_pod(world, "c3", policy))  # room left on the node's slices: no second NodeClaim
    world.rounds(3)
    assert list(world.claims()) == [name]
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 4, "the fourth pod running there too")


L4 = "NVIDIA-L4"


def shared_pod(world: World, name: str, policy: str, claim: str) -> dict[str, Any]:
    """A pod as the webhook rewrote it under a TimeSlicing `via: DRA` policy: its GPU is a share of `claim`."""
    pod = make_pod(name, world.ns, tolerations=TOLERATE_GPU, annotations={"gpu.kubeon.io/policy": policy},
                   labels={SHARED_CLAIM_LABEL: claim})
    pod["spec"]["resourceClaims"] = [{"name": f"{POD_CLAIM_PREFIX}0", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": f"{POD_CLAIM_PREFIX}0"}]
    return pod


def test_a_burst_on_one_shared_claim_gets_one_gpu_and_its_pods_share_it(
        make_world: Any, dra: Callable[[World], DraDriver]) -> None:  # noqa: F811 (the fixture imported above)
    """Four pods of one shared claim (replicas 4) ask for one GPU, not four: one NodeClaim of the 1-GPU L4
    type (g6.xlarge; counted per pod, four such NodeClaims), the driver publishes its GPU, and the four pods
    run there on the claim's one device."""
    world = make_world()
    sharing = sharing_policy("ts", "TimeSlicing", via="DRA", replicas=4, gpuModels=[L4])
    world.create_policy(sharing)
    world.create_policy(capacity_policy(models=[L4]))
    dra(world)
    policy = world.scoped("ts")
    spec = parse_policy({**sharing, "metadata": {"name": policy}}).spec.sharing
    assert spec is not None
    claim_name = shared_claim_name(policy, 0)
    world.create(shared_claim(claim_name, world.ns, spec, DEFAULT_CATALOG, policy))
    for i in range(4):
        world.create(shared_pod(world, f"s{i}", policy, claim_name))
    world.pending(4)

    world.rounds(3)  # the burst: one launch for the claim, counted once while it boots
    [(name, claim)] = world.claims().items()
    assert claim["spec"]["requirements"][0]["values"] == ["g6.xlarge"]
    pods = world.until(lambda: (found := world.cluster.pods(world.ns, ready=True)) and len(found) == 4 and found,
                       "the 4 pods running on the new node")
    node = world.node_name(name)
    allocation = get(world.cluster, "resourceclaim", claim_name, world.ns)["status"]["allocation"]
    [result] = allocation["devices"]["results"]  # the claim holds one whole GPU of the new node
    slices = yaml.safe_load(world.cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    pool = next(s for s in slices if s["spec"]["pool"]["name"] == result["pool"])
    assert pool["spec"]["nodeName"] == node and result["device"] == "gpu-0"
    assert {pod["spec"]["nodeName"] for pod in pods} == {node}
    reserved = get(world.cluster, "resourceclaim", claim_name, world.ns)["status"]["reservedFor"]
    assert sorted(r["name"] for r in reserved) == [f"s{i}" for i in range(4)]  # the four share it
    world.rounds(2)  # the claim is allocated: its pods ask for nothing more
    assert list(world.claims()) == [name]
