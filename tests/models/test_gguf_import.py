"""GGUF import: a tiny random checkpoint written as GGUF in each tensor type (by the bench's
exporter, through gguf's own quantizers) and imported back loads in saguaro with the source's
logits, within the type's rounding; float32 round-trips bit for bit; the tokenizer gives the
source's ids; what the importer cannot read is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from saguaro.bench.gguf_export import export_gguf
from saguaro.engine.model_runner import ModelRunner
from saguaro.errors import ModelLoadError
from saguaro.models.gguf_import import import_gguf
from saguaro.models.gguf_names import deinterleave_rope_rows, interleave_rope_rows
from saguaro.models.loader import load_model
from saguaro.models.tokenizer import Tokenizer as SaguaroTokenizer
from tests.conftest import EOS, write_tiny_model

gguf = pytest.importorskip("gguf", reason="gguf is a dev dependency (pip install -e '.[dev]')")

# Each type's relative rounding step per weight: 16-bit floats keep 11 and 8 significant bits,
# Q8_0 and Q4_x round to 1/127 and 1/15 of a block's range (float32 round-trips exactly).
UNIT_ROUNDOFF = {
    "f32": 0.0,
    "f16": 2**-11,
    "bf16": 2**-8,
    "q8_0": 1 / 127,
    "q4_0": 1 / 15,
    "q4_1": 1 / 15,
}
# Largest |logit - source logit| over every position and token, in units of the logits' std, per
# unit of the type's roundoff: the weights' errors add up over two layers of random weights (about
# 15-25 units measured for every type here).
LOGIT_ERROR_UNITS = 40
SAMPLE_TEXT = "def add(a, b):\n    return a + b  # 42 apples, café\n\nclass Foo(Bar): pass"


def bpe_model(path, family: str = "llama"):
    """A tiny model whose tokenizer is a trained byte-level BPE with merges (GPT-2 style
    pre-tokenizer), so the import has merges and a regex split to reproduce."""
    model = write_tiny_model(
        path,
        family,
        init_std=0.1,
        vocab_size=320,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([SAMPLE_TEXT * 3, "hello world " * 20, "return x + y\n" * 10], trainer)
    tok.save(str(model / "tokenizer.json"))
    return model


def logits(model_dir, ids: list[int]) -> torch.Tensor:
    """Prefill logits of ``ids`` through saguaro's own runner."""
    runner = ModelRunner(load_model(model_dir), num_blocks=8, block_size=16, device="cpu")
    with torch.no_grad():
        return runner.forward([runner.sequence_query(list(range(8)), 0, ids, len(ids))])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return bpe_model(tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("dtype", sorted(UNIT_ROUNDOFF))
def test_imported_logits_equal_the_source_within_the_types_rounding(source, tmp_path, dtype):
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf", dtype), tmp_path / "hf")
    ids = SaguaroTokenizer(source).encode(SAMPLE_TEXT)
    want, got = logits(source, ids), logits(imported, ids)
    err = (got - want).abs().max().item() / want.std().item()
    tolerance = LOGIT_ERROR_UNITS * UNIT_ROUNDOFF[dtype]
    assert err <= tolerance, (dtype, err)
    if dtype != "f32":
        assert err > 0  # the file really was stored in that type
    # Greedy picks agree where the source is not near a tie.
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * tolerance * want.std()
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0", "q4_1"])
def test_quantized_weights_are_the_files_blocks_dequantized(source, tmp_path, dtype):
    """The imported matrix is exactly gguf's dequantization of the stored blocks (rows in the
    checkpoint's order), not a re-rounding of it."""
    path = export_gguf(source, tmp_path / "m.gguf", dtype)
    weights = load_file(str(import_gguf(path, tmp_path / "hf") / "model.safetensors"))
    reader = gguf.GGUFReader(path)
    stored = {t.name: t for t in reader.tensors}
    for gg, hf in [
        ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
        ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
    ]:
        t = stored[gg]
        assert t.tensor_type == gguf.GGMLQuantizationType[dtype.upper()]
        blocks = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        want = torch.from_numpy(np.ascontiguousarray(blocks, dtype=np.float32))
        if "attn_k" in gg:
            want = deinterleave_rope_rows(want, 2)
        assert torch.equal(weights[hf], want), gg


def test_float32_round_trip_is_bit_exact(tiny_llama, tmp_path):
    imported = import_gguf(export_gguf(tiny_llama, tmp_path / "m.gguf"), tmp_path / "hf")
    src, got = (
        load_file(str(tiny_llama / "model.safetensors")),
        load_file(str(imported / "model.safetensors")),
    )
    assert set(src) == set(got)
    for name, w in src.items():
        assert torch.equal(got[name], w), name
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is False


def test_qwen3_imports_with_qk_norms_and_halves_unrotated(tiny_qwen3, tmp_path):
    imported = import_gguf(export_gguf(tiny_qwen3, tmp_path / "q.gguf"), tmp_path / "hf")
    assert json.loads((imported / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]
    src, got = (
        load_file(str(tiny_qwen3 / "model.safetensors")),
        load_file(str(imported / "model.safetensors")),
    )
    for name, w in src.items():
        assert torch.equal(got[name], w), name


def test_rope_row_orders_are_inverse():
    w = torch.arange(4 * 8 * 3).reshape(32, 3)
    assert torch.equal(deinterleave_rope_rows(interleave_rope_rows(w, 4), 4), w)
    assert not torch.equal(interleave_rope_rows(w, 4), w)
    with pytest.raises(ValueError):
        deinterleave_rope_rows(torch.zeros(10, 2), 2)


def test_tokenizer_ids_and_special_tokens_equal_the_source(source, tmp_path):
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf"), tmp_path / "hf")
    a, b = SaguaroTokenizer(source), SaguaroTokenizer(imported)
    for text in [SAMPLE_TEXT, "  two  spaces\n\n\ttabs 3.14 don't", f"hi{EOS}there", ""]:
        ids = a.encode(text)
        assert b.encode(text) == ids, text
        assert b.decode(ids, skip_special_tokens=False) == a.decode(ids, skip_special_tokens=False)
    assert len(set(a.encode(SAMPLE_TEXT))) < len(SAMPLE_TEXT.encode())  # merges did apply
    assert b.eos_token == EOS and b.eos_token_id == a.token_to_id(EOS)
    assert b.encode(EOS) == [a.token_to_id(EOS)]  # the special token stays whole


def test_chat_template_and_bos_come_across(tmp_path):
    """A file carrying a chat template and add_bos_token: both reach tokenizer_config.json."""
    model = bpe_model(tmp_path / "src")
    path = export_gguf(model, tmp_path / "m.gguf")
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    edited = tmp_path / "t.gguf"
    rewrite_fields(
        path, edited, {"tokenizer.chat_template": template, "tokenizer.ggml.add_bos_token": True}
    )
    tok = SaguaroTokenizer(import_gguf(edited, tmp_path / "hf"))
    assert tok.has_chat_template
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<user>x"
    assert tok.encode("hello")[0] == tok.bos_token_id


def rewrite_fields(src, dst, changes: dict, requantize: dict | None = None) -> None:
    """Copy a GGUF file, setting string/bool fields and storing the tensors named in
    ``requantize`` in the given type (the writer has no in-place edit)."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        kind = f.types[0]
        sub = f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), kind, sub_type=sub)
    for name, value in changes.items():
        kind = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.STRING
        w.add_key_value(name, value, kind)
    for t in reader.tensors:
        qtype = (requantize or {}).get(t.name)
        if qtype is None:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        else:  # the source is float32
            dense = np.asarray(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))
            w.add_tensor(t.name, gguf.quants.quantize(dense, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unsupported_architecture_and_tensor_type_are_named(source, tmp_path):
    path = export_gguf(source, tmp_path / "m.gguf")
    w = gguf.GGUFWriter(tmp_path / "g.gguf", "gemma")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="architecture 'gemma'"):
        import_gguf(tmp_path / "g.gguf", tmp_path / "out")
    # A tensor of a type the importer does not read (Q5_0) is refused with its name and type.
    q5 = tmp_path / "q5.gguf"
    rewrite_fields(path, q5, {}, {"blk.0.ffn_up.weight": gguf.GGMLQuantizationType.Q5_0})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_up\.weight has type Q5_0"):
        import_gguf(q5, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written under the final name
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")


def test_an_existing_directory_is_replaced_only_when_it_is_a_model(source, tmp_path):
    path = export_gguf(source, tmp_path / "m.gguf")
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "mine.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a model directory"):
        import_gguf(path, keep)
    assert (keep / "mine.txt").read_text() == "not a model"  # nothing lost
    model = import_gguf(path, tmp_path / "hf")
    (model / "stale.txt").write_text("from an older import")
    import_gguf(path, model)  # a model directory is replaced whole
    assert not (model / "stale.txt").exists() and (model / "config.json").is_file()


def test_cli_imports_and_reports_errors(source, tmp_path, capsys):
    from saguaro.cli import main

    path = export_gguf(source, tmp_path / "m.gguf", "q8_0")
    assert main(["import-gguf", str(path), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert main(["import-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "x")]) == 2
    assert "no such GGUF file" in capsys.readouterr().err
