"""Logits and greedy generations match the transformers reference implementation."""

from __future__ import annotations

import pytest
import torch
import transformers

from saguaro import LLM, SamplingParams
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from tests.conftest import write_tiny_model

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

CASES = {
    "llama-gqa2-untied": ("llama", {}),
    "llama-gqa4-tied-rope-llama3": (
        "llama",
        dict(
            num_attention_heads=8,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_scaling=LLAMA3_ROPE,
            rope_theta=500000.0,
        ),
    ),
    "llama-mha": ("llama", dict(num_key_value_heads=4)),
    "qwen2-gqa2-untied": ("qwen2", {}),
    "qwen2-tied-theta1e6": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3-gqa2": ("qwen3", {}),
    "qwen3-tied-headdim32": ("qwen3", dict(tie_word_embeddings=True, head_dim=32)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def model_dir(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    # Moderate init keeps logits O(1-10) so a 1e-4 absolute tolerance is meaningful.
    return write_tiny_model(
        tmp_path_factory.mktemp(request.param), family, init_std=0.1, **overrides
    )


def test_prefill_and_decode_logits_match(model_dir):
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model = load_model(model_dir)
    runner = ModelRunner(model, num_blocks=8, block_size=16, device="cpu")
    ids = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    table = list(range(3))
    got = [runner.forward([runner.sequence_query(table, 0, ids[:30], 30)])]
    got.append(runner.forward([runner.sequence_query(table, 30, ids[30:36], 6)]))  # verify-style
    for i in range(36, 48):  # step-by-step decode against the KV cache
        got.append(runner.forward([runner.sequence_query(table, i, ids[i : i + 1], 1)]))
    diff = (torch.cat(got) - expected).abs().max().item()
    assert diff <= 1e-4, f"max abs logit difference {diff}"


def test_greedy_generation_matches_transformers(model_dir):
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    llm = LLM(model=str(model_dir), max_model_len=256)
    prompts = ["def f(x):\n    return", "hello", "The quick brown fox"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        with torch.no_grad():
            gen = ref.generate(
                torch.tensor([ids]),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out.token_ids == gen[0, len(ids) :].tolist()


def test_bfloat16_and_float16_load_and_run(tiny_llama):
    for dtype in ("bfloat16", "float16"):
        llm = LLM(model=str(tiny_llama), dtype=dtype, max_model_len=128)
        out = llm.generate("abc", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        assert len(out[0].token_ids) == 5
        assert llm.engine.runner.model.embed_tokens.dtype == getattr(torch, dtype)
