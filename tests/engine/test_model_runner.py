"""The compiled forward (``compile=True``) gives the eager forward's logits for every kind of
forward the engine and the draft worker run: prefill chunks, single-token decode, K+1
verification, mixed batches of different query lengths, and masked branch decoding; warming up
compiles all of them."""

from __future__ import annotations

import ctypes
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from saguaro.core.query import Query, token_slots
from saguaro.engine.model_runner import ALIGNMENT, ForwardClock, ModelRunner, kv_pool
from saguaro.models.loader import load_model

# Inductor's fused kernels reorder float32 sums: equal to the eager logits up to rounding.
TOLERANCE = 1e-4


def _batches(runner: ModelRunner) -> list[tuple[str, list[Query]]]:
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    a, b = list(range(0, 4)), list(range(4, 8))  # block tables of two sequences
    q = runner.sequence_query
    # Branch decoding: three branches at the same positions in different slots, each seeing the
    # shared prefix and its own token only.
    prefix = token_slots(a, 0, 20, runner.block_size)
    branch_slots = token_slots(a, 40, 43, runner.block_size)
    mask = np.zeros((3, 23), dtype=bool)
    mask[:, :20] = True
    mask[np.arange(3), 20 + np.arange(3)] = True
    branches = Query(
        ids[20:23], np.full(3, 20), branch_slots, np.concatenate([prefix, branch_slots]), 3, mask
    )
    return [
        ("prefill", [q(a, 0, ids[:20], 1), q(b, 0, ids[20:50], 1)]),
        ("decode", [q(a, 20, ids[50:51], 1), q(b, 30, ids[51:52], 1)]),
        ("verify", [q(a, 21, ids[52:57], 5), q(b, 31, ids[57:62], 5)]),
        ("mixed", [q(a, 26, ids[:1], 1), q(b, 36, ids[1:6], 5)]),
        ("branches", [branches]),
        ("a prompt alone, its last logit", [q(b, 0, ids[:10], 1)]),
        ("a prompt's first chunk, no logits", [q(a, 0, ids[:16], 0)]),
    ]


def test_compiled_forward_matches_eager_for_every_kind(tiny_llama):
    eager = ModelRunner(load_model(tiny_llama), 8, 16, "cpu")
    compiled = ModelRunner(load_model(tiny_llama), 8, 16, "cpu", compile=True)
    compiled.warm_up()
    graphs = counters["stats"]["unique_graphs"]
    for kind, queries in _batches(eager):
        want = eager.forward(queries)
        got = compiled.forward(queries)
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0, msg=kind)
    # Warming up compiled every kind: serving compiles nothing more.
    assert counters["stats"]["unique_graphs"] == graphs
    for (e_k, e_v), (c_k, c_v) in zip(eager.kv_caches, compiled.kv_caches, strict=True):
        assert torch.allclose(e_k, c_k, atol=TOLERANCE) and torch.allclose(e_v, c_v, atol=TOLERANCE)


def test_compiled_qwen3_with_qk_norm_matches_eager(tiny_qwen3):
    eager = ModelRunner(load_model(tiny_qwen3), 8, 16, "cpu")
    compiled = ModelRunner(load_model(tiny_qwen3), 8, 16, "cpu", compile=True)
    for kind, queries in _batches(eager)[:3]:  # prefill, decode, verify
        assert (compiled.forward(queries) - eager.forward(queries)).abs().max() <= TOLERANCE, kind


def test_prepare_lays_out_masks_padding_and_rows(tiny_llama):
    """One causal query of 2 tokens after 3 cached, one masked branch query of 1: the flat
    inputs, each query's mask in its corner, padded rows attending to key 0 only, and the maps
    between the flat tokens and the padded [b, Q] layout."""
    runner = ModelRunner(load_model(tiny_llama), 8, 4, "cpu")
    causal = runner.sequence_query([2, 5], 3, [11, 12], 2)
    keys = token_slots([6], 0, 2, 4)
    branch = Query([13], np.array([1]), keys[1:], keys, 1, np.array([[False, True]]))
    inputs = runner.prepare([causal, branch])
    assert inputs.input_ids.tolist() == [11, 12, 13]
    assert inputs.positions.tolist() == [3, 4, 1]
    assert inputs.slot_mapping.tolist() == [11, 20, 25]  # block 2 slot 3, block 5 slot 0, 6·4+1
    assert inputs.key_slots.tolist() == [[8, 9, 10, 11, 20], [24, 25, 0, 0, 0]]
    assert inputs.mask[0, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert inputs.mask[1, 0].int().tolist() == [[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert inputs.query_index.tolist() == [[0, 1], [2, 0]]
    assert inputs.out_index.tolist() == [0, 1, 2]
    assert inputs.logits_index.tolist() == [0, 1, 2]
    for t in (inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.key_slots):
        assert t.dtype == torch.int64
    assert inputs.mask.dtype == torch.bool


FORWARD_S = 0.2  # a forward's stand-in: a sleep, far above the host's timing jitter


def test_a_forward_clock_times_the_forward_without_a_graph_it_captured():
    """What a forward costs from now on: its time less any graph it captured on first use (a
    capture booked as a forward's cost once made SSD's planner build nothing for good)."""
    runner = SimpleNamespace(device=torch.device("cpu"), capture_s=0.0)
    plain = ForwardClock(runner)
    with pytest.raises(RuntimeError):
        plain.seconds()
    time.sleep(FORWARD_S)
    plain.stop()
    assert plain.seconds() >= FORWARD_S
    capturing = ForwardClock(runner)
    time.sleep(FORWARD_S)
    runner.capture_s += FORWARD_S  # the whole sleep was a capture
    capturing.stop()
    runner.capture_s += 1.0  # a later capture is not this forward's
    assert capturing.seconds() < FORWARD_S / 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_kv_pool_is_aligned_zeros_that_keep_what_is_written(dtype):
    pools = [kv_pool((33, 2, 8), dtype, torch.device("cpu")) for _ in range(4)]
    for pool in pools:
        assert pool.dtype == dtype and pool.shape == (33, 2, 8) and pool.is_contiguous()
        assert pool.data_ptr() % ALIGNMENT == 0
        assert torch.equal(pool, torch.zeros_like(pool))
    pools[0][5] = 1.5
    assert pools[0][5].eq(1.5).all() and pools[0].sum() == 1.5 * 16
    assert all(p.sum() == 0 for p in pools[1:])  # no pool shares another's memory


def _resident_share(t: torch.Tensor) -> float:
    """Share of ``t``'s pages the kernel has resident (mincore(2): exact, where /proc's RSS
    counters may lag behind a few large faults)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - first
    pages = -(-length // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec) / pages


POOL_MIB = 64  # large enough that calloc maps fresh pages, where nothing else ran before


def test_a_prefaulted_pool_is_resident_at_once():
    """``prefault`` writes every page of the pool at start-up (a lazy pool's pages become
    resident as they are first written, unless the allocator hands back memory already
    resident: that depends on what ran before, so only the prefaulted case is asserted)."""
    shape = (POOL_MIB * 2**20 // 4 // 64, 1, 64)  # float32 rows of 64
    pool = kv_pool(shape, torch.float32, torch.device("cpu"), prefault=True)
    assert _resident_share(pool) > 0.99
    assert not pool.any()
