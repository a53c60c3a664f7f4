"""Coupled sampling end to end: a seeded request at T > 0 gives the same tokens in AR, SD and
SSD (hits, misses, each backup, a killed worker), alone or in any batch, and coupled AR
samples the target's distribution."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from saguaro import LLM, SamplingParams
from tests.conftest import FIRST_TWO_SAMPLES, PROMPTS, SMALL_VOCAB, exact_first_two
from tests.stats import assert_first_two_follow

SETTINGS = [
    dict(temperature=0.5, top_k=20),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=1.0, top_k=30, top_p=0.95),
    dict(temperature=0.5),
]
PARAMS = [
    SamplingParams(**SETTINGS[i % len(SETTINGS)], seed=100 + i, max_tokens=24, ignore_eos=True)
    for i in range(len(PROMPTS))
]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """Coupled AR, each request alone."""
    llm = LLM(model=str(tiny_llama), max_model_len=256, sampling="coupled")
    return [llm.generate(p, q)[0].token_ids for p, q in zip(PROMPTS, PARAMS, strict=True)]


def pair(target, draft, mode: str, k: int, **kw) -> LLM:
    """An SD or SSD engine over the tiny pair (coupled unless ``kw`` says otherwise)."""
    kw.setdefault("sampling", "coupled")
    kw.setdefault("max_model_len", 256)
    return LLM(model=str(target), draft=str(draft), mode=mode, num_speculative_tokens=k, **kw)


def check_batches(llm, reference, sizes=range(1, 9)):
    for b in sizes:
        outs = llm.generate(PROMPTS[:b], PARAMS[:b])
        assert [o.token_ids for o in outs] == reference[:b], f"batch {b}"


@pytest.mark.parametrize("k", [2, 5])
def test_sd_gives_ars_tokens(tiny_llama, close_draft, reference, k):
    llm = pair(tiny_llama, close_draft, "sd", k)
    check_batches(llm, reference)
    assert llm.last_run["acceptance_rate"] > 0.3


@pytest.mark.parametrize(
    "name, k, overrides",
    [
        ("hits", 2, dict(fanout=[3, 2, 3])),
        ("hits, K=5", 5, dict(fanout=[2, 1, 1, 1, 1, 2])),
        ("misses, neural backup", 5, dict(fanout="0", backup="neural")),
        ("misses, fast backup", 2, dict(fanout="0", backup="fast")),
        ("planned", 5, dict()),
        ("hits, bfloat16 draft", 2, dict(fanout=[3, 2, 3], draft_dtype="bfloat16")),
    ],
)
def test_ssd_gives_ars_tokens(tiny_llama, close_draft, reference, name, k, overrides):
    with pair(tiny_llama, close_draft, "ssd", k, max_num_seqs=8, **overrides) as llm:
        few = name == "planned" or "bfloat16" in name
        check_batches(llm, reference, sizes=(1, 3, 8) if few else range(1, 9))
        run = llm.last_run
    if name.startswith("hits"):
        assert run["cache_hit_rate"] > 0.3, run["cache_hit_rate"]
    if name.startswith("misses"):
        assert run["cache_hit_rate"] == 0 and set(run["backups"]) == {overrides["backup"]}


def test_killed_worker_changes_nothing(tiny_llama, close_draft, reference):
    with pair(tiny_llama, close_draft, "ssd", 3, fanout=[2, 1, 1, 2], draft_restarts=0) as llm:
        eng = llm.engine
        seqs = [
            eng.add_request(eng.encode_prompt(p), q) for p, q in zip(PROMPTS, PARAMS, strict=True)
        ]
        for _ in range(3):
            eng.step()
        eng.proposer.worker.proc.kill()
        while eng.has_unfinished():
            eng.step()
        assert eng.proposer.worker is None and "exited" in eng.draft_health().failure
    assert [s.output_token_ids for s in seqs] == reference


@pytest.mark.slow
def test_coupled_ar_first_two_tokens_follow_target(small_vocab_pair):
    target, _, _ = small_vocab_pair
    prompt, v, samples = [1, 4, 2], SMALL_VOCAB, FIRST_TWO_SAMPLES
    base = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=2, ignore_eos=True)
    expected = exact_first_two(target, prompt, base)
    llm = LLM(model=str(target), max_model_len=32, max_num_seqs=2000, sampling="coupled")
    counts = torch.zeros(v, v)
    seeds = itertools.count()
    for _ in range(samples // 2000):
        params = [
            SamplingParams(temperature=0.9, top_p=0.9, max_tokens=2, ignore_eos=True, seed=s)
            for s in itertools.islice(seeds, 2000)
        ]
        for out in llm.generate([prompt] * 2000, params):
            counts[out.token_ids[0], out.token_ids[1]] += 1
    assert_first_two_follow(counts, expected, "coupled AR")


def test_a_request_can_name_its_method_inside_a_mixed_batch(tiny_llama, close_draft, reference):
    """Per-request methods: in one batch, coupled requests give coupled AR's tokens and
    rejection requests give what they give in a batch of their own method, in SD and SSD."""
    coupled = [replace(p, sampling="coupled") for p in PARAMS]
    rejection = [replace(p, sampling="rejection") for p in PARAMS]
    mixed = [c if i % 2 else r for i, (c, r) in enumerate(zip(coupled, rejection, strict=True))]
    sd = pair(tiny_llama, close_draft, "sd", 3, sampling="auto")  # auto: rejection for SD
    alone = [o.token_ids for o in sd.generate(PROMPTS, rejection)]
    got = [o.token_ids for o in sd.generate(PROMPTS, mixed)]
    for i, tokens in enumerate(got):
        assert tokens == (reference[i] if i % 2 else alone[i]), i
    # the SSD engine's method is coupled (auto); half the requests ask for rejection
    ssd = pair(
        tiny_llama, close_draft, "ssd", 3, sampling="auto", fanout=[2, 1, 1, 2], backup="neural"
    )
    with ssd as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, mixed)]
    for i, tokens in enumerate(got):  # SSD rejection with a neural backup gives SD's text
        assert tokens == (reference[i] if i % 2 else alone[i]), i
