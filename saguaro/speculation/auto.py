"""mode="auto": before each step, the strategy that serves the running batch best (docs/design.md
§12): AR, SD with k = 1..K proposals, SD with copies alone, or SSD, chosen by the planner's cost
model (:func:`saguaro.speculation.planner.plan_mode`) from what the engine measures as it runs.

Exactness does not depend on the choice. Each round's proposals come with the distribution
they were drawn from (point masses for greedy and coupled proposals), and verification is exact
for any proposal and any k (docs/design.md §3); the choice is made before the round from past
timings and outcomes, never from the round's own randomness. A request whose rounds switch mode
therefore samples exactly the target's distribution; under coupled sampling its text is the
target's noise's and so the same in every mode.

The SSD worker stays up while SD or AR runs (its cache for a round that never came unused):
switching back costs one miss, not a start. Where it has cores of its own (``feeds``) it is sent
every step's tokens and drafts shadow chains, whose acceptance the pool takes in as rounds'
(docs/design.md §12); elsewhere it idles, since it would compute on the target's cores.
Hysteresis keeps the choice from flapping: a new choice must beat the current one's predicted
rate by ``HYSTERESIS``, and a choice runs at least ``MIN_DWELL`` steps. Rates are compared net
of the catch-up a choice's draft needs first (the tokens of the batch it has not seen), spread
over ``SWITCH_HORIZON`` steps: a switch that would not repay it within them is not made. SD
and SSD may settle only once ``MIN_ROUNDS`` speculative rounds (or shadow chains) have been
observed: before, their rates rest on a prior acceptance, and a switch made on a prior pays the
draft's catch-up for nothing when the draft is weak.

Estimates of a mode not chosen go stale, so a mode that has not run for ``EXPLORE_EVERY`` steps
runs for ``EXPLORE_STEPS``, and its costs restart from what the try measures (a cost is a moving
average; one taken while the machine was busy elsewhere would otherwise keep the mode looking
slow for many tries); each try that leaves it unchosen doubles its interval, up to
``EXPLORE_MAX``, and being chosen resets it. A try costs more than its steps: the draft first
catches up on every token it missed, and SSD's first round after a pause misses. So an SD try
drafts only for the ``TRY_SEQS`` sequences whose draft has missed the fewest tokens (a try is
for acceptance, which a few sequences show, and a catch-up over a whole batch's context is
what makes a try dear), the others verifying no proposals meanwhile. And tries keep to a budget
of time: one starts only if the tries so far and this one, at its predicted cost, stay within
``EXPLORE_BUDGET`` of the time the engine has run; each later step of a try is priced again
(sequences that joined the batch meanwhile are context the draft has not seen), and the try
stops once it no longer fits. What auto can lose to a fixed choice by exploring is thereby
bounded by that share, and a short run whose first try would cost more never explores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from saguaro.core.proposal import DraftHealth, Proposal, Proposer, TargetProbe
from saguaro.core.records import RoundRecord
from saguaro.core.sequence import Sequence
from saguaro.engine.model_runner import time_forward
from saguaro.speculation.lookup import LookupProposer
from saguaro.speculation.ngram import Lookup
from saguaro.speculation.planner import EMA_ALPHA, Choice, CopyEstimates, Curve, plan_mode
from saguaro.speculation.policy import PRIOR_ACCEPT
from saguaro.speculation.sd import DraftProposer
from saguaro.speculation.supervisor import Supervised

HYSTERESIS = 0.05  # a new choice must promise this much more than the current one
MIN_DWELL = 4  # steps a choice runs before another may replace it
EXPLORE_EVERY = 64  # steps after which a mode not run since is tried again
EXPLORE_MAX = 2048  # the longest interval between tries of a mode that keeps losing
# steps such a try runs: SSD's first round after a pause misses by construction and teaches
# nothing, so two more for fresh timings and outcomes
EXPLORE_STEPS = 3
EXPLORE_BUDGET = 0.02  # the largest share of the engine's time that tries may take
# steps after which a cost not measured since restarts from its next measurement: fewer than
# EXPLORE_EVERY, so a try measures its mode afresh instead of nudging an old estimate
STALE_STEPS = EXPLORE_EVERY // 2
# sequences an SD try drafts for: its EXPLORE_STEPS rounds of them observe at least MIN_ROUNDS
TRY_SEQS = 4
PRIOR_ROUNDS = 8.0  # a request's own acceptance counts as much as the pool after this many
# The pool starts as a mean over its observations and this many pseudo-observations of the prior;
# it becomes a moving average once 1 / alpha - PRIOR_WEIGHT positions have been seen.
PRIOR_WEIGHT = 2.0
MIN_ROUNDS = 8  # speculative rounds observed before SD or SSD may be the settled choice
CALIBRATION_REPEATS = 2  # forwards timed per shape at start (the faster is kept)
CALIBRATION_SEQS = (1, 2, 4, 8, 16, 32, 64)  # batch sizes timed at start, up to max_num_seqs
# steps within which a switch must repay its draft's catch-up (AutoProposer.worth)
SWITCH_HORIZON = EXPLORE_EVERY
CATCH_UP_PROBE = 64  # tokens of the draft forward timed at start to price a catch-up per token


@dataclass(frozen=True)
class Threads:
    """Torch threads of the target's process where auto shares the worker's cores: ``other``
    for AR and SD steps (every core), ``ssd`` for SSD steps (the cores the worker leaves)."""

    other: int
    ssd: int


@dataclass
class Acceptance:
    """Per-position acceptance a_j = P(s_j accepted | s_1..s_{j-1} accepted): pooled over
    requests and per request (its own counts, shrunk towards the pool by ``PRIOR_ROUNDS``
    pseudo-rounds).

    The pool's a_j after n_j observations x_1..x_n (1 accepted, 0 rejected) moves by weight
    w_n = max(alpha, 1 / (n_j + PRIOR_WEIGHT)): while 1 / (n + PRIOR_WEIGHT) is the larger it is
    the plain mean (PRIOR_WEIGHT a_prior + sum x) / (PRIOR_WEIGHT + n), so the first rounds
    move the prior as far as they show (three rejections: 0.28 from a prior of 0.7, where a
    fixed alpha of 0.1 gives 0.51); after that, an exponential moving average that follows
    drift."""

    k_max: int
    alpha: float = EMA_ALPHA
    pooled: list[float] = field(init=False)
    seen: list[int] = field(init=False)  # n_j: the pool's observations at position j
    own: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # tried, accepted
    rounds: int = 0  # rounds observed, all requests together

    def __post_init__(self) -> None:
        self.pooled = [PRIOR_ACCEPT] * self.k_max
        self.seen = [0] * self.k_max

    def observe(self, seq_id: int | None, drafted: int, accepted: int) -> None:
        """A round that verified ``drafted`` proposals and accepted ``accepted``: positions
        1..accepted were accepted, position accepted + 1 (if drafted) rejected. ``seq_id``
        None: the pool only (the request has ended)."""
        self.rounds += 1
        own = None
        if seq_id is not None:
            own = self.own.setdefault(seq_id, ([0] * self.k_max, [0] * self.k_max))
        for j in range(min(accepted + 1, drafted)):
            ok = j < accepted
            if own is not None:
                own[0][j] += 1
                own[1][j] += ok
            self._pool(j, float(ok))

    def observe_counts(self, tried: list[int], hits: list[int]) -> None:
        """Chains seen only in aggregate (SSD's shadow chains, protocol FEED): ``tried[j]``
        reached position j and ``hits[j]`` had it accepted. The pool moves as that many
        observations of position j would, each at their mean hits[j] / tried[j]; each chain
        (``tried[0]`` of them) counts as a round."""
        self.rounds += tried[0]
        for j, (n, h) in enumerate(zip(tried, hits, strict=True)):
            for _ in range(n):
                self._pool(j, h / n)

    def _pool(self, j: int, x: float) -> None:
        weight = max(self.alpha, 1.0 / (self.seen[j] + 1 + PRIOR_WEIGHT))
        self.pooled[j] += weight * (x - self.pooled[j])
        self.seen[j] += 1

    def expected(self, seq_id: int) -> list[float]:
        """Expected tokens a round with k proposals commits, for k = 0..k_max:
        1 + sum_{j<=k} prod_{l<=j} a_l."""
        tried, hits = self.own.get(seq_id, ([0] * self.k_max, [0] * self.k_max))
        out, run = [1.0], 1.0
        for j in range(self.k_max):
            run *= (hits[j] + PRIOR_ROUNDS * self.pooled[j]) / (tried[j] + PRIOR_ROUNDS)
            out.append(out[-1] + run)
        return out

    def forget(self, seq_id: int) -> None:
        self.own.pop(seq_id, None)


class AutoProposer(Proposer):
    """Runs SD's in-process draft, SSD's (supervised) worker or nothing, step by step.

    ``modes`` limits the choices (None: every mode its proposers can run): SD and SSD with
    ``ar_fallback`` choose between AR and their own speculation. ``feeds``: the SSD worker has
    cores of its own, so every step run without it sends it the batch's tokens (protocol FEED):
    it stays current, and its shadow chains' acceptance is observed as SD's and SSD's rounds'
    is. ``force`` (tests and experiments only: no request can reach it) overrides the choice:
    step number -> Choice."""

    def __init__(
        self,
        sd: DraftProposer,
        ssd: Supervised | None,
        k_max: int,
        max_num_seqs: int,
        threads: Threads | None = None,
        lookup: Lookup | None = None,
        modes: tuple[str, ...] | None = None,
        feeds: bool = False,
    ) -> None:
        self.sd, self.ssd = sd, ssd
        self.feeds = feeds and ssd is not None
        # SD with copies alone, where the draft's chains copy at all (its own acceptance)
        self.copier = LookupProposer(lookup) if lookup is not None else None
        self.copies = Acceptance(k_max)
        self.k_max, self.max_num_seqs = k_max, max_num_seqs
        self.threads = threads
        # The forwards' curves share one level (measured / calibrated): a machine busier than at
        # calibration slows every forward, not only those of the mode that is running.
        self.target, self.other = Curve(stale_after=STALE_STEPS), Curve(stale_after=STALE_STEPS)
        self.draft = Curve(stale_after=STALE_STEPS, shared_level=self.target.level)
        # an SSD step's target forward runs on fewer threads where the cores are shared
        self.ssd_target = (
            Curve(stale_after=STALE_STEPS, shared_level=self.target.level)
            if threads is not None
            else self.target
        )
        self.acceptance = Acceptance(k_max)
        self.force: Callable[[int], Choice] | None = None
        self.choice: Choice | None = None  # the last step's
        self.settled: Choice | None = None  # the cost model's, which tries interrupt
        self.trying = Choice("ar", 0)  # a stale mode's, while ``exploring``
        self.try_ids: set[int] | None = None  # the sequences an SD try drafts for (None: all)
        self.steps = 0
        runnable = ["ar", "sd", "ssd"] + (["lookup"] if self.copier is not None else [])
        chosen = [m for m in runnable if modes is None or m in modes]
        self.since: dict[str, int] = dict.fromkeys(chosen, 0)  # steps since each mode ran
        self.interval = dict.fromkeys(self.since, EXPLORE_EVERY)  # steps between tries
        self.dwell = 0  # steps since the settled choice was made
        self.exploring = 0  # steps left of a try
        self.in_try = False  # the step being run is part of a try
        self.run_s = 0.0  # seconds of every step observed
        self.try_s = 0.0  # of which, in tries
        self.step_s = 0.0  # the last step's
        self.catch_up_s = 0.0  # the draft's seconds per token of a catch-up (calibrated)
        self.last_rates: dict[Choice, float] = {}
        self.counts: dict[Choice, int] = {}  # steps run under each choice

    # ---- the choice ----------------------------------------------------------------------------

    def rates(self, seqs: list[Sequence]) -> dict[Choice, float]:
        """Predicted tokens per second of this batch under each choice."""
        n = len(seqs)
        if self.target(1) is None:  # before any measurement (calibrate always runs first)
            return {Choice("ar", 0): 0.0}
        per_seq = [self.acceptance.expected(s.seq_id) for s in seqs]
        tokens = [sum(e[k] for e in per_seq) for k in range(self.k_max + 1)]
        ssd = None if self.ssd is None else self.ssd.estimates(n)
        if ssd is not None:
            # A round's tokens from this acceptance (SD's and SSD's rounds, warm-started), not the
            # worker's moving averages of its own rounds: a few tries leave those near a prior
            # of 0.7 a position, and a weak draft's SSD then looks worth a switch. A hit's branch
            # and a neural backup each speculate K tokens.
            full = tokens[self.k_max] / n
            ssd = replace(ssd, e_hit=full, e_miss=full if ssd.backup == "neural" else ssd.e_miss)
        rates = plan_mode(
            n=n,
            k_max=self.k_max,
            target_s=lambda m: self.target(m) or 0.0,
            ssd_target_s=lambda m: self.ssd_target(m) or 0.0,
            other_s=lambda m: self.other(m) or 0.0,
            draft_s=lambda rows: self.draft(rows) or 0.0,
            tokens=tokens,
            ssd=ssd,
            copies=self.copy_estimates(seqs),
        )
        return {c: r for c, r in rates.items() if c.mode in self.since}

    def copy_estimates(self, seqs: list[Sequence]) -> CopyEstimates | None:
        """What SD with copies alone would verify and commit for ``seqs``: a sequence whose
        context has a copy proposes k (a chain of copies runs to its end), the others none."""
        if self.copier is None:
            return None
        copying = [s for s in seqs if self.copier.has_copy(s)]
        per_seq = [self.copies.expected(s.seq_id) for s in copying]
        rest = len(seqs) - len(copying)
        return CopyEstimates(
            tokens=[rest + sum(e[k] for e in per_seq) for k in range(self.k_max + 1)],
            positions=[len(seqs) + len(copying) * k for k in range(self.k_max + 1)],
        )

    def choose(self, seqs: list[Sequence]) -> Choice:
        """The forced choice, a stale mode's try, or the settled choice: the best predicted one,
        replaced only by one that beats it by ``HYSTERESIS`` after ``MIN_DWELL`` steps."""
        if self.force is not None:
            return self.force(self.steps)
        rates = self.last_rates = self.rates(seqs)
        self.in_try = self.exploring > 0
        if self.exploring:
            # Re-priced each step: sequences that joined the batch since the try began would
            # make the worker catch up on their whole context, a cost the try was not priced at.
            if self.affords_try(self.trying, self.tried(seqs), self.exploring):
                self.exploring -= 1
                return self.trying
            self.exploring, self.in_try = 0, False
        stale = [c for c in rates if self.since[c.mode] >= self.interval[c.mode]]
        trying = max(stale, key=rates.__getitem__) if stale else None
        tried = self.try_seqs(trying, seqs) if trying is not None else []
        if trying is not None and self.affords_try(trying, tried, EXPLORE_STEPS):
            self.in_try, self.trying = True, trying
            self.try_ids = {s.seq_id for s in tried} if trying.mode == "sd" else None
            self.exploring = EXPLORE_STEPS - 1
            self.interval[trying.mode] = min(2 * self.interval[trying.mode], EXPLORE_MAX)
            return trying
        # Until speculation has been seen (by a try), its rates rest on the prior acceptance
        # alone: only measured choices may settle.
        known = [c for c in rates if self.seen(c.mode)]
        # a catch-up depends on the mode's draft, not on k: once per mode
        cost = {m: self.catch_up_cost(m, seqs) for m in {c.mode for c in known}}
        worth = {c: self.worth(rates[c], cost[c.mode]) for c in known}
        best, settled = max(known, key=worth.__getitem__), self.settled
        if (
            settled is None
            or settled not in worth
            or (self.dwell >= MIN_DWELL and worth[best] > worth[settled] * (1.0 + HYSTERESIS))
        ):
            self.settled, self.dwell = best, 0
            self.interval[best.mode] = EXPLORE_EVERY
        return self.settled

    def seen(self, mode: str) -> bool:
        """Whether ``mode`` may settle: SD and SSD once their rounds have been observed. AR
        needs none, and copies alone may settle on their prior acceptance: with no draft there
        is no catch-up to waste on a wrong prior, and their first rounds correct it. So may
        SSD with a fed worker, which catches up on cores of its own."""
        if mode in ("ar", "lookup") or (mode == "ssd" and self.feeds):
            return True
        return self.acceptance.rounds >= MIN_ROUNDS

    def worth(self, rate: float, cost: float) -> float:
        """``rate`` (tokens/s) net of the catch-up its draft needs first (``cost`` = C,
        seconds), over a horizon of T = SWITCH_HORIZON steps at the last step's time: the
        N = rate T tokens of the horizon take N / rate + C = T + C, so rate T / (T + C). A
        choice whose draft has missed the batch's context (SD after AR ran, new sequences) must
        repay that within the horizon; one whose draft is current is worth its rate."""
        if not cost:
            return rate
        horizon = SWITCH_HORIZON * self.step_s
        return rate * horizon / (horizon + cost)

    def catch_up_cost(self, mode: str, seqs: list[Sequence]) -> float:
        """Seconds the draft of ``mode`` takes to catch up on every token of ``seqs`` it has
        not seen, in one forward at the calibrated cost per token: where SSD shares the cores,
        its worker runs on the threads the target leaves it, so at that cost times the threads
        it was calibrated on over the worker's. Zero for AR and copies alone (no draft), and
        for SSD where its worker is fed (``feeds``): it reads on cores of its own, and a round
        for a sequence it is still reading gets the fast backup instead of waiting for it."""
        if mode in ("ar", "lookup") or not self.catch_up_s or (mode == "ssd" and self.feeds):
            return 0.0
        per_token = self.catch_up_s
        if mode == "ssd" and self.threads is not None:
            per_token *= self.threads.other / max(1, self.threads.other - self.threads.ssd)
        return per_token * sum(self.missed(s, mode) for s in seqs)

    def missed(self, seq: Sequence, mode: str = "sd") -> int:
        """Tokens of ``seq`` the draft of ``mode`` has not seen: that SD's in-process draft has
        no KV for, or that SSD's worker has not been sent."""
        if mode == "ssd" and self.ssd is not None:
            return self.ssd.unsent(seq)
        return len(seq) - 1 - self.sd.draft_ready(seq)

    def try_seqs(self, choice: Choice, seqs: list[Sequence]) -> list[Sequence]:
        """The sequences a try of ``choice`` drafts for: for SD the ``TRY_SEQS`` whose draft
        has missed the fewest tokens, for SSD (whose worker drafts for the batch) all."""
        if choice.mode != "sd" or len(seqs) <= TRY_SEQS:
            return seqs
        return sorted(seqs, key=self.missed)[:TRY_SEQS]

    def tried(self, seqs: list[Sequence]) -> list[Sequence]:
        """The sequences of ``seqs`` the running try drafts for."""
        if self.try_ids is None:
            return seqs
        return [s for s in seqs if s.seq_id in self.try_ids]

    def affords_try(self, choice: Choice, seqs: list[Sequence], steps: int) -> bool:
        """Whether ``steps`` more steps of a try of ``choice`` drafting for ``seqs`` keep the
        tries' share of the run within ``EXPLORE_BUDGET`` (:meth:`try_cost`)."""
        cost = self.try_cost(choice, seqs, steps)
        return self.try_s + cost <= EXPLORE_BUDGET * (self.run_s + cost)

    def try_cost(self, choice: Choice, seqs: list[Sequence], steps: int) -> float:
        """Predicted seconds of ``steps`` steps of a try drafting for ``seqs``: each at the
        last step's time (an SSD step where the cores are shared: at least its target's
        measured cost on the cores the worker leaves), plus the draft's catch-up on them."""
        step = self.step_s
        if choice.mode == "ssd" and self.threads is not None:
            m = len(seqs) * (self.k_max + 1)
            step = max(step, (self.ssd_target(m) or 0.0) + (self.other(m) or 0.0))
        return steps * step + self.catch_up_cost(choice.mode, seqs)

    def book(self, step_s: float) -> None:
        """A step of ``step_s`` seconds has run (part of a try or not)."""
        self.step_s = step_s
        self.run_s += step_s
        self.try_s += step_s if self.in_try else 0.0

    # ---- the Proposer interface ----------------------------------------------------------------

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        if self.ssd is not None:
            self.ssd.maintain()
        choice = self.choose(seqs)
        self.advance(choice)
        if self.feeds and choice.mode != "ssd" and self.ssd is not None:
            counts = self.ssd.feed(seqs)
            if counts is not None:
                self.acceptance.observe_counts(*counts)
        return self._proposal(choice, seqs, ks)

    def advance(self, choice: Choice) -> None:
        """Book one step under ``choice`` (a worker left idle is told so)."""
        leaving_ssd = self.choice is not None and self.choice.mode == "ssd" and choice.mode != "ssd"
        if leaving_ssd and self.ssd is not None:
            self.ssd.pause()
        self.choice = choice
        self.steps += 1
        self.dwell += 1
        self.counts[choice] = self.counts.get(choice, 0) + 1
        for mode in self.since:
            self.since[mode] = 0 if mode == choice.mode else self.since[mode] + 1

    def _proposal(self, choice: Choice, seqs: list[Sequence], ks: list[int]) -> Proposal:
        self._use_threads(choice.mode)
        if choice.mode == "ssd" and self.ssd is not None:
            return self.ssd.propose(seqs, ks)
        if choice.mode == "lookup" and self.copier is not None:
            return self.copier.propose(seqs, [min(k, choice.k) for k in ks])
        if choice.mode == "sd" and choice.k > 0:
            ks = [min(k, choice.k) for k in ks]
            if self.in_try and self.try_ids is not None:
                ks = [k if s.seq_id in self.try_ids else 0 for s, k in zip(seqs, ks, strict=True)]
            return self.sd.propose(seqs, ks)
        return Proposal.none(len(seqs), self.k_max)

    def observe(self, seqs: list[Sequence], target_s: float, positions: int) -> None:
        """Learn from the round just verified: its costs, every sequence's acceptance, and (an
        SSD step) the worker's cache outcomes."""
        latest = [(s, s.records[-1]) for s in seqs if s.records]
        records = [r for _, r in latest]
        # each record holds its share of the step, of the forward and of the proposing (SD's
        # drafting, SSD's wait)
        step_s = sum(r.step_s for r in records)
        self.book(step_s)
        ssd_step = self.choice is not None and self.choice.mode == "ssd"
        self._observe_costs(records, step_s, target_s, positions, ssd_step)
        for s, r in latest:
            if r.num_drafted and r.backup != "fast":
                seq_id = None if s.is_finished else s.seq_id
                observed = self.copies if r.mode == "lookup" else self.acceptance
                observed.observe(seq_id, r.num_drafted, r.num_accepted)
        if ssd_step and self.ssd is not None:
            self.ssd.observe(seqs, target_s, positions)

    def _observe_costs(
        self,
        records: list[RoundRecord],
        step_s: float,
        target_s: float,
        positions: int,
        ssd_step: bool,
    ) -> None:
        """The forward's cost (only when it scored these rounds alone: a prompt chunk in the
        same forward would blur it), the rest of the step, and the draft's steps."""
        if not records or positions != sum(r.num_drafted + 1 for r in records):
            return
        step = self.steps
        (self.ssd_target if ssd_step else self.target).observe(positions, target_s, step)
        draft_s = sum(r.draft_s for r in records)
        self.other.observe(positions, max(0.0, step_s - target_s - draft_s), step)
        k = max(r.num_drafted for r in records)
        if self.choice is not None and self.choice.mode == "sd" and k > 0:
            self.draft.observe(sum(1 for r in records if r.num_drafted), draft_s / k, step)

    def calibrate(self, probe: TargetProbe) -> None:
        """Time the target's forwards and the draft's steps at the batch sizes the engine can
        run, so the first choices are made on measured costs, not guesses."""
        sizes = [n for n in CALIBRATION_SEQS if n <= self.max_num_seqs]

        def timed(fn: Callable[[], float]) -> float:
            return min(fn() for _ in range(CALIBRATION_REPEATS))

        if self.ssd_target is not self.target:
            self._use_threads("ssd")
            for n in sizes:
                m = n * (self.k_max + 1)
                self.ssd_target.calibrate(m, timed(lambda n=n: probe(n, self.k_max + 1)))
        self._use_threads("sd")
        for n in sizes:
            for k in (0, self.k_max):
                m = n * (k + 1)
                self.target.calibrate(m, timed(lambda n=n, k=k: probe(n, k + 1)))
            self.draft.calibrate(n, timed(lambda n=n: time_forward(self.sd.runner, n, 1)))
        tokens = min(CATCH_UP_PROBE, self.sd.runner.num_slots)  # a tiny pool holds fewer
        self.catch_up_s = timed(lambda: time_forward(self.sd.runner, 1, tokens)) / tokens

    def _use_threads(self, mode: str) -> None:
        """Where the cores are shared: torch threads for an SSD step or for the others."""
        if self.threads is None:
            return
        want = self.threads.ssd if mode == "ssd" else self.threads.other
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def draft_ready(self, seq: Sequence) -> int | None:
        # SD's draft KV lives in the engine's blocks (SSD's in its worker's)
        return self.sd.draft_ready(seq)

    def preempted(self, seq: Sequence) -> None:
        self.sd.preempted(seq)
        if self.ssd is not None:
            self.ssd.preempted(seq)

    def release(self, seq: Sequence) -> None:
        self.sd.release(seq)
        self.acceptance.forget(seq.seq_id)
        self.copies.forget(seq.seq_id)
        if self.copier is not None:
            self.copier.release(seq)
        if self.ssd is not None:
            self.ssd.release(seq)

    def health(self) -> DraftHealth:
        # SD's draft cannot fail apart from the engine; SSD's worker can, leaving AR and SD
        return self.ssd.health() if self.ssd is not None else DraftHealth()

    def stats(self, batch: int) -> dict:
        out = dict(self.ssd.stats(batch)) if self.ssd is not None else {}
        out["auto"] = {
            "choice": None if self.choice is None else f"{self.choice.mode}:{self.choice.k}",
            "steps": {f"{c.mode}:{c.k}": n for c, n in sorted(self.counts.items(), key=str)},
            "rates": {f"{c.mode}:{c.k}": r for c, r in self.last_rates.items()},
        }
        return out

    def close(self, failed: bool = False) -> None:
        self.sd.close(failed)
        if self.ssd is not None:
            self.ssd.close(failed)
