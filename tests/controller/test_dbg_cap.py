import json
from tests.controller.test_capacity_cluster import World, make_world, sharing_policy, capacity_policy, gpu_pods, NS, two_nodes_one_pod_each  # noqa
def test_dbg(make_world):
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    world.rounds(1, advance=30)
    print(world.capacity.last_disruptions)
    print([c for c in world.status()["conditions"] if c["type"] in ("Consolidation",)])
    print(world.bound())
    import gpupolicy.capacity.consolidation as c
