"""GGUF export: the q/k row reordering gives the same attention scores under adjacent-pair RoPE as
the checkpoint under rotate-half RoPE, and the written file reads back (names, shapes, values,
metadata, tokenizer) through gguf's own reader. These carry the correctness of the llama.cpp peer
in CI; running llama.cpp itself needs the `peer` extra (see test_backends.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from saguaro.bench.gguf_export import (
    PAD_TOKEN,
    PRE_TOKENIZER,
    export_gguf,
    gguf_tensor_name,
    interleave_rope_rows,
)
from saguaro.models.config import ModelConfig
from saguaro.models.layers import rope_inv_freq
from tests.conftest import write_tiny_model
from tests.speculation.test_reduced_head import reduced_copy

gguf = pytest.importorskip("gguf", reason="gguf is a dev dependency (pip install -e '.[dev]')")


def rotate_half_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as the checkpoint's attention applies it: element i of each head pairs with i + d/2,
    turned by the angle position * theta^(-2i/d). x: [T, H, D]."""
    d = x.shape[-1]
    angle = positions[:, None].float() * rope_inv_freq(d, theta, None)[None, :]  # [T, D/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def adjacent_pair_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as llama.cpp's llama architecture applies it: the pair (2i, 2i+1) of each head turns
    by the angle position * theta^(-2i/d). x: [T, H, D]."""
    d = x.shape[-1]
    angle = positions[:, None].float() * rope_inv_freq(d, theta, None)[None, :]  # [T, D/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (3, 1, 64), (2, 2, 8)])
def test_reordered_rows_give_the_same_attention_scores(heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(0)
    hidden, T, theta = 48, 11, 10000.0
    wq = torch.randn(heads * head_dim, hidden, generator=gen)
    wk = torch.randn(kv_heads * head_dim, hidden, generator=gen)
    x = torch.randn(T, hidden, generator=gen)
    pos = torch.arange(T) * 7  # positions far enough apart that every frequency turns

    def project(w: torch.Tensor, n: int) -> torch.Tensor:
        return (x @ w.T).reshape(T, n, head_dim)

    q_hf = rotate_half_rope(project(wq, heads), pos, theta)
    k_hf = rotate_half_rope(project(wk, kv_heads), pos, theta)
    q_gg = adjacent_pair_rope(project(interleave_rope_rows(wq, heads), heads), pos, theta)
    k_gg = adjacent_pair_rope(project(interleave_rope_rows(wk, kv_heads), kv_heads), pos, theta)

    group = heads // kv_heads
    scores_hf = torch.einsum("thd,shd->hts", q_hf, k_hf.repeat_interleave(group, dim=1))
    scores_gg = torch.einsum("thd,shd->hts", q_gg, k_gg.repeat_interleave(group, dim=1))
    torch.testing.assert_close(scores_gg, scores_hf, rtol=1e-4, atol=1e-3)
    # Not vacuous: without the reordering the scores differ.
    plain = adjacent_pair_rope(project(wq, heads), pos, theta)
    k_plain = adjacent_pair_rope(project(wk, kv_heads), pos, theta)
    wrong = torch.einsum("thd,shd->hts", plain, k_plain.repeat_interleave(group, dim=1))
    assert not torch.allclose(wrong, scores_hf, rtol=1e-2, atol=1e-1)


def test_reordering_moves_rows_to_pairs():
    """Within a head of d rows, row j goes to 2j and row d/2 + j to 2j + 1; biases too."""
    w = torch.arange(2 * 6).float()  # 2 heads of 6 rows, as a bias
    assert interleave_rope_rows(w, 2).tolist() == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
    m = torch.arange(8).float()[:, None].expand(8, 3)
    assert interleave_rope_rows(m, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    with pytest.raises(ValueError):
        interleave_rope_rows(torch.zeros(10, 2), 2)  # heads of odd size


def test_tensor_names():
    assert gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("model.layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight"
    assert gguf_tensor_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert gguf_tensor_name("model.layers.1.self_attn.k_norm.weight") == "blk.1.attn_k_norm.weight"
    assert gguf_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None


def read(path):
    reader = gguf.GGUFReader(path)
    fields = {name: f.contents() for name, f in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    return fields, tensors


def expected_names(cfg: ModelConfig, tied: bool) -> set[str]:
    per_layer = [
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
    ]  # fmt: skip
    if cfg.qk_norm:
        per_layer += ["attn_q_norm", "attn_k_norm"]
    names = {f"blk.{i}.{n}.weight" for i in range(cfg.num_hidden_layers) for n in per_layer}
    names |= {"token_embd.weight", "output_norm.weight"}
    return names if tied else names | {"output.weight"}


def test_llama_round_trip(tiny_llama, tmp_path):
    path = export_gguf(tiny_llama, tmp_path / "m.gguf")
    cfg = ModelConfig.from_dir(tiny_llama)
    fields, tensors = read(path)

    assert fields["general.architecture"] == "llama"
    assert fields["general.file_type"] == int(gguf.LlamaFileType.ALL_F32)
    assert fields["llama.context_length"] == cfg.max_position_embeddings
    assert fields["llama.embedding_length"] == cfg.hidden_size
    assert fields["llama.block_count"] == cfg.num_hidden_layers
    assert fields["llama.feed_forward_length"] == cfg.intermediate_size
    assert fields["llama.attention.head_count"] == cfg.num_attention_heads
    assert fields["llama.attention.head_count_kv"] == cfg.num_key_value_heads
    assert fields["llama.attention.key_length"] == cfg.head_dim
    assert fields["llama.rope.dimension_count"] == cfg.head_dim
    assert fields["llama.rope.freq_base"] == pytest.approx(cfg.rope_theta)
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg.rms_norm_eps)

    # Tokenizer: the 256 byte tokens and EOS of the fixture, padded to config.json's vocabulary.
    vocab = json.loads((tiny_llama / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == cfg.vocab_size == 260
    assert all(tokens[i] == t for t, i in vocab.items())
    assert tokens[256] == "<|endoftext|>" and tokens[257] == PAD_TOKEN.format(257)
    types = fields["tokenizer.ggml.token_type"]
    assert types[0] == gguf.TokenType.NORMAL and types[256] == gguf.TokenType.CONTROL
    assert types[259] == gguf.TokenType.UNUSED
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == PRE_TOKENIZER
    assert fields["tokenizer.ggml.bos_token_id"] == 256
    assert fields["tokenizer.ggml.eos_token_id"] == 256
    assert fields["tokenizer.ggml.add_bos_token"] is False  # the fixture's tokenizer adds none

    # Tensors: llama.cpp's names, GGUF shapes (innermost first), values (q/k reordered).
    assert set(tensors) == expected_names(cfg, tied=False)
    weights = load_file(str(tiny_llama / "model.safetensors"))
    for hf_name, w in weights.items():
        name = gguf_tensor_name(hf_name)
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == list(reversed(w.shape)), name
        got = np.asarray(t.data).reshape(w.shape)
        want = w
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            n = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            want = interleave_rope_rows(w, n)
            assert not np.array_equal(got, w.numpy())
        np.testing.assert_array_equal(got, want.numpy(), err_msg=name)


def test_tied_embeddings_have_no_output_matrix(tmp_path):
    model = write_tiny_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    fields, tensors = read(export_gguf(model, tmp_path / "m.gguf"))
    assert set(tensors) == expected_names(ModelConfig.from_dir(model), tied=True)


def test_qwen3_keeps_rotate_half_and_writes_qk_norms(tiny_qwen3, tmp_path):
    cfg = ModelConfig.from_dir(tiny_qwen3)
    fields, tensors = read(export_gguf(tiny_qwen3, tmp_path / "q.gguf"))
    assert fields["general.architecture"] == "qwen3"
    assert fields["qwen3.attention.key_length"] == cfg.head_dim
    assert set(tensors) == expected_names(cfg, tied=cfg.tie_word_embeddings)
    weights = load_file(str(tiny_qwen3 / "model.safetensors"))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    got = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(q.shape)
    np.testing.assert_array_equal(got, q.numpy())  # llama.cpp's qwen3 rotates halves itself
    assert list(tensors["blk.0.attn_q_norm.weight"].shape) == [cfg.head_dim]


def test_f16_matrices_f32_vectors(tiny_llama, tmp_path):
    fields, tensors = read(export_gguf(tiny_llama, tmp_path / "h.gguf", dtype="f16"))
    assert fields["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_F16)
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    with pytest.raises(ValueError, match="dtype"):
        export_gguf(tiny_llama, tmp_path / "x.gguf", dtype="q4")


def test_the_default_models_tokenizer_adds_bos_as_its_tokenizer_does(tmp_path):
    """llama.cpp must put BOS before the text exactly where saguaro's tokenizer does (SmolLM2's
    does not)."""
    from saguaro.bench.gguf_export import _tokenizer_fields
    from saguaro.models.catalog import SMOLLM2, resolve_model
    from saguaro.models.tokenizer import Tokenizer

    model_dir = resolve_model(SMOLLM2)
    tok = _tokenizer_fields(model_dir, 49152)
    saguaro_tok = Tokenizer(model_dir)
    assert tok["add_bos"] == (saguaro_tok.encode("x")[0] == saguaro_tok.bos_token_id)
    assert len(tok["tokens"]) == 49152 and all(" " in m for m in tok["merges"])


def test_rope_scaling_is_refused(tmp_path):
    model = write_tiny_model(
        tmp_path / "scaled",
        "llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    )
    with pytest.raises(ValueError, match="RoPE scaling"):
        export_gguf(model, tmp_path / "s.gguf")
    assert not (tmp_path / "s.gguf").exists()


def test_a_reduced_head_is_written_whole_with_zero_rows_off_it(close_draft, tmp_path):
    """llama.cpp holds no reduced output vocabulary: the head's rows go to their tokens' ids
    and every other token's row is zero."""
    keep = [*range(0, 256, 3), 256]
    reduced = reduced_copy(close_draft, tmp_path / "reduced", keep)
    cfg = ModelConfig.from_dir(reduced)
    _, tensors = read(export_gguf(reduced, tmp_path / "r.gguf"))
    assert set(tensors) == expected_names(cfg, tied=False)
    head = np.asarray(tensors["output.weight"].data).reshape(cfg.vocab_size, cfg.hidden_size)
    rows = load_file(str(reduced / "model.safetensors"))["lm_head.weight"]
    np.testing.assert_array_equal(head[keep], rows.numpy())
    off = np.setdiff1d(np.arange(cfg.vocab_size), keep)
    assert not head[off].any()
