"""The bucketed static-buffer path (saguaro.engine.graphs), run on the CPU without capture: every
kind of forward that fits a bucket gives the unbucketed forward's logits (bit for bit on
saguaro's batch-invariant kernels), padding never writes a cache row a real token owns, and a
forward beyond the largest bucket runs eagerly."""

from __future__ import annotations

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.config import EngineConfig
from saguaro.engine.graphs import MAX_GRAPH_ROWS, Buckets, Shape, ladder
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from tests.conftest import PROMPTS
from tests.engine.test_model_runner import _batches

NUM_BLOCKS, BLOCK_SIZE = 9, 16
# torch's matrix products may round a padded shape differently from the unpadded one.
TORCH_TOLERANCE = 1e-4  # logits here are about 10 in size: 1e-5 relative


def test_buckets_are_the_smallest_ladder_sizes_holding_the_forward():
    assert ladder(16) == (1, 2, 4, 8, 16) and ladder(12) == (1, 2, 4, 8, 12)
    buckets = Buckets.for_runner(max_num_seqs=12, max_keys=300, exact_positions=(5,))
    assert buckets.batch == (1, 2, 4, 8, 12)
    assert buckets.positions == (1, 2, 4, 5, 8, 16, 32, 64)
    assert buckets.keys == (256, 300)
    assert buckets.shape(3, 5, 40) == Shape(4, 5, 256)
    assert buckets.shape(12, 1, 257) == Shape(12, 1, 300)
    assert buckets.shape(13, 1, 10) is None  # past the largest batch
    assert buckets.shape(1, 17, 10) == Shape(1, 32, 256)
    assert buckets.shape(1, 65, 10) is None  # a long prefill chunk
    assert buckets.shape(1, 1, 301) is None  # past the longest context
    wide = Buckets.for_runner(max_num_seqs=64, max_keys=300)
    assert wide.shape(16, 32, 10) == Shape(16, 32, 256)
    assert wide.shape(64, 16, 10) is None and 64 * 16 > MAX_GRAPH_ROWS


def _runners(model_dir, kernels: bool) -> tuple[ModelRunner, ModelRunner]:
    buckets = Buckets.for_runner(max_num_seqs=4, max_keys=NUM_BLOCKS * BLOCK_SIZE)
    plain = ModelRunner(load_model(model_dir, kernels=kernels), NUM_BLOCKS, BLOCK_SIZE, "cpu")
    bucketed = ModelRunner(
        load_model(model_dir, kernels=kernels), NUM_BLOCKS, BLOCK_SIZE, "cpu", buckets=buckets
    )
    return plain, bucketed


@pytest.mark.parametrize("kernels", [True, False], ids=["saguaro-kernels", "torch"])
def test_bucketed_forwards_give_the_unbucketed_logits_and_cache(tiny_llama, kernels):
    plain, bucketed = _runners(tiny_llama, kernels)
    fitted = 0
    # A prefill longer than the largest position bucket runs eagerly, on the same cache.
    long_prompt = ("a long prefill", [plain.sequence_query([4, 5, 6, 7, 8], 0, [7] * 70, 1)])
    for kind, queries in [*_batches(plain), long_prompt]:
        inputs = plain.prepare(queries)
        fitted += bucketed.static.shape_of(inputs.mask) is not None
        want, got = plain.forward(queries), bucketed.forward(queries)
        if kernels:
            assert torch.equal(got, want), kind
        else:
            torch.testing.assert_close(got, want, atol=TORCH_TOLERANCE, rtol=0, msg=kind)
    assert fitted == len(_batches(plain))  # all but the long prefill
    scratch = plain.num_slots
    for (pk, pv), (bk, bv) in zip(plain.kv_caches, bucketed.kv_caches, strict=True):
        # Padding wrote the scratch row only: every row of the pool is the unbucketed one's,
        # the rows no real token wrote still zero.
        for want, got in ((pk, bk[:scratch]), (pv, bv[:scratch])):
            if kernels:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, atol=TORCH_TOLERANCE, rtol=0)
        assert bk[scratch].abs().sum() > 0  # padding did write somewhere: there


def test_padding_rows_never_change_a_real_sequences_logits(tiny_llama):
    """One decode alone and padded to a batch bucket of 4 beside three padding sequences, and
    again after other sequences filled the static buffers: the same bits."""
    _, bucketed = _runners(tiny_llama, kernels=True)
    q = bucketed.sequence_query
    ids = list(range(30, 60))
    bucketed.forward([q([0, 1], 0, ids[:10], 1)])
    alone = bucketed.forward([q([0, 1], 10, ids[10:11], 1)])
    crowd = [q([2 * i, 2 * i + 1], 0, ids[i : i + 12], 12) for i in range(1, 4)]
    bucketed.forward(crowd)  # leaves other tokens and keys in the buffers
    again = bucketed.forward([q([0, 1], 10, ids[10:11], 1)])
    assert torch.equal(alone, again)


def test_capture_is_a_no_op_on_the_cpu(tiny_llama):
    _, bucketed = _runners(tiny_llama, kernels=True)
    bucketed.capture_graphs((1, 5))
    assert bucketed.static.graphs == {} and not bucketed.static.capturing


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=7)


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_an_engine_on_the_bucketed_path_writes_the_eager_engines_tokens(
    tiny_llama, close_draft, monkeypatch, mode
):
    """The engine as it runs on a GPU (every runner bucketed: target, SD's draft, SSD's worker),
    on the CPU: greedy and seeded T > 0 tokens equal the eager engine's, whose logits are the
    same bits on saguaro's kernels."""
    # On the CPU wherever it runs: on a machine with a GPU, device="auto" would pick the GPU.
    engine = dict(device="cpu", max_model_len=256, max_num_seqs=8, num_speculative_tokens=3)
    if mode != "ar":
        engine.update(draft=str(close_draft), mode=mode)
    with LLM(model=str(tiny_llama), **engine) as eager:
        assert eager.engine.runner.static is None
        want = [eager.generate(PROMPTS, p) for p in (GREEDY, SEEDED)]
    monkeypatch.setattr(EngineConfig, "graphs_on", lambda self, device: True)
    with LLM(model=str(tiny_llama), **engine) as bucketed:
        assert bucketed.engine.runner.static is not None
        got = [bucketed.generate(PROMPTS, p) for p in (GREEDY, SEEDED)]
    for w, g in zip(want, got, strict=True):
        assert [o.token_ids for o in g] == [o.token_ids for o in w]
