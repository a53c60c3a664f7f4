"""Every sampling feature in every mode: logits processors, min-p, log-probabilities and n
samples give AR's output under SD and SSD (greedy: token for token; T > 0: the exact law of the
first two tokens by enumeration, within the total-variation noise floor)."""

from __future__ import annotations

import math

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.sampling import SamplingTensors, logits_to_probs
from tests.conftest import FIRST_TWO_SAMPLES, PROMPTS, SMALL_VOCAB, sample_first_two
from tests.sampling.test_processors import reference
from tests.stats import assert_first_two_follow

FEATURES = {
    "penalties": dict(presence_penalty=1.2, frequency_penalty=0.6, repetition_penalty=1.4),
    "bias and bad words": dict(logit_bias={26: 4.0, 120: -100.0}, bad_words=["pf", "w"]),
    "min_tokens": dict(min_tokens=12, stop_token_ids=[3, 9]),
    "everything": dict(
        presence_penalty=-0.5,
        repetition_penalty=0.8,
        logit_bias={11: 2.0},
        bad_words=["in"],
        min_tokens=5,
    ),
}
MODES = {
    "sd": dict(mode="sd", num_speculative_tokens=4),
    "sd coupled": dict(mode="sd", num_speculative_tokens=3, sampling="coupled"),
    "ssd hits": dict(mode="ssd", num_speculative_tokens=2, fanout=[2, 2, 2]),
    "ssd misses, fast backup": dict(
        mode="ssd", num_speculative_tokens=3, fanout="0", backup="fast"
    ),
    "ssd misses, neural backup": dict(
        mode="ssd", num_speculative_tokens=3, fanout="0", backup="neural"
    ),
}
BATCH = PROMPTS[:4]


def greedy(**features) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3, **features)


@pytest.fixture(scope="module")
def ar(tiny_llama):
    """AR's outputs for each feature (and for none)."""
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    out = {name: llm.generate(BATCH, greedy(**f)) for name, f in FEATURES.items()}
    out["none"] = llm.generate(BATCH, greedy())
    return out


def test_each_feature_changes_ars_output(ar):
    """The features act (otherwise the equalities below would prove nothing)."""
    plain = [o.token_ids for o in ar["none"]]
    for name in FEATURES:
        assert [o.token_ids for o in ar[name]] != plain, name


def test_banned_tokens_never_appear_and_min_tokens_holds(ar, tiny_llama):
    for o in ar["bias and bad words"]:
        assert 120 not in o.token_ids and "pf" not in o.text and "w" not in o.text
    for o in ar["min_tokens"]:
        assert not {3, 9} & set(o.token_ids[:12])


def assert_same(outs, ref, what):
    for o, r in zip(outs, ref, strict=True):
        assert o.token_ids == r.token_ids, what
        assert [lp.token for lp in o.logprobs] == o.token_ids
        for a, b in zip(o.logprobs, r.logprobs, strict=True):
            assert math.isclose(a.logprob, b.logprob, abs_tol=1e-5), what
            assert [t for t, _ in a.top] == [t for t, _ in b.top], what
            for (_, x), (_, y) in zip(a.top, b.top, strict=True):
                assert math.isclose(x, y, abs_tol=1e-5), what


@pytest.mark.parametrize("mode", MODES)
def test_greedy_speculation_with_every_feature_equals_ar(tiny_llama, close_draft, ar, mode):
    """Tokens and their log-probabilities (raw: the model's softmax) equal AR's."""
    kw = dict(MODES[mode], max_model_len=256, max_num_seqs=8, draft_timeout_s=60)
    with LLM(model=str(tiny_llama), draft=str(close_draft), **kw) as llm:
        for name, features in FEATURES.items():
            assert_same(llm.generate(BATCH, greedy(**features)), ar[name], (mode, name))
        assert llm.last_run["accepted"] > 0


def test_processed_log_probs_equal_ars_under_coupled_sd(tiny_llama, close_draft):
    """At T > 0 coupled sampling commits AR's seeded tokens, so every log-probability (of the
    processed distribution) can be compared with AR's."""
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=20,
            min_p=0.02,
            seed=i,
            max_tokens=20,
            ignore_eos=True,
            logprobs=2,
            logprobs_mode="processed",
            **FEATURES["everything"],
        )
        for i in range(len(BATCH))
    ]
    kw = dict(max_model_len=256, sampling="coupled")
    ref = LLM(model=str(tiny_llama), **kw).generate(BATCH, params)
    sd = LLM(model=str(tiny_llama), draft=str(close_draft), mode="sd", **kw)
    outs = sd.generate(BATCH, params)
    assert_same(outs, ref, "coupled sd")
    assert all(lp.logprob > -math.inf for o in outs for lp in o.logprobs)
    assert sd.last_run["accepted"] > 0


def test_n_samples_share_the_prompts_blocks_and_differ(tiny_llama, close_draft):
    prompt = "import os\nimport sys\n" * 6  # several full KV blocks
    with LLM(model=str(tiny_llama), draft=str(close_draft), mode="sd", max_model_len=256) as llm:
        params = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True, n=4)
        [out] = llm.generate(prompt, params)
        assert len(out.samples) == 4 and out.samples[0].token_ids == out.token_ids
        assert len({tuple(s.token_ids) for s in out.samples}) > 1
        blocks = len(out.prompt_token_ids) // llm.config.block_size
        for s in out.samples[1:]:  # every full block of the prompt came from the first sample
            assert s.metrics["cached_prompt_tokens"] == blocks * llm.config.block_size
        # sample 0 of a seeded request is the request itself with n = 1
        [alone] = llm.generate(prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=12))
        assert alone.token_ids == out.token_ids
        [again] = llm.generate(prompt, params)
        assert [s.token_ids for s in again.samples] == [s.token_ids for s in out.samples]


# ---- exactness at temperature > 0 (vocabulary of 8: exact enumeration) ------------------------

V = SMALL_VOCAB
TV_SAMPLES = FIRST_TWO_SAMPLES
TV_BATCH = 1_000
TV_PROMPT = [1, 4, 2]  # sample_first_two's
TV_FEATURES = dict(
    presence_penalty=0.5,
    frequency_penalty=0.8,
    repetition_penalty=1.5,
    logit_bias={3: 1.5, 6: -0.7},
    min_p=0.04,
)


def exact_first_two_processed(target, params: SamplingParams) -> torch.Tensor:
    """P(t1, t2) [V, V] by enumeration with transformers' model and the reference processors."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    st = SamplingTensors.from_params([params])

    def p_next(generated: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = ref(torch.tensor([TV_PROMPT + generated])).logits[0, -1].tolist()
        processed = reference(logits, params, TV_PROMPT, generated, [], [])
        return logits_to_probs(torch.tensor([processed]), st)[0]

    p1 = p_next([])
    return torch.stack([p1[t] * p_next([t]) for t in range(V)])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, temperature, engine",
    [
        ("sd", 0.9, dict(mode="sd", num_speculative_tokens=3)),
        ("sd coupled", 0.9, dict(mode="sd", num_speculative_tokens=3, sampling="coupled")),
        ("ssd hits", 1.0, dict(mode="ssd", num_speculative_tokens=3, fanout=[3, 2, 2, 3])),
        ("ssd misses, fast", 1.0, dict(mode="ssd", num_speculative_tokens=3, fanout="0")),
        (
            "ssd misses, neural",
            0.7,
            dict(mode="ssd", num_speculative_tokens=3, fanout="0", backup="neural"),
        ),
    ],
)
def test_first_two_tokens_follow_the_processed_target(small_vocab_pair, name, temperature, engine):
    target, draft, _ = small_vocab_pair
    if "fanout" in engine and engine["fanout"] == "0":
        engine.setdefault("backup", "fast")
    engine.setdefault("sampling", "rejection")
    base = SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True, **TV_FEATURES)
    expected = exact_first_two_processed(target, base)

    def params(seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=temperature, max_tokens=4, ignore_eos=True, seed=seed, **TV_FEATURES
        )

    counts, hits = sample_first_two(target, draft, params, TV_SAMPLES, TV_BATCH, **engine)
    assert_first_two_follow(counts, expected, name)
    if name == "ssd hits":
        assert hits, "the hit path was not exercised"


def test_min_tokens_holds_stop_strings_back(ar, tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    text = ar["none"][0].text
    stop = text[2]  # a character AR writes third: a stop string there ends the text early
    cut = llm.generate(BATCH[0], greedy(stop=[stop]))[0]
    assert cut.finish_reason == "stop" and len(cut.token_ids) < 8
    held = llm.generate(BATCH[0], greedy(stop=[stop], min_tokens=8))[0]
    assert len(held.token_ids) >= 8 and held.text.startswith(text[:3])


@pytest.mark.parametrize("engine", [dict(mode="ar"), dict(mode="sd", num_speculative_tokens=3)])
def test_prompt_logprobs_are_the_models(tiny_llama, close_draft, engine):
    """Each prompt token's log-probability given the tokens before it, as transformers computes
    it, also when the prompt is fed in chunks and its blocks sit in the prefix cache."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    draft = None if engine["mode"] == "ar" else str(close_draft)
    llm = LLM(model=str(tiny_llama), draft=draft, max_model_len=256, max_num_batched_tokens=24,
              **engine)  # fmt: skip
    prompt = PROMPTS[3] * 3
    ids = llm.tokenizer.encode(prompt)
    with torch.no_grad():
        want = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), -1)
    llm.generate(prompt, greedy())  # its blocks are now in the prefix cache
    outs = llm.generate([prompt, prompt], greedy(prompt_logprobs=2, n=2))
    for out in outs:
        lps = out.prompt_logprobs
        assert len(lps) == len(ids) and lps[0] is None
        for p, lp in enumerate(lps[1:]):
            assert lp.token == ids[p + 1]
            assert math.isclose(lp.logprob, float(want[p, ids[p + 1]]), abs_tol=1e-4)
            assert [t for t, _ in lp.top] == want[p].topk(2).indices.tolist()
        assert out.samples[1].prompt_logprobs is None  # scored once, by the first sample
        assert out.samples[1].metrics["cached_prompt_tokens"] > 0
