"""Per-position fan-out: how many candidate outcomes the speculation cache prepares for each
number accepted k (docs/design.md §5). The one place in the engine that computes it.

An outcome of a round is `(k, t)`: k of the K speculated tokens accepted, then token t. For each
k the cache holds branches for F_k candidate tokens t, with `sum_k F_k = B`. The round hits when
the realised k's true t is among those F_k, so the hit rate is `sum_k P(k) H_k(F_k)` where
`H_k(F)` is the chance that t ranks within the draft's top F at position k.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Acceptance rates are clamped into an open interval so that log a and log(1 - a) stay finite.
_A_MIN, _A_MAX = 0.01, 0.99
# Fitted power-law exponents are clamped: the log-log fit is noisy when few ranks are observed.
_R_MIN, _R_MAX = 0.1, 10.0
# Floor under P(rank >= F) before its log: a tail the observations exhausted stays finite.
_MISS_FLOOR = 1e-12


def capped_geometric(k: int, accept_rate: float) -> list[float]:
    """P(0..K) of the number accepted when each token is accepted independently with rate a:
    `P(j) = (1 - a) a^j` for j < K and `P(K) = a^K` (the bonus outcome absorbs the tail)."""
    a = accept_rate
    return [(1.0 - a) * a**j for j in range(k)] + [a**k]


def geometric_fanout(
    budget: int, k: int, accept_rate: float, r: float = 1.0, cap: int | None = None
) -> list[int]:
    """F_0..F_K for K = ``k`` speculated tokens: the allocation of ``budget`` branches maximising
    the hit rate under the capped-geometric P(k) and a power-law miss chance `1 - H(F) = F^(-r)`.

    Maximising `sum_j P(j) (1 - F_j^(-r))` subject to `sum_j F_j = B` (Lagrange, treating F as
    real): `r P(j) F_j^(-r-1) = lambda`, so `F_j ∝ P(j)^(1/(1+r))`. The real solution is scaled to
    sum to B with every F_j <= ``cap`` (water-filling: capped positions are fixed and the rest
    rescaled), then rounded by largest remainder so the integers still sum to B (ties to lower j).
    If `cap (K+1) < B` every position gets ``cap``. ``accept_rate`` is clamped to [0.01, 0.99].
    """
    _check_budget(budget, cap)
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    if r <= 0:
        raise ValueError(f"power-law exponent r must be > 0, got {r}")
    a = min(max(accept_rate, _A_MIN), _A_MAX)
    # Work in logs: a^K underflows for deep K and small a.
    log_p = [math.log1p(-a) + j * math.log(a) for j in range(k)] + [k * math.log(a)]
    top = max(log_p)
    weights = [math.exp((lp - top) / (1.0 + r)) for lp in log_p]
    return _round_to_total(_water_fill(weights, budget, cap))


def marginal_fanout(
    budget: int,
    pos_probs: Sequence[float],
    hit_curves: Sequence[Sequence[float]],
    cap: int | None = None,
) -> list[int]:
    """Greedy allocation for observed hit curves: each of the ``budget`` units goes to the position
    with the largest marginal gain `P(k) (H_k(F_k + 1) - H_k(F_k))`.

    ``hit_curves[k][F]`` is H_k(F), with H_k(0) = 0, non-decreasing, and constant past the curve's
    end. When every H_k is concave the marginal gains of each position are non-increasing, so the
    greedy picks the B largest gains overall: the allocation is optimal. A curve that is not
    concave is replaced by its least concave majorant (the upper hull of its points), so a unit
    that only pays off together with the next one is credited its share: under the power law
    `H(F) = 1 - F^(-r)` the first unit gains nothing alone (H(1) = 0), and plain greedy would never
    give it. Ties go to the position with fewer units so far, then to lower k, so that zero-gain
    units (flat curves) are spread evenly. Positions stop at ``cap``; if `cap (K+1) < B` the result
    sums to `cap (K+1)`.
    """
    fanout = [0] * len(pos_probs)
    for j, _ in _greedy_units(budget, pos_probs, hit_curves, cap):
        fanout[j] += 1
    return fanout


def hit_rates(
    budget: int,
    pos_probs: Sequence[float],
    hit_curves: Sequence[Sequence[float]],
    cap: int | None = None,
) -> list[float]:
    """The hit rate of the :func:`marginal_fanout` allocation of every budget 0..``budget``: entry
    B is `sum_k P(k) H_k(F_k)` for the best B units (on the concave majorants, so it is concave
    and non-decreasing in B)."""
    rates = [0.0]
    for _, gain in _greedy_units(budget, pos_probs, hit_curves, cap):
        rates.append(rates[-1] + gain)
    return rates + [rates[-1]] * (budget + 1 - len(rates))


def _greedy_units(
    budget: int,
    pos_probs: Sequence[float],
    hit_curves: Sequence[Sequence[float]],
    cap: int | None,
):
    """Yield (position, gain) for each budget unit the greedy marginal-gain allocation hands out."""
    _check_budget(budget, cap)
    if len(pos_probs) != len(hit_curves):
        raise ValueError(f"{len(pos_probs)} position probabilities but {len(hit_curves)} curves")

    hulls = [_concave_majorant(curve) for curve in hit_curves]

    def hit(j: int, f: int) -> float:
        hull = hulls[j]
        return hull[min(f, len(hull) - 1)] if hull else 0.0

    def entry(j: int, f: int) -> tuple[float, int, int]:
        return (-pos_probs[j] * (hit(j, f + 1) - hit(j, f)), f, j)

    heap = [entry(j, 0) for j in range(len(pos_probs))] if cap != 0 else []
    heapq.heapify(heap)
    for _ in range(budget):
        if not heap:
            break
        gain, f, j = heapq.heappop(heap)
        yield j, -gain
        if cap is None or f + 1 < cap:
            heapq.heappush(heap, entry(j, f + 1))


@dataclass
class FanoutEstimator:
    """Online statistics that the SSD draft worker feeds every round, and the fan-out they imply.

    Rounds may speculate any K' <= ``K``. Acceptance is kept as per-position counts: position j
    was *reached* when the j-th speculated token was verified, and *passed* when it was accepted.
    Then the continue rate `c_j = passed_j / reached_j` gives, for any K',
    `P(k) = c_0 .. c_{k-1} (1 - c_k)` for k < K' and `P(K') = c_0 .. c_{K'-1}`: the empirical
    histogram when every round used K' = K. The prior adds the counts of ``prior_weight`` rounds of
    a capped geometric with rate ``prior_accept`` (reached_j = w a^j, passed_j = w a^(j+1)).

    Ranks of the true t are kept per row: rows 0..K-1 for a rejection at that position, row K for
    the bonus outcome (all accepted), one extra column for "not within the top ``max_rank``". Each
    row is shrunk toward the pooled distribution of all rows with weight ``prior_weight``, and the
    pool toward the prior `P(rank >= F) = 1 / (F + 1)` (a power law in F + 1 with r = 1), so that
    rarely seen positions borrow the shape of the others.
    """

    K: int
    max_rank: int = 64
    prior_accept: float = 0.7
    prior_weight: float = 10.0
    _reached: list[float] = field(init=False, repr=False)
    _passed: list[float] = field(init=False, repr=False)
    _ranks: list[list[float]] = field(init=False, repr=False)
    _prior_ranks: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.K < 1 or self.max_rank < 1:
            raise ValueError(f"need K >= 1 and max_rank >= 1, got {self.K}, {self.max_rank}")
        if not 0.0 < self.prior_accept < 1.0 or self.prior_weight <= 0:
            raise ValueError("need 0 < prior_accept < 1 and prior_weight > 0")
        a, w = self.prior_accept, self.prior_weight
        self._reached = [w * a**j for j in range(self.K)]
        self._passed = [w * a ** (j + 1) for j in range(self.K)]
        self._ranks = [[0.0] * (self.max_rank + 1) for _ in range(self.K + 1)]
        self._prior_ranks = [1.0 / (i + 1) - 1.0 / (i + 2) for i in range(self.max_rank)]
        self._prior_ranks.append(1.0 / (self.max_rank + 1))

    def observe(self, k: int, rank: int | None, K: int | None = None) -> None:
        """Record one round of one sequence: k of ``K`` (default: the estimator's K) accepted, and
        the 0-based rank of the true t among the draft's candidates for outcome k (None, or a
        rank >= ``max_rank``: not within the ranked candidates)."""
        K = self.K if K is None else K
        if not 0 <= k <= K <= self.K:
            raise ValueError(f"need 0 <= k <= K <= {self.K}, got k={k}, K={K}")
        if rank is not None and rank < 0:
            raise ValueError(f"rank must be >= 0 or None, got {rank}")
        for j in range(k):
            self._reached[j] += 1.0
            self._passed[j] += 1.0
        if k < K:
            self._reached[k] += 1.0
        row = self.K if k == K else k
        col = self.max_rank if rank is None else min(rank, self.max_rank)
        self._ranks[row][col] += 1.0

    @property
    def accept_rate(self) -> float:
        """Per-token acceptance: accepted / (accepted + rejections), the maximum-likelihood rate
        of a capped geometric."""
        return sum(self._passed) / sum(self._reached)

    @property
    def power_r(self) -> float:
        """Exponent r of the power law `P(rank >= F) ∝ F^(-r)` fitted to the pooled rank
        distribution: weighted least squares of log P(rank >= F) on log F over F = 1..max_rank,
        with weights 1/F (equal weight per octave). The prior alone gives r ≈ 0.83."""
        pooled = self._pooled()
        xs, ys, ws = [], [], []
        miss = 1.0
        for f in range(1, self.max_rank + 1):
            miss -= pooled[f - 1]
            xs.append(math.log(f))
            ys.append(math.log(max(miss, _MISS_FLOOR)))
            ws.append(1.0 / f)
        sw = sum(ws)
        mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
        my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
        sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
        sxy = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True))
        if sxx == 0.0:  # max_rank == 1: one point, no slope to fit
            return 1.0
        return min(max(-sxy / sxx, _R_MIN), _R_MAX)

    def pos_probs(self, K: int | None = None) -> list[float]:
        """Smoothed P(0..K') for a round speculating K' = ``K`` tokens (default: self.K)."""
        K = self.K if K is None else K
        if not 0 <= K <= self.K:
            raise ValueError(f"need 0 <= K <= {self.K}, got {K}")
        probs, reach = [], 1.0
        for j in range(K):
            cont = self._passed[j] / self._reached[j]
            probs.append(reach * (1.0 - cont))
            reach *= cont
        probs.append(reach)
        return probs

    def hit_curve(self, k: int, max_f: int, K: int | None = None) -> list[float]:
        """Smoothed H_k(0..max_f) for outcome k of a round speculating ``K`` tokens: the chance that
        the true t ranks within the draft's top F. Non-decreasing, flat beyond ``max_rank``."""
        return self._curve(self._row(k, K), max_f, self._pooled())

    def expected_tokens(self, K: int | None = None) -> float:
        """Expected tokens a round speculating K' = ``K`` tokens commits: `sum_k P(k) (k + 1)`."""
        return sum(p * (k + 1) for k, p in enumerate(self.pos_probs(K)))

    def hit_rates(self, budget: int, K: int | None = None, cap: int | None = None) -> list[float]:
        """The best achievable hit rate for every budget 0..``budget`` (see :func:`hit_rates`)."""
        K = self.K if K is None else K
        pooled = self._pooled()
        max_f = budget if cap is None else min(cap, budget)
        curves = [self._curve(self._row(k, K), max_f, pooled) for k in range(K + 1)]
        return hit_rates(budget, self.pos_probs(K), curves, cap)

    def allocate(
        self, budget: int, K: int | None = None, mode: str = "geometric", cap: int | None = None
    ) -> list[int]:
        """F_0..F_K' from the current estimates. ``geometric``: the closed form
        (docs/design.md §5) with the measured acceptance rate and fitted r. ``empirical``: the
        greedy marginal-gain allocation on the smoothed P(k) and hit curves."""
        K = self.K if K is None else K
        if mode == "geometric":
            return geometric_fanout(budget, K, self.accept_rate, self.power_r, cap)
        if mode == "empirical":
            pooled = self._pooled()
            max_f = budget if cap is None else min(cap, budget)
            curves = [self._curve(self._row(k, K), max_f, pooled) for k in range(K + 1)]
            return marginal_fanout(budget, self.pos_probs(K), curves, cap)
        raise ValueError(f"unknown fan-out mode {mode!r}; expected 'geometric' or 'empirical'")

    def _row(self, k: int, K: int | None) -> int:
        K = self.K if K is None else K
        if not 0 <= k <= K <= self.K:
            raise ValueError(f"need 0 <= k <= K <= {self.K}, got k={k}, K={K}")
        return self.K if k == K else k

    def _pooled(self) -> list[float]:
        totals = [sum(col) for col in zip(*self._ranks, strict=True)]
        n = sum(totals) + self.prior_weight
        return [
            (t + self.prior_weight * p) / n for t, p in zip(totals, self._prior_ranks, strict=True)
        ]

    def _curve(self, row: int, max_f: int, pooled: list[float]) -> list[float]:
        counts = self._ranks[row]
        n = sum(counts) + self.prior_weight
        curve, h = [0.0], 0.0
        for f in range(max_f):
            if f < self.max_rank:  # the last column (unranked) never hits
                h += (counts[f] + self.prior_weight * pooled[f]) / n
            curve.append(h)
        return curve


def _check_budget(budget: int, cap: int | None) -> None:
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if cap is not None and cap < 0:
        raise ValueError(f"cap must be >= 0 or None, got {cap}")


def _concave_majorant(curve: Sequence[float]) -> list[float]:
    """The least concave majorant of the points (F, curve[F]), evaluated at F = 0..len - 1: the
    upper convex hull (monotone chain), linearly interpolated between its vertices."""
    hull: list[int] = []
    for f in range(len(curve)):
        # Drop the last vertex while it lies on or below the chord from the one before it to f.
        while len(hull) >= 2:
            f0, f1 = hull[-2], hull[-1]
            if (curve[f1] - curve[f0]) * (f - f0) > (curve[f] - curve[f0]) * (f1 - f0):
                break
            hull.pop()
        hull.append(f)
    out = [0.0] * len(curve)
    for f0, f1 in itertools.pairwise(hull):
        slope = (curve[f1] - curve[f0]) / (f1 - f0)
        for f in range(f0, f1):
            out[f] = curve[f0] + slope * (f - f0)
    if hull:
        out[hull[-1]] = curve[hull[-1]]
    return out


def _water_fill(weights: list[float], budget: int, cap: int | None) -> list[float]:
    """Real x_j ∝ weights_j summing to min(B, cap n), each <= cap: positions whose share exceeds
    the cap are fixed at it and the rest of the budget is rescaled over the others, until none
    exceed."""
    n = len(weights)
    if cap is not None and cap * n <= budget:
        return [float(cap)] * n
    x = [0.0] * n
    free = set(range(n))
    left = float(budget)
    while True:
        scale = left / sum(weights[j] for j in free)
        over = {j for j in free if cap is not None and weights[j] * scale > cap}
        if not over:
            for j in free:
                x[j] = weights[j] * scale
            return x
        for j in over:
            x[j] = float(cap)
        free -= over
        left -= cap * len(over)


def _round_to_total(x: list[float]) -> list[int]:
    """Largest-remainder rounding: floors, then +1 for the largest fractional parts (ties to lower
    index) until the integers sum to round(sum x). The fractional parts sum to the number of units
    handed out, each below 1, so only positions with a positive fraction get one: an x_j that
    equals the cap is never raised above it."""
    total = round(sum(x))
    out = [math.floor(v) for v in x]
    order = sorted(range(len(x)), key=lambda j: (out[j] - x[j], j))
    for j in order[: total - sum(out)]:
        out[j] += 1
    return out
