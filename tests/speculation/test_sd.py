"""Synchronous speculative decoding is exact: greedy equality with AR, and the sampled output
distribution equals the target's (total-variation test against exact enumeration)."""

from __future__ import annotations

import itertools

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.kernels import transfer
from saguaro.speculation import ngram, sd
from saguaro.speculation.lookup import LookupProposer
from tests.conftest import (
    FIRST_TWO_SAMPLES,
    PROMPTS,
    SMALL_VOCAB,
    exact_first_two,
    first_two_tokens,
)
from tests.stats import assert_first_two_follow


@pytest.fixture(scope="module")
def ar_reference(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    return {p: o for p, o in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True)}


def sd_engine(target, draft, k: int, **engine) -> LLM:
    """An SD engine for the greedy tests; ``engine``: more EngineConfig fields."""
    return LLM(
        model=str(target),
        draft=str(draft),
        mode="sd",
        num_speculative_tokens=k,
        max_model_len=256,
        max_num_seqs=8,
        **engine,
    )


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("which_draft", ["close", "random"])
def test_greedy_sd_equals_ar(tiny_llama, tiny_draft, close_draft, ar_reference, k, which_draft):
    llm = sd_engine(tiny_llama, close_draft if which_draft == "close" else tiny_draft, k)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for batch in range(1, 9):
        outs = llm.generate(PROMPTS[:batch], params)
        for prompt, out in zip(PROMPTS, outs, strict=False):
            assert out.token_ids == ar_reference[prompt].token_ids, (k, batch, prompt)
    if which_draft == "close":
        assert llm.last_run["mean_accepted_length"] > 1.3


def test_greedy_sd_with_a_bfloat16_draft_equals_ar(tiny_llama, close_draft, ar_reference):
    """The draft's precision changes what it proposes, never what the target commits."""
    llm = sd_engine(tiny_llama, close_draft, 3, draft_dtype="bfloat16", draft_quantization="none")
    assert llm.engine.proposer.runner.model.lm_head.weight.dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [ar_reference[p].token_ids for p in PROMPTS]
    assert llm.last_run["mean_accepted_length"] > 1.3


@pytest.mark.parametrize(
    "dtype, quantization", [("bfloat16", "none"), ("float32", "int4"), ("bfloat16", "int4-g64")]
)
def test_greedy_sd_equals_ar_in_every_precision(tiny_llama, close_draft, dtype, quantization):
    """On saguaro's kernels a verified token's logits are AR's bits in any precision; the draft
    quantized on its own (int8) changes only what it proposes."""
    engine = dict(dtype=dtype, quantization=quantization)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ar = LLM(model=str(tiny_llama), max_model_len=256, **engine).generate(PROMPTS, params)
    llm = sd_engine(tiny_llama, close_draft, 3, draft_quantization="int8", **engine)
    assert llm.engine.proposer.runner.model.lm_head.fmt == "q8"
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    assert llm.last_run["mean_accepted_length"] > 1.3


def test_greedy_sd_stops_like_ar(tiny_llama, close_draft, ar_reference, tmp_path):
    """Stop strings, stop ids and EOS inside an accepted run end the request at that token."""
    ref = ar_reference[PROMPTS[0]]
    stop_tok = ref.token_ids[7]
    stop_str = ref.text[10:12]
    for params in (
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_tok]),
        SamplingParams(temperature=0, max_tokens=40, stop=[stop_str]),
        SamplingParams(temperature=0, max_tokens=13, ignore_eos=True),
    ):
        ar = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS, params)
        sd = LLM(
            model=str(tiny_llama),
            draft=str(close_draft),
            mode="sd",
            num_speculative_tokens=5,
            max_model_len=256,
        ).generate(PROMPTS, params)
        for a, s in zip(ar, sd, strict=True):
            assert (a.token_ids, a.text, a.finish_reason) == (s.token_ids, s.text, s.finish_reason)


def test_sd_near_max_model_len_shrinks_rounds(tiny_llama, close_draft):
    params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    ar = LLM(model=str(tiny_llama), max_model_len=40).generate(PROMPTS[:3], params)
    sd = LLM(
        model=str(tiny_llama),
        draft=str(close_draft),
        mode="sd",
        num_speculative_tokens=8,
        max_model_len=40,
    ).generate(PROMPTS[:3], params)
    for a, s in zip(ar, sd, strict=True):
        assert a.token_ids == s.token_ids and s.finish_reason == "length"


def test_sd_under_preemption_recomputes_draft_kv_from_the_prefix_hit(tiny_llama, close_draft):
    """Preempted sequences lose their blocks, draft KV included: the proposer is told, restarts
    the draft from the prefix-cache hit, and keeps proposing as well as without preemption (stale
    draft KV would still be exact, but would propose from garbage and accept far less)."""
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    kw = dict(model=str(tiny_llama), draft=str(close_draft), mode="sd", max_model_len=128)
    roomy = LLM(**kw).generate(PROMPTS[:4], params)
    # 8 blocks of 16 = one full-length sequence (with K slots): four growing sequences preempt.
    tight = LLM(**kw, num_kv_blocks=8, block_size=16)
    told = []
    proposer = tight.engine.proposer
    preempted = proposer.preempted
    proposer.preempted = lambda seq: (told.append(seq.seq_id), preempted(seq))
    got = tight.generate(PROMPTS[:4], params)
    assert tight.snapshot().num_preemptions == len(told) > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in roomy]
    accepted = [sum(r.num_accepted for r in o.records) for o in (*roomy, *got)]
    assert sum(accepted[4:]) >= 0.9 * sum(accepted[:4]) > 0
    assert proposer.computed == {} and tight.snapshot().kv_blocks_free == 8


def count_lookups(monkeypatch) -> dict[bool, int]:
    """Counts, from now on, the chains' lookups that found a token to copy (True) or none."""
    found = {True: 0, False: 0}
    real = ngram.CopyIndex.next_token

    def spy(self, committed, tail=()):
        t = real(self, committed, tail)
        found[t is not None] += 1
        return t

    monkeypatch.setattr(ngram.CopyIndex, "next_token", spy)
    return found


def test_greedy_sd_with_context_copies_equals_ar(
    tiny_llama, close_draft, ar_reference, monkeypatch
):
    """One-token n-grams recur often: most depths copy from the context, the draft runs only at
    the others (one forward a depth for a lone sequence), and the text is AR's."""
    found = count_lookups(monkeypatch)
    forwards = []
    forward = sd.Drafted.forward
    monkeypatch.setattr(sd.Drafted, "forward", lambda *a: (forwards.append(1), forward(*a))[1])
    llm = sd_engine(tiny_llama, close_draft, 4, draft_lookup=1)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS[:4]:
        assert llm.generate([prompt], params)[0].token_ids == ar_reference[prompt].token_ids
    assert found[True] > 0 and found[False] > 0
    assert len(forwards) == found[False]


def test_greedy_sd_with_copies_alone_equals_ar(tiny_llama, ar_reference, monkeypatch):
    """draft="lookup": no draft model is loaded, every proposal is a copy from the context (a
    chain of them, up to K), rounds without one verify no proposal, and the text is AR's."""
    chains = []  # (copies made, k asked)
    chain = ngram.CopyIndex.chain

    def spy(self, committed, k):
        made = chain(self, committed, k)
        chains.append((len(made), k))
        return made

    monkeypatch.setattr(ngram.CopyIndex, "chain", spy)
    llm = LLM(
        model=str(tiny_llama), draft="lookup", num_speculative_tokens=4, copy_lookup=1,
        max_model_len=256, max_num_seqs=8,
    )  # fmt: skip
    assert isinstance(llm.engine.proposer, LookupProposer) and llm.engine.draft_dir is None
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for batch in (1, 3, 8):
        outs = llm.generate(PROMPTS[:batch], params)
        assert [o.token_ids for o in outs] == [ar_reference[p].token_ids for p in PROMPTS[:batch]]
    # a chain, once started, copies to K: a copied token's earlier occurrence recurs with it
    assert any(0 < n == k for n, k in chains) and all(n in (0, k) for n, k in chains)
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]
    assert llm.last_run["choices"].get("lookup:0", 0) > 0  # rounds with no copy to propose
    assert {k.split(":")[0] for k in llm.last_run["choices"]} <= {"ar", "lookup"}


def test_a_chain_fed_past_its_copies_proposes_what_its_draft_says(
    tiny_llama, close_draft, monkeypatch
):
    """After depths the lookup copied, the draft's next forward feeds the copies with its own
    token: each token the draft proposed is its greedy token after the whole context, as a
    fresh run of the draft gives it (the kernels' logits do not depend on what shares a
    forward), so no draft KV was skipped or written twice."""
    rounds = []
    decode = sd.decode_chains

    def spy(*args):
        drafts, chains = decode(*args), args[1]
        rounds.extend(
            (list(c.token_ids), row[:n])
            for c, row, n in zip(chains, drafts.tokens.tolist(), drafts.counts, strict=True)
        )
        return drafts

    monkeypatch.setattr(sd, "decode_chains", spy)
    llm = sd_engine(tiny_llama, close_draft, 4, draft_lookup=1, draft_quantization="none")
    llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    lookup = ngram.Lookup.of(1)
    drafted = [
        (ctx + row[:d], row[d])
        for ctx, row in rounds
        for d in range(len(row))
        if lookup.next_token(ctx + row[:d]) is None
    ]
    assert len(drafted) > 10 and len(drafted) < sum(len(row) for _, row in rounds)
    ref = LLM(model=str(close_draft), max_model_len=256, quantization="none")
    want = ref.generate([c for c, _ in drafted], SamplingParams(temperature=0, max_tokens=1))
    assert [t for _, t in drafted] == [o.token_ids[0] for o in want]


def test_greedy_sd_that_stops_on_unsure_drafts_equals_ar(tiny_llama, close_draft, ar_reference):
    """Chains that stop before an unsure draft row propose fewer than K tokens in some rounds,
    and the text is AR's."""
    llm = sd_engine(tiny_llama, close_draft, 6, draft_stop_below=0.6, draft_lookup=0)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [ar_reference[p].token_ids for p in PROMPTS]
    rounds = [r for o in outs for r in o.records if r.num_drafted]
    assert any(r.num_drafted < 6 for r in rounds) and any(r.num_drafted > 1 for r in rounds)


def test_seeded_sd_reproducible(tiny_llama, close_draft):
    llm = LLM(model=str(tiny_llama), draft=str(close_draft), mode="sd", max_model_len=256)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=30, ignore_eos=True)
    a = llm.generate(PROMPTS[:4], params)
    b = llm.generate(PROMPTS[:4][::-1], params)[::-1]
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_a_long_prompts_first_token_waits_for_no_draft(tiny_llama, close_draft, ar_reference):
    """A request's first round proposes nothing where its prompt is longer than the draft may
    read first (the draft reads it in the next round); a short prompt's proposes at once.
    Greedy output equals AR's either way."""
    llm = sd_engine(tiny_llama, close_draft, 4, draft_lookup=0, draft_stop_below=0)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    long_prompt = next(p for p in PROMPTS if len(p) > sd.PREFILL_CATCH_UP)
    short = [1, 4, 2]
    out_long, out_short = llm.generate([long_prompt, short], params)
    assert out_long.token_ids == ar_reference[long_prompt].token_ids
    assert out_long.records[0].num_drafted == 0
    assert out_long.records[1].num_drafted > 0
    assert out_short.records[0].num_drafted > 0


def test_sd_metrics(tiny_llama, close_draft):
    llm = LLM(
        model=str(tiny_llama),
        draft=str(close_draft),
        mode="sd",
        num_speculative_tokens=4,
        max_model_len=256,
    )
    out = llm.generate("def f(x):", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    m = out[0].metrics
    assert m["rounds"] == len(out[0].records)
    assert m["mean_accepted_length"] == pytest.approx(1 + m["accepted"] / m["rounds"])
    assert len(m["per_position_acceptance"]) == 4
    assert sum(m["accepted_histogram"].values()) == m["rounds"]
    assert 0 <= m["acceptance_rate"] <= 1


# ---- exactness at temperature > 0: enumeration on a vocabulary of 8 ---------------------------

V = SMALL_VOCAB
SAMPLES = FIRST_TWO_SAMPLES


def check_sd_first_two(
    target, draft, temperature: float, top_p: float, prompt: list[int] | None = None, **engine
) -> LLM:
    """Check SD's first two tokens after ``prompt`` (default [1, 4, 2]) against the exact law
    (:func:`assert_first_two_follow`); the engine, for the caller's checks of how it ran.
    ``engine``: more EngineConfig fields."""
    prompt = prompt or [1, 4, 2]
    base = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=4, ignore_eos=True)
    expected = exact_first_two(target, prompt, base)
    llm = LLM(
        model=str(target),
        draft=str(draft),
        mode="sd",
        num_speculative_tokens=3,
        max_model_len=32,
        max_num_seqs=2000,
        num_kv_blocks=2000,
        block_size=16,
        max_num_batched_tokens=20000,
        **engine,
    )
    counts = torch.zeros(V, V)
    seeds = itertools.count()
    for _ in range(SAMPLES // 2000):
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_tokens=4,
                ignore_eos=True,
                seed=next(seeds),
            )
            for _ in range(2000)
        ]
        for t1, t2 in first_two_tokens(llm, prompt, params):
            counts[t1, t2] += 1
    try:
        assert_first_two_follow(counts, expected, f"SD T={temperature} top_p={top_p} {engine}")
    except AssertionError:
        llm.close()  # a tensor-parallel target's ranks are processes
        raise
    return llm


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
@pytest.mark.parametrize("which_draft", ["close", "far"])
def test_sd_first_two_tokens_follow_target(small_vocab_pair, temperature, top_p, which_draft):
    target, close, far = small_vocab_pair
    draft = close if which_draft == "close" else far
    llm = check_sd_first_two(target, draft, temperature, top_p)
    assert llm.last_run["drafted"] > 0


@pytest.mark.slow
def test_sd_with_a_bfloat16_draft_first_two_tokens_follow_target(small_vocab_pair):
    """The target verifies against the q the bfloat16 draft sampled from (float32 rows of its
    bfloat16 logits): exact, with a draft that is a different model from its float32 self."""
    target, close, _ = small_vocab_pair
    llm = check_sd_first_two(target, close, 1.0, 0.8, draft_dtype="bfloat16")
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_sd_with_context_copies_first_two_tokens_follow_target(
    small_vocab_pair, monkeypatch, temperature, top_p
):
    """After the prompt 0, 1, .., V - 1 its last token has not occurred before: the draft
    samples the first proposal s_1. Every token has occurred, so with one-token n-grams every
    later depth copies (s_2 = s_1 + 1, and so on): each round's q mixes the draft's rows with
    point masses, the second token's acceptance is the target's p(s_1 + 1), and the law is
    still the target's."""
    found = count_lookups(monkeypatch)
    target, close, _ = small_vocab_pair
    prompt = list(range(V))
    llm = check_sd_first_two(target, close, temperature, top_p, prompt, draft_lookup=1)
    assert found[True] > 0 and found[False] > 0
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature, top_p, sampling", [(0.7, 1.0, "rejection"), (1.0, 0.8, "coupled")]
)
def test_sd_with_copies_alone_first_two_tokens_follow_target(
    small_vocab_pair, temperature, top_p, sampling
):
    """draft="lookup" after the prompt 0, 1, .., V - 1, 0: the first round proposes the chain of
    copies 1, 2, 3 (point masses, no model's q), the first token is 1 with probability p(1) and
    otherwise drawn from p without 1; the law of the first two tokens is still the target's."""
    target, _, _ = small_vocab_pair
    prompt = [*range(V), 0]
    llm = check_sd_first_two(
        target, "lookup", temperature, top_p, prompt, copy_lookup=1, sampling=sampling
    )
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]


@pytest.mark.slow
def test_sd_that_stops_on_unsure_drafts_first_two_tokens_follow_target(small_vocab_pair):
    """How many tokens a chain proposes depends on its draft rows (here often one, sometimes
    three): the law is still the target's."""
    target, close, _ = small_vocab_pair
    llm = check_sd_first_two(target, close, 1.0, 1.0, draft_stop_below=0.35)
    hist = llm.last_run["accepted_histogram"]
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"] < 3 * llm.last_run["rounds"]
    assert len(hist) > 1


@pytest.mark.slow
def test_sd_first_two_tokens_follow_confident_target(confident_pair):
    """Rows that round to one-hot at T = 0.5, a draft that proposes their improbable tokens."""
    llm = check_sd_first_two(*confident_pair, 0.5, 1.0)
    assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=30, ignore_eos=True),
    ],
    ids=["greedy", "seeded T=0.9"],
)
def test_sd_on_the_paths_a_gpu_takes_writes_the_hosts_tokens(
    tiny_llama, close_draft, monkeypatch, params
):
    """Where a read waits for the device (a GPU), the draft's tokens stay there between depths
    (each depth's forward takes its input ids from the last depth's tokens) and the verifier
    tests every position at once. Forced here on the CPU, SD must write the same tokens as on
    the host's paths, and the tokens must really have been fed from the device. (The chain's
    context lookup and confidence stop read each depth on the host: they are off here.)"""
    llm = sd_engine(tiny_llama, close_draft, 3, draft_lookup=0, draft_stop_below=0)
    want = [o.token_ids for o in llm.generate(PROMPTS[:5], params)]
    fed = []
    forward = sd.Drafted.forward

    def spy(self, runner, queries, active):
        fed.append(self.last is not None)
        return forward(self, runner, queries, active)

    monkeypatch.setattr(transfer, "reads_wait", lambda device: True)
    monkeypatch.setattr(sd.Drafted, "forward", spy)
    assert [o.token_ids for o in llm.generate(PROMPTS[:5], params)] == want
    assert any(fed) and not all(fed)  # depth 0 catches up from the host's tokens
