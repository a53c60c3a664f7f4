"""Continuous batching, chunked prefill, prefix caching, preemption and stop conditions."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from saguaro import LLM, SamplingParams
from saguaro.errors import RequestError

PROMPTS = [
    "def add(a, b):",
    "x",
    "import os\nimport sys\n\nclass Foo:\n    def __init__(self):",
    "hello world, this is a longer prompt of several words",
    "for i in range(10):",
    "#",
]


def alone(llm, prompt, params):
    return llm.generate(prompt, params)[0].token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_equals_alone(tiny_llama, temperature):
    llm = LLM(model=str(tiny_llama), max_model_len=256, max_num_seqs=3)
    params = [
        SamplingParams(temperature=temperature, seed=i, max_tokens=4 + 3 * i, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    batched = llm.generate(PROMPTS, params)  # 6 requests through 3 slots: join as others leave
    for prompt, p, out in zip(PROMPTS, params, batched, strict=True):
        assert out.token_ids == alone(llm, prompt, p)
        assert len(out.token_ids) == p.max_tokens and out.finish_reason == "length"


def test_requests_join_a_running_batch(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    eng = llm.engine
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=12, ignore_eos=True)
    first = eng.add_request(eng.encode_prompt(PROMPTS[0]), params)
    for _ in range(4):
        eng.step()
    late = eng.add_request(eng.encode_prompt(PROMPTS[2]), params)
    while eng.has_unfinished():
        eng.step()
    assert first.output_token_ids == alone(llm, PROMPTS[0], params)
    assert late.output_token_ids == alone(llm, PROMPTS[2], params)


def test_chunked_prefill_matches(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS, params)
    small = LLM(model=str(tiny_llama), max_model_len=256, max_num_batched_tokens=7)
    got = small.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]


def test_prefix_cache_reuses_shared_prefix(tiny_llama):
    prefix = "class Foo:\n    def method(self, a, b, c):\n        return a + b + c\n" * 2
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm = LLM(model=str(tiny_llama), max_model_len=512, block_size=16)
    first = llm.generate(prefix + "x = 1", params)[0]
    second = llm.generate(prefix + "y = 2", params)[0]
    assert first.metrics["cached_prompt_tokens"] == 0
    cached = second.metrics["cached_prompt_tokens"]
    assert cached >= 16 * ((len(prefix.encode()) // 16) - 1)
    nocache = LLM(model=str(tiny_llama), max_model_len=512, enable_prefix_caching=False)
    assert second.token_ids == nocache.generate(prefix + "y = 2", params)[0].token_ids
    other = llm.generate("Z" + prefix + "y = 2", params)[0]  # differs in the first block
    assert other.metrics["cached_prompt_tokens"] == 0


@pytest.mark.parametrize("decodes", [False, True])
def test_a_finished_requests_last_round_serves_the_next_turn_from_the_prefix_cache(
    tiny_llama, decodes
):
    """The blocks a request filled in its last round are hashed before it frees them: that
    round is its prompt's last chunk (one token asked), or a decode step that fills a block.
    The next turn (the context, its reply and more) finds every full block of the first
    request's written KV cached."""
    block, chunk = 16, 64
    llm = LLM(model=str(tiny_llama), max_model_len=512, block_size=block,
              max_num_batched_tokens=chunk)  # fmt: skip
    ids = llm.tokenizer.encode("class Foo:\n    def method(self, a, b, c):\n" * 6)
    assert len(ids) % chunk > block  # the last chunk fills a block of its own
    # decoding: the last step writes the position that completes a block
    max_tokens = block - len(ids) % block + 1 if decodes else 1
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    first = llm.generate([ids], params)[0]
    written = len(ids) + max_tokens - 1  # every token has KV but the last one drawn
    turn = ids + first.token_ids + ids[:5]
    second = llm.generate([turn], SamplingParams(temperature=0, max_tokens=2))[0]
    assert second.metrics["cached_prompt_tokens"] == block * (written // block)


def test_preemption_keeps_generated_text(tiny_llama):
    params = [
        SamplingParams(temperature=0.9, seed=i, max_tokens=60, ignore_eos=True) for i in range(4)
    ]
    prompts = PROMPTS[:4]
    ref = LLM(model=str(tiny_llama), max_model_len=128).generate(prompts, params)
    # 8 blocks of 16 = one full-length sequence: four growing sequences must preempt.
    tight = LLM(model=str(tiny_llama), max_model_len=128, num_kv_blocks=8, block_size=16)
    got = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert [o.text for o in got] == [o.text for o in ref]
    assert tight.engine.block_manager.num_free_blocks == 8


def test_prompt_longer_than_max_model_len_is_rejected_and_engine_survives(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=32)
    with pytest.raises(RequestError, match="max_model_len"):
        llm.generate(["ok", "y" * 40], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished()  # nothing was started
    out = llm.generate("ok", SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.token_ids) == 32


def test_pool_too_small_for_max_model_len(tiny_llama):
    with pytest.raises(ValueError, match="num_kv_blocks"):
        LLM(model=str(tiny_llama), max_model_len=256, num_kv_blocks=2, block_size=16)


@pytest.mark.parametrize("bad", ["", []])
def test_empty_prompt_rejected(tiny_llama, bad):
    llm = LLM(model=str(tiny_llama), max_model_len=64)
    with pytest.raises(RequestError, match="empty"):
        llm.generate([bad])


def test_out_of_vocab_token_ids_rejected(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=64)
    with pytest.raises(RequestError, match="out of range"):
        llm.generate([[1, 2, 99999]])


def test_stop_string_token_id_and_eos(tmp_path, tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    base = llm.generate("def", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    # stop token id: generation ends at (and includes) the first occurrence
    stop_tok = base.token_ids[5]
    out = llm.generate(
        "def", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok])
    )[0]
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_tok) + 1]
    assert out.finish_reason == "stop"
    # stop string: text is cut before it
    stop = base.text[8:11]
    out = llm.generate("def", SamplingParams(temperature=0, max_tokens=30, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == base.text[: base.text.index(stop)]
    # EOS from generation_config.json ends the request unless ignore_eos
    eos_dir = tmp_path / "eos"
    shutil.copytree(tiny_llama, eos_dir)
    (eos_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop_tok]}))
    eos_llm = LLM(model=str(eos_dir), max_model_len=256)
    out = eos_llm.generate("def", SamplingParams(temperature=0, max_tokens=30))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == stop_tok
    out = eos_llm.generate("def", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert out.token_ids == base.token_ids


def test_streaming_deltas_concatenate_to_text(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    params = SamplingParams(temperature=0.5, seed=3, max_tokens=25, ignore_eos=True)
    deltas = list(llm.stream("def f():", params))
    assert len(deltas) > 1
    assert "".join(deltas) == llm.generate("def f():", params)[0].text


def test_seeded_request_reproducible_and_unseeded_differ(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    p = SamplingParams(temperature=1.0, seed=123, max_tokens=20, ignore_eos=True)
    assert alone(llm, "abc", p) == alone(llm, "abc", p)
    q = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    assert alone(llm, "abc", q) != alone(llm, "abc", q)


def test_token_id_prompt_equals_string_prompt(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ids = llm.tokenizer.encode("hello")
    assert llm.generate([ids], params)[0].token_ids == llm.generate("hello", params)[0].token_ids


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_finished_requests_leave_no_state(tiny_llama, tiny_draft, mode):
    """After many requests (finished, stopped, aborted) the engine holds none of them: no
    sequence, no detokenizer state, no scheduled work, every KV block free again."""
    draft = str(tiny_draft) if mode == "sd" else None
    llm = LLM(model=str(tiny_llama), draft=draft, mode=mode, max_model_len=128)
    eng = llm.engine
    for i in range(5):
        outs = llm.generate(PROMPTS * 4, SamplingParams(temperature=0.7, seed=i, max_tokens=6))
        assert all(o.records for o in outs)  # the caller keeps what the rounds did
    stream = llm.stream(PROMPTS[0], SamplingParams(max_tokens=50))
    next(stream)
    stream.close()  # aborted mid-way
    assert eng.seqs == {} and eng.detok.states == {}
    assert not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


@pytest.mark.parametrize(
    "dtype, kernels, warned",
    [("bfloat16", "torch", True), ("bfloat16", "saguaro", False), ("float32", "torch", False)],
)
def test_speculation_below_float32_on_torch_says_it_can_part_from_ar(
    tiny_llama, tiny_draft, caplog, dtype, kernels, warned
):
    """On torch's operators, at 16-bit precision, a verification forward's logits differ from
    AR's by rounding, enough to flip near-ties: the engine says so rather than promise AR's
    greedy tokens. saguaro's kernels give a token the same logits in both, so it need not."""
    engine = dict(model=str(tiny_llama), dtype=dtype, kernels=kernels)
    with caplog.at_level(logging.WARNING, logger="saguaro"):
        LLM(draft=str(tiny_draft), mode="sd", **engine)
        LLM(**engine)  # AR: nothing to part from
    said = [r.getMessage() for r in caplog.records if "near-ties" in r.getMessage()]
    assert len(said) == (1 if warned else 0)
