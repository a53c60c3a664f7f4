"""Quantized weights: load-time int4/int8 within their rounding, a GGUF file's Q4_0/Q4_1/Q8_0
blocks run exactly as the file's dequantized weights, and a model on saguaro's kernels gives a
token the same logits, bit for bit, alone, in a K + 1-position verification and in a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saguaro.bench.gguf_export import export_gguf
from saguaro.engine.model_runner import ModelRunner
from saguaro.errors import ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_import import import_gguf
from saguaro.models.gguf_names import deinterleave_rope_rows
from saguaro.models.gguf_weights import gguf_linears
from saguaro.models.linear import KernelLinear, PackedEmbedding
from saguaro.models.loader import DRAFT_AUTO_SCHEME, load_model, resolve_quantization
from saguaro.models.parallel import TensorParallel
from saguaro.models.quant import dequantize, exact_q8, pack_nibbles, quantize, unpack_nibbles
from tests.models.test_gguf_import import bpe_model

gguf = pytest.importorskip("gguf", reason="gguf is a dev dependency (pip install -e '.[dev]')")

BLOCK_SIZE = 16
PROMPT = [5, 17, 99, 3, 42, 8, 61, 7, 7, 30, 2, 250]
EXTENSION = [11, 12, 13, 14, 15]  # a K + 1 = 5-position verification
# Logits with every product's input rounded to int8 by blocks of 32 (half a step of 1/127 of a
# block's largest value), against the largest dense logit: 1.6% on the test model, so 3x that.
Q8_ACTIVATION_TOLERANCE = 0.05


def test_nibbles_round_trip_in_ggufs_layout():
    codes = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (3, 32)
    assert torch.equal(packed[:, 0] & 15, codes[:, 0]) and torch.equal(
        packed[:, 0] >> 4, codes[:, 16]
    )
    assert torch.equal(unpack_nibbles(packed), codes)


@pytest.mark.parametrize("scheme, group", [("int4", 32), ("int4-g64", 64), ("int4-g128", 128)])
def test_int4_rounds_each_weight_to_its_groups_nearest_level(scheme, group):
    w = torch.randn(6, 256)
    q = quantize(w, scheme)
    assert (q.fmt, q.group, tuple(q.scales.shape)) == ("q4", group, (6, 256 // group))
    step = q.scales.float().repeat_interleave(group, dim=1)
    # half a level, plus the float16 rounding of the group's minimum
    slack = (w.reshape(6, -1, group).amin(2) - q.mins.float()).abs().repeat_interleave(group, 1)
    assert ((dequantize(q) - w).abs() <= step / 2 * 1.001 + slack + 1e-6).all()


def test_int8_is_per_channel_and_symmetric():
    w = torch.randn(5, 96)
    q = quantize(w, "int8")
    assert (q.fmt, q.group) == ("q8", 96) and not q.mins.any()
    step = q.scales.float()
    assert ((dequantize(q) - w).abs() <= step / 2 * 1.001 + 1e-6).all()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return bpe_model(tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0", "q4_1"])
def test_a_ggufs_blocks_stand_for_exactly_its_dequantized_weights(source, tmp_path, dtype):
    path = export_gguf(source, tmp_path / "m.gguf", dtype)
    packed = gguf_linears(path, ModelConfig.from_dir(source))
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def file_weights(name: str) -> torch.Tensor:
        t = stored[name]
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    qkv = torch.cat(
        [
            deinterleave_rope_rows(file_weights("blk.1.attn_q.weight"), 4),
            deinterleave_rope_rows(file_weights("blk.1.attn_k.weight"), 2),
            file_weights("blk.1.attn_v.weight"),
        ]
    )
    assert torch.equal(dequantize(packed["layers.1.self_attn.qkv_proj"]), qkv)
    assert torch.equal(
        dequantize(packed["layers.0.mlp.down_proj"]), file_weights("blk.0.ffn_down.weight")
    )
    assert torch.equal(dequantize(packed["lm_head"]), file_weights("token_embd.weight"))


def forward_logits(model, queries) -> torch.Tensor:
    runner = ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE, device="cpu")
    return runner.forward([runner.sequence_query(*q) for q in queries])


def test_the_gguf_model_runs_the_files_blocks_bit_for_bit(source, tmp_path):
    """Q4_1's blocks map onto int4 groups, which the packed model multiplies by the very weights
    the dequantized checkpoint holds, in the kernels' one order, so its logits equal the dense
    kernels' exactly."""
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf", "q4_1"), tmp_path / "hf")
    quantized = load_model(imported, quantization="auto", kernels=True)
    assert isinstance(quantized.lm_head, KernelLinear)  # tied: the embedding's blocks
    assert quantized.lm_head.fmt == quantized.layers[0].mlp.down_proj.fmt == "q4"
    # the embedding is the head's blocks too, not a dense copy of them
    assert isinstance(quantized.embed_tokens, PackedEmbedding)
    assert quantized.embed_tokens.codes is quantized.lm_head.codes
    dense = load_model(imported, quantization="none", kernels=True)
    assert not isinstance(dense.embed_tokens, PackedEmbedding)  # its tied head holds the table
    ids = torch.tensor([[0, 5, 17], [3, 3, 1]])
    table = load_model(imported).embed_tokens.weight
    assert torch.equal(quantized.embed_tokens(ids), table[ids])
    assert dense.layers[0].mlp.down_proj.fmt == "f32"
    query = [(list(range(4)), 0, PROMPT, len(PROMPT))]
    assert torch.equal(forward_logits(quantized, query), forward_logits(dense, query))


def test_a_q8_0_file_runs_its_blocks_as_stored(source, tmp_path):
    """Q8_0 runs as GGUF's other block types do (quant_kernels.c): its codes, four rows
    interleaved, against the activation rounded to int8 row by row, so the logits are the
    dense model's up to that rounding; the embedding looks up the file's rows exactly."""
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf", "q8_0"), tmp_path / "hf")
    quantized = load_model(imported, quantization="auto", kernels=True)
    assert quantized.lm_head.fmt == quantized.layers[0].mlp.down_proj.fmt == "q8_0_x4"
    assert isinstance(quantized.embed_tokens, PackedEmbedding)
    assert quantized.embed_tokens.fmt == "q8_0"  # the file's blocks, rows as stored
    ids = torch.tensor([[0, 5, 17], [3, 3, 1]])
    table = load_model(imported).embed_tokens.weight
    assert torch.equal(quantized.embed_tokens(ids), table[ids])
    dense = load_model(imported, quantization="none", kernels=True)
    query = [(list(range(4)), 0, PROMPT, len(PROMPT))]
    got, want = forward_logits(quantized, query), forward_logits(dense, query)
    assert not torch.equal(got, want)  # the activation's rounding, not the dense product
    assert (got - want).abs().max() <= Q8_ACTIVATION_TOLERANCE * want.abs().max()


def test_auto_keeps_a_targets_dense_weights_and_quantizes_a_drafts(source, tmp_path):
    """Without a GGUF file, ``auto`` leaves a target's weights as they are (its logits are the
    model's) and gives a draft int8 on the kernels (a draft moves speed, never the output)."""
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf", "q8_0"), tmp_path / "hf")
    assert resolve_quantization(source, "auto", kernels=True) == "none"
    assert resolve_quantization(source, "auto", kernels=True, draft=True) == DRAFT_AUTO_SCHEME
    assert resolve_quantization(source, "auto", kernels=False, draft=True) == "none"
    assert resolve_quantization(imported, "auto", kernels=True, draft=True) == "gguf"
    draft = load_model(source, quantization="auto", kernels=True, draft=True)
    assert draft.layers[0].mlp.down_proj.fmt == "q8"
    assert (
        load_model(source, quantization="auto", kernels=True).layers[0].mlp.down_proj.fmt == "f32"
    )


def test_an_embedding_int8_holds_exactly_is_held_packed_and_no_other(source, tmp_path):
    """A table dequantized from Q8_0 (the shipped draft's is SmolLM2's) comes back exactly from
    int8 groups of 32, so it is held that way; a table that does not, as a trained float one,
    stays dense."""
    imported = import_gguf(export_gguf(source, tmp_path / "m.gguf", "q8_0"), tmp_path / "hf")
    table = load_model(imported).embed_tokens.weight.data
    q = exact_q8(table)
    assert q is not None and q.fmt == "q8" and q.group == 32
    assert torch.equal(dequantize(q), table)
    assert exact_q8(table * 1.0001) is None  # no longer d * code for float16 d
    assert exact_q8(table.bfloat16()) is None
    draft = load_model(imported, quantization="int8", kernels=True, draft=True)
    assert isinstance(draft.embed_tokens, PackedEmbedding)
    ids = torch.tensor([2, 9, 9, 40])
    assert torch.equal(draft.embed_tokens(ids), table[ids])
    dense = load_model(source, quantization="int8", kernels=True)  # a random float table
    assert not isinstance(dense.embed_tokens, PackedEmbedding)


def test_quantization_errors_name_the_way_out(source, tmp_path):
    with pytest.raises(ModelLoadError, match="model.gguf"):
        load_model(source, quantization="gguf", kernels=True)
    with pytest.raises(ModelLoadError, match="tensor-parallel"):
        load_model(source, quantization="int4", tp=TensorParallel(0, 2))


def token_logits_three_ways(model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits after PROMPT + EXTENSION[0]: decoded alone, as row 0 of a 5-position
    verification, and inside a batch of 16 sequences' verifications (this one 4th)."""
    runner = ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE, device="cpu")
    tables = [[2 * i, 2 * i + 1] for i in range(16)]
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(16)]
    runner.forward([runner.sequence_query(tables[i], 0, prompts[i], 0) for i in range(16)])
    start = len(PROMPT)
    alone = runner.forward([runner.sequence_query(tables[3], start, EXTENSION[:1], 1)])[0]
    verify = runner.forward([runner.sequence_query(tables[3], start, EXTENSION, 5)])[0]
    batch = runner.forward(
        [
            runner.sequence_query(tables[i], start, EXTENSION[: 1 + i % 5], 1 + i % 5)
            for i in range(16)
        ]
    )
    row = sum(1 + i % 5 for i in range(3))
    return alone, verify, batch[row]


@pytest.mark.parametrize(
    "dtype, quantization",
    [("float32", "none"), ("bfloat16", "none"), ("float32", "int4"), ("bfloat16", "int8")],
)
def test_a_tokens_logits_do_not_depend_on_what_shares_its_forward(tiny_llama, dtype, quantization):
    model = load_model(tiny_llama, dtype, quantization=quantization, kernels=True)
    alone, verify, batch = token_logits_three_ways(model)
    assert torch.equal(alone, verify) and torch.equal(alone, batch)
