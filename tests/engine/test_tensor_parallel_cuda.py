"""The tensor-parallel target on GPUs (NCCL for the model's collectives): TP = 2 against TP = 1 on
the same device type. Runs where two GPUs are visible (scripts/cuda_tp.sh); the CPU suite tests
the same code paths over gloo (test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from saguaro import LLM, SamplingParams
from tests.conftest import PROMPTS, write_tiny_model

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_two_gpu_target_generates_the_tokens_of_one(tmp_path, mode):
    target = write_tiny_model(tmp_path / "t", "qwen3", init_std=0.1, tie_word_embeddings=True)
    draft = write_tiny_model(tmp_path / "d", "qwen3", seed=1, init_std=0.1, num_hidden_layers=1)
    extra = {} if mode == "ar" else {"draft": str(draft), "num_speculative_tokens": 3}
    one = LLM(str(target), mode=mode, device="cuda", **extra)
    want = [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    one.close()
    two = LLM(str(target), mode=mode, device="cuda", tensor_parallel_size=2, **extra)
    try:
        assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == want
        assert two.engine.runner.kv_caches[0][0].device == torch.device("cuda", 0)  # rank 0
    finally:
        two.close()
