"""bench/capacity_bound.py: the whole-GPU bound on hand-made pods (pure arithmetic, nothing faked)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from capacity_bound import ffd, integrate, l2_bound


def test_shares_need_whole_gpus_and_the_bound_never_exceeds_a_packing() -> None:
    assert l2_bound(Counter({460: 3})) == 2 == ffd(Counter({460: 3}))  # 1.38 GPUs of shares: 2 GPUs
    assert l2_bound(Counter({600: 2, 400: 1})) == 2  # two shares over half a GPU never share one
    assert l2_bound(Counter({810: 3, 220: 1})) == 4 == ffd(Counter({810: 3, 220: 1}))  # 220 fits beside no 810


def test_integrated_over_time_against_the_fractional_hours() -> None:
    # a 0.46 share runs two hours, a whole-GPU pod one hour beside it: 1.92 GPU-hours used, at least 3 held
    low, high, used = integrate([(0.0, 1, 1, 460), (7200.0, -1, 1, 460), (0.0, 1, 1, 1000), (3600.0, -1, 1, 1000)])
    assert abs(used - 1.92) < 1e-9 and low == high == 3.0
