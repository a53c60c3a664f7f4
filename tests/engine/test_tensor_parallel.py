"""A tensor-parallel target in real processes (gloo on CPU): TP = 2 computes what TP = 1 does,
generates the same tokens in every mode, and ends cleanly, whether closed or broken."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.distributed.processes import alive, children
from saguaro.engine.model_runner import ModelRunner
from saguaro.errors import TensorParallelError
from saguaro.models.loader import load_model
from tests.conftest import PROMPTS, write_tiny_model
from tests.models.test_parity import LLAMA3_ROPE
from tests.speculation.test_sd import check_sd_first_two

# TP = 2 sums each projection in two halves: float reassociation, not bit-for-bit equality.
LOGITS_ATOL = 1e-4
GREEDY = SamplingParams(temperature=0, max_tokens=24)

CASES = {
    # GQA (8 query heads over 2 KV heads: one KV head per rank) with Llama-3 RoPE scaling.
    "llama3-gqa": (
        "llama",
        dict(num_attention_heads=8, num_key_value_heads=2, rope_scaling=LLAMA3_ROPE),
    ),
    # q/k norm, tied head, and a vocabulary the two ranks split unevenly (263 = 132 + 131).
    "qwen3-tied-odd-vocab": ("qwen3", dict(tie_word_embeddings=True, vocab_size=263)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tp_pair(request, tmp_path_factory):
    """(model dir, TP = 2 LLM) for each case; the LLM is closed after the module."""
    family, overrides = CASES[request.param]
    # Moderate init keeps logits O(1-10) so an absolute tolerance is meaningful.
    model_dir = write_tiny_model(
        tmp_path_factory.mktemp(request.param), family, init_std=0.1, **overrides
    )
    llm = LLM(str(model_dir), tensor_parallel_size=2, num_kv_blocks=64, max_num_seqs=8)
    yield model_dir, llm
    llm.close()


def test_two_ranks_give_the_logits_of_one(tp_pair):
    """Prefill, single-token decode and K+1 verification, in one batch with uneven lengths."""
    model_dir, llm = tp_pair
    parallel = llm.engine.runner
    single = ModelRunner(load_model(model_dir), num_blocks=8, block_size=16, device="cpu")
    kv_heads = single.kv_caches[0][0].shape[1]
    assert parallel.kv_caches[0][0].shape[1] == kv_heads // 2  # each rank caches its own heads
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    a, b = [0, 1, 2], [3, 4]  # two sequences' block tables
    steps = [
        [(a, 0, ids[:30], 30), (b, 0, ids[5:12], 7)],  # prefill, two lengths
        [(a, 30, ids[30:31], 1), (b, 7, ids[12:17], 5)],  # decode beside a K+1 = 5 verify
        [(a, 31, ids[31:36], 5)],  # verify alone
    ]
    for step in steps:
        got = parallel.forward([parallel.sequence_query(*q) for q in step])
        want = single.forward([single.sequence_query(*q) for q in step])
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0)


def test_two_ranks_generate_the_tokens_of_one(tp_pair):
    model_dir, llm = tp_pair
    reference = LLM(str(model_dir), num_kv_blocks=64, max_num_seqs=8)
    want = [o.token_ids for o in reference.generate(PROMPTS, GREEDY)]
    reference.close()
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want
    assert llm.snapshot().tensor_parallel_size == 2


def test_sizes_the_model_cannot_split_are_refused_before_any_rank_starts(tmp_path):
    model_dir = write_tiny_model(tmp_path / "m", "llama", num_key_value_heads=1)
    before = set(children(os.getpid()))
    with pytest.raises(ValueError, match="tensor_parallel_size=2 does not divide .*KV heads"):
        LLM(str(model_dir), tensor_parallel_size=2)
    assert set(children(os.getpid())) == before


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_speculation_on_a_two_rank_target_equals_ar(tiny_llama, close_draft, mode):
    reference = LLM(str(tiny_llama), max_num_seqs=8)
    want = [o.token_ids for o in reference.generate(PROMPTS, GREEDY)]
    reference.close()
    llm = LLM(
        str(tiny_llama),
        str(close_draft),
        mode=mode,
        tensor_parallel_size=2,
        num_speculative_tokens=3,
        max_num_seqs=8,
    )
    try:
        outs = llm.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == want
        assert llm.last_run["accepted"] > 0
    finally:
        llm.close()


@pytest.mark.slow
def test_sd_on_a_two_rank_target_samples_the_target_at_t_above_zero(small_vocab_pair):
    """The first two tokens' law at T = 0.8, top-p 0.9: TV within the noise floor."""
    target, close, _ = small_vocab_pair
    llm = check_sd_first_two(target, close, 0.8, 0.9, tensor_parallel_size=2)
    try:
        assert 0 < llm.last_run["accepted"] < llm.last_run["drafted"]
    finally:
        llm.close()


def test_a_killed_rank_ends_the_engine_with_a_clear_error(tiny_llama):
    llm = LLM(str(tiny_llama), tensor_parallel_size=2, tensor_parallel_timeout_s=30)
    (pid,) = llm.engine.tensor_parallel.pids()
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    started = threading.Event()

    def kill_once_decoding() -> None:
        while llm.engine.num_steps < 3:
            time.sleep(0.005)
        started.set()
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_decoding)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match="rank 1 exited \\(killed by SIGKILL\\)"):
        llm.generate(["def f(x):"] * 2, params, use_tqdm=False)
    assert time.monotonic() - t0 < 30
    killer.join()
    assert started.is_set()
    assert "rank 1" in llm.snapshot().failure
    with pytest.raises(TensorParallelError):  # the engine stays failed: it cannot compute
        llm.generate(["x"], GREEDY)
    llm.close()
    assert not alive(pid)


def test_closing_stops_every_rank(tiny_llama):
    llm = LLM(str(tiny_llama), tensor_parallel_size=2)
    pids = llm.engine.tensor_parallel.pids()
    assert all(alive(p) for p in pids)
    llm.close()
    assert not any(alive(p) for p in pids)


def test_ranks_do_not_outlive_a_killed_rank_0(tiny_llama):
    """SIGKILL leaves rank 0 no chance to stop its ranks: they notice and exit by themselves."""
    script = (
        "import sys; from saguaro import LLM; "
        f"llm = LLM({str(tiny_llama)!r}, tensor_parallel_size=2); "
        "print(*llm.engine.tensor_parallel.pids(), flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    (rank,) = (int(p) for p in proc.stdout.readline().split())
    assert alive(rank)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(rank):
        assert time.monotonic() < deadline, "a rank outlived its killed rank 0"
        time.sleep(0.05)


def test_an_interrupted_forward_stops_the_ranks_and_the_engine(tiny_llama, monkeypatch):
    """Ctrl-C inside rank 0's part of a forward leaves the ranks mid-collective, out of step
    for good: the interrupt propagates, the ranks are stopped, and the engine says why."""
    llm = LLM(str(tiny_llama), tensor_parallel_size=2)
    (pid,) = llm.engine.tensor_parallel.pids()

    def interrupted(self, inputs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ModelRunner, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["x"], GREEDY)
    assert "KeyboardInterrupt" in llm.snapshot().failure
    assert not alive(pid)
    llm.close()
