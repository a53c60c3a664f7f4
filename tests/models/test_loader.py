"""Loading from Hugging Face directories, and the clear errors for broken ones."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from saguaro import LLM, SamplingParams
from saguaro.errors import IncompatibleModelsError, ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.loader import load_model
from saguaro.models.tokenizer import Tokenizer
from tests.conftest import write_tiny_model


@pytest.fixture
def broken(tmp_path, tiny_llama):
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama, dst)
    return dst


def test_architecture_chosen_by_config_not_path(tmp_path, tiny_qwen3):
    dst = tmp_path / "llama-looking-name"
    shutil.copytree(tiny_qwen3, dst)
    cfg = ModelConfig.from_dir(dst)
    assert cfg.family == "qwen3" and cfg.qk_norm
    assert load_model(dst).layers[0].self_attn.q_norm is not None


def test_sharded_safetensors_equal_single_file(tmp_path, tiny_llama):
    dst = tmp_path / "sharded"
    shutil.copytree(tiny_llama, dst)
    (dst / "model.safetensors").unlink()
    weights = load_file(str(tiny_llama / "model.safetensors"))
    names = sorted(weights)
    weight_map = {}
    for i, chunk in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: weights[n] for n in chunk}, str(dst / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, fname))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a, b = load_model(tiny_llama), load_model(dst)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: shutil.rmtree(d), "does not exist"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "malformed JSON"),
        (lambda d: _edit_config(d, architectures=["GPT2LMHeadModel"]), "unsupported architecture"),
        (lambda d: _edit_config(d, hidden_size=None), "hidden_size"),
        (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda d: _truncate(d / "model.safetensors"), "corrupt or truncated"),
        (lambda d: (d / "model.safetensors").write_bytes(b"garbage" * 10), "corrupt or truncated"),
        (lambda d: _edit_config(d, intermediate_size=96), "shape"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json missing"),
        (lambda d: (d / "tokenizer.json").write_text("{}"), "cannot be parsed"),
    ],
)
def test_broken_model_dir_gives_clear_error(broken, breakage, message):
    breakage(broken)
    with pytest.raises(ModelLoadError, match=message):
        LLM(model=str(broken))


def test_missing_tensor_named(broken):
    weights = load_file(str(broken / "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="norm.weight"):
        load_model(broken)


def test_draft_with_other_vocabulary_rejected(tmp_path, tiny_llama):
    other = write_tiny_model(tmp_path / "small-vocab", "llama", vocab_size=16)
    with pytest.raises(IncompatibleModelsError, match="tokenizer"):
        LLM(model=str(tiny_llama), draft=str(other), mode="sd")


def test_draft_with_other_model_vocab_size_rejected(tmp_path, tiny_llama):
    other = write_tiny_model(tmp_path / "padded", "llama", vocab_size=272)
    shutil.copy(tiny_llama / "tokenizer.json", other / "tokenizer.json")
    with pytest.raises(IncompatibleModelsError, match="vocab_size"):
        LLM(model=str(tiny_llama), draft=str(other), mode="sd")


def test_unknown_dtype(tiny_llama):
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(model=str(tiny_llama), dtype="int3")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(tiny_llama, "int3", "cpu")  # the loader checks too, for its other callers


def test_tokenizer_chat_template_and_special_tokens(broken):
    cfg = json.loads((broken / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    (broken / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer(broken)
    assert tok.eos_token_id == 256
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|endoftext|><user>hi<assistant>"
    assert tok.decode(tok.encode("héllo\n  x")) == "héllo\n  x"
    llm = LLM(model=str(broken))
    out = llm.generate("x", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
