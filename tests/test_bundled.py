"""The bundled pair: what ships, that it is the default, and that it matches transformers."""

from __future__ import annotations

import json

import pytest
import transformers

from saguaro import LLM, SamplingParams
from saguaro.bundled import DRAFT_DIR, TARGET_DIR
from tests.conftest import transformers_greedy

FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):"]


@pytest.mark.parametrize("model_dir", [TARGET_DIR, DRAFT_DIR], ids=["target", "draft"])
def test_each_model_ships_as_a_complete_hugging_face_directory(model_dir):
    for name in (*FILES, "README.md", "training.json"):
        assert (model_dir / name).is_file(), name
    weights = sorted(model_dir.glob("*.safetensors"))
    assert weights and all(w.stat().st_size <= 16 * 2**20 for w in weights)
    if len(weights) > 1:  # shards are listed by their index
        index = json.loads((model_dir / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == {w.name for w in weights}
    card = (model_dir / "README.md").read_text()
    assert "## Cost regime" in card and "mean accepted length" in card


def test_the_pair_fits_the_package_budget_and_shares_a_tokenizer():
    size = sum(f.stat().st_size for d in (TARGET_DIR, DRAFT_DIR) for f in d.iterdir())
    assert size <= 80 * 2**20
    assert (TARGET_DIR / "tokenizer.json").read_bytes() == (
        DRAFT_DIR / "tokenizer.json"
    ).read_bytes()


@pytest.fixture(scope="module")
def default_outputs():
    """Greedy continuations by the default engine: no model given."""
    with LLM(max_model_len=256) as llm:
        assert llm.engine.target_dir == TARGET_DIR
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.tokenizer


def test_the_default_model_is_the_bundled_target_and_matches_transformers(default_outputs):
    outputs, tokenizer = default_outputs
    ref = transformers.AutoModelForCausalLM.from_pretrained(TARGET_DIR).eval()
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert out == transformers_greedy(ref, tokenizer.encode(prompt), 32)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculation_with_the_bundled_draft_equals_ar(default_outputs, mode):
    with LLM(mode=mode, max_model_len=256) as llm:
        assert llm.engine.draft_dir == DRAFT_DIR
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert got == default_outputs[0]
