"""kubeon's model pressure: unrestricted pods leave the GPUs that model-restricted pods need.

Real: the packing engine (Kubeon, decide) and gpupolicy/packing/strategies/modelpressure.py.
Faked: nothing; states and mixes are built by hand.
"""

from __future__ import annotations

from gpupolicy.packing.engine import decide
from gpupolicy.packing.nodemodel import NodeState
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.strategies.kubeon import Kubeon
from gpupolicy.packing.strategies.modelpressure import model_pressure
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.builders import make_pod, make_state


def two_models() -> NodeState:
    return make_state([("p", 64000, 65536, [500, 1000], "P100"), ("g", 64000, 65536, [1000, 1000], "G2")])


# One pod in four needs a P100 (1000m); the rest take 500m of any GPU.
MIX = TypicalMix.from_pods([make_pod(1, spec="P100")] + [make_pod(1, milli=500)] * 3)


def test_pressure_is_what_restricted_types_want_per_gpu_against_the_whole_mix() -> None:
    # Demand 0.25 x 1000 + 0.75 x 500 = 625 per pod over 4 GPUs: 156.25 per GPU. The P100 pods
    # want 250 from 2 P100 GPUs: 125 per GPU, pressure 0.8; nobody needs the G2s (models: G2, P100).
    assert two_models().models == ("G2", "P100")
    assert model_pressure(two_models(), MIX).tolist() == [0.0, 0.8]


def test_an_unrestricted_pod_leaves_the_gpus_restricted_pods_need() -> None:
    # A 500m pod. On p it fills the 500m slice: the P100 type's fragment loses that 500m,
    # delta 0.25 x 500 = +125. On g it takes half a fresh GPU: g cannot host the P100 type, so
    # all of g's free GPU is its fragment and shrinks by 500: also +125. Both score
    # int(100 sigmoid(0.125)) = 53 and without the term p wins (already in use). With it p's
    # change loses 0.3 x 500 x 0.8 = 120: int(100 sigmoid(0.005)) = 50, and the pod goes to g.
    state = two_models()
    pod = make_pod(1, milli=500)
    without = decide(state, pod, Kubeon().without("model-pressure"), PackingContext(mix=MIX))
    kubeon = decide(state, pod, Kubeon(), PackingContext(mix=MIX))
    assert state.names[without.node] == "p" and without.scores.tolist() == [53.0, 53.0]
    assert state.names[kubeon.node] == "g" and kubeon.scores.tolist() == [50.0, 53.0]
    # a P100 pod pays nothing: it may only go to p
    restricted = decide(state, make_pod(1, spec="P100"), Kubeon(), PackingContext(mix=MIX))
    assert state.names[restricted.node] == "p"


def test_a_mix_without_restricted_types_puts_no_pressure_anywhere() -> None:
    mix = TypicalMix.from_pods([make_pod(1), make_pod(1, milli=500)])
    assert model_pressure(two_models(), mix).tolist() == [0.0, 0.0]


def test_context_keeps_a_derived_value_until_an_input_is_another_object() -> None:
    ctx = PackingContext()
    builds: list[int] = []
    first, second = two_models(), two_models()
    for state in (first, first, second, first):
        ctx.derived("pressure", (MIX, state), lambda: builds.append(1) or len(builds))
    assert len(builds) == 3  # first, second, first again: the equal twin still counts as new
