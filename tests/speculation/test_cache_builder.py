"""The speculation cache: every prepared branch is exactly what the draft would produce for that
outcome's prefix (in full, shallow or cut short), and outcomes are matched against it exactly."""

from __future__ import annotations

import time

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.core.query import token_slots
from saguaro.engine.block_manager import BlockManager
from saguaro.engine.model_runner import ModelRunner
from saguaro.sampling import SamplingParams as Params
from saguaro.speculation import cache_builder
from saguaro.speculation import protocol as P
from saguaro.speculation.cache_builder import (
    CATCH_UP_CHUNK,
    FIT,
    MAX_BUDGET,
    REPLAN_EVERY,
    SCRATCH_RUNS,
    CacheBuilder,
    DraftSeq,
    common_prefix,
    fanout_cap,
    kv_blocks,
    room,
)
from saguaro.speculation.ngram import Lookup
from saguaro.speculation.planner import MAX_SLOPE_FRACTION, PRIOR_SLOPE_FRACTION, Plan
from tests.speculation.workers import make_worker

K = 3
BLOCK = 4
BLOCK_16 = 16  # make_worker's KV block size


class Observations:
    """Stands in for the fan-out estimator: records what the builder reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int | None, int]] = []

    def observe(self, k: int, rank: int | None, K: int) -> None:
        self.seen.append((k, rank, K))


def worker_config(**kw) -> P.WorkerConfig:
    base = dict(
        draft_dir="unused",
        k=K,
        fanout=[2, 1, 1, 2],
        budget=None,
        saguaro_c=1.0,
        top_m=64,
        max_model_len=32,
        max_num_seqs=2,
        block_size=BLOCK,
        dtype="float32",
        quantization="none",
        head_tokens=0,
        kernels=False,
        device="cpu",
        cpus=None,
        num_threads=None,
        seed=0,
        compile=False,
    )
    return P.WorkerConfig(**{**base, **kw})


def speculated_seq(bm: BlockManager) -> DraftSeq:
    """Prompt 1..4 with the speculation s = 10, 11, 12 glued (draft KV up to index 7), branches
    cached for (1, 20) and (3, 40), and outcome 1's ranking [20, 21]."""
    seq = DraftSeq(0, [1, 2, 3, 4], Params(temperature=0), seed=0, coupled=False)
    bm.allocate(seq, 16)
    seq.spec, seq.computed, seq.written = [10, 11, 12], 3, 7
    seq.cache = {(1, 20): ([30, 31], None), (3, 40): ([41], None)}
    seq.ranked = [[5, 6], [20, 21], [7], [40]]
    return seq


@pytest.fixture
def builder() -> CacheBuilder:
    cfg = worker_config()
    bm = BlockManager(kv_blocks(cfg), BLOCK, enable_prefix_caching=False)
    out = CacheBuilder(cfg, runner=None, bm=bm, vocab_size=50)
    out.estimator = Observations()
    return out


@pytest.mark.parametrize(
    "committed, branch, seen, computed",
    [
        ([10, 20], ([30, 31], None), [(1, 0, K)], 5),  # a rejection at s_2, recovered to 20
        ([10, 11, 12, 40], ([41], None), [(3, 0, K)], 7),  # all accepted, bonus token 40
        ([10, 21], None, [(1, 1, K)], 5),  # ranked second, but only the first was built
        ([10, 22], None, [(1, None, K)], 5),  # not among the ranked candidates
        ([5, 10, 20], None, [], 4),  # one extra token ahead: not an outcome of the speculation
    ],
)
def test_an_outcome_is_matched_exactly(builder, committed, branch, seen, computed):
    seq = speculated_seq(builder.bm)
    assert builder.match_outcome(seq, committed) == branch
    assert builder.estimator.seen == seen
    assert seq.token_ids == [1, 2, 3, 4, *committed]
    # draft KV stays valid for the committed prefix that the glue wrote, never the last token
    assert seq.computed == computed
    assert seq.cache == {} and seq.ranked == []
    assert len(seq.block_table) == -(-len(seq.token_ids) // BLOCK)  # the scratch is released


@pytest.mark.parametrize(
    "feeds, verdicts, computed",
    [
        ([[10], [11, 12]], [None, (3, 3)], 6),  # the whole chain committed, over two steps
        ([[10], [11], [50]], [None, None, (3, 2)], 6),  # its third token rejected
        ([[50, 51]], [(3, 0)], 4),  # its first token rejected: KV up to the last committed one
        ([[10, 11, 12, 13]], [(3, 3)], 6),  # the steps went past the chain: it is settled
    ],
)
def test_a_shadow_chain_is_settled_by_the_tokens_committed_after_it(
    builder, feeds, verdicts, computed
):
    """A shadow chain 10, 11, 12 after 1..4 (draft KV written below index 6): each step's
    tokens keep it going while they agree with it and settle it as (drafted, accepted) where
    they leave it or cover it, keeping the KV of the tokens it shares with them."""
    seq = DraftSeq(0, [1, 2, 3, 4], Params(temperature=0), seed=0, coupled=False)
    builder.bm.allocate(seq, 16)
    seq.spec, seq.computed, seq.written = [10, 11, 12], 3, 6
    seq.shadow_len = 3
    assert [builder.absorb(seq, tokens) for tokens in feeds] == verdicts
    assert seq.token_ids == [1, 2, 3, 4, *(t for f in feeds for t in f)]
    assert seq.computed == computed and seq.spec == [] and seq.shadow_len == 0
    # without a chain, tokens are only committed
    assert builder.absorb(seq, [60]) is None and seq.token_ids[-1] == 60


def test_an_unranked_sequence_feeds_no_statistics(builder):
    seq = speculated_seq(builder.bm)
    seq.ranked = []  # a backup answered it and no build has ranked its candidates yet
    assert builder.match_outcome(seq, [10, 20]) == ([30, 31], None)
    assert builder.estimator.seen == []


def test_sizes_and_limits():
    cfg = worker_config()
    assert SCRATCH_RUNS > MAX_BUDGET + 1  # glue + every branch at full depth fit
    assert kv_blocks(cfg) == -(-(32 + SCRATCH_RUNS * K) // BLOCK) * 2
    assert fanout_cap(50) == 48
    seq = DraftSeq(0, list(range(30)), Params(), seed=0, coupled=False)
    assert room(seq, cfg) == 2  # context 32
    seq.token_ids = list(range(10))
    assert room(seq, cfg) == K
    seq.token_ids = list(range(33))
    assert room(seq, cfg) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_a_fixed_fanout_serves_shorter_rounds_with_its_bonus_entry_last(builder):
    assert builder.fanout(K) == [2, 1, 1, 2]
    assert builder.fanout(1) == [2, 2] and builder.fanout(0) == [2]
    assert not builder.planned and builder.budget == 6


def test_the_plan_is_remade_every_few_builds_and_when_the_batch_changes(monkeypatch):
    cfg = worker_config(fanout="auto")
    bm = BlockManager(kv_blocks(cfg), BLOCK, enable_prefix_caching=False)
    planner = CacheBuilder(cfg, runner=None, bm=bm, vocab_size=50)
    assert planner.planned
    planned_for: list[int] = []

    def plan_build(**kw):
        planned_for.append(kw["num_seqs"])
        return Plan(budget=3, depth=2, rate=1.0)

    monkeypatch.setattr(cache_builder, "plan_build", plan_build)
    planner._plan(1)
    assert planned_for == []  # no timings yet: nothing to plan from, and it keeps trying
    planner.costs.window.observe(2, 0.010)
    planner.costs.fixed.update(0.002)
    planner.costs.observe_depth(3, 0.003)
    planner._plan(1)
    assert planned_for == [1] and (planner.budget, planner.depth) == (3, 2)
    # what the plan saw, in ms: the window it planned against (FIT of the observed 10 ms at two
    # positions, the one size observed), the fixed part and a depth over the 3 branches chosen
    figures = planner.plan_figures
    assert figures["window_ms"] == pytest.approx([FIT * 10.0] * K)
    assert figures["fixed_ms"] == pytest.approx(2.0) and figures["rate"] == 1.0
    assert figures["depth_ms"] == pytest.approx(planner.costs.depth_s(3) * 1000.0)
    for _ in range(2 * REPLAN_EVERY):
        planner._plan(1)
    assert planned_for == [1, 1, 1]
    planner._plan(2)  # a sequence joined: planned at once
    planner._plan(2)
    assert planned_for == [1, 1, 1, 2]


@pytest.mark.parametrize("k, fanout", [(3, [2, 2, 1, 3]), (2, [1, 0, 4])])
def test_every_branch_equals_sequential_greedy_decoding(tiny_draft, k, fanout):
    worker = make_worker(tiny_draft, k, fanout)
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    prompts = [[5, 17, 99, 3, 42, 8, 61], [200, 1, 2, 3]]
    worker.handle(
        P.RoundRequest(
            [P.SeqUpdate(i, p, new=True) for i, p in enumerate(prompts)], backup="neural"
        )
    )
    worker.build_pending()
    for sid, prompt in enumerate(prompts):
        seq = worker.seqs[sid]
        # the neural first speculation is the draft's own greedy continuation
        assert seq.spec == reference.generate([prompt], greedy)[0].token_ids
        assert len(seq.cache) == sum(fanout[:k]) + fanout[k]
        for (kk, t), (tokens, q) in seq.cache.items():
            assert q is None  # greedy: point masses, nothing to ship
            if kk < k:
                assert t != seq.spec[kk]  # the drafted token is never a recovery candidate
            prefix = prompt + seq.spec[:kk] + [t]
            assert tokens == reference.generate([prefix], greedy)[0].token_ids, (kk, t)


def test_shallow_branches_are_the_drafts_first_tokens(tiny_draft):
    """A planned depth d < K caches d-token branches, each the draft's own continuation of its
    outcome's prefix, and a hit serves those d tokens."""
    k, fanout = 3, [2, 1, 1, 2]
    worker = make_worker(tiny_draft, k, fanout)
    worker.builder.depth = 2
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    prompt = [5, 17, 99, 3, 42, 8, 61]
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    assert len(seq.spec) == k  # the neural backup still drafts K
    assert len(seq.cache) == sum(fanout)
    for (kk, t), (tokens, _) in seq.cache.items():
        assert tokens == reference.generate([prompt + seq.spec[:kk] + [t]], greedy)[0].token_ids
    (kk, t), (branch, _) = next(iter(seq.cache.items()))
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])], backup="neural"))
    assert reply.specs[0].hit and reply.specs[0].tokens == branch and len(branch) == 2
    worker.build_pending()  # outcomes of a 2-token round: F_0, F_1 and the bonus F_K
    assert {kk for kk, _ in seq.cache} == {0, 1, 2}
    assert len(seq.cache) == fanout[0] + fanout[1] + fanout[k]


def glue_after_a_hit(worker, monkeypatch) -> tuple[DraftSeq, list[int], list]:
    """One round of a new sequence at depth 2, then the hit of its first cached branch: the
    sequence after the next build, the branch's tokens, and the token lists of that build's
    forwards (its glue first)."""
    worker.builder.depth = 2
    prompt = [5, 17, 99, 3, 42, 8, 61]
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    (kk, t), (branch, _) = next(iter(seq.cache.items()))
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])], backup="neural"))
    assert reply.specs[0].hit and reply.specs[0].tokens == branch and len(branch) == 2
    fed, forward = [], worker.runner.forward
    monkeypatch.setattr(
        worker.runner, "forward", lambda qs: fed.append([q.token_ids for q in qs]) or forward(qs)
    )
    worker.build_pending()
    return seq, branch, fed


def test_the_glue_after_a_hit_runs_only_what_the_branch_did_not(tiny_draft, monkeypatch):
    """On a hit the branch's draft KV for its first inputs (t, b_1) is copied where the glue
    would write it, and the glue over ``[t, b_1, b_2]`` runs ``b_2`` alone, its other rows the
    branch's: the cache it leads to is the one a full glue leads to (the draft's rows and KV
    agree to rounding: a branch's forward and the glue's differ in shape)."""
    k, fanout = 3, [2, 1, 1, 2]
    reused = make_worker(tiny_draft, k, fanout)
    seq, branch, fed = glue_after_a_hit(reused, monkeypatch)
    assert fed[0] == [[branch[1]]]  # the glue: b_2 alone
    with monkeypatch.context() as m:
        m.setattr(cache_builder, "MAX_KEPT_ROWS", 0)  # no build keeps rows: every glue is full
        full = make_worker(tiny_draft, k, fanout)
        full_seq, full_branch, full_fed = glue_after_a_hit(full, monkeypatch)
    assert full_branch == branch and full_fed[0] == [[seq.token_ids[-1], *branch]]
    assert seq.ranked == full_seq.ranked and seq.cache.keys() == full_seq.cache.keys()
    assert all(seq.cache[key][0] == full_seq.cache[key][0] for key in seq.cache)
    n = len(seq.token_ids)  # t, the last committed token, and b_1 have the copied KV
    slots = [token_slots(w.seqs[0].block_table, n - 1, n + 1, BLOCK_16) for w in (reused, full)]
    for pools, ref_pools in zip(reused.runner.kv_caches, full.runner.kv_caches, strict=True):
        for pool, ref in zip(pools, ref_pools, strict=True):
            torch.testing.assert_close(pool[slots[0]], ref[slots[1]], rtol=1e-4, atol=1e-4)


def test_budget_zero_builds_no_branches_but_still_ranks(tiny_draft):
    worker = make_worker(tiny_draft, 2, "auto", budget=0)
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [1, 2, 3, 4], new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    assert seq.cache == {} and len(seq.ranked) == 3 and all(seq.ranked)
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, [seq.spec[0], 7])], backup="neural"))
    assert reply.specs[0].hit is False and reply.specs[0].backup == "neural"


def test_a_build_cut_short_keeps_the_depths_decoded(tiny_draft):
    """When the target's next request rings during a planned build, branches keep the tokens
    decoded so far (each a prefix of what the full build caches), never fewer than one; a fan-out
    fixed by the user is built in full."""
    k = 3
    prompt = [5, 17, 99, 3, 42, 8, 61]

    def built(fanout, stop_after=None):
        worker = make_worker(tiny_draft, k, fanout)
        reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)]))
        assert reply.cut is False
        polls = iter(range(100))
        worker.build_pending(stop=None if stop_after is None else lambda: next(polls) >= stop_after)
        return worker

    full = built("auto")
    assert not full.builder.cut and {len(b) for b, _ in full.seqs[0].cache.values()} == {k}
    for stop_after, depth in ((0, 1), (1, 2)):  # polled before depths 2 and 3
        worker = built("auto", stop_after)
        seq = worker.seqs[0]
        assert worker.builder.cut
        assert seq.cache.keys() == full.seqs[0].cache.keys()
        for key, (tokens, _) in seq.cache.items():
            assert tokens == full.seqs[0].cache[key][0][:depth]
        (kk, t), (branch, _) = next(iter(seq.cache.items()))
        reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])]))
        assert reply.cut and reply.specs[0].hit and reply.specs[0].tokens == branch
    fixed = built([2, 1, 1, 2], stop_after=0)
    assert not fixed.builder.cut and {len(b) for b, _ in fixed.seqs[0].cache.values()} == {k}


@pytest.mark.parametrize("fanout", ["auto", [2, 1, 1, 2]])
@pytest.mark.parametrize("released_after", [0, 1, 2])
def test_a_build_whose_sequences_were_all_released_is_abandoned(tiny_draft, fanout, released_after):
    """Once the target has released every sequence of a build (polled before it and before each
    depth), the build stops, planned or fixed: what it decoded is never stored, and the figures
    the next reply reports stay the last finished build's."""
    prompt = [5, 17, 99, 3, 42, 8, 61]
    worker = make_worker(tiny_draft, K, fanout)
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="neural"))
    worker.build_pending()
    seq, b = worker.seqs[0], worker.builder
    figures = (b.glue_s, b.branch_s, b.build_s, b.cut)
    (kk, t), _ = next(iter(seq.cache.items()))
    worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])], backup="neural"))
    polls = iter(range(100))
    worker.build_pending(released=lambda: next(polls) >= released_after)
    assert seq.cache == {} and (b.glue_s, b.branch_s, b.build_s, b.cut) == figures
    assert next(polls) == released_after + 1  # no poll after the one that said released


def test_a_long_prompt_catches_up_a_chunk_a_build_while_the_target_rings(tiny_draft):
    """A new sequence more than CATCH_UP_CHUNK tokens ahead of its draft KV is answered by the
    fast backup (a neural one would read its whole prompt first), and a build the target's next
    request interrupts feeds the draft one chunk. A build that is left to run reads the rest and
    then builds its cache. Caught up, the neural backup and the cache are the draft's own greedy
    continuations, as after one long glue."""
    k = 3
    prompt = [(7 * i) % 199 + 1 for i in range(2 * CATCH_UP_CHUNK + 10)]
    worker = make_worker(tiny_draft, k, "auto")
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="neural"))
    assert reply.specs[0].backup == "fast"
    seq = worker.seqs[0]
    worker.build_pending(stop=lambda: True)  # rung: one chunk, then the build ends
    assert worker.builder.cut and seq.cache == {}
    assert seq.computed == seq.written == CATCH_UP_CHUNK
    context = [*prompt, 9]  # the target's round: its own token after the fast speculation
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, [9])], backup="neural"))
    assert reply.specs[0].backup == "fast" and seq.behind() > CATCH_UP_CHUNK
    worker.build_pending(stop=lambda: False)  # the rest of the prompt, then its cache
    assert not worker.builder.cut and seq.written == len(context) + len(seq.spec)
    assert seq.cache  # built for the outcomes of the fast speculation the target verifies
    for (kk, t), (tokens, _) in seq.cache.items():
        prefix = context + seq.spec[:kk] + [t]
        assert tokens == reference.generate([prefix], greedy)[0].token_ids, (kk, t)
    miss = next(x for x in range(1, 200) if (0, x) not in seq.cache)
    context += [miss]
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, [miss])], backup="neural"))
    assert reply.specs[0].backup == "neural"
    assert seq.spec == reference.generate([context], greedy)[0].token_ids
    worker.build_pending(stop=lambda: False)
    assert seq.cache
    for (kk, t), (tokens, _) in seq.cache.items():
        prefix = context + seq.spec[:kk] + [t]
        assert tokens == reference.generate([prefix], greedy)[0].token_ids, (kk, t)
    (kk, t), (branch, _) = max(seq.cache.items())  # the longest outcome
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])], backup="neural"))
    assert reply.specs[0].hit and reply.specs[0].tokens == branch


def test_a_sequence_catching_up_leaves_the_others_their_caches(tiny_draft):
    """A long prompt joining a batch catches up after the other sequences' caches are built:
    when the target rings, they keep their first depth, and it has read one chunk."""
    worker = make_worker(tiny_draft, 3, "auto")
    long = [(7 * i) % 199 + 1 for i in range(2 * CATCH_UP_CHUNK + 10)]
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [5, 17, 99, 3], new=True)], backup="neural"))
    worker.build_pending(stop=lambda: False)
    short = worker.seqs[0]
    miss = next(x for x in range(1, 200) if (0, x) not in short.cache)
    updates = [P.SeqUpdate(0, [miss]), P.SeqUpdate(1, long, new=True)]
    reply = worker.handle(P.RoundRequest(updates, backup="neural"))
    assert [s.backup for s in reply.specs] == ["neural", "fast"]
    worker.build_pending(stop=lambda: True)
    assert short.cache and {len(tokens) for tokens, _ in short.cache.values()} == {1}
    assert worker.seqs[1].cache == {} and worker.seqs[1].computed == CATCH_UP_CHUNK


def test_sequences_of_every_kind_built_together_get_what_they_get_alone(tiny_draft):
    """A depth draws the rows of all greedy, all coupled and all rejection-sampled sequences in
    one call per kind: each sequence's branches (tokens and q) are those it gets built alone.
    q agrees to rounding, not bit for bit: a forward over four sequences and one over a single
    sequence may sum in another order (the matrix library picks its path by shape and CPU)."""
    k, fanout = 3, [2, 1, 1, 2]
    kinds = [
        dict(params=SamplingParams(temperature=0.0)),
        dict(params=SamplingParams(temperature=0.9, top_p=0.8)),
        dict(params=SamplingParams(temperature=0.8), coupled=True),
        dict(params=SamplingParams(temperature=1.0, top_k=5)),
    ]
    prompts = [[5, 17, 99, 3], [200, 1, 2, 3, 4], [7, 7, 8], [42, 8, 61]]

    def build(ids):
        worker = make_worker(tiny_draft, k, fanout)
        updates = [P.SeqUpdate(i, prompts[i], new=True, seed=100 + i, **kinds[i]) for i in ids]
        worker.handle(P.RoundRequest(updates, backup="neural"))
        worker.build_pending()
        return {i: worker.seqs[i] for i in ids}

    together = build(range(len(kinds)))
    for i in range(len(kinds)):
        alone = build([i])[i]
        assert together[i].cache.keys() == alone.cache.keys() and alone.cache, kinds[i]
        for key, (tokens, q) in alone.cache.items():
            got_tokens, got_q = together[i].cache[key]
            assert got_tokens == tokens, (kinds[i], key)
            assert (q is None) == (got_q is None)
            if q is not None:
                assert torch.equal(got_q.ids, q.ids)
                torch.testing.assert_close(got_q.probs, q.probs, rtol=1e-5, atol=1e-6)


CAPTURE_S = 0.5  # each forward below "captures" for this long: far above a tiny draft's forward


def test_a_graph_captured_on_first_use_is_not_booked_as_drafting(tiny_draft, monkeypatch):
    """On a GPU the first forward of a bucket captures its graph. The planner's costs (a branch
    depth, a build's fixed part, a backup) are net of the capture: booked whole, one capture
    makes branches look dear, and the budget of 0 it leads to observes no branch again."""
    worker = make_worker(tiny_draft, 2, "auto")
    captured = {"s": 0.0}
    monkeypatch.setattr(ModelRunner, "capture_s", property(lambda self: captured["s"]))
    forward = worker.runner.forward

    def capturing(queries):
        time.sleep(CAPTURE_S)
        captured["s"] += CAPTURE_S
        return forward(queries)

    monkeypatch.setattr(worker.runner, "forward", capturing)
    prompts = [[5, 17, 99, 3, 42, 8, 61], [200, 1, 2, 3]]
    worker.handle(
        P.RoundRequest(
            [P.SeqUpdate(i, p, new=True) for i, p in enumerate(prompts)], backup="neural"
        )
    )
    worker.build_pending()
    costs = worker.builder.costs
    assert worker.builder.build_s > 3 * CAPTURE_S  # glue and two depths, each captured
    # Booked whole, each would be at least CAPTURE_S; half of it leaves room for a loaded
    # machine's slow sleeps and forwards (tens of ms on two busy cores).
    assert costs.depth_s(1) < CAPTURE_S / 2
    assert costs.fixed.value < CAPTURE_S / 2 and costs.backup.value < CAPTURE_S / 2


@pytest.mark.parametrize("stop_below", [0.0, 0.5])
def test_a_branch_is_what_a_backup_proposes_with_copies_and_stops(tiny_draft, stop_below):
    """Copies from the context and the confidence stop shape a cached branch as they shape a
    backup's chain: each branch's tokens are what a neural backup drafts for its outcome's
    prefix (a fresh worker's first speculation), some of them copies, some branches cut short."""
    k, fanout = 3, [2, 1, 1, 2]
    rules = dict(lookup=Lookup.of(1), stop_below=stop_below, max_num_seqs=8)
    worker = make_worker(tiny_draft, k, fanout, **rules)
    prompt = [5, 17, 99, 3, 42, 8, 61, 17, 99]
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    keys = list(seq.cache)
    fresh = make_worker(tiny_draft, k, fanout, **rules)
    updates = [
        P.SeqUpdate(i, prompt + seq.spec[:kk] + [t], new=True) for i, (kk, t) in enumerate(keys)
    ]
    fresh.handle(P.RoundRequest(updates, backup="neural"))
    branches = [seq.cache[key][0] for key in keys]
    assert branches == [fresh.seqs[i].spec for i in range(len(keys))]
    lookup = Lookup.of(1)
    copies = [
        tokens[d] == lookup.next_token(prompt + seq.spec[:kk] + [t] + tokens[:d])
        for (kk, t), tokens in zip(keys, branches, strict=True)
        for d in range(len(tokens))
    ]
    assert any(copies) and not all(copies)
    if stop_below:
        assert any(len(tokens) < k for tokens in branches)
    else:
        assert all(len(tokens) == k for tokens in branches)


def test_the_window_is_booked_at_the_positions_the_target_verified():
    """The target's window is spent verifying the last reply's speculations (each its tokens
    and one more), and a reply with a new sequence leaves no window: the target prefills its
    prompt in it."""
    cfg = worker_config(fanout="auto")
    bm = BlockManager(kv_blocks(cfg), BLOCK, enable_prefix_caching=False)
    planner = CacheBuilder(cfg, runner=None, bm=bm, vocab_size=50)
    planner.replied([P.SeqSpec(0, [7, 8], None, True, None), P.SeqSpec(1, [], None, False, None)])
    planner.observe_request(P.RoundRequest([], window_s=0.020))
    assert set(planner.costs.window.knots) == {4}
    planner.replied([P.SeqSpec(0, [7], None, True, None), P.SeqSpec(2, [], None, None, None)])
    planner.observe_request(P.RoundRequest([], window_s=3.0))  # seq 2's prompt, prefilled
    assert set(planner.costs.window.knots) == {4}
    assert planner.costs.window(4) == pytest.approx(0.020)


def test_the_depth_cost_prior_is_measured_at_start(tiny_draft, monkeypatch):
    """A planning worker times a depth over 1 and over PROBE_BRANCHES branches when it starts
    (the prior slope of its depth-cost line); a fixed fan-out plans nothing and skips it."""
    worker = make_worker(tiny_draft, 2, "auto")
    assert 0.0 <= worker.builder.costs.slope_fraction <= MAX_SLOPE_FRACTION
    builder = worker.builder
    monkeypatch.setattr(builder, "_probe_depth_s", lambda m: 0.010 + 0.005 * m)
    builder.calibrate()  # t(8) / t(1) = 0.05 / 0.015: f = (10 / 3 - 1) / (8 - 10 / 3) = 0.5
    assert builder.costs.slope_fraction == pytest.approx(0.5)
    fixed = make_worker(tiny_draft, 2, [1, 1, 1])
    assert fixed.builder.costs.slope_fraction == PRIOR_SLOPE_FRACTION


def test_a_glue_that_reads_a_prompt_is_not_a_builds_fixed_cost(tiny_draft):
    """The first build after a sequence joins reads its prompt in the glue pass: booked as the
    fixed part of every build, it would make caches look dear for dozens of rounds."""
    worker = make_worker(tiny_draft, 2, "auto")
    prompt = list(range(3, 3 + 40))  # under CATCH_UP_CHUNK: read by the glue, not caught up
    # fast: a neural backup would read the prompt itself, before the build
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)], backup="fast"))
    worker.build_pending()
    assert worker.builder.costs.fixed.value is None
    spec = worker.seqs[0].spec
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [*spec[:1], 9])], backup="neural"))
    worker.build_pending()
    assert worker.builder.costs.fixed.value is not None
