"""The draft worker's speculation cache, in process: every prepared branch is exactly what the
draft would produce for that outcome's prefix, and outcomes are read back correctly."""

from __future__ import annotations

import pytest

from saguaro import LLM, SamplingParams
from saguaro.speculation import protocol as P
from saguaro.speculation.worker import DraftWorker


def make_worker(draft_dir, k, fanout, **kw) -> DraftWorker:
    cfg = P.WorkerConfig(
        draft_dir=str(draft_dir),
        k=k,
        fanout=fanout,
        budget=None,
        saguaro_c=1.0,
        top_m=64,
        max_model_len=256,
        max_num_seqs=4,
        block_size=16,
        dtype="float32",
        device="cpu",
        cpus=None,
        num_threads=None,
        seed=0,
    )
    for key, value in kw.items():
        setattr(cfg, key, value)
    return DraftWorker(cfg)


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


def test_outcomes_hit_and_miss(tiny_draft):
    k = 2
    worker = make_worker(tiny_draft, k, [2, 2, 2])
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [1, 2, 3, 4], new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    (kk, t), (branch, _) = next(iter(seq.cache.items()))
    committed = seq.spec[:kk] + [t]
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, committed)], backup="fast"))
    spec = reply.specs[0]
    assert spec.hit and spec.tokens == branch and spec.backup is None
    assert seq.token_ids == [1, 2, 3, 4] + committed
    worker.build_pending()
    # an outcome no branch prepared: (k=0, t=s_1), the drafted token is never a candidate
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, [seq.spec[0]])], backup="fast"))
    assert reply.specs[0].hit is False and reply.specs[0].backup == "fast"


def test_dropped_sequences_free_their_blocks(tiny_draft):
    worker = make_worker(tiny_draft, 2, [1, 1, 1])
    free = worker.bm.num_free_blocks
    worker.handle(P.RoundRequest([P.SeqUpdate(7, list(range(40)), new=True)]))
    worker.build_pending()
    assert worker.bm.num_free_blocks < free
    worker.handle(P.RoundRequest([], dropped=[7]))
    assert worker.bm.num_free_blocks == free and 7 not in worker.seqs


def test_tokens_committed_outside_a_round_are_a_miss(tiny_draft):
    """If the target commits more than one round's worth (rounds it ran without the worker),
    no branch may be used: each was sampled for one exact prefix."""
    k = 2
    worker = make_worker(tiny_draft, k, [3, 3, 3])
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [1, 2, 3, 4], new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    (kk, t), _ = next(iter(seq.cache.items()))
    extra = 5 if kk == 0 else seq.spec[0]
    committed = [extra] + seq.spec[:kk] + [t]  # one extra token ahead of the outcome
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, committed)], backup="neural"))
    assert reply.specs[0].hit is False
    assert seq.token_ids == [1, 2, 3, 4] + committed
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    assert reply.specs[0].tokens == reference.generate([seq.token_ids], greedy)[0].token_ids


def test_shallow_branches_are_the_drafts_first_tokens(tiny_draft):
    """A planned depth d < K caches d-token branches, each the draft's own continuation of its
    outcome's prefix, and a hit serves those d tokens."""
    k, fanout = 3, [2, 1, 1, 2]
    worker = make_worker(tiny_draft, k, fanout)
    worker.depth = 2
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
    assert not full.cut and {len(b) for b, _ in full.seqs[0].cache.values()} == {k}
    for stop_after, depth in ((0, 1), (1, 2)):  # polled before depths 2 and 3
        worker = built("auto", stop_after)
        seq = worker.seqs[0]
        assert worker.cut
        assert seq.cache.keys() == full.seqs[0].cache.keys()
        for key, (tokens, _) in seq.cache.items():
            assert tokens == full.seqs[0].cache[key][0][:depth]
        (kk, t), (branch, _) = next(iter(seq.cache.items()))
        reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, seq.spec[:kk] + [t])]))
        assert reply.cut and reply.specs[0].hit and reply.specs[0].tokens == branch
    fixed = built([2, 1, 1, 2], stop_after=0)
    assert not fixed.cut and {len(b) for b, _ in fixed.seqs[0].cache.values()} == {k}
