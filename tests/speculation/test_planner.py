"""The cache planner: budget B and depth d from online costs, and its cost model."""

from __future__ import annotations

import pytest

from saguaro.speculation.fanout import (
    FanoutEstimator,
    _concave_majorant,
    hit_rates,
    marginal_fanout,
)
from saguaro.speculation.planner import MAX_SLOPE_FRACTION, BuildCosts, plan_build

K = 4


def plan(window_ms, glue_ms, depth_ms, estimator=None, backup_ms=10.0, num_seqs=1):
    est = estimator or FanoutEstimator(K)
    return plan_build(
        window_s=lambda d: (window_ms(d) if callable(window_ms) else window_ms) / 1000,
        fixed_s=glue_ms / 1000,
        depth_s=lambda m: depth_ms(m) / 1000,
        hit_rates=est.hit_rates(64, K),
        expected_tokens=[est.expected_tokens(d) for d in range(K + 1)],
        miss_tokens=est.expected_tokens(K),
        backup_s=backup_ms / 1000,
        num_seqs=num_seqs,
        max_budget=64,
    )


def test_free_branches_buy_the_widest_deepest_cache():
    """GPU-like: a depth costs the same for any number of branches and everything fits."""
    p = plan(window_ms=10, glue_ms=1, depth_ms=lambda m: 1.0)
    assert p.depth == K and p.budget == 64


def test_costly_forwards_make_the_cache_shallow_and_narrow():
    """CPU-like: a depth costs about a quarter of the window, each branch a bit more."""
    p = plan(window_ms=11, glue_ms=3, depth_ms=lambda m: 2.5 + 0.17 * m)
    assert p.depth < K and p.budget < 16
    build = 3 + p.depth * (2.5 + 0.17 * p.budget)
    assert build <= 11 + 2.5  # at most about one depth past the window


def test_a_cache_that_rarely_hits_is_not_built():
    """Branches that overrun the window cost time; when candidates almost never contain the
    outcome they are not worth it. (Branches that fit in the window are free.)"""
    est = FanoutEstimator(K)
    for _ in range(500):
        est.observe(0, None)
    p = plan(window_ms=5, glue_ms=3, depth_ms=lambda m: 2.5 + 0.17 * m, estimator=est)
    assert p.budget == 0
    hopeful = plan(window_ms=5, glue_ms=3, depth_ms=lambda m: 2.5 + 0.17 * m)
    assert hopeful.budget > 0  # under the prior's hit curve a cache pays


def test_batches_shrink_the_budget_per_sequence():
    lone = plan(window_ms=11, glue_ms=3, depth_ms=lambda m: 1.0 + 0.2 * m)
    batch = plan(window_ms=11, glue_ms=3, depth_ms=lambda m: 1.0 + 0.2 * m, num_seqs=8)
    assert batch.budget < lone.budget


def test_hit_rates_match_the_allocation():
    est = FanoutEstimator(K)
    for k, rank in [(0, 0), (1, 2), (4, 0), (2, 9), (0, 1), (3, None)] * 5:
        est.observe(k, rank)
    rates = est.hit_rates(12, K)
    assert rates[0] == 0 and all(b >= a for a, b in zip(rates, rates[1:], strict=False))
    probs = est.pos_probs(K)
    # Observed curves need not be concave; the greedy (and so the rates) credit their hulls.
    curves = [_concave_majorant(est.hit_curve(k, 12, K)) for k in range(K + 1)]
    for budget in (1, 5, 12):
        fanout = marginal_fanout(budget, probs, curves)
        direct = sum(p * c[f] for p, c, f in zip(probs, curves, fanout, strict=True))
        assert rates[budget] == pytest.approx(direct, abs=1e-9)
    assert hit_rates(3, [1.0], [[0.0, 1.0]]) == [0.0, 1.0, 1.0, 1.0]  # flat past the curve


def test_depth_cost_line_and_prior():
    costs = BuildCosts()
    assert costs.depth_s(4) is None
    for _ in range(50):
        costs.observe_depth(2, 0.003)
    # One m seen: the prior slope through the mean observation.
    assert costs.depth_s(2) == pytest.approx(0.003)
    assert 0.003 < costs.depth_s(10) < 0.006
    for _ in range(50):
        costs.observe_depth(1, 0.002)
        costs.observe_depth(9, 0.004)
    assert costs.depth_s(5) == pytest.approx(0.003, rel=0.05)
    assert costs.depth_s(17) == pytest.approx(0.006, rel=0.05)


def test_a_calibrated_prior_shapes_the_line_until_branch_counts_vary():
    """The worker's start-up probe (a depth over 1 and over 8 branches) sets the prior slope:
    t(8) / t(1) = 4 gives f = 3 / 4, and a line through one observed m keeps that shape."""
    costs = BuildCosts()
    costs.calibrate(0.010, 8, 0.040)
    assert costs.slope_fraction == pytest.approx(0.75)
    for _ in range(50):
        costs.observe_depth(1, 0.020)  # twice as slow as probed (a longer context, say)
    assert costs.depth_s(1) == pytest.approx(0.020)
    assert costs.depth_s(8) == pytest.approx(0.080)
    costs.calibrate(0.010, 8, 0.090)  # no cheaper batched than alone: capped, near proportional
    assert costs.slope_fraction == MAX_SLOPE_FRACTION
    assert costs.depth_s(8) == pytest.approx(8 * 0.020, rel=0.1)
    costs.calibrate(0.010, 8, 0.009)  # a noisy probe cannot make branches cheaper than free
    assert costs.slope_fraction == 0.0


def test_the_window_of_a_shallow_speculation_is_its_own():
    """The target verifies d + 1 positions, so a shallow cache shortens the window it must fit
    in. Planned against the full-depth window, a shallow build overruns the window its own
    speculations leave; planned against W(d), it fits."""
    windows = {d: 8.0 + 3.0 * d for d in range(K + 1)}  # W(K) = 20 ms

    def build_ms(p):
        return 3 + p.depth * (2.0 + 0.5 * p.budget)

    const = plan(window_ms=windows[K], glue_ms=3, depth_ms=lambda m: 2.0 + 0.5 * m)
    curve = plan(window_ms=lambda d: windows[d], glue_ms=3, depth_ms=lambda m: 2.0 + 0.5 * m)
    assert const.depth < K and build_ms(const) > windows[const.depth]
    assert build_ms(curve) <= windows[curve.depth]
