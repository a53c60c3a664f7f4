"""The soak's workload and its checks (saguaro.bench.soak_jobs): what each kind of request must
bring back, and that a wrong answer of each kind is caught."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from saguaro.bench.soak import ended
from saguaro.bench.soak_jobs import (
    MIX,
    N_CHOICES,
    STOP,
    TOP_LOGPROBS,
    Job,
    Outcome,
    plan,
    problem,
    references_needed,
)

REQUESTS = 2000
MIX_TOLERANCE = 0.03  # a share's binomial sd at 2,000 draws is at most 0.011


def test_the_plan_follows_the_mix_and_is_reproducible():
    jobs = plan(REQUESTS, seed=0)
    assert jobs == plan(REQUESTS, seed=0) and jobs != plan(REQUESTS, seed=1)
    counts = Counter(j.kind for j in jobs)
    for kind, share in MIX.items():
        assert abs(counts[kind] / REQUESTS - share) < MIX_TOLERANCE, kind
    assert all(j.stream for j in jobs if j.kind == "disconnect")
    assert {j.chat for j in jobs if j.kind == "greedy"} == {True, False}


def test_one_reference_per_distinct_greedy_or_stop_request():
    jobs = plan(REQUESTS, seed=0)
    refs = references_needed(jobs)
    keys = {j.reference_key for j in jobs if j.kind in ("greedy", "stop")}
    assert {r.reference_key for r in refs} == keys and len(refs) == len(keys)
    assert all(r.kind == "greedy" and not r.stream for r in refs)


def _job(kind: str, chat: bool = True) -> Job:
    return Job(0, kind, chat, "def f():", False, 8, 0)


REFS = {(True, "def f():", 8): f"    return 1{STOP}x = 2"}


def _ok(job: Job, text: str, **kw) -> Outcome:
    return Outcome(job, ok=True, texts=[text], reasons=["length"], completion_tokens=8, **kw)


def test_greedy_and_stop_texts_must_match_the_quiet_servers():
    greedy, stop = _job("greedy"), _job("stop")
    assert problem(_ok(greedy, REFS[greedy.reference_key]), REFS) is None
    assert "differs" in problem(_ok(greedy, "    return 2"), REFS)
    assert problem(_ok(stop, "    return 1"), REFS) is None  # cut before its first STOP
    assert "differs" in problem(_ok(stop, REFS[stop.reference_key]), REFS)


def test_a_failed_or_malformed_answer_is_a_problem_but_a_disconnect_never_is():
    sampled = _job("sampled")
    assert problem(Outcome(sampled, error="APIError: 500"), REFS) == "APIError: 500"
    assert problem(replace(_ok(sampled, "x"), reasons=[None]), REFS) is not None
    assert problem(Outcome(_job("disconnect"), error="closed"), REFS) is None
    n = _job("n")
    two = Outcome(n, ok=True, texts=["a", "b"], reasons=["stop", "length"])
    assert problem(two, REFS) is None and N_CHOICES == len(two.texts)
    assert problem(_ok(n, "a"), REFS) is not None


@pytest.mark.parametrize(
    ("text", "fine"),
    [
        (json.dumps({"language": "rust", "typed": True}), True),
        (json.dumps({"language": "go", "typed": True}), False),
        (json.dumps({"language": "c"}), False),
        (json.dumps({"language": "c", "typed": "yes"}), False),
        ('{"language": "c", ', False),
    ],
)
def test_json_answers_that_finished_must_follow_the_schema(text, fine):
    out = replace(_ok(_job("json"), text), reasons=["stop"])
    assert (problem(out, REFS) is None) == fine
    assert problem(replace(out, reasons=["length"]), REFS) is None  # cut: counted, not failed


def test_logprobs_need_a_row_per_token_and_the_asked_width():
    job = _job("logprobs")
    assert problem(_ok(job, "x", logprob_rows=8, top_widths={TOP_LOGPROBS}), REFS) is None
    assert problem(_ok(job, "x", logprob_rows=7, top_widths={TOP_LOGPROBS}), REFS) is not None
    assert problem(_ok(job, "x", logprob_rows=8, top_widths={1, TOP_LOGPROBS}), REFS) is not None


def test_a_drained_stream_may_end_by_abort_but_must_end():
    job = _job("sampled")
    assert ended(replace(_ok(job, "x"), reasons=["abort"])) and ended(_ok(job, "x"))
    assert not ended(replace(_ok(job, "x"), reasons=[None]))
    assert not ended(Outcome(job, error="closed"))
