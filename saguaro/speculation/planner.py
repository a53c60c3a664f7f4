"""The cost model behind every choice of how to speculate (docs/design.md §5, §12): which mode
runs each round (AR, SD with k proposals, SSD), and for SSD how much cache to build (budget B
and branch depth d).

The draft worker builds the cache for round T while the target verifies it. For n sequences a
build costs `T_build(B, d) = T_fixed + d T_depth(n B)`: a fixed part (glue pass, candidate
ranking), then one batched forward per depth over all n B branches. It pays off through the hit
rate p(B) (the best allocation of B branches, from :class:`FanoutEstimator`) and the tokens a
hit brings, E(d) (expected commits of a round speculating d tokens). A build longer than the
target's window W(d) (its time between our reply and its next request, which grows with the d
tokens a sequence's speculation gives it to verify) delays the round; a miss delays the batch by
a backup. Per round:

    tokens(B, d) = p(B) E(d) + (1 - p(B)) E_miss
    time(B, d)   = max(W(d), T_build(B, d)) + (1 - p(B)^n) T_backup

The planner picks the (B, d) with the most tokens per second over B = 0..max_budget and
d = 1..K. B = 0 builds no branches: every round misses, as in synchronous SD with the draft
working on demand, and candidates are still ranked so the hit statistics keep learning. Where
T_depth barely grows with B (a GPU), wide, full-depth caches win; where each forward's fixed
cost is large against the window (a CPU), short, narrow caches pay. d < K is exact: a cached
branch of d tokens is a valid speculation of length d (the target verifies whatever length it
is given), and d depends only on timings, never on sampled tokens.

Timings are online estimates: exponential moving averages; for W a curve over the positions the
target verified; for T_depth a least-squares line `a + b m` over recent (m branches, seconds)
observations, with a prior slope while the observed m have not varied enough to fit one. The
prior is measured when the worker starts (:meth:`BuildCosts.calibrate`): what an extra branch
costs relative to one differs by an order of magnitude between a GPU and a CPU core, and a
prior from the wrong device sends the first builds far wider than their window.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field

# Before a line can be fitted: each extra branch costs this fraction of a one-branch forward.
# Only a starting point until the worker measures its own (BuildCosts.calibrate); the fitted
# slope replaces either once the branch counts vary.
PRIOR_SLOPE_FRACTION = 0.07
# The measured fraction's cap: a depth whose m branches cost m one-branch forwards (no gain from
# batching) has f -> infinity, the line through zero; at this f the line is within 10% of it.
MAX_SLOPE_FRACTION = 10.0
# Below this variance of the observed branch counts m a fitted slope is noise: use the prior.
MIN_BRANCH_VARIANCE = 0.25
EMA_ALPHA = 0.1  # weight of the newest observation in every online cost


@dataclass
class _Ema:
    alpha: float
    value: float | None = None

    def update(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


@dataclass
class Curve:
    """Online seconds as a function of a size m (positions in a target forward, rows of a draft
    step): an exponential moving average at each size observed, linear between neighbouring
    sizes, flat below the smallest and extended along the last segment's slope (never falling)
    beyond the largest. A forward's cost is far from linear in m on a CPU (flat while bound by
    reading the weights, then rising with the arithmetic), so no single line fits it.

    Sizes timed before serving (:meth:`calibrate`) give the curve its shape where no step has
    measured it, at the level the steps measure: c(m) = level * base(m), with base the
    calibration's curve and level the moving average of observed / base(m) over the
    observations. Calibration runs on an idle engine with short contexts; steps run with long
    ones, beside the server's other work, on a machine whose speed drifts. At face value every
    size not yet observed would look cheaper than the sizes the steps have measured, and a
    mode whose forwards have those sizes would win on that alone."""

    alpha: float = EMA_ALPHA
    # A size last observed more than this many steps before restarts from its next observation:
    # its value measured conditions that may be gone (a burst of other work on the machine
    # left a mode looking slow long after it ended, the mode unchosen and so unmeasured).
    stale_after: int | None = None
    knots: dict[int, _Ema] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)  # the step each size was last observed
    base: dict[int, float] = field(default_factory=dict)  # calibrated seconds at each size
    # another curve's level to share: forwards of one process on one machine slow down together
    shared_level: InitVar[_Ema | None] = None
    level: _Ema = field(init=False)  # observed / calibrated

    def __post_init__(self, shared_level: _Ema | None) -> None:
        self.level = shared_level if shared_level is not None else _Ema(self.alpha)

    def calibrate(self, m: int, seconds: float) -> None:
        """Size m timed before serving: part of the shape, never a measurement."""
        self.base[m] = seconds

    def observe(self, m: int, seconds: float, step: int = 0) -> None:
        if self.stale_after is not None and step - self.last.get(m, step) > self.stale_after:
            del self.knots[m]
        self.last[m] = step
        self.knots.setdefault(m, _Ema(self.alpha)).update(seconds)
        calibrated = interpolate(self.base, m)
        if calibrated:
            self.level.update(seconds / calibrated)

    def __call__(self, m: int) -> float | None:
        level = 1.0 if self.level.value is None else self.level.value
        values = {size: level * seconds for size, seconds in self.base.items()}
        for size, ema in self.knots.items():
            if ema.value is not None:
                values[size] = ema.value
        return interpolate(values, m)


def interpolate(values: dict[int, float], m: int) -> float | None:
    """``values`` (size -> seconds) at m: linear between neighbouring sizes, flat below the
    smallest, and beyond the largest along the last segment's slope, never falling."""
    if not values:
        return None
    sizes = sorted(values)
    i = bisect.bisect_left(sizes, m)
    if i < len(sizes) and sizes[i] == m:
        return values[m]
    if i == 0 or len(sizes) == 1:  # below the smallest size, or one size only: flat
        return values[sizes[0]]
    if i == len(sizes):  # beyond the largest size: the last segment's slope, never falling
        lo, hi = sizes[-2], sizes[-1]
        slope = max(0.0, (values[hi] - values[lo]) / (hi - lo))
        return values[hi] + slope * (m - hi)
    lo, hi = sizes[i - 1], sizes[i]
    return values[lo] + (values[hi] - values[lo]) * (m - lo) / (hi - lo)


@dataclass
class BuildCosts:
    """Online seconds: a build's fixed part (glue pass, ranking), one branch depth over m
    branches, a backup, the target's window over the positions it verified."""

    alpha: float = EMA_ALPHA
    slope_fraction: float = PRIOR_SLOPE_FRACTION  # the prior: a branch's share of a forward
    fixed: _Ema = field(init=False)
    backup: _Ema = field(init=False)
    window: Curve = field(init=False)
    _moments: list[float] = field(init=False)  # EMAs of 1, m, t, m^2, m t

    def __post_init__(self) -> None:
        self.fixed, self.backup = _Ema(self.alpha), _Ema(self.alpha)
        self.window = Curve(self.alpha)
        self._moments = [0.0] * 5

    def calibrate(self, one_s: float, m: int, m_s: float) -> None:
        """The prior slope from a depth over one branch (``one_s``) and over ``m`` (``m_s``):
        with t(m) = c (1 + f m), t(m) / t(1) = R gives f = (R - 1) / (m - R)."""
        ratio = m_s / one_s
        f = (ratio - 1.0) / (m - ratio) if ratio < m else MAX_SLOPE_FRACTION
        self.slope_fraction = min(max(f, 0.0), MAX_SLOPE_FRACTION)

    def observe_depth(self, m: int, seconds: float) -> None:
        x = (1.0, float(m), seconds, float(m * m), m * seconds)
        self._moments = [
            old + self.alpha * (new - old) for old, new in zip(self._moments, x, strict=True)
        ]

    def depth_s(self, m: int) -> float | None:
        """Seconds of one depth over m branches: the fitted line, or the prior slope through the
        mean observation while the m's have not varied."""
        w, sm, st, smm, smt = self._moments
        if w == 0.0:
            return None
        mean_m, mean_t = sm / w, st / w
        var = smm / w - mean_m**2
        if var > MIN_BRANCH_VARIANCE:
            slope = max(0.0, (smt / w - mean_m * mean_t) / var)
            intercept = max(0.0, mean_t - slope * mean_m)
        else:
            intercept = mean_t / (1.0 + self.slope_fraction * mean_m)
            slope = self.slope_fraction * intercept
        return intercept + slope * m


@dataclass(frozen=True)
class Plan:
    budget: int
    depth: int
    rate: float  # predicted tokens per second per sequence


def plan_build(
    *,
    window_s: Callable[[int], float],  # d -> the target's window verifying d-token speculations
    fixed_s: float,
    depth_s: Callable[[int], float],  # branches in the batch -> seconds of one depth
    hit_rates: list[float],  # p(B) for B = 0..max_budget
    expected_tokens: list[float],  # E(d) for d = 0..K
    miss_tokens: float,
    backup_s: float,
    num_seqs: int,
    max_budget: int,
) -> Plan:
    """The (B, d) with the highest predicted tokens per second (see the module docstring)."""
    max_depth = len(expected_tokens) - 1
    # No cache: every sequence gets its backup's speculation, K tokens if neural.
    no_cache = miss_tokens / (max(window_s(max_depth), fixed_s) + backup_s)
    best = Plan(0, max_depth, no_cache)
    for b in range(1, max_budget + 1):
        p = hit_rates[min(b, len(hit_rates) - 1)]
        per_depth = depth_s(num_seqs * b)
        stall = (1.0 - p**num_seqs) * backup_s
        for d in range(1, max_depth + 1):
            tokens = p * expected_tokens[d] + (1.0 - p) * miss_tokens
            seconds = max(window_s(d), fixed_s + d * per_depth) + stall
            rate = tokens / seconds
            if rate > best.rate:
                best = Plan(b, d, rate)
    return best


# ---- which mode runs a round (docs/design.md §12) ----------------------------------------------


@dataclass(frozen=True)
class Choice:
    """How one step's rounds run: ``mode`` ar, sd, lookup (SD with copies alone) or ssd, with
    ``k`` proposals per sequence (0 for AR; K for SSD, whose worker plans its own cache)."""

    mode: str
    k: int


@dataclass(frozen=True)
class CopyEstimates:
    """SD with copies alone (docs/design.md §3, "Copies alone") for the batch at hand, for
    k = 0..k_max: the tokens its round would commit (expected) and the positions it would score
    (exact: whether a sequence's context has a copy is known before the round, and a chain of
    copies, once started, runs to k)."""

    tokens: Sequence[float]
    positions: Sequence[int]


@dataclass(frozen=True)
class SSDEstimates:
    """The SSD worker's figures (saguaro/speculation/policy.py): hit rate, tokens a round commits
    on a hit and on a miss, and the primary speculation's and the backup's seconds relative to
    the target's forward."""

    p_hit: float
    e_hit: float
    e_miss: float
    t_p: float
    t_b: float
    backup: str = "neural"  # the kind of backup a miss would run


def plan_mode(
    *,
    n: int,
    k_max: int,
    target_s: Callable[[int], float],  # positions in one forward -> seconds
    ssd_target_s: Callable[[int], float],  # the same in an SSD step (fewer cores, maybe)
    other_s: Callable[[int], float],  # positions scored -> the step's seconds beyond forwards
    draft_s: Callable[[int], float] | None,  # rows -> seconds of one SD draft step
    tokens: Sequence[float],  # expected tokens committed by the batch for k = 0..k_max
    ssd: SSDEstimates | None,
    copies: CopyEstimates | None = None,
) -> dict[Choice, float]:
    """Predicted tokens per second of a batch of n sequences under each choice:

        AR:      n / (T(n) + O(n))
        SD, k:   E(k) / (T(n (k + 1)) + O(n (k + 1)) + k D(n))
        lookup, k: E_c(k) / (T(n + c k) + O(n + c k))
        SSD:     n (p E_hit + (1 - p) E_miss)
                 / (p^n max(V, T_p F) + (1 - p^n) (V + T_b F)),  F = T(n (K + 1)),  V = F + O(...)

    T(m) is a target forward over m positions (in SSD's steps on the cores the worker leaves
    it: fewer where AR and SD borrow the worker's), O(m) the rest of a step that scores m
    positions (scheduling, processors, verification, commit), D(n) one draft forward over n
    rows, E(k) the batch's expected commits with k proposals each, sum_i (1 + sum_{j<=k}
    prod_{l<=j} a_il) for per-position acceptance a_il. An SD round drafts k tokens, then
    verifies them; nothing overlaps. With copies alone the c sequences whose context has a copy
    propose k each and no model drafts; E_c(k) is the batch's expected commits at the copies'
    own acceptance. An SSD round is the §7 round in seconds: the batch waits for its target
    step V, or for the primary speculation if longer, when every sequence hit (p^n), and for a
    backup after V when any missed. Each is expected tokens per round over expected round time
    (renewal-reward), the long-run rate of repeating that choice.
    """
    rates = {Choice("ar", 0): n / (target_s(n) + other_s(n))}
    if draft_s is not None:
        for k in range(1, k_max + 1):
            m = n * (k + 1)
            rates[Choice("sd", k)] = tokens[k] / (target_s(m) + other_s(m) + k * draft_s(n))
    if copies is not None:
        for k in range(1, k_max + 1):
            m = copies.positions[k]
            rates[Choice("lookup", k)] = copies.tokens[k] / (target_s(m) + other_s(m))
    if ssd is not None:
        rates[Choice("ssd", k_max)] = ssd_rate(n, k_max, ssd_target_s, other_s, ssd)
    return rates


def ssd_rate(
    n: int,
    k_max: int,
    ssd_target_s: Callable[[int], float],
    other_s: Callable[[int], float],
    ssd: SSDEstimates,
) -> float:
    """SSD's predicted tokens per second for n sequences (:func:`plan_mode`):
    ``n (p E_hit + (1 - p) E_miss) / (p^n max(V, T_p F) + (1 - p^n) (V + T_b F))`` with
    ``F = T(n (K + 1))`` and ``V = F + O(n (K + 1))``."""
    m = n * (k_max + 1)
    forward = ssd_target_s(m)
    step = forward + other_s(m)
    all_hit = ssd.p_hit**n
    seconds = all_hit * max(step, ssd.t_p * forward) + (1.0 - all_hit) * (step + ssd.t_b * forward)
    per_seq = ssd.p_hit * ssd.e_hit + (1.0 - ssd.p_hit) * ssd.e_miss
    return n * per_seq / seconds
