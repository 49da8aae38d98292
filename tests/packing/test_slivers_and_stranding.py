"""The third-round terms of kubeon: sliver waste and CPU stranding, on hand-worked numbers.

Real: the packing engine (FragModel, Kubeon, decide) and the two
terms' modules. Faked: nothing; states and mixes are built by hand.
"""

from __future__ import annotations

import numpy as np

from bench.parts import without as ablated
from gpupolicy.packing.engine import decide, get_strategy
from gpupolicy.packing.fragmentation import FragModel
from gpupolicy.packing.placement import PackingContext
from gpupolicy.packing.strategies.kubeon import Kubeon
from gpupolicy.packing.strategies.slivers import filler_types, plentiful, sliver_waste, waste_table
from gpupolicy.packing.strategies.stranding import FeedRate, stranding_relief
from gpupolicy.packing.typicalmix import TypicalMix
from tests.packing.builders import make_pod, make_state


def test_waste_table_is_what_no_sum_of_sizes_fills() -> None:
    table = waste_table((320, 470))
    # sums <= 1000: 320, 470, 640, 790, 940, 960
    assert table[210] == 210  # nothing fits
    assert table[790] == 0  # 470 + 320
    assert table[650] == 10  # 320 + 320
    assert table[1000] == 40  # 960
    assert waste_table(())[300] == 300


def test_a_slice_counts_only_the_fillers_the_node_can_still_host() -> None:
    # Mix: 160m pods asking 4 cores, 810m pods asking 3. After an 810m pod, a 190m slice holds
    # one 160m pod (30m waste) on a node with 4 cores left, nothing (190m waste) on one with 1.
    mix = TypicalMix.from_pods([make_pod(1, milli=160, cpu=4000)] * 3 + [make_pod(1, milli=810, cpu=3000)] * 7)
    state = make_state([("rich", 8000, 65536, [1000], "A100"), ("poor", 8000, 65536, [1000], "A100")])
    model = FragModel(state, mix, use_memory=True)
    waste = sliver_waste(model, np.array([190, 190]), np.array([4000, 1000]), np.array([60000, 60000]),
                         np.array([0, 1]))
    assert waste.tolist() == [30.0, 190.0]


def test_kubeon_leaves_the_slice_a_typical_pod_fills_where_fgd_takes_a_fresh_gpu() -> None:
    # Mix: nine 320m pods for one 470m pod. A 470m pod on A (790m free) leaves 320m: exactly one
    # 320m pod, waste 0; FGD counts it as fragment for the 470m type only: delta -0.1 x 320 = -32,
    # score int(100 sigmoid(-0.032)) = 49. On C (fresh GPU) it leaves 530m: FGD sees no fragment
    # (score 50) but 320 + 320 does not fit, so 470 is the best fill: 60m waste x weight 3,
    # int(100 sigmoid(-0.18)) = 45.
    mix = TypicalMix.from_pods([make_pod(1, milli=320)] * 9 + [make_pod(1, milli=470)])
    state = make_state([("A", 64000, 65536, [790], "A100"), ("C", 64000, 65536, [1000], "A100")])
    pod = make_pod(1, milli=470)
    fgd = decide(state, pod, get_strategy("fgd"), PackingContext(mix=mix))
    kubeon = decide(state, pod, get_strategy("kubeon"), PackingContext(mix=mix))
    without = decide(state, pod, ablated(Kubeon(), "slivers"), PackingContext(mix=mix))
    assert state.names[fgd.node] == "C" and fgd.scores.tolist() == [49.0, 50.0]
    assert state.names[without.node] == "C"
    assert state.names[kubeon.node] == "A" and kubeon.scores.tolist() == [49.0, 45.0]


def test_a_filler_rarer_than_the_slices_waiting_for_it_is_scarce() -> None:
    # openb default: 810m pods (13.9% of pods) leave 190m, which 160m pods (0.7%) fill best;
    # 590m and 550m pods (1.9%) leave 410m / 450m, which 370m pods (0.58%) fill best (the rest
    # spill to 320m); 650m pods (3.05%) leave 350m for 320m pods (3.9%): enough. Pods of <= 500m
    # wait for nobody (470m + 470m).
    sizes = (160, 320, 370, 470, 550, 590, 650, 810)
    weights = (0.007, 0.039, 0.0058, 0.096, 0.0093, 0.0097, 0.0305, 0.139)
    kept = dict(zip(sizes, plentiful(sizes, weights, 0.4), strict=True))
    assert [s for s, ok in kept.items() if not ok] == [160, 370]
    assert all(plentiful(sizes, weights, 0.0))  # ratio 0: every size counts
    # below 160m the 190m slices wait for 110m and 50m pods: scarce too
    assert plentiful((50, 110, 160, 810), (0.01, 0.01, 0.01, 0.97), 0.4) == (False, False, False, True)


def test_a_slice_only_scarce_fillers_fit_is_waste() -> None:
    # Six 810m pods for one 160m and three 320m: a 470m + 320m GPU's 210m would hold a 160m pod,
    # but 160m pods are spoken for by the 190m slices beside 810m pods.
    mix = TypicalMix.from_pods([make_pod(1, milli=810)] * 6 + [make_pod(1, milli=320)] * 3
                               + [make_pod(1, milli=160)])
    state = make_state([("n", 64000, 65536, [1000], "A100")])
    model = FragModel(state, mix, use_memory=True)
    args = (np.array([210, 680]), np.array([60000, 60000]), np.array([60000, 60000]), np.array([0, 0]))
    assert sliver_waste(model, *args).tolist() == [50.0, 40.0]  # 160; 320 + 320 (or 320 + 160 + 160)
    assert sliver_waste(model, *args, filler_types(model, 0.4)).tolist() == [210.0, 40.0]  # 320 + 320 only


def test_feed_rate_strands_the_gpus_free_cpu_cannot_feed() -> None:
    # The mix's GPU pods ask 10 cores per GPU: 0.1 GPU milli per CPU milli.
    mix = TypicalMix.from_pods([make_pod(1, cpu=10_000, mem=0), make_pod(0, cpu=2000, mem=0)])
    rate = FeedRate.of(mix, use_memory=False)
    assert rate.per_cpu == 0.1 and rate.per_mib == np.inf
    # 4 free GPUs, 20 cores: 2 fed, 2000 milli stranded
    state = make_state([("n", 20_000, 65536, [1000] * 4, "A100")])
    assert rate.stranded(state.gpu_free_total, state.cpu_free, state.mem_free).tolist() == [2000.0]
    rows = np.array([0])
    assert stranding_relief(state, make_pod(1, cpu=10_000), rows, rate).tolist() == [0.0]  # in step
    assert stranding_relief(state, make_pod(1, cpu=2000), rows, rate).tolist() == [800.0]  # GPU-heavy: relieves
    assert stranding_relief(state, make_pod(0, cpu=10_000), rows, rate).tolist() == [-1000.0]  # CPU only: strands


def test_a_mix_without_cpu_never_strands() -> None:
    rate = FeedRate.of(TypicalMix.from_pods([make_pod(1, cpu=0, mem=0)]))
    assert rate.stranded(np.array([8000]), np.array([0]), np.array([0])).tolist() == [0.0]
