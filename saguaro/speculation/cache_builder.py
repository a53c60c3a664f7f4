"""The SSD draft worker's speculation cache: building it, and matching an outcome against it.

While the target verifies round T, :meth:`CacheBuilder.build` prepares round T + 1 for every
outcome ``(k, t)`` it guesses (docs/design.md §4):

- glue pass: one forward over ``[r, s_1..s_K]`` (plus any committed tokens the draft has not
  seen) writes the draft KV of the path that may be accepted and gives the draft's logits at
  every position 1..K+1;
- candidates: for outcome k < K, the top ``F_k`` draft tokens at position k+1 with ``s_{k+1}``
  excluded (a rejected token is never the recovery token); for k = K, the top ``F_K`` at K+1;
- branch decoding: every branch ``(k, t)`` extends ``prefix + s_1..s_k + t`` by d sampled
  tokens. All branches of all sequences decode together, one forward per depth. A branch sees
  the committed prefix, the glue tokens up to its fork point and its own earlier tokens, through
  a per-sequence mask; its KV goes to scratch slots past the glue while its RoPE positions
  continue its own path. Scratch is overwritten by the next glue pass.

B and d are planned online (:mod:`saguaro.speculation.planner`, docs/design.md §5) unless the
user fixed the fan-out or the budget. While planned online, a build is cut short when the
target's next request is already on its way (``stop``, checked before each depth after the
first): branches keep the depths decoded so far. A late cache would stall the target for the rest
of the build; a shallower one costs only tokens on a hit. An empty one would turn every outcome
into a miss, so the first depth always runs. A fan-out or budget fixed by the user is built in
full. Any build ends at once when the target has released every sequence it is for (the
requests finished or were aborted): nobody could read its caches. For the same reason as a cut,
a sequence more than ``CATCH_UP_CHUNK`` committed tokens ahead of its
draft KV (a new long prompt) is left out of the build and catches up after it, that many tokens
a forward, ``stop`` checked before each after the first; it gets no cache until it has (misses,
served by the fast backup: a neural one would read the rest of its context on the target's
time), and its cache is built in the same window where the window lasts (a prompt's first
round, while the target reads the prompt too).

:meth:`CacheBuilder.match_outcome` reads the target's committed tokens back as an outcome and
returns the branch prepared for it, if any.

Exactness of a hit: the branch for ``(k, t)`` was sampled, with its q rows recorded, given exactly
the prefix that the outcome commits; whether it is used depends only on the target's own
randomness. Every draft token, on a branch or in a backup, is drawn from the draft's top-M
distribution with the request's draft noise at that token's absolute position, so a hit
proposes what a backup would have. Saguaro sampling lowers q on the draft's top
``F_{i-1} + 1`` tokens at speculation position i (docs/design.md §6); the target verifies
against that same q. Under coupled sampling every draft token is the perturbed argmax of the
draft's distribution under the target's own noise at its position, and outcome k's candidates are
ranked by the same perturbed values (excluding s_{k+1}): speculation at T > 0 then works like
greedy speculation on perturbed logits, and nothing about q is shipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from saguaro.core.query import Query, token_slots
from saguaro.engine.block_manager import BlockManager
from saguaro.engine.model_runner import ForwardClock, ModelRunner
from saguaro.sampling import SamplingParams, SamplingTensors, SparseQ, propose, seed_tensor
from saguaro.sampling.coupled import propose_coupled, ranked_proposals
from saguaro.sampling.processors import Processors, RowsOf, process_draft_rows, process_rows
from saguaro.sampling.reduce import argmax_rows, top_probability_rows, topk_rows
from saguaro.speculation import protocol as P
from saguaro.speculation.fanout import FanoutEstimator
from saguaro.speculation.ngram import CopyIndex, Lookup
from saguaro.speculation.planner import BuildCosts, plan_build

MAX_BUDGET = 64  # the planner's largest B: branches per sequence the KV pool is sized for
MAX_RANK = 64  # candidates ranked per position for the fan-out statistics
FIT = 0.9  # plan the cache build against this fraction of the target's window (timing noise)
INITIAL_BUDGET = 8  # B until the planner has the timings to choose one
MS = 1000.0  # the plan's figures are reported in milliseconds
# The start-up probe of a branch depth's cost (CacheBuilder.calibrate): one branch and this many,
# each seeing this many keys, the fastest of this many timed tries after an untimed one (which
# may allocate, or capture a graph).
PROBE_BRANCHES = 8
PROBE_CONTEXT = 32
PROBE_TRIES = 2
# The plan's inputs (online timings, hit statistics) move little from one round to the next,
# while planning costs a sizeable part of a draft forward inside the build's window: plan on
# every REPLAN_EVERY-th build, and at once whenever the number of sequences changes.
REPLAN_EVERY = 4
# K-token runs of draft KV a sequence may hold past its context: the glue's speculation, d <= K
# scratch slots for each of up to MAX_BUDGET branches, and one spare.
SCRATCH_RUNS = MAX_BUDGET + 2
# Committed tokens the draft reads per forward while a sequence catches up (a new long prompt):
# a target whose next request comes meanwhile waits for at most one such forward, so it is kept
# near what one verification's window holds on a CPU core (docs/bench/draft).
CATCH_UP_CHUNK = 64

# A build keeps its branches' draft rows for the glue after a hit (Kept) while a depth has at
# most this many branch rows in all: a CPU's narrow caches. A GPU's wide ones keep none: a
# glue costs it little, and copying their rows would not.
MAX_KEPT_ROWS = 16

# A prepared branch: its tokens, and the exact q they were drawn from (None: point masses).
Branch = tuple[list[int], SparseQ | None]


@dataclass
class Kept:
    """What decoding one branch computed that the glue after its hit would compute again: the
    draft KV of its first inputs ``t, b_1, ..`` (at scratch ``slots``) and the draft's raw rows
    after each. The glue after a hit reads ``[t, b_1 .. b_m]``: given these for its first p
    tokens, it runs the rest only."""

    slots: np.ndarray  # [p] the scratch slots of the branch's first p inputs
    rows: torch.Tensor  # [p, V] the draft's raw logits after each


@dataclass
class BranchScratch:
    """Where one sequence's branches decode: branch j's token at depth i goes to scratch index
    ``base + j d + i`` (its slot ``keys[...]``) and sees the keys ``mask[j]`` marks, which each
    depth extends by that slot. The per-depth layout is a few small integer arrays, NumPy as a
    :class:`Query`'s are (docs/design.md §10); each depth's query shares them, so the mask's
    edits show in it."""

    base: int  # scratch index of branch 0's first token
    d: int  # slots per branch
    keys: np.ndarray  # key slot of every scratch index up to the last branch's end
    mask: np.ndarray  # [branches, keys]: what each branch sees so far
    fork: np.ndarray  # [branches]: each branch's outcome k (it follows s_1..s_k, t)

    def query(self, seq: DraftSeq, tokens: list[int], depth: int) -> Query:
        """The branches' forward at ``depth``, fed ``tokens`` (one per branch)."""
        nb = len(self.fork)
        own = self.base + np.arange(nb) * self.d + depth  # scratch index of this depth
        self.mask[np.arange(nb), own] = True
        return Query(
            token_ids=tokens,
            positions=len(seq.token_ids) + self.fork + depth,
            slots=self.keys[own],
            key_slots=self.keys,
            num_logits=nb,
            mask=self.mask,  # copied into the batch mask before the next edit
        )


@dataclass(eq=False)
class DraftSeq:
    """The worker's view of one sequence: its committed tokens, draft KV and speculation cache."""

    seq_id: int
    token_ids: list[int]
    params: SamplingParams
    seed: int
    coupled: bool  # this request's method: coupled sampling, or rejection sampling
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    computed: int = 0  # committed tokens with valid draft KV
    written: int = 0  # draft KV written for indices < written by the last glue / backup
    spec: list[int] = field(default_factory=list)  # speculation the target is verifying
    cache: dict[tuple[int, int], Branch] = field(default_factory=dict)
    ranked: list[list[int]] = field(default_factory=list)  # per outcome k: candidate ranking
    processors: Processors | None = None  # the request's, applied to the draft's rows too
    num_prompt: int = 0  # token_ids[num_prompt:] are generated (what the processors count)
    copies: CopyIndex | None = None  # its context's n-grams, made on first use
    # A shadow chain (protocol FEED): ``spec`` holds its tokens not yet settled, of the
    # ``shadow_len`` drafted; ``shadow_hits`` of them were committed so far. 0: none under way.
    shadow_len: int = 0
    shadow_hits: int = 0
    kept: dict[tuple[int, int], Kept] = field(default_factory=dict)  # by cached branch
    # A hit's branch KV and rows for the first tokens of the next glue's feed, which copies the
    # KV and computes the rest (CacheBuilder._glue). None: it computes all.
    prepared: Kept | None = None

    def behind(self) -> int:
        """Committed tokens without draft KV."""
        return len(self.token_ids) - self.computed

    def catching_up(self) -> bool:
        """Whether the draft is too far behind to build for this sequence or to back it up
        with the draft: it first reads the rest in ``CATCH_UP_CHUNK``-token forwards."""
        return self.behind() > CATCH_UP_CHUNK

    def copy_index(self, lookup: Lookup | None) -> CopyIndex | None:
        """Where ``lookup``'s rule copies from after this sequence's committed tokens (None: no
        lookup)."""
        if lookup is not None and self.copies is None:
            self.copies = lookup.index()
        return self.copies

    def processed(
        self, logits: torch.Tensor, drafts: list[int], first: int | None = None
    ) -> torch.Tensor:
        """The draft's rows [m, V] after the committed tokens, row j after
        ``drafts[:first + j]`` (``first`` None: one row after all of ``drafts``), processed as
        the target will process its rows there (the rows themselves without processors)."""
        generated = self.token_ids[self.num_prompt :]
        return process_draft_rows(logits, self.processors, generated, drafts, first)

    def rows_of(self, rows: range, prefixes: list[list[int]]) -> RowsOf:
        """Branch ``rows``, row j after the committed tokens and ``prefixes[j]``, to be
        processed as the target will process its row there."""
        assert self.processors is not None
        return RowsOf(self.processors, self.token_ids[self.num_prompt :], rows, prefixes)


class _Released(Exception):
    """The target released every sequence of the build under way (``CacheBuilder.build``)."""


@dataclass
class _Checks:
    """What a build polls between its forwards: ``stop`` (cut it short, keeping the depths
    decoded so far) and ``released`` (abandon it: nobody will read its caches)."""

    stop_when: Callable[[], bool] | None
    released: Callable[[], bool] | None

    def stop(self) -> bool:
        return self.stop_when is not None and self.stop_when()

    def abandon_if_released(self) -> None:
        if self.released is not None and self.released():
            raise _Released


@dataclass
class _BranchQ:
    """The q rows of one build's rejection-sampled branches (greedy and coupled branches are
    point masses: their tokens are all a hit needs): one SparseQ [branches, d, M] for them all,
    so that a depth's draws go in with one write, not two per sequence. Sequence i's branches
    are the rows from ``first[i]`` on, the sequences in the order their rows are drawn in."""

    q: SparseQ | None
    first: dict[int, int]

    def rows(self, i: int, n: int) -> SparseQ | None:
        """Sequence i's ``n`` branches' rows (None: not rejection-sampled)."""
        if self.q is None or i not in self.first:
            return None
        return self.q[self.first[i] : self.first[i] + n]


def kv_blocks(cfg: P.WorkerConfig) -> int:
    """Draft KV blocks for ``max_num_seqs`` sequences, each its full context plus
    ``SCRATCH_RUNS`` runs of K slots (ceil to whole blocks)."""
    per_seq = -(-(cfg.max_model_len + SCRATCH_RUNS * cfg.k) // cfg.block_size)
    return per_seq * cfg.max_num_seqs


def fanout_cap(vocab_size: int) -> int:
    """The most candidates one outcome may be given: V - 2. Once the rejected ``s_{k+1}`` is
    excluded V - 1 tokens remain, and one fewer keeps Saguaro sampling's lowered set (the F
    candidates plus the drafted token) short of the whole vocabulary."""
    return vocab_size - 2


def room(seq: DraftSeq, cfg: P.WorkerConfig) -> int:
    """Proposals that still fit in the context after the sequence's committed tokens."""
    return max(0, min(cfg.k, cfg.max_model_len - len(seq.token_ids)))


def draw_kind(seq: DraftSeq) -> str:
    """How a sequence's draft tokens are drawn: greedy, coupled or (rejection-)sampled."""
    return "greedy" if seq.params.greedy else "coupled" if seq.coupled else "sampled"


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CacheBuilder:
    """Plans, builds and reads back the speculation cache of every sequence (module docstring).

    Holds the fan-out statistics, the online build costs and the current plan (B, d); the draft
    model and its KV pool are the worker's, shared with the backups."""

    def __init__(
        self, cfg: P.WorkerConfig, runner: ModelRunner, bm: BlockManager, vocab_size: int
    ) -> None:
        self.cfg, self.runner, self.bm = cfg, runner, bm
        self.k = cfg.k
        self.vocab_size = vocab_size
        self.estimator = FanoutEstimator(cfg.k, max_rank=MAX_RANK)
        self.fixed = cfg.fanout if isinstance(cfg.fanout, list) else None
        # B and d are planned online (planner.py) unless the user fixed the fan-out or budget.
        self.planned = self.fixed is None and cfg.budget is None
        if self.fixed is not None:
            self.budget = sum(self.fixed)
        else:
            self.budget = INITIAL_BUDGET if cfg.budget is None else cfg.budget
        self.depth = self.k
        self.costs = BuildCosts()
        self._fanouts: dict[int, list[int]] = {}
        self.glue_s = self.branch_s = self.build_s = 0.0
        self.cut = False  # the last build stopped before its planned depth
        self.backup_kind = "neural"  # the target's choice for the last round's misses
        self.verify_s: float | None = None  # the target's last verification forward
        self._since_plan = 0  # builds since (B, d) were last planned
        self._plan_seqs = 0  # the number of sequences they were planned for
        self._replied_positions: int | None = None  # what the last reply gave the target
        # What the last plan saw and predicted, in milliseconds: the target's window W(d) for
        # d = 1..K (as planned against: FIT of it), the build's fixed part, one depth over the
        # chosen n B branches, and the predicted tokens a second per sequence.
        self.plan_figures: dict[str, float | list[float]] = {}

    # ---- fan-out and plan -------------------------------------------------------------------

    def fanout(self, m: int) -> list[int]:
        """F_0..F_m for a round speculating m tokens, at the current budget (memoised per plan).
        A fixed fan-out F_0..F_K serves shorter rounds with its bonus entry F_K last."""
        if m not in self._fanouts:
            if self.fixed is not None:
                self._fanouts[m] = self.fixed[:m] + [self.fixed[self.k]]
            else:
                mode = "geometric" if self.cfg.fanout == "geometric" else "empirical"
                cap = fanout_cap(self.vocab_size)
                self._fanouts[m] = self.estimator.allocate(self.budget, m, mode, cap=cap)
        return self._fanouts[m]

    def calibrate(self) -> None:
        """Measure the depth-cost line's prior (BuildCosts.calibrate): a depth over one branch
        and over ``PROBE_BRANCHES``. Writes KV only into the first blocks, which no sequence
        holds yet: call it before serving."""
        times = []
        for m in (1, PROBE_BRANCHES):
            self._probe_depth_s(m)
            times.append(min(self._probe_depth_s(m) for _ in range(PROBE_TRIES)))
        one, many = times
        if one > 0.0:  # a clock that read nothing leaves the prior as it was
            self.costs.calibrate(one, PROBE_BRANCHES, many)

    def _probe_depth_s(self, m: int) -> float:
        """Seconds of one forward shaped like a branch depth: m tokens at one position, each
        seeing ``PROBE_CONTEXT`` keys and itself."""
        blocks = -(-(PROBE_CONTEXT + m) // self.cfg.block_size)
        query = self.runner.fork_query(list(range(blocks)), PROBE_CONTEXT, [0] * m)
        clock = ForwardClock(self.runner)
        self.runner.forward([query])
        clock.stop()
        return clock.seconds()

    def observe_request(self, req: P.RoundRequest) -> None:
        """The target's timings and backup choice, as the next plan's inputs; its window was
        spent verifying what the last reply gave it."""
        if req.window_s and self._replied_positions:
            self.costs.window.observe(self._replied_positions, req.window_s)
        self.backup_kind, self.verify_s = req.backup, req.verify_s

    def replied(self, specs: list[P.SeqSpec]) -> None:
        """The target verifies these speculations next: each its tokens and one more. Unless
        a sequence is new: the target prefills its prompt in that window, which no steady round
        does (``hit`` None: nothing could be prepared for it)."""
        new = any(spec.hit is None for spec in specs)
        self._replied_positions = None if new else sum(len(spec.tokens) + 1 for spec in specs)

    def observe_backup(self, seconds: float) -> None:
        """Seconds a neural backup took this round (the cost of a miss)."""
        self.costs.backup.update(seconds)

    def _plan(self, num_seqs: int) -> None:
        """Choose B and d for the next build from the online costs and statistics (on every
        ``REPLAN_EVERY``-th build, or when ``num_seqs`` changed)."""
        if not self.planned:
            return
        self._since_plan += 1
        if num_seqs == self._plan_seqs and self._since_plan < REPLAN_EVERY:
            return
        observed = self.costs.window
        fixed = self.costs.fixed.value
        depth_s = self.costs.depth_s
        if (not observed.knots and not self.verify_s) or fixed is None or depth_s(1) is None:
            return

        def window_s(d: int) -> float:  # every sequence verifying d tokens and one more
            seconds = observed(num_seqs * (d + 1))
            return FIT * (seconds if seconds is not None else self.verify_s)

        self._since_plan, self._plan_seqs = 0, num_seqs
        backup_s = 0.0
        miss_tokens = 1.0  # a fast backup: the round commits the target's token, rarely more
        if self.backup_kind == "neural":
            backup_s = self.costs.backup.value or self.k * depth_s(num_seqs)
            miss_tokens = self.estimator.expected_tokens(self.k)
        cap = fanout_cap(self.vocab_size)
        plan = plan_build(
            window_s=window_s,
            fixed_s=fixed,
            depth_s=depth_s,
            hit_rates=self.estimator.hit_rates(MAX_BUDGET, self.depth, cap=cap),
            expected_tokens=[self.estimator.expected_tokens(d) for d in range(self.k + 1)],
            miss_tokens=miss_tokens,
            backup_s=backup_s,
            num_seqs=num_seqs,
            max_budget=MAX_BUDGET,
        )
        self.plan_figures = {
            "window_ms": [window_s(d) * MS for d in range(1, self.k + 1)],
            "fixed_ms": fixed * MS,
            "depth_ms": depth_s(num_seqs * max(plan.budget, 1)) * MS,
            "rate": plan.rate,
        }
        if (plan.budget, plan.depth) != (self.budget, self.depth):
            self.budget, self.depth = plan.budget, plan.depth
            self._fanouts = {}

    # ---- reading an outcome back ------------------------------------------------------------

    def match_outcome(self, seq: DraftSeq, new_tokens: list[int]) -> Branch | None:
        """Commit ``new_tokens`` to ``seq`` and return the branch cached for the outcome they
        spell, or None on a miss.

        An outcome of the speculation ``s_1..s_K`` commits ``s_1..s_k, t`` and is read as
        ``(k, t)``; it feeds the fan-out statistics with the rank of t among outcome k's
        candidates. The cache is cleared and the draft KV kept only where it is still valid."""
        k, t = len(new_tokens) - 1, new_tokens[-1]
        # Anything but an outcome of the speculation (the target also ran rounds without asking
        # us) can only be a miss: a branch is used only for the exact prefix it was sampled under.
        matched = common_prefix(new_tokens, seq.spec)
        outcome = k <= len(seq.spec) and matched >= k
        if outcome and seq.ranked:  # ranked[k] ranks the candidates for outcome k
            ranking = seq.ranked[k]
            rank = ranking.index(t) if t in ranking else None
            self.estimator.observe(k, rank, K=len(seq.spec))
        branch = seq.cache.get((k, t)) if outcome else None
        kept = seq.kept.get((k, t)) if branch is not None else None
        self._commit(seq, new_tokens, matched)
        seq.shadow_len = seq.shadow_hits = 0
        if kept is None or not self._prepare(seq, kept, len(branch[0])):
            self.bm.trim(seq, len(seq.token_ids))
        # else the branch's scratch keeps the KV the glue copies: the next outcome trims it
        return branch

    @staticmethod
    def _prepare(seq: DraftSeq, kept: Kept, m: int) -> bool:
        """On a hit of a branch of ``m`` tokens: whether the next glue, over ``[t, b_1 .. b_m]``,
        can take its first tokens from what the branch computed (``kept``: t must be the one
        committed token without draft KV); if so they become ``seq.prepared``.

        The draft only proposes: the rows and KV of a branch's forward, not the glue's, change
        no distribution the target samples (its own forward verifies every proposal)."""
        p = min(len(kept.rows), m)
        if seq.computed != len(seq.token_ids) - 1 or p == 0:
            return False
        seq.prepared = Kept(kept.slots[:p], kept.rows[:p])
        return True

    def _commit(self, seq: DraftSeq, new_tokens: list[int], matched: int) -> None:
        """Append ``new_tokens``, of which the first ``matched`` are the speculation's: the
        draft KV written for it (glue, backup or shadow chain) stays valid for r and those."""
        old_len = len(seq.token_ids)
        seq.token_ids.extend(new_tokens)
        seq.computed = min(seq.written, old_len + matched, len(seq.token_ids) - 1)
        seq.cache, seq.ranked, seq.kept, seq.prepared = {}, [], {}, None

    def absorb(self, seq: DraftSeq, new_tokens: list[int]) -> tuple[int, int] | None:
        """Commit tokens of steps the target ran without asking (protocol FEED). Where a shadow
        chain is under way they settle it: (drafted, accepted) once they leave it or cover it,
        accepted counting the chain's tokens committed in a row from its first; None while
        they agree with it and it goes on (its KV past them stays, for the tokens to come)."""
        matched = common_prefix(new_tokens, seq.spec)
        self._commit(seq, new_tokens, matched)
        if seq.shadow_len and matched == len(new_tokens) < len(seq.spec):
            seq.spec = seq.spec[matched:]
            seq.shadow_hits += matched
            return None
        verdict = (seq.shadow_len, seq.shadow_hits + matched) if seq.shadow_len else None
        seq.spec, seq.shadow_len, seq.shadow_hits = [], 0, 0
        self.bm.trim(seq, len(seq.token_ids))
        return verdict

    # ---- building (overlaps the target's verification) ---------------------------------------

    def build(
        self,
        seqs: list[DraftSeq],
        stop: Callable[[], bool] | None = None,
        released: Callable[[], bool] | None = None,
    ) -> None:
        """Plan, then glue, candidates and branch decoding for ``seqs``; ``stop`` (polled before
        each depth after the first) ends the build with the depths decoded so far. With ``stop``,
        sequences far behind catch up instead, after the others' caches. ``released`` (polled
        before the build and before each forward after the glue) says the target has released
        every sequence of ``seqs``: no cache of theirs can be read any more, so the build ends
        there, its figures (times, cut) left those of the last build that ran to its end."""
        checks = _Checks(stop, released)
        try:
            checks.abandon_if_released()
            t0 = time.perf_counter()
            self._plan(len(seqs))
            far = [s for s in seqs if s.catching_up()] if stop is not None else []
            if far:  # the others' caches first, then the catch-up in what is left of the window
                self._cache([s for s in seqs if not s.catching_up()], checks, t0)
                caught_up = self._catch_up(far, checks)
                self.cut = self.cut or not caught_up
                if caught_up and not checks.stop():
                    self._cache_caught_up(far, checks)
            else:
                self._cache(seqs, checks, t0)
        except _Released:
            return

    def _cache_caught_up(self, seqs: list[DraftSeq], checks: _Checks) -> None:
        """The caches of sequences that caught up within the window (a new prompt read while
        the target reads it too), so that their next round can hit instead of waiting a build.
        The build's figures stay those of the others' caches, the steady build the planner
        sizes; a cut of either counts."""
        figures = (self.glue_s, self.branch_s, self.build_s, self.cut)
        self._cache(seqs, checks, time.perf_counter())
        self.glue_s, self.branch_s, self.build_s = figures[:3]
        self.cut = self.cut or figures[3]

    def _cache(self, seqs: list[DraftSeq], checks: _Checks, t0: float) -> None:
        """Glue, candidates and branch decoding for ``seqs``, timed from ``t0`` (the build's
        start: its plan counts with the glue)."""
        if not seqs:
            self.glue_s = self.branch_s = self.build_s = 0.0
            self.cut = False
            return
        clock = ForwardClock(self.runner)
        # A glue that reads a prompt (more than a round's tokens unseen) is no steady build's.
        steady = all(seq.behind() <= self.k + 1 for seq in seqs)
        glue_logits = self._glue(seqs)
        t1 = time.perf_counter()
        branches: list[list[tuple[int, int]]] = []
        offset = 0
        for seq in seqs:
            m = len(seq.spec) + 1
            branches.append(self._candidates(seq, glue_logits[offset : offset + m]))
            offset += m
        depths_s, self.cut = self._decode_branches(seqs, branches, checks)
        t2 = time.perf_counter()
        clock.stop()
        self.glue_s, self.branch_s, self.build_s = t1 - t0, t2 - t1, t2 - t0
        if steady:
            self.costs.fixed.update(clock.seconds() - depths_s)

    def catch_up(self, seqs: list[DraftSeq], stop: Callable[[], bool]) -> bool:
        """:meth:`_catch_up` outside a build (protocol FEED): whether none is far behind."""
        return self._catch_up(seqs, _Checks(stop, None))

    def _catch_up(self, seqs: list[DraftSeq], checks: _Checks) -> bool:
        """Feed the committed tokens of sequences more than ``CATCH_UP_CHUNK`` behind to the
        draft, that many a forward, until none is or ``stop()`` holds (checked before each
        forward after the first, so that every build makes progress; the planner's costs and the
        build's reported times leave it out, as no steady build pays it). Returns whether none is
        behind."""
        chunks = 0
        while far := [s for s in seqs if s.catching_up()]:
            checks.abandon_if_released()
            if chunks and checks.stop():
                return False
            chunks += 1
            queries = []
            for seq in far:
                self.bm.allocate(seq, len(seq.token_ids) + self.k)
                end = seq.computed + CATCH_UP_CHUNK
                feed = seq.token_ids[seq.computed : end]
                queries.append(self.runner.sequence_query(seq.block_table, seq.computed, feed, 1))
                seq.computed = seq.written = end  # committed tokens: their KV stays valid
            self.runner.forward(queries)
        return True

    def _glue(self, seqs: list[DraftSeq]) -> torch.Tensor:
        """One forward over each sequence's unseen committed tokens and its speculation; the
        logits of ``r, s_1..s_K`` (len(spec) + 1 rows per sequence, in order). Where a hit's
        branch already computed the first p of them (``DraftSeq.prepared``), their draft KV is
        copied from the branch's scratch to their indices, the forward runs the rest, and its
        rows follow the branch's."""
        queries, prepared = [], []
        for seq in seqs:
            n = len(seq.token_ids)
            self.bm.allocate(seq, n + self.k)
            # No position past the context: the target cannot commit tokens there anyway.
            seq.spec = seq.spec[: room(seq, self.cfg)]
            feed = seq.token_ids[seq.computed :] + seq.spec
            rows = self._copy_prepared(seq) if len(feed) == len(seq.spec) + 1 else None
            p = 0 if rows is None else len(rows)
            prepared.append(rows)
            queries.append(
                self.runner.sequence_query(
                    seq.block_table, seq.computed + p, feed[p:], len(seq.spec) + 1 - p
                )
            )
            seq.written, seq.prepared = n + len(seq.spec), None
        logits = self.runner.forward(queries)
        if all(rows is None for rows in prepared):
            return logits
        out, offset = [], 0
        for query, rows in zip(queries, prepared, strict=True):
            ran = logits[offset : offset + query.num_logits]
            out.append(ran if rows is None else torch.cat([rows.to(ran), ran]))
            offset += query.num_logits
        return torch.cat(out)

    def _copy_prepared(self, seq: DraftSeq) -> torch.Tensor | None:
        """Copy the draft KV of ``seq.prepared``'s tokens (t, b_1 ..: the feed's first p, at
        most all but its last) from the branch's scratch to their indices; their rows."""
        kept = seq.prepared
        p = 0 if kept is None else min(len(kept.rows), len(seq.spec))
        if kept is None or p == 0:
            return None
        start, size = seq.computed, self.cfg.block_size
        dst = torch.as_tensor(token_slots(seq.block_table, start, start + p, size))
        src = torch.as_tensor(kept.slots[:p])
        dst, src = dst.to(self.runner.device), src.to(self.runner.device)
        for pools in self.runner.kv_caches:
            for pool in pools:
                pool[dst] = pool[src]  # the gather copies first: the two may overlap
        return kept.rows[:p]

    def _candidates(self, seq: DraftSeq, rows: torch.Tensor) -> list[tuple[int, int]]:
        """Rank every outcome's candidates from the glue logits ``rows`` (stored in
        ``seq.ranked`` for the statistics) and return the branches ``(k, t)`` to decode: the
        top ``F_k`` of each ranking."""
        m = len(rows)
        if seq.processors is not None:  # row k follows s_1..s_k: the target's row there
            rows = seq.processed(rows, seq.spec, first=0)
        # One more than MAX_RANK: outcome k < K drops the rejected s_{k+1} from its ranking.
        width = min(MAX_RANK + 1, self.vocab_size)
        if seq.coupled and not seq.params.greedy:
            # outcome k's token is the target's perturbed argmax at position n + k: rank
            # the draft's candidates under the same noise
            st = SamplingTensors.from_params([seq.params] * m)
            positions = len(seq.token_ids) + torch.arange(m)
            seeds = seed_tensor([seq.seed] * m)
            top = ranked_proposals(rows, st, seeds, positions, width)[:, :width].tolist()
        else:
            top = topk_rows(rows, width)[1].tolist()
        fanout = self.fanout(m - 1)
        seq.ranked, branches = [], []
        for k in range(m):
            excluded = seq.spec[k] if k < len(seq.spec) else None
            ranking = [t for t in self._copy_first(seq, k, top[k]) if t != excluded][:MAX_RANK]
            seq.ranked.append(ranking)
            branches.extend((k, t) for t in ranking[: fanout[k]])
        # A branch forked after the whole speculation decodes up to position
        # n + len(spec) + depth - 1: near the end of the context, build nothing (every
        # outcome then misses and the backup speculates what still fits).
        if len(seq.token_ids) + len(seq.spec) + self.depth > self.cfg.max_model_len:
            return []
        return branches

    def _copy_first(self, seq: DraftSeq, k: int, top: list[int]) -> list[int]:
        """``top`` with the token the chains' lookup would copy after ``s_1..s_k`` first: where
        the context recurs, the target's own next token is that copy more often than it is
        the draft's favourite (docs/bench/draft)."""
        copies = seq.copy_index(self.cfg.lookup)
        copy = None if copies is None else copies.next_token(seq.token_ids, seq.spec[:k])
        return top if copy is None else [copy, *(t for t in top if t != copy)]

    def _decode_branches(
        self,
        seqs: list[DraftSeq],
        branches: list[list[tuple[int, int]]],
        checks: _Checks,
    ) -> tuple[float, bool]:
        """Decode every branch for d = ``self.depth`` tokens (at least 1 once ``stop()``), one
        forward per depth; store them. Returns the depths' seconds and whether ``stop()`` cut.

        Cutting is exact: a branch's first j tokens are sampled exactly as a j-token branch's
        would be, and where the cut falls depends only on the target's timing."""
        d, fanout = self.depth, self.fanout(self.depth)
        live = [i for i, b in enumerate(branches) if b]
        if not live:
            return 0.0, False
        scratch = {i: self._scratch(seqs[i], branches[i]) for i in live}
        tokens = {i: [t for _, t in branches[i]] for i in live}
        out_tokens: dict[int, list[list[int]]] = {i: [[] for _ in branches[i]] for i in live}
        out_q = self._branch_q(seqs, branches, live)
        forks = {i: scratch[i].fork for i in live}
        num_branches = sum(len(branches[i]) for i in live)
        depths_s, done = 0.0, d
        stops = {i: [d] * len(branches[i]) for i in live}  # a branch's tokens end there
        kept: list[torch.Tensor] | None = [] if num_branches <= MAX_KEPT_ROWS else None
        for depth in range(d):
            checks.abandon_if_released()
            if depth and checks.stop():
                done = depth
                break
            clock = ForwardClock(self.runner)
            queries = [scratch[i].query(seqs[i], tokens[i], depth) for i in live]
            raw = self.runner.forward(queries)
            kept = None if kept is None else [*kept, raw.clone()]  # raw's buffer is reused
            logits = self._processed(seqs, branches, out_tokens, raw)
            drawn = self._draw(seqs, branches, forks, logits, depth, fanout[depth], out_q)
            copied = self._copy(seqs, branches, out_tokens, drawn, depth, out_q)
            if self.cfg.stop_below and depth:
                self._stop(branches, logits, copied, depth, stops)
            for i in live:
                _extend(out_tokens[i], drawn[i])
                tokens[i] = drawn[i]
            clock.stop()
            self.costs.observe_depth(num_branches, seconds := clock.seconds())
            depths_s += seconds
        ends = {i: [min(done, stop_at) for stop_at in stops[i]] for i in live}
        for i in live:
            self._store(seqs[i], branches[i], out_tokens[i], out_q.rows(i, len(ends[i])), ends[i])
        if kept is not None:
            _keep(seqs, branches, scratch, kept, ends)
        return depths_s, done < d

    @staticmethod
    def _store(
        seq: DraftSeq,
        branches: list[tuple[int, int]],
        tokens: list[list[int]],
        q: SparseQ | None,
        ends: list[int],
    ) -> None:
        """Put ``seq``'s decoded branches in its cache: branch j's first ``ends[j]`` tokens
        (the depth reached, or where it stopped) and what each was drawn from (``q[j]``)."""
        for j, key in enumerate(branches):
            end = ends[j]
            seq.cache[key] = (tokens[j][:end], None if q is None else q[j, :end].clone())

    def _scratch(self, seq: DraftSeq, branches: list[tuple[int, int]]) -> BranchScratch:
        """Slots and mask for ``seq``'s branches: scratch starts after the longest possible
        glue (K + 1 positions past the committed tokens), each branch owning d slots."""
        d, nb, n = self.depth, len(branches), len(seq.token_ids)
        base = n + self.k
        self.bm.allocate(seq, base + nb * d)
        keys = token_slots(seq.block_table, 0, base + nb * d, self.cfg.block_size)
        fork = np.array([k for k, _ in branches], dtype=np.int64)
        mask = np.zeros((nb, base + nb * d), dtype=bool)
        mask[:, :n] = True
        mask[:, n : n + len(seq.spec)] = np.arange(len(seq.spec)) < fork[:, None]
        return BranchScratch(base, d, keys, mask, fork)

    def _branch_q(
        self, seqs: list[DraftSeq], branches: list[list[tuple[int, int]]], live: list[int]
    ) -> _BranchQ:
        """The q rows to fill for the rejection-sampled sequences' branches, in the order of
        ``live``: the order :meth:`_draw` draws their rows in."""
        width, d = min(self.cfg.top_m, self.vocab_size), self.depth
        first, rows = {}, 0
        for i in live:
            if draw_kind(seqs[i]) == "sampled":
                first[i], rows = rows, rows + len(branches[i])
        if not first:
            return _BranchQ(None, first)
        return _BranchQ(SparseQ.point_mass(torch.zeros(rows, d, dtype=torch.long), width), first)

    def _copy(
        self,
        seqs: list[DraftSeq],
        branches: list[list[tuple[int, int]]],
        out_tokens: dict[int, list[list[int]]],
        drawn: dict[int, list[int]],
        depth: int,
        out_q: _BranchQ,
    ) -> set[tuple[int, int]]:
        """Where a branch's context (the committed tokens, the speculation up to its fork, its
        outcome token and its own tokens so far) ends in an n-gram that occurred before, the
        token that followed it replaces the drawn one, a point mass in its q: the rule of the
        draft's chains in a backup (saguaro.speculation.sd.decode_chains), so that a hit proposes
        what a backup would have. Returns the (sequence, branch) pairs copied."""
        copied: set[tuple[int, int]] = set()
        for i, tokens in drawn.items():
            seq = seqs[i]
            if (copies := seq.copy_index(self.cfg.lookup)) is None:
                continue
            rows, made = [], []
            for j, ((k, t), so_far) in enumerate(zip(branches[i], out_tokens[i], strict=True)):
                copy = copies.next_token(seq.token_ids, seq.spec[:k] + [t] + so_far)
                if copy is not None:
                    tokens[j] = copy
                    copied.add((i, j))
                    rows.append(j)
                    made.append(copy)
            if rows and (q := out_q.q) is not None and i in out_q.first:
                at = torch.tensor([out_q.first[i] + j for j in rows])
                mass = SparseQ.point_mass(torch.tensor(made), q.width)
                q.ids[at, depth], q.probs[at, depth] = mass.ids, mass.probs
        return copied

    def _stop(
        self,
        branches: list[list[tuple[int, int]]],
        logits: torch.Tensor,
        copied: set[tuple[int, int]],
        depth: int,
        stops: dict[int, list[int]],
    ) -> None:
        """Branches whose drawn token at ``depth`` (not a copy) comes from a draft row giving its
        likeliest token less than ``stop_below`` end before it: the rule of SD's chains and of
        backups (saguaro.speculation.sd.decode_chains), so that a hit proposes what they would."""
        sure, r = top_probability_rows(logits), 0
        for i, ends in stops.items():
            for j in range(len(branches[i])):
                if sure[r + j] < self.cfg.stop_below and (i, j) not in copied:
                    ends[j] = min(ends[j], depth)
            r += len(branches[i])

    @staticmethod
    def _processed(
        seqs: list[DraftSeq],
        branches: list[list[tuple[int, int]]],
        out_tokens: dict[int, list[list[int]]],
        logits: torch.Tensor,
    ) -> torch.Tensor:
        """One depth's branch rows (in ``out_tokens``' order of sequences), each processed as
        the target will process it: after the speculation up to its fork, its outcome token and
        what the branch drew so far."""
        jobs, r = [], 0
        for i, drawn in out_tokens.items():
            if seqs[i].processors is not None:
                spec = seqs[i].spec
                prefixes = [
                    spec[:k] + [t] + so_far
                    for (k, t), so_far in zip(branches[i], drawn, strict=True)
                ]
                jobs.append(seqs[i].rows_of(range(r, r + len(prefixes)), prefixes))
            r += len(drawn)
        return process_rows(logits.float().clone(), jobs) if jobs else logits

    def _draw(
        self,
        seqs: list[DraftSeq],
        branches: list[list[tuple[int, int]]],
        forks: dict[int, np.ndarray],
        logits: torch.Tensor,
        depth: int,
        fanout: int,
        out_q: _BranchQ,
    ) -> dict[int, list[int]]:
        """Each sequence's next branch tokens from one depth's logits (rows in the order of
        ``forks``' sequences, ``len(branches[i])`` each); the rejection-sampled sequences' q go
        into ``out_q`` at this depth (their rows there are theirs here, in the same order).

        The rows of every sequence of one kind (greedy, coupled, rejection-sampled) are drawn in
        one call. Each rule works row by row: a row's token (and q) depends only on its logits,
        its request's settings and seed, and its position, never on the other rows, so drawing
        them together gives every sequence exactly the tokens it would get alone."""
        spans, offset = {}, 0
        for i in forks:
            spans[i] = (offset, offset + len(branches[i]))
            offset += len(branches[i])
        out: dict[int, list[int]] = {}
        for group in ("greedy", "coupled", "sampled"):
            members = [i for i in forks if draw_kind(seqs[i]) == group]
            if not members:
                continue
            if len(members) == len(forks):
                rows = logits
            else:
                rows = logits[torch.tensor([r for i in members for r in range(*spans[i])])]
            if group == "greedy":
                drawn, q = argmax_rows(rows), None
            else:
                rows_of = [(seqs[i], len(branches[i]), forks[i]) for i in members]
                drawn, q = self._sample(rows_of, rows, depth, fanout, group == "coupled")
            if q is not None:  # the rejection-sampled group: every row of out_q
                assert out_q.q is not None
                out_q.q.ids[:, depth], out_q.q.probs[:, depth] = q.ids, q.probs
            start, drawn_list = 0, drawn.tolist()
            for i in members:
                end = start + len(branches[i])
                out[i] = drawn_list[start:end]
                start = end
        return out

    def _sample(
        self,
        rows_of: list[tuple[DraftSeq, int, np.ndarray]],
        rows: torch.Tensor,
        depth: int,
        fanout: int,
        coupled: bool,
    ) -> tuple[torch.Tensor, SparseQ | None]:
        """Branch tokens at ``depth`` from ``rows``, whose sequences' rows come in the order of
        ``rows_of`` (a sequence, its number of branches, their forks): the perturbed argmax of
        coupled sampling (no q: point masses), or a draw from the draft's top-M with Saguaro
        sampling's q, at the request's seed and the drawn token's position."""
        params, seeds, positions = [], [], []
        for seq, nb, fork in rows_of:
            params += [seq.params] * nb
            seeds += [seq.seed] * nb
            # the token drawn here lands right after the branch's input token
            positions.append(len(seq.token_ids) + fork + depth + 1)
        st, at = SamplingTensors.from_params(params), torch.from_numpy(np.concatenate(positions))
        if coupled:
            drawn, _ = propose_coupled(rows, st, seed_tensor(seeds), at, self.cfg.top_m)
            return drawn, None
        top_m, c = self.cfg.top_m, self.cfg.saguaro_c
        return propose(rows, st, seed_tensor(seeds), at, top_m, fanout, c)


def _extend(rows: list[list[int]], drawn: list[int]) -> None:
    """Append one depth's drawn token to each branch's tokens."""
    for row, token in zip(rows, drawn, strict=True):
        row.append(token)


def _keep(
    seqs: list[DraftSeq],
    branches: list[list[tuple[int, int]]],
    scratch: dict[int, BranchScratch],
    depth_rows: list[torch.Tensor],
    ends: dict[int, list[int]],
) -> None:
    """Keep, for the glue after a hit (:meth:`CacheBuilder._glue`), each branch's draft KV
    slots and raw rows of its first ``ends[i][j]`` inputs. ``depth_rows[depth]`` holds a depth's
    branch rows, sequence by sequence in the order of ``ends``."""
    first = 0
    for i, seq_ends in ends.items():
        seq, at = seqs[i], scratch[i]
        for j, key in enumerate(branches[i]):
            n = seq_ends[j]
            if n:
                index = at.base + j * at.d + np.arange(n)
                rows = torch.stack([depth_rows[depth][first + j] for depth in range(n)])
                seq.kept[key] = Kept(at.keys[index], rows)
        first += len(branches[i])
