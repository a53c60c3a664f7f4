"""Fan-out allocation (DESIGN §5): the closed form, the greedy marginal-gain allocator, the online
estimator and the --fanout parser."""

from __future__ import annotations

import itertools
import random

import pytest

from saguaro.config import parse_fanout
from saguaro.speculation.fanout import (
    FanoutEstimator,
    capped_geometric,
    geometric_fanout,
    marginal_fanout,
)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("budget", [0, 1, 7, 30, 100])
def test_geometric_sums_to_budget(a, k, budget):
    fan = geometric_fanout(budget, k, a)
    assert len(fan) == k + 1
    assert sum(fan) == budget
    assert all(f >= 0 for f in fan)


def test_geometric_budget_zero():
    assert geometric_fanout(0, 5, 0.8) == [0] * 6


@pytest.mark.parametrize("a", [0.3, 0.8, 0.99])
def test_geometric_respects_cap(a):
    fan = geometric_fanout(40, 5, a, cap=8)
    assert sum(fan) == 40 and max(fan) <= 8
    # The cap binds more than the total allows: every position gets the cap.
    assert geometric_fanout(100, 5, a, cap=8) == [8] * 6
    assert geometric_fanout(5, 4, a, cap=0) == [0] * 5


@pytest.mark.parametrize("a", [0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("r", [0.5, 1.0, 2.0])
def test_geometric_non_increasing_before_k(a, r):
    for budget in (5, 17, 64):
        fan = geometric_fanout(budget, 6, a, r)
        assert all(fan[j] >= fan[j + 1] for j in range(5)), fan


def test_geometric_matches_closed_form():
    # F_j ∝ P(j)^(1/(1+r)); B = 100, a = 0.5, r = 1, K = 2: P = (0.5, 0.25, 0.25),
    # sqrt P = (0.707, 0.5, 0.5), so F = 100 (0.4142, 0.2929, 0.2929) -> 41.42, 29.29, 29.29.
    assert geometric_fanout(100, 2, 0.5, r=1.0) == [42, 29, 29]


def test_geometric_high_acceptance_favours_bonus():
    fan = geometric_fanout(30, 4, 1.0)
    assert fan[-1] == max(fan) and fan[-1] >= 20
    # Low acceptance: the first rejection dominates.
    assert geometric_fanout(30, 4, 0.0)[0] >= 25


def _power_curves(k: int, budget: int, r: float) -> list[list[float]]:
    return [[0.0] + [1.0 - f ** (-r) for f in range(1, budget + 1)] for _ in range(k + 1)]


@pytest.mark.parametrize("r", [0.5, 1.0, 2.0])
def test_marginal_reproduces_closed_form_under_power_law(r):
    # The closed form solves the continuous problem. The discrete power law has H(1) = 0, so tiny
    # fan-outs can differ by more than rounding; compare where every closed-form F_k >= 3.
    compared = 0
    for a in (0.3, 0.5, 0.7, 0.8, 0.9):
        for k in (2, 4, 5):
            for budget in (20, 40, 64, 100, 160):
                closed = geometric_fanout(budget, k, a, r)
                if min(closed) < 3:
                    continue
                greedy = marginal_fanout(
                    budget, capped_geometric(k, a), _power_curves(k, budget, r)
                )
                assert sum(greedy) == budget
                assert all(abs(g - c) <= 1 for g, c in zip(greedy, closed, strict=True)), (
                    a,
                    k,
                    budget,
                )
                compared += 1
    assert compared >= 10


def test_marginal_concave_is_greedy_optimal():
    # Two positions, concave curves: the best 3 of the marginal gains 0.5*0.6, 0.5*0.2, 0.5*0.1
    # and 0.5*0.5, 0.5*0.4, 0.5*0.05 are 0.30, 0.25, 0.20 -> F = (1, 2).
    curves = [[0.0, 0.6, 0.8, 0.9], [0.0, 0.5, 0.9, 0.95]]
    assert marginal_fanout(3, [0.5, 0.5], curves) == [1, 2]


def test_marginal_flat_and_zero_curves():
    zero = [[0.0] * 5 for _ in range(3)]
    assert marginal_fanout(7, [0.2, 0.3, 0.5], zero) == [3, 2, 2]
    # Empty curves and zero probabilities are fine too.
    assert sum(marginal_fanout(5, [0.0, 0.0], [[], [0.0]])) == 5
    # A curve that saturates early: the units it cannot use go elsewhere.
    curves = [[0.0, 1.0], [0.0, 0.5, 0.75, 0.875]]
    assert marginal_fanout(3, [0.5, 0.5], curves) == [1, 2]


def test_marginal_cap_and_budget_zero():
    curves = _power_curves(3, 50, 1.0)
    probs = capped_geometric(3, 0.8)
    fan = marginal_fanout(20, probs, curves, cap=6)
    assert sum(fan) == 20 and max(fan) <= 6
    assert marginal_fanout(50, probs, curves, cap=6) == [6] * 4
    assert marginal_fanout(0, probs, curves) == [0] * 4
    with pytest.raises(ValueError):
        marginal_fanout(3, [0.5], curves)


def _feed(est: FanoutEstimator, n: int, a: float, seed: int = 0) -> None:
    """k ~ capped geometric(a); rank ~ geometric with P(rank = i) = 0.5^(i+1), None past 10."""
    rng = random.Random(seed)
    for _ in range(n):
        k = 0
        while k < est.K and rng.random() < a:
            k += 1
        rank = 0
        while rng.random() < 0.5:
            rank += 1
        est.observe(k, rank if rank < 10 else None)


def test_estimator_prior():
    est = FanoutEstimator(K=5)
    assert est.accept_rate == pytest.approx(0.7)
    assert est.pos_probs() == pytest.approx(capped_geometric(5, 0.7))
    assert sum(est.allocate(30, 5)) == 30
    assert sum(est.allocate(30, 5, mode="empirical")) == 30


def test_estimator_learns():
    est = FanoutEstimator(K=5, max_rank=16)
    _feed(est, 5000, 0.8)
    assert est.accept_rate == pytest.approx(0.8, abs=0.03)
    assert est.pos_probs() == pytest.approx(capped_geometric(5, 0.8), abs=0.03)
    curve = est.hit_curve(0, 20)
    assert len(curve) == 21 and curve[0] == 0.0
    assert all(x <= y for x, y in itertools.pairwise(curve))
    assert curve[1] == pytest.approx(0.5, abs=0.05) and curve[3] == pytest.approx(0.875, abs=0.05)
    assert curve[20] == curve[16] < 1.0  # flat past max_rank: unranked outcomes never hit
    # Ranks decaying geometrically fall faster than the prior's 1/(F+1): a steeper fitted r.
    assert est.power_r > FanoutEstimator(K=5, max_rank=16).power_r
    for mode in ("geometric", "empirical"):
        for cap in (None, 4, 100):
            fan = est.allocate(24, 5, mode=mode, cap=cap)
            assert len(fan) == 6 and sum(fan) == 24
            assert cap is None or max(fan) <= cap


def test_estimator_shorter_rounds():
    est = FanoutEstimator(K=5)
    rng = random.Random(1)
    for _ in range(500):
        k = 0
        while k < 3 and rng.random() < 0.6:
            k += 1
        est.observe(k, rng.randrange(3), K=3)
    probs = est.pos_probs(3)
    assert len(probs) == 4 and sum(probs) == pytest.approx(1.0)
    assert probs == pytest.approx(capped_geometric(3, 0.6), abs=0.06)
    assert est.hit_curve(3, 4, K=3)[3] > 0.9  # the bonus row of a K=3 round
    assert sum(est.allocate(16, 3, mode="empirical")) == 16
    with pytest.raises(ValueError):
        est.observe(4, 0, K=3)
    with pytest.raises(ValueError):
        est.pos_probs(6)


def test_parse_fanout():
    assert parse_fanout("auto", 4) == "auto"
    assert parse_fanout(" Geometric ", 4) == "geometric"
    assert parse_fanout("empirical", 4) == "empirical"
    assert parse_fanout("3,2,1,1,1", 4) == [3, 2, 1, 1, 1]
    assert parse_fanout("0", 4) == [0] * 5
    assert parse_fanout("2", 2) == [2, 2, 2]
    for bad in ("3,2,1", "3,2,1,1,1,1", "1,-1,1,1,1", "x", "", "1.5", "1,,1,1,1"):
        with pytest.raises(ValueError, match="fan-out"):
            parse_fanout(bad, 4)
