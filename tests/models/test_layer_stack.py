"""The decoder layers in one kernel call (``ops.LayerStack``) compute what the layers' modules
compute calling the kernels one by one: the same logits and the same KV cache, bit for bit, in
every weight format, for prefill, decode, verification, mixed batches and masked branches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saguaro.core.query import Query
from saguaro.engine.model_runner import ModelRunner
from saguaro.kernels import ops
from saguaro.models.loader import load_model
from tests.models.test_gguf_direct import K_QUANTS, SMALL_BLOCKS, write_qwen2

TYPES = {"k_quants": K_QUANTS, "small_blocks": SMALL_BLOCKS}

BLOCK_SIZE = 16
PROMPTS = [[5, 17, 99, 3, 42, 8, 61, 7, 7, 30, 2, 250, 19], [40, 41, 42]]


def forwards(model, stacked: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Logits of a two-sequence prefill, a decode beside a verification, and masked branches;
    then every layer's keys and values."""
    model._stack = False if stacked else None  # None: the modules, kernel by kernel
    runner = ModelRunner(model, num_blocks=8, block_size=BLOCK_SIZE, device="cpu")
    tables, q = [[0, 1], [2, 3]], runner.sequence_query
    out = [runner.forward([q(tables[i], 0, p, len(p)) for i, p in enumerate(PROMPTS)])]
    n0, n1 = len(PROMPTS[0]), len(PROMPTS[1])
    out.append(runner.forward([q(tables[0], n0, [11], 1), q(tables[1], n1, [1, 2, 3, 4, 5], 5)]))
    # Three branches of one token each after sequence 1's verified tokens: each sees the
    # prefix and itself (a tree's sibling rows).
    prefix = q(tables[1], 0, [0] * (n1 + 5), 0).key_slots
    slots = np.array([32 + 10, 32 + 11, 32 + 12])
    mask = np.concatenate([np.ones((3, n1 + 5), dtype=bool), np.eye(3, dtype=bool)], axis=1)
    positions = np.full(3, n1 + 5)
    branches = Query([7, 8, 9], positions, slots, np.concatenate([prefix, slots]), 3, mask)
    out.append(runner.forward([branches]))
    assert (model._stack is not None) == stacked
    return out, [c for kv in runner.kv_caches for c in kv]


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_one_call_per_forward_gives_the_modules_bits(tiny_llama, quantization):
    model = load_model(tiny_llama, "float32", quantization=quantization, kernels=True)
    logits, caches = forwards(model, stacked=True)
    logits_modules, caches_modules = forwards(model, stacked=False)
    assert all(torch.equal(a, b) for a, b in zip(logits, logits_modules, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(caches, caches_modules, strict=True))


def test_layers_the_kernel_does_not_cover_stay_on_the_modules(tiny_llama, tiny_qwen3):
    qwen = load_model(tiny_qwen3, "float32", kernels=True)
    assert qwen.layer_stack() is None  # per-head q/k norms
    assert load_model(tiny_llama, "float32", kernels=False).layer_stack() is None
    model = load_model(tiny_llama, "float32", kernels=True)
    assert isinstance(model.layer_stack(), ops.LayerStack)
    model.to(torch.bfloat16)  # cast weights: the stack's pointers would be stale
    assert model._stack is False and model.layer_stack() is None  # bf16 norms


def test_a_slot_outside_the_caches_is_an_error_that_writes_nothing(tiny_llama):
    model = load_model(tiny_llama, "float32", kernels=True)
    runner = ModelRunner(model, num_blocks=2, block_size=BLOCK_SIZE, device="cpu")
    query = runner.sequence_query([0, 1], 0, PROMPTS[0], 1)
    query.slots[-1] = runner.num_slots  # one past the pool
    with pytest.raises(ValueError, match="slot outside"):
        runner.forward([query])
    assert not any(c.any() for kv in runner.kv_caches for c in kv)


@pytest.mark.parametrize("types", ["k_quants", "small_blocks"])
def test_qwen2_layers_with_biases_and_mixed_formats_give_the_modules_bits(types, tmp_path):
    """A Qwen2 file's layers (QKV bias; a Q6_K value beside Q4_K query and key, run part by
    part; 32-weight blocks) run in one call too, with the modules' bits."""
    path = write_qwen2(tmp_path / "q.gguf", TYPES[types], hidden=256, seed=3)
    model = load_model(path, "float32", quantization="auto", kernels=True)
    assert model.layer_stack() is not None and model.layers[0].self_attn.qkv_proj.bias is not None
    logits, caches = forwards(model, stacked=True)
    logits_modules, caches_modules = forwards(model, stacked=False)
    assert all(torch.equal(a, b) for a, b in zip(logits, logits_modules, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(caches, caches_modules, strict=True))
