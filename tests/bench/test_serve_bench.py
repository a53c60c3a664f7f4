"""The serving benchmark: its statistics (percentiles, chunk gaps, TPOT, a level's summary, the
servers' Prometheus counters differenced), its settings, and one run end to end against a real
``saguaro serve`` process on a tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest

from saguaro.bench import serve
from saguaro.bench.serve_client import RequestShape, one_request
from saguaro.bench.serve_engines import PACKAGE_ROOT, Launch, engine_spec
from saguaro.bench.serve_report import markdown_table, speculation_cell, steps_cell, write_all
from saguaro.bench.serve_stats import (
    LevelSummary,
    RequestRecord,
    chunk_gaps,
    llama_speculation,
    parse_prometheus,
    percentile,
    saguaro_speculation,
    speculation,
    summarize,
    tpot,
)
from saguaro.distributed.processes import children
from saguaro.server.main import serve_parser

# ---- statistics --------------------------------------------------------------------------------


def test_percentile_interpolates_like_numpy():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert percentile([1.0, 2.0], 50) == 1.5
    assert math.isnan(percentile([], 50))


def test_chunk_gaps_and_tpot():
    assert chunk_gaps([0.5, 0.6, 0.9]) == pytest.approx([0.1, 0.3])
    assert chunk_gaps([0.5]) == [] and chunk_gaps([]) == []
    # 4 tokens: the first at 0.5 s, the last response byte at 1.1 s -> 0.2 s per later token
    r = RequestRecord(0, True, 0.0, 1.1, 0.5, [0.5, 0.7, 1.1], output_tokens=4)
    assert tpot(r) == pytest.approx(0.2)
    assert tpot(RequestRecord(0, True, 0.0, 1.0, 0.5, [0.5], output_tokens=1)) is None
    assert tpot(RequestRecord(0, False, 0.0, 1.0, None)) is None


def test_summary_counts_failures_and_times_completed_requests_only():
    ok = [
        RequestRecord(0, True, 0.0, 1.0, 0.2, [0.2, 0.6, 1.0], output_tokens=5, prompt_tokens=7),
        RequestRecord(1, True, 0.1, 2.0, 0.4, [0.4, 1.2, 2.0], output_tokens=3, prompt_tokens=9),
    ]
    failed = RequestRecord(2, False, 0.2, 0.05, None, error="APIConnectionError: refused")
    s = summarize("saguaro ar", [*ok, failed], duration_s=2.0, concurrency=2)
    assert (s.level, s.completed, s.failed) == ("c=2", 2, 1)
    assert (s.output_tokens, s.prompt_tokens) == (8, 16)
    assert s.output_tok_s == pytest.approx(4.0) and s.requests_s == pytest.approx(1.0)
    assert s.ttft_p50 == pytest.approx(0.3) and s.latency_p50 == pytest.approx(1.5)
    assert s.itl_p50 == pytest.approx(percentile([0.4, 0.4, 0.8, 0.8], 50))
    assert s.tpot_p50 == pytest.approx(percentile([0.8 / 4, 1.6 / 2], 50))
    assert s.chunks_per_token == pytest.approx(6 / 8)
    assert s.errors == ["APIConnectionError: refused"]
    assert summarize("x", [], 1.0, rate=2.0).level == "rate=2/s"


SAGUARO_BEFORE = """# HELP saguaro_rounds_total Decoding rounds.
# TYPE saguaro_rounds_total counter
saguaro_rounds_total{mode="ar",k="0"} 2
saguaro_rounds_total{mode="sd",k="4"} 10
saguaro_spec_draft_tokens_total 40
saguaro_spec_accepted_tokens_total 20
saguaro_generation_tokens_total 32
saguaro_ssd_rounds_total 0
saguaro_ssd_cache_hits_total 0
saguaro_info{model="m",mode="auto",k="4"} 1
saguaro_engine_steps_total 30
saguaro_engine_step_seconds_total 3.5
saguaro_engine_propose_seconds_total 0.5
saguaro_engine_forward_seconds_total 2.5
"""
SAGUARO_AFTER = """saguaro_rounds_total{mode="ar",k="0"} 6
saguaro_rounds_total{mode="sd",k="4"} 22
saguaro_rounds_total{mode="ssd",k="4"} 12
saguaro_spec_draft_tokens_total 136
saguaro_spec_accepted_tokens_total 68
saguaro_generation_tokens_total 132
saguaro_ssd_rounds_total 12
saguaro_ssd_cache_hits_total 9
saguaro_mean_accepted_length NaN
saguaro_engine_steps_total 58
saguaro_engine_step_seconds_total 9.5
saguaro_engine_propose_seconds_total 1.5
saguaro_engine_forward_seconds_total 7.0
"""


def test_prometheus_text_is_parsed_with_labels():
    samples = parse_prometheus(SAGUARO_BEFORE)
    assert samples['saguaro_rounds_total{mode="sd",k="4"}'] == 10
    assert samples["saguaro_spec_draft_tokens_total"] == 40
    assert not any(k.startswith("#") for k in samples)
    assert math.isnan(parse_prometheus(SAGUARO_AFTER)["saguaro_mean_accepted_length"])


def test_saguaro_speculation_is_the_difference_over_the_level():
    spec = saguaro_speculation(parse_prometheus(SAGUARO_BEFORE), parse_prometheus(SAGUARO_AFTER))
    assert spec["rounds"] == 4 + 12 + 12
    assert spec["rounds_by_mode"] == {"ar": 4, "sd": 12, "ssd": 12}
    assert spec["speculating_share"] == pytest.approx(24 / 28)
    assert (spec["drafted"], spec["accepted"], spec["acceptance"]) == (96, 48, 0.5)
    assert spec["tokens_per_round"] == pytest.approx(100 / 28)
    assert spec["ssd_hit_rate"] == pytest.approx(9 / 12)
    assert (spec["steps"], spec["step_s"], spec["propose_s"], spec["forward_s"]) == (
        28,
        6.0,
        1.0,
        4.5,
    )
    assert steps_cell(spec, duration_s=12.0) == "214 (161), 50%"  # mean step (forward), busy
    assert "hit 75%" in speculation_cell(spec) and "ar 4/sd 12/ssd 12" in speculation_cell(spec)


def test_llama_speculation_and_an_ar_server():
    before = parse_prometheus(
        "llamacpp:spec_decode_num_draft_tokens_total 10\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 5\n"
        "llamacpp:spec_decode_num_drafts_total 3\nllamacpp:n_decode_total 7\n"
    )
    after = parse_prometheus(
        "llamacpp:spec_decode_num_draft_tokens_total 50\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 35\n"
        "llamacpp:spec_decode_num_drafts_total 13\nllamacpp:n_decode_total 27\n"
    )
    spec = speculation(before, after)
    assert spec == llama_speculation(before, after)
    assert (spec["drafted"], spec["accepted"], spec["verifications"]) == (40, 30, 10)
    assert spec["acceptance"] == 0.75 and spec["accepted_per_verification"] == 3.0
    ar = speculation({}, parse_prometheus('saguaro_rounds_total{mode="ar",k="0"} 5\n'))
    assert ar["speculating_share"] == 0 and ar["acceptance"] is None
    assert speculation_cell(ar) == "-" and speculation({}, {}) == {}
    assert steps_cell(spec, duration_s=1.0) == "-"  # llama-server counts no engine steps


# ---- settings and servers ----------------------------------------------------------------------


def test_settings_are_checked():
    with pytest.raises(ValueError, match="one per level"):
        serve.parse_config(["--concurrency", "1,2", "--num-requests", "1,2,3"])
    with pytest.raises(SystemExit):
        serve.parse_config(["--engines", "vllm"])
    cfg = serve.parse_config(["--concurrency", "1,4", "--request-rates", "0.5"])
    assert cfg.engines == ("ar", "sd", "ssd") and cfg.num_requests == (8, 16, 32)


def test_levels_get_prompts_of_their_own(tmp_path):
    """No level reuses another's prompt (or the warm-up's): a prefix cache gains nothing. Too
    long a prompt is left out."""
    path = tmp_path / "p.jsonl"
    lines = [{"prompt": f"question {i}"} for i in range(7)] + [{"prompt": "x" * 100}]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    args = ["--prompts", str(path), "--concurrency", "1,2", "--request-rates", "1"]
    args += ["--num-requests", "1,2,3", "--max-prompt-chars", "20"]
    levels, warmup = serve.levels_of(serve.parse_config(args))
    assert [(lv.concurrency, lv.rate, len(lv.prompts)) for lv in levels] == [
        (1, None, 1),
        (2, None, 2),
        (None, 1.0, 3),
    ]
    texts = [warmup, *(p for lv in levels for p in lv.prompts)]
    assert sorted(texts) == [f"question {i}" for i in range(7)]


def test_server_commands_share_slots_context_and_threads(tmp_path):
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"")
    launch = Launch(
        str(gguf), str(gguf), k=3, slots=4, context_per_slot=512, cpus=(0, 1), threads=2
    )
    sd = engine_spec("sd", launch).argv
    assert sd[sd.index("--mode") + 1] == "sd" and sd[sd.index("--k") + 1] == "3"
    assert sd[sd.index("--max-num-seqs") + 1] == "4" and "--max-model-len" in sd
    assert "--draft" not in engine_spec("ar", launch).argv
    llama = engine_spec("llama.cpp-sd", launch).argv
    assert llama[llama.index("-np") + 1] == "4" and llama[llama.index("-c") + 1] == "2048"
    assert (
        llama[llama.index("-t") + 1] == "2" and llama[llama.index("--spec-draft-n-max") + 1] == "3"
    )
    assert "-md" not in engine_spec("llama.cpp", launch).argv
    # the server runs the saguaro this benchmark runs, whichever copy is installed
    assert engine_spec("sd", launch).env()["PYTHONPATH"].split(os.pathsep)[0] == str(PACKAGE_ROOT)
    assert engine_spec("llama.cpp", launch).env().get("PYTHONPATH") == os.environ.get("PYTHONPATH")


def test_the_paper_layout_keeps_every_target_on_the_first_core(tmp_path):
    """--layout paper: saguaro's AR and SD targets on the first core with one thread, SSD's and
    auto's workers on a core their target never computes on, llama-server pinned to the first
    core with one thread (its draft too); the options are ones saguaro serve parses."""
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"")
    launch = Launch(str(gguf), str(gguf), 3, 4, 512, cpus=(2, 3), threads=2, layout="paper")
    for mode in ("ar", "sd"):
        argv = engine_spec(mode, launch).argv
        args = serve_parser().parse_args(list(argv[argv.index("serve") + 1 :]))
        assert args.target_cpus == [2] and args.num_threads == 1
    for mode in ("ssd", "auto"):
        argv = engine_spec(mode, launch).argv
        args = serve_parser().parse_args(list(argv[argv.index("serve") + 1 :]))
        assert args.auto_cores == "own" and args.target_cpus is None
    llama = engine_spec("llama.cpp-sd", launch)
    assert launch.cpus_of(llama) == (2,) and launch.cpus_of(engine_spec("ssd", launch)) == (2, 3)
    for flag in ("-t", "-tb", "-td", "-tbd"):
        assert llama.argv[llama.argv.index(flag) + 1] == "1"
    equal = dataclasses.replace(launch, layout="equal")
    assert "--auto-cores" not in engine_spec("ssd", equal).argv
    assert equal.cpus_of(engine_spec("llama.cpp", equal)) == (2, 3)
    with pytest.raises(ValueError, match="--layout"):
        serve.parse_config(["--layout", "side-by-side"])


# ---- end to end --------------------------------------------------------------------------------


def test_a_run_against_a_real_saguaro_server(tiny_llama, tiny_draft, prompt_file, tmp_path):
    """saguaro serve --mode sd on a tiny pair, at concurrency 1 and 2 and Poisson arrivals, two
    short requests each: every request completes, tokens are counted, and no server is left
    behind. An engine that cannot start (llama-server on a model that is no GGUF file) is
    recorded, fails the run's exit code and stops no other engine."""
    out = tmp_path / "out"
    argv = [
        "--engines", "llama.cpp,sd", "--model", str(tiny_llama), "--draft", str(tiny_draft),
        "--prompts", str(prompt_file), "--concurrency", "1,2", "--request-rates", "20",
        "--num-requests", "2", "--max-tokens", "8", "--context-per-slot", "256",
        "--no-plot", "--out", str(out),
    ]  # fmt: skip
    assert serve.main(argv) == 1
    assert children(os.getpid()) == []
    body = json.loads((out / "results.json").read_text())
    assert list(body["failed_engines"]) == ["llama.cpp"]
    assert "GGUF" in body["failed_engines"]["llama.cpp"]
    assert [lv["level"] for lv in body["levels"]] == ["c=1", "c=2", "rate=20/s"]
    for lv in body["levels"]:
        assert (lv["completed"], lv["failed"], lv["output_tokens"]) == (2, 0, 16)
        assert 0 < lv["ttft_p50"] <= lv["latency_p50"] and lv["tpot_p50"] > 0
        assert lv["output_tok_s"] > 0 and lv["prompt_tokens"] > 0
        spec = lv["speculation"]
        assert spec["rounds"] > 0 and spec["drafted"] >= spec["accepted"] >= 0
    for recs in body["requests"].values():
        for r in recs:
            assert r["ok"] and r["output_tokens"] == 8 and r["ttft_s"] <= r["latency_s"]
            assert r["chunk_s"] == sorted(r["chunk_s"])
    assert body["servers"]["saguaro sd"]["model_id"]
    assert "| saguaro sd | c=2 | 2/0 |" in (out / "results.md").read_text()
    assert markdown_table([]).count("\n") == 2


def test_the_report_files(tmp_path):
    """results.json is strict JSON (NaN written as null), results.md has a row per level, and
    latency.png is drawn."""
    ok = RequestRecord(0, True, 0.0, 1.0, 0.2, [0.2, 0.6, 1.0], output_tokens=3)
    levels = [
        summarize("saguaro ar", [ok], 1.0, concurrency=1),
        summarize("llama.cpp", [RequestRecord(0, False, 0.0, 0.1, None)], 1.0, concurrency=1),
    ]
    meta = json.loads(json.dumps({"date": "d", "machine": {"cpu": "c"}, "cpus": [0]}))
    meta["config"] = dataclasses.asdict(serve.parse_config([]))
    write_all(tmp_path, meta, levels, {"saguaro ar c=1": [dataclasses.asdict(ok)]}, True)
    body = json.loads((tmp_path / "results.json").read_text(), parse_constant=pytest.fail)
    assert body["levels"][1]["ttft_p50"] is None and body["levels"][1]["failed"] == 1
    table = (tmp_path / "results.md").read_text()
    assert "| saguaro ar | c=1 | 1/0 |" in table and "| llama.cpp | c=1 | 0/1 |" in table
    assert (tmp_path / "latency.png").stat().st_size > 0


def test_rounds_are_reported_as_medians_against_the_first_engine(tmp_path):
    """With --rounds, every round keeps its row and a medians table gives each engine's median
    throughput at each level against the first engine's: 2 and 4 tok/s for AR, 3, 3 and 9 for
    SD (median 3 = 1.00x of AR's median 3)."""

    def level(engine: str, tokens: int, round_: int) -> LevelSummary:
        ok = RequestRecord(0, True, 0.0, 1.0, 0.2, [0.2, 1.0], output_tokens=tokens)
        s = summarize(engine, [ok], 1.0, concurrency=4)
        s.round = round_
        return s

    levels = [level("saguaro ar", 2, 0), level("saguaro ar", 4, 1)]
    levels += [level("saguaro sd", t, r) for r, t in enumerate((3, 9, 3))]
    meta = {"date": "d", "machine": {"cpu": "c"}, "cpus": [0]}
    meta["config"] = dataclasses.asdict(serve.parse_config(["--rounds", "3"]))
    write_all(tmp_path, meta, levels, {}, True)
    text = (tmp_path / "results.md").read_text()
    assert "| saguaro ar | c=4 | 2 | 3.0 (2.0-4.0) | 1.00x |" in text
    assert "| saguaro sd | c=4 | 3 | 3.0 (3.0-9.0) | 1.00x |" in text
    assert "| saguaro sd #2 | c=4 | 1/0 | 9.0 |" in text
    with pytest.raises(ValueError, match="--rounds"):
        serve.parse_config(["--rounds", "0"])


class _FakeCompletions:
    """Fails the first ``fail`` sends with ``error``, then streams two chunks of text and a
    usage chunk."""

    def __init__(self, error: Exception, fail: int) -> None:
        self.error, self.fail, self.sends = error, fail, 0

    async def create(self, **_: object) -> object:
        self.sends += 1
        if self.sends <= self.fail:
            raise self.error

        async def chunks():
            for text in ("a", "b"):
                delta = SimpleNamespace(content=text)
                yield SimpleNamespace(choices=[SimpleNamespace(delta=delta)], usage=None)
            usage = SimpleNamespace(completion_tokens=2, prompt_tokens=5)
            yield SimpleNamespace(choices=[], usage=usage)

        return chunks()


def _send(error: Exception, fail: int) -> tuple[RequestRecord, int]:
    completions = _FakeCompletions(error, fail)
    api = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    shape = RequestShape(max_tokens=2, temperature=0.0, seed=0, ignore_eos=True, timeout_s=1.0)
    rec = asyncio.run(one_request(api, "m", "p", 0, shape, level_start=0.0))
    return rec, completions.sends


def test_a_stale_connection_is_retried_once_and_counted():
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    rec, sends = _send(openai.APIConnectionError(request=request), fail=1)
    assert (rec.ok, rec.retries, sends, rec.output_tokens, len(rec.chunk_s)) == (True, 1, 2, 2, 2)
    assert summarize("e", [rec], 1.0, concurrency=1).retried == 1
    rec, sends = _send(openai.APIConnectionError(request=request), fail=2)  # once only
    assert (rec.ok, rec.retries, sends) == (False, 1, 2) and "APIConnectionError" in rec.error
    rec, sends = _send(openai.APITimeoutError(request=request), fail=1)  # a timeout is a failure
    assert (rec.ok, rec.retries, sends) == (False, 0, 1)
