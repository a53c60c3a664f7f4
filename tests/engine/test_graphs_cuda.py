"""CUDA graphs on a GPU (saguaro.engine.graphs): replay gives the eager forward's logits, greedy SD
and SSD through graphs equal AR, and SD's first two tokens at T > 0 follow the exact law. Runs
where a GPU is visible (scripts/gpu_check.sh); tests/engine/test_graphs.py tests the same
bucketed path on the CPU, without capture."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.engine.graphs import Buckets
from saguaro.engine.model_runner import ForwardClock, ModelRunner
from saguaro.kernels import transfer
from saguaro.models.loader import load_model
from tests.conftest import FIRST_TWO_SAMPLES, PROMPTS, exact_first_two, sample_first_two
from tests.engine.test_model_runner import _batches
from tests.stats import assert_first_two_follow

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

NUM_BLOCKS, BLOCK_SIZE = 8, 16
# A padded product may take another cuBLAS kernel than the unpadded one: float32 rounding.
TOLERANCE = 1e-3
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
ENGINE = dict(device="cuda", max_model_len=256, max_num_seqs=8)


def test_graph_replay_gives_the_eager_logits_and_cache(tiny_llama):
    buckets = Buckets.for_runner(max_num_seqs=4, max_keys=NUM_BLOCKS * BLOCK_SIZE)
    eager = ModelRunner(load_model(tiny_llama, device="cuda"), NUM_BLOCKS, BLOCK_SIZE, "cuda")
    graphed = ModelRunner(
        load_model(tiny_llama, device="cuda"), NUM_BLOCKS, BLOCK_SIZE, "cuda", buckets=buckets
    )
    graphed.capture_graphs((1, 5))
    captured = len(graphed.static.graphs)
    assert captured > 0
    for kind, queries in _batches(eager):
        want, got = eager.forward(queries), graphed.forward(queries)
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0, msg=kind)
    assert len(graphed.static.graphs) > captured  # other shapes were captured on first use
    scratch = eager.num_slots
    for (ek, ev), (gk, gv) in zip(eager.kv_caches, graphed.kv_caches, strict=True):
        torch.testing.assert_close(gk[:scratch], ek, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(gv[:scratch], ev, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_speculation_through_graphs_equals_ar(tiny_llama, close_draft, mode):
    with LLM(model=str(tiny_llama), enforce_eager=True, **ENGINE) as ar:
        want = [o.token_ids for o in ar.generate(PROMPTS, GREEDY)]
    spec = dict(draft=str(close_draft), mode=mode, num_speculative_tokens=3)
    with LLM(model=str(tiny_llama), **spec, **ENGINE) as llm:
        assert llm.engine.runner.static is not None and llm.engine.runner.static.graphs
        for batch in (1, 3, 8):
            got = [o.token_ids for o in llm.generate(PROMPTS[:batch], GREEDY)]
            assert got == want[:batch], batch


SEEDED = [
    SamplingParams(temperature=0.7, top_p=0.95, seed=100 + i, max_tokens=24, ignore_eos=True)
    for i in range(len(PROMPTS))
]


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_coupled_speculation_through_graphs_gives_coupled_ars_seeded_tokens(
    tiny_llama, close_draft, mode
):
    """At T > 0 with coupled sampling a seeded request's tokens are the target's own perturbed
    argmaxes, whatever was proposed: SD and SSD (its worker ranking and drawing on the GPU)
    give coupled AR's, and the worker is still up at the end (a failure would fall back to
    AR and hide itself)."""
    with LLM(model=str(tiny_llama), enforce_eager=True, sampling="coupled", **ENGINE) as ar:
        want = [o.token_ids for o in ar.generate(PROMPTS, SEEDED)]
    spec = dict(draft=str(close_draft), mode=mode, num_speculative_tokens=3, sampling="coupled")
    with LLM(model=str(tiny_llama), **spec, **ENGINE) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, SEEDED)]
        assert llm.last_run["acceptance_rate"] > 0.3
        if mode == "ssd":
            assert llm.engine.proposer.worker is not None
    assert got == want


SAMPLES = FIRST_TWO_SAMPLES
BATCH = 64  # the largest graph batch bucket


def test_sd_through_graphs_first_two_tokens_follow_the_target(small_vocab_pair):
    target, close, _ = small_vocab_pair
    expected = exact_first_two(
        target, [1, 4, 2], SamplingParams(temperature=0.7, max_tokens=4, ignore_eos=True)
    )

    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.7, max_tokens=4, ignore_eos=True, seed=seed)

    def graphed(llm: LLM) -> None:
        assert llm.engine.runner.static is not None and llm.engine.runner.static.graphs

    counts, _ = sample_first_two(
        target, close, params, SAMPLES, BATCH, prepare=graphed,
        mode="sd", num_speculative_tokens=3, device="cuda",
    )  # fmt: skip
    assert_first_two_follow(counts, expected, "SD on CUDA graphs")


GPU_SPIN_CYCLES = 200_000_000  # some 0.1 s of a GPU's clock: far beyond the host's launch


def test_a_forward_clock_on_a_gpu_times_the_work_not_its_launch():
    """The host returns from queued kernels at once; the clock reads the GPU's events, so the
    cost models see what a forward takes (a launch's time made SSD's window look too short to
    build in)."""
    runner = SimpleNamespace(device=torch.device("cuda"), capture_s=0.0)
    clock = ForwardClock(runner)
    torch.cuda._sleep(GPU_SPIN_CYCLES)
    clock.stop()
    assert clock.seconds() > 0.05
    assert clock.host_s is not None and clock.host_s < clock.seconds() / 2


def _graphs(llm: LLM) -> int:
    runners = (llm.engine.runner, getattr(llm.engine.proposer, "runner", None))
    return sum(len(r.static.graphs) for r in runners if r is not None and r.static is not None)


def _syncs_per_step(llm: LLM, params: SamplingParams) -> tuple[float, Counter]:
    """Host-device synchronisations per engine step of a warm ``llm`` generating PROMPTS, and
    the lines that caused them. A graph captured on a shape's first use waits once for its
    warm-up run: a one-time cost per shape, not counted."""
    for _ in range(2):  # captures and allocator pools on first use, then prefix-cache hits
        llm.generate(PROMPTS, params)
    steps, graphs = llm.engine.num_steps, _graphs(llm)
    with transfer.waits_recorded() as caught:
        llm.generate(PROMPTS, params)
    lines = Counter(f"{w.filename}:{w.lineno}" for w in caught)
    lines["graphs captured"] = captures = _graphs(llm) - graphs
    return (len(caught) - captures) / (llm.engine.num_steps - steps), lines


SAMPLED = SamplingParams(temperature=0.7, max_tokens=32, ignore_eos=True, seed=0)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "T=0.7"])
def test_an_ar_step_waits_for_the_gpu_once(tiny_llama, params):
    """Everything an AR step does, greedy or sampling at a temperature, is queued on the GPU;
    the host waits once, for the copy of the round's outcome (committed tokens, counts, invalid
    flags) that scheduling needs. (Top-k and top-p cut-offs still read rows back.)"""
    with LLM(model=str(tiny_llama), **ENGINE) as llm:
        per_step, lines = _syncs_per_step(llm, params)
    assert per_step == 1, lines


@pytest.mark.parametrize("sampling", ["rejection", "coupled"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "T=0.7"])
def test_an_sd_step_waits_for_the_gpu_twice(tiny_llama, close_draft, params, sampling):
    """SD's draft keeps each depth's tokens on the GPU for the next depth's forward and reads
    them once, after the last (the engine builds the round from them); the verifier tests
    every position at once on the GPU; then the round's outcome is read. Two waits a step
    (prefill steps draft nothing: at most two). Without the chain's context lookup, which reads
    each depth's tokens on the host."""
    spec = dict(
        draft=str(close_draft),
        mode="sd",
        num_speculative_tokens=3,
        sampling=sampling,
        draft_lookup=0,
    )
    with LLM(model=str(tiny_llama), **spec, **ENGINE) as llm:
        per_step, lines = _syncs_per_step(llm, params)
    assert per_step <= 2, lines
