"""SSD with a real draft-worker process over gloo: exact with hits, misses and every backup,
per-sequence backups, fault tolerance, side-by-side engines and external workers."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.distributed.channel import free_port
from saguaro.speculation import protocol
from tests.conftest import (
    FIRST_TWO_SAMPLES,
    PROMPTS,
    SMALL_VOCAB,
    exact_first_two,
    first_two_tokens,
)
from tests.stats import assert_first_two_follow

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def ar_reference(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    return {p: o.token_ids for p, o in zip(PROMPTS, llm.generate(PROMPTS, GREEDY), strict=True)}


def ssd(target, draft, **kw) -> LLM:
    kw.setdefault("max_model_len", 256)
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("draft_timeout_s", 60)
    # these tests cover rejection sampling's paths; coupled SSD has tests of its own
    kw.setdefault("sampling", "rejection")
    return LLM(model=str(target), draft=str(draft), mode="ssd", **kw)


def check_greedy(llm, ar_reference, sizes=range(1, 9)):
    for batch in sizes:
        outs = llm.generate(PROMPTS[:batch], GREEDY)
        for prompt, out in zip(PROMPTS, outs, strict=False):
            assert out.token_ids == ar_reference[prompt], (batch, prompt)


@pytest.mark.parametrize(
    "name, k, overrides",
    [
        # A fixed fan-out: for a draft as costly as its target the planner builds no cache. The
        # draft is the target only in the target's precision (auto would quantize it to int8),
        # proposing its own argmax (no copies from the context, no confidence stop).
        (
            "hits (draft = target)",
            2,
            dict(
                draft="target",
                fanout=[2, 2, 2],
                draft_quantization="none",
                draft_lookup=0,
                draft_stop_below=0,
            ),
        ),
        ("auto fan-out, close draft", 5, dict(draft="close")),
        ("misses + neural backup", 5, dict(draft="close", fanout="0", backup="neural")),
        ("misses + fast backup", 2, dict(draft="close", fanout="0", backup="fast")),
        ("random draft, fixed fan-out", 2, dict(draft="random", fanout=[2, 1, 1])),
        (
            "hits, bfloat16 draft",
            3,
            dict(draft="close", fanout=[2, 1, 1, 2], draft_dtype="bfloat16"),
        ),
    ],
)
def test_greedy_ssd_equals_ar(
    tiny_llama, tiny_draft, close_draft, ar_reference, name, k, overrides
):
    draft = {"target": tiny_llama, "close": close_draft, "random": tiny_draft}[
        overrides.pop("draft")
    ]
    with ssd(tiny_llama, draft, num_speculative_tokens=k, **overrides) as llm:
        # a variant of the hit path (the draft's precision): a few batch sizes suffice
        check_greedy(llm, ar_reference, (1, 3, 8) if "bfloat16" in name else range(1, 9))
        run = llm.last_run
        if name.startswith("hits ("):
            assert run["cache_hit_rate"] > 0.9 and run["mean_accepted_length"] > 2.5
        if name.startswith("hits,"):
            assert run["cache_hit_rate"] > 0.3
        if name.startswith("misses"):
            assert run["cache_hit_rate"] == 0
            assert set(run["backups"]) == {overrides["backup"]}


@pytest.mark.parametrize("dtype, quantization", [("bfloat16", "none"), ("float32", "int4")])
def test_greedy_ssd_equals_ar_in_every_precision(tiny_llama, close_draft, dtype, quantization):
    engine = dict(dtype=dtype, quantization=quantization, max_model_len=256)
    ar = LLM(model=str(tiny_llama), **engine).generate(PROMPTS, GREEDY)
    reference = {p: o.token_ids for p, o in zip(PROMPTS, ar, strict=True)}
    with ssd(
        tiny_llama, close_draft, num_speculative_tokens=3, fanout=[2, 1, 1, 2], **engine
    ) as llm:
        check_greedy(llm, reference, (1, 3, 8))
        assert llm.last_run["cache_hit_rate"] > 0.3


def test_tight_token_budget(tiny_llama, close_draft, ar_reference):
    """A token budget that cuts rounds short, sometimes to no proposal at all: the target then
    commits tokens the worker did not speculate on, which must never count as a hit."""
    with ssd(tiny_llama, close_draft, num_speculative_tokens=3, max_num_batched_tokens=6) as llm:
        outs = llm.generate(PROMPTS[:4], GREEDY)
    assert [o.token_ids for o in outs] == [ar_reference[p] for p in PROMPTS[:4]]


def test_hits_kept_when_others_in_the_batch_miss(tiny_llama, close_draft):
    """Backups are per sequence: in steps where some sequences miss, the others still hit."""
    with ssd(
        tiny_llama, close_draft, num_speculative_tokens=3, fanout=[1, 1, 1, 1], backup="neural"
    ) as llm:
        outs = llm.generate(PROMPTS, GREEDY)
        records = [r for o in outs for r in o.records if r.hit is not None]
    by_step = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r)
    mixed = [rs for rs in by_step.values() if any(r.hit for r in rs) and not all(r.hit for r in rs)]
    assert mixed, "expected steps with both hits and misses"
    for rs in mixed:
        hits = [r for r in rs if r.hit]
        assert all(r.backup is None and r.num_drafted > 0 for r in hits)
        assert all(r.backup == "neural" for r in rs if not r.hit)


def test_metrics(tiny_llama, close_draft):
    with ssd(tiny_llama, close_draft, num_speculative_tokens=3) as llm:
        out = llm.generate(PROMPTS[:2], GREEDY)
        stats = llm.engine.proposer.stats(batch=1)
    m = out[0].metrics
    assert 0 <= m["cache_hit_rate"] <= 1 and m["wait_s"] >= 0
    assert m["mean_accepted_length_hit"] is None or m["mean_accepted_length_hit"] >= 1
    assert sum(stats["fanout"]) == stats["budget"] and 1 <= stats["depth"] <= 3
    assert len(stats["fanout"]) == stats["depth"] + 1
    assert stats["policy"]["p_hit"] > 0


# ---- exactness at temperature > 0 (vocabulary of 8: exact enumeration) ------------------------

V = SMALL_VOCAB
PROMPT_V = list(range(V))
SAMPLES = FIRST_TWO_SAMPLES
BATCH = 1_000


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, temperature, top_p, overrides",
    [
        ("hit path", 1.0, 1.0, dict(fanout=[3, 2, 2, 3])),
        ("miss + neural backup", 0.7, 1.0, dict(fanout="0", backup="neural")),
        ("miss + fast backup", 1.0, 1.0, dict(fanout="0", backup="fast")),
        ("saguaro C=0.3", 1.0, 1.0, dict(fanout=[3, 2, 2, 3], saguaro_c=0.3)),
        ("top-p 0.8, auto", 0.9, 0.8, dict(cache_budget=6)),
        ("planned budget and depth", 1.0, 1.0, dict()),
        (
            "bfloat16 draft, hits and neural misses",
            1.0,
            1.0,
            dict(fanout=[1, 1, 1, 1], backup="neural", draft_dtype="bfloat16"),
        ),
        # After 0, 1, .., V - 1 every token has occurred: with one-token n-grams each chain and
        # branch copies from the context after its first drawn token (or at once after an
        # outcome token): q mixes the draft's rows with point masses.
        ("hit path, copies", 1.0, 1.0, dict(fanout=[3, 2, 2, 3], draft_lookup=1, prompt=PROMPT_V)),
        (
            "miss + neural backup, copies",
            0.7,
            1.0,
            dict(fanout="0", backup="neural", draft_lookup=1, prompt=PROMPT_V),
        ),
    ],
)
def test_ssd_first_two_tokens_follow_target(small_vocab_pair, name, temperature, top_p, overrides):
    target, draft, _ = small_vocab_pair
    check_first_two(target, draft, name, temperature, top_p, overrides)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, overrides",
    [("hit path", dict(fanout=[3, 2, 2, 3])), ("miss + neural", dict(fanout="0", backup="neural"))],
)
def test_ssd_first_two_tokens_follow_confident_target(confident_pair, name, overrides):
    """Rows that round to one-hot at T = 0.5, a draft that proposes their improbable tokens."""
    check_first_two(*confident_pair, f"confident, {name}", 0.5, 1.0, overrides)


def check_first_two(target, draft, name, temperature, top_p, overrides):
    """``overrides``: EngineConfig fields, and ``prompt`` (default [1, 4, 2])."""
    overrides = dict(overrides)
    prompt = overrides.pop("prompt", [1, 4, 2])
    base = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=4, ignore_eos=True)
    expected = exact_first_two(target, prompt, base)
    counts, backups = torch.zeros(V, V), Counter()
    seeds = itertools.count()
    with ssd(
        target,
        draft,
        num_speculative_tokens=3,
        max_model_len=32,
        max_num_seqs=BATCH,
        num_kv_blocks=BATCH,
        block_size=16,
        max_num_batched_tokens=20 * BATCH,
        **overrides,
    ) as llm:
        hits = 0
        for _ in range(SAMPLES // BATCH):
            params = [
                SamplingParams(
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=4,
                    ignore_eos=True,
                    seed=next(seeds),
                )
                for _ in range(BATCH)
            ]
            for t1, t2 in first_two_tokens(llm, prompt, params):
                counts[t1, t2] += 1
            hits += llm.last_run["cache_hit_rate"] > 0
            backups.update(llm.last_run.get("backups", {}))
    assert_first_two_follow(counts, expected, name)
    if "fanout" in overrides and overrides["fanout"] != "0":
        assert hits, "the hit path was not exercised"
    if "backup" in overrides:  # the backup named served misses: the path under test ran
        assert backups[overrides["backup"]] > 0, f"{name}: backups {dict(backups)}"


# ---- fault tolerance and process management ---------------------------------------------------


def _run_with_fault(llm, fault, steps_before=3):
    eng = llm.engine
    seqs = [eng.add_request(eng.encode_prompt(p), GREEDY) for p in PROMPTS[:4]]
    for _ in range(steps_before):
        eng.step()
    fault(eng.proposer.worker.proc)
    t0 = time.monotonic()
    while eng.has_unfinished():
        eng.step()
        assert time.monotonic() - t0 < 60, "generation hung after the draft worker failed"
    return seqs


def test_worker_killed_mid_generation(tiny_llama, close_draft, ar_reference, caplog):
    with caplog.at_level(logging.WARNING, logger="saguaro"):
        with ssd(tiny_llama, close_draft, num_speculative_tokens=3, draft_restarts=0) as llm:
            seqs = _run_with_fault(llm, lambda proc: proc.kill())
            assert (
                llm.engine.draft_health().failure and "exited" in llm.engine.draft_health().failure
            )
            assert llm.engine.draft_health().state == "failed"
    for p, s in zip(PROMPTS, seqs, strict=False):
        assert s.output_token_ids == ar_reference[p]
    assert "continuing without speculation" in caplog.text


def test_worker_that_stops_answering_times_out(tiny_llama, close_draft, ar_reference):
    with ssd(
        tiny_llama, close_draft, num_speculative_tokens=3, draft_timeout_s=2, draft_restarts=0
    ) as llm:
        proc = llm.engine.proposer.worker.proc
        try:
            seqs = _run_with_fault(llm, lambda p: os.kill(p.pid, signal.SIGSTOP))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
        assert "stopped answering" in llm.engine.draft_health().failure
    for p, s in zip(PROMPTS, seqs, strict=False):
        assert s.output_token_ids == ar_reference[p]
    assert proc.wait(timeout=10) is not None  # reaped


def test_two_engines_side_by_side_and_shutdown_reaps(tiny_llama, close_draft, ar_reference):
    a = ssd(tiny_llama, close_draft, num_speculative_tokens=2)
    b = ssd(tiny_llama, close_draft, num_speculative_tokens=3)
    pa, pb = a.engine.proposer.worker, b.engine.proposer.worker
    assert pa.channel.port != pb.channel.port
    outs = a.generate(PROMPTS[:2], GREEDY) + b.generate(PROMPTS[:2], GREEDY)
    assert [o.token_ids for o in outs] == [ar_reference[p] for p in PROMPTS[:2]] * 2
    a.close()
    b.close()
    assert pa.proc.poll() is not None and pb.proc.poll() is not None
    import socket

    with socket.socket() as s:  # nothing listens on the rendezvous port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", pa.channel.port))


def test_external_worker_via_env_rendezvous(tiny_llama, close_draft, ar_reference):
    """Multi-host layout on one machine: the worker is started on its own (as on another host)
    with MASTER_ADDR / MASTER_PORT, and the engine waits for it."""
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    worker = subprocess.Popen([sys.executable, "-m", "saguaro.speculation.worker"], env=env)
    try:
        with ssd(
            tiny_llama,
            close_draft,
            num_speculative_tokens=2,
            draft_worker="external",
            draft_port=port,
        ) as llm:
            outs = llm.generate(PROMPTS[:3], GREEDY)
        assert [o.token_ids for o in outs] == [ar_reference[p] for p in PROMPTS[:3]]
        assert worker.wait(timeout=10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()


# ---- reproducibility ---------------------------------------------------------------------------


def sd_tokens(target, draft, prompts, params, **engine) -> list[list[int]]:
    """SD's tokens (K = 3) for ``prompts``: what SSD with a neural backup and C = 1 commits."""
    sd = LLM(
        model=str(target),
        draft=str(draft),
        mode="sd",
        num_speculative_tokens=3,
        max_model_len=256,
        **engine,
    )
    try:
        return [o.token_ids for o in sd.generate(prompts, params)]
    finally:
        sd.close()


def test_seeded_text_is_the_same_alone_in_a_batch_and_in_sd(tiny_llama, close_draft):
    """Counter-based noise: a seeded request's draft tokens depend on (seed, position) only, so
    SSD with a neural backup and C = 1 proposes what SD proposes, hit or miss, and commits the
    same text alone, in any batch, and as SD (up to float rounding of the forwards)."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=10 + i, max_tokens=24, ignore_eos=True)
        for i in range(4)
    ]
    expected = sd_tokens(tiny_llama, close_draft, PROMPTS[:4], params)
    with ssd(
        tiny_llama, close_draft, num_speculative_tokens=3, fanout=[2, 1, 1, 2], backup="neural"
    ) as llm:
        batched = [o.token_ids for o in llm.generate(PROMPTS[:4], params)]
        assert 0 < llm.last_run["cache_hit_rate"] < 1  # both paths ran
        alone = [llm.generate(p, q)[0].token_ids for p, q in zip(PROMPTS[:4], params, strict=True)]
    assert batched == expected
    assert alone == expected


def test_replies_over_the_device_lane_give_the_same_text(tiny_llama, close_draft, monkeypatch):
    """Between a target and a worker on two GPUs the replies' q travel over the channel's
    device lane (NCCL). Forced here on CPU (gloo), the same path must commit SD's text."""
    monkeypatch.setattr(protocol, "lane_between", lambda target, worker: True)
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=20 + i, max_tokens=16, ignore_eos=True)
        for i in range(3)
    ]
    expected = sd_tokens(tiny_llama, close_draft, PROMPTS[:3], params, sampling="rejection")
    with ssd(
        tiny_llama,
        close_draft,
        num_speculative_tokens=3,
        fanout=[2, 1, 1, 2],
        backup="neural",
        sampling="rejection",
    ) as llm:
        assert llm.engine.proposer.worker.channel.lane is not None
        got = [o.token_ids for o in llm.generate(PROMPTS[:3], params)]
        assert llm.last_run["drafted"] > 0
    assert got == expected


def test_requests_that_reach_the_end_of_the_context_keep_the_worker(tiny_llama, close_draft):
    """Branches and backups never decode past the model's context: a request near the end
    speculates less, and the worker survives to serve the next requests."""
    limit = 512  # the tiny models' max_position_embeddings: RoPE has no row past it
    params = SamplingParams(temperature=0, max_tokens=limit, ignore_eos=True)
    prompts = [PROMPTS[3] * 9, PROMPTS[0] * 3]
    ar = LLM(model=str(tiny_llama)).generate(prompts, params)
    for overrides in (dict(fanout=[3, 2, 2, 3]), dict(fanout="0", backup="neural")):
        with ssd(
            tiny_llama, close_draft, num_speculative_tokens=3, max_model_len=None, **overrides
        ) as llm:
            outs = llm.generate(prompts, params)
            assert llm.engine.draft_health().state == "running", llm.engine.draft_health().failure
            assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
            assert all(len(o.prompt_token_ids) + len(o.token_ids) == limit for o in outs)
            worker = llm.engine.proposer.worker
            idle = worker.channel.rings(protocol.IDLE_BELL)
            again = llm.generate(PROMPTS[:2], GREEDY)  # the worker still answers
            assert llm.engine.draft_health().state == "running" and len(again[0].token_ids) == 32
            # finished requests leave nothing in the engine or the proposer, and the worker is
            # told once, when the last one ends, that no build of theirs will be read
            assert llm.engine.seqs == {} and worker.known == {}
            assert worker.channel.rings(protocol.IDLE_BELL) == idle + 1


def test_a_killed_worker_is_restarted_and_speculation_resumes(
    tiny_llama, close_draft, ar_reference
):
    """Requests in flight finish exactly while the worker is down; after the backoff a new
    worker joins, picks the running sequences up and SSD rounds resume; restarts are capped."""
    with ssd(
        tiny_llama,
        close_draft,
        num_speculative_tokens=3,
        fanout=[2, 1, 1, 2],
        draft_restarts=1,
        draft_restart_backoff_s=0.0,
    ) as llm:
        eng = llm.engine
        first = eng.proposer.worker.proc
        long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        seqs = [eng.add_request(eng.encode_prompt(p), long) for p in PROMPTS[:3]]
        for _ in range(3):
            eng.step()
        first.kill()
        while eng.has_unfinished():
            eng.step()
        assert eng.draft_health().restarts == 1 and eng.draft_health().state == "running"
        resumed = [r for s in seqs for r in s.records if r.hit is not None and r.step > 5]
        assert resumed, "no SSD rounds after the restart"
        assert first.poll() is not None  # the dead worker was reaped
        ar = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS[:3], long)
        assert [s.output_token_ids for s in seqs] == [o.token_ids for o in ar]
        eng.proposer.worker.proc.kill()  # the cap is reached: speculation stays off, still exact
        outs = llm.generate(PROMPTS[:2], GREEDY)
        assert eng.draft_health().state == "failed" and eng.proposer.worker is None
        assert [o.token_ids for o in outs] == [ar_reference[p] for p in PROMPTS[:2]]
