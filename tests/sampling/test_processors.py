"""Logits processors against a per-token reference of their definitions, row by row of a
speculative round (each row over its own prefix), and log-probabilities against theirs."""

from __future__ import annotations

import math

import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, process
from saguaro.sampling.logprobs import log_probs, token_logprobs
from saguaro.sampling.processors import Processors, apply_processors

V = 12
EOS = 11


def reference(logits: list[float], params: SamplingParams, prompt, generated, words, stop):
    """The module docstring's four steps, one token at a time, in float64."""
    out = []
    for t, x in enumerate(logits):
        x += (params.logit_bias or {}).get(t, 0.0)
        banned = len(generated) < params.min_tokens and t in stop
        for w in words:
            head = tuple(w[:-1])
            if t == w[-1] and (not head or tuple(generated[len(generated) - len(head) :]) == head):
                banned = True
        if banned:
            out.append(-math.inf)
            continue
        c = generated.count(t)
        r = params.repetition_penalty
        if t in prompt or c:
            x = x / r if x > 0 else x * r
        x -= params.frequency_penalty * c + params.presence_penalty * (c > 0)
        out.append(x)
    return out


CASES = [
    dict(presence_penalty=0.7),
    dict(frequency_penalty=-0.4),
    dict(repetition_penalty=1.6),
    dict(repetition_penalty=0.7, presence_penalty=1.0, frequency_penalty=0.5),
    dict(logit_bias={3: 5.0, 4: -100.0}),
    dict(min_tokens=4),
    dict(bad_words=["x"]),  # tokenized by the test itself below
    dict(logit_bias={2: 2.0}, repetition_penalty=1.3, min_tokens=3, frequency_penalty=1.0),
]
WORDS = [(5,), (6, 7), (2, 8, 9)]


@pytest.mark.parametrize("kwargs", CASES)
def test_each_row_of_a_round_is_processed_over_its_own_prefix(kwargs):
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=16, **kwargs)
    words = WORDS if "bad_words" in kwargs else []
    prompt = [1, 3, 3, 9]
    histories = [[], [2, 8], [6, 4, 4, 2], [7, 6, 2, 8, 3]]
    drafts = [[6, 7, 2, 8], [9, 5], [], [7]]
    rows, offset = [], 0
    for d in drafts:
        rows.append(list(range(offset, offset + len(d) + 1)))
        offset += len(d) + 1
    logits = torch.randn(offset, V, generator=g) * 3
    procs = [Processors.build(params, prompt, V, [EOS], words) for _ in drafts]
    out = apply_processors(logits, procs, histories, drafts, rows)
    assert not torch.equal(out, logits)
    for gen, draft, row in zip(histories, drafts, rows, strict=True):
        for j, r in enumerate(row):
            want = reference(logits[r].tolist(), params, prompt, gen + draft[:j], words, [EOS])
            torch.testing.assert_close(out[r], torch.tensor(want, dtype=torch.float32))


@pytest.mark.parametrize("kwargs", CASES)
def test_branch_rows_are_processed_as_each_alone(kwargs):
    """An SSD worker's branches (rows of different continuations) processed in one call: each
    row the bits of its own one-row round, and the reference."""
    params = SamplingParams(max_tokens=16, **kwargs)
    words = WORDS if "bad_words" in kwargs else []
    prompt, generated = [1, 3, 3, 9], [2, 8]
    prefixes = [[], [6], [6, 7], [9, 5, 5], [2, 8, 4]]
    logits = torch.randn(len(prefixes), V, generator=torch.Generator().manual_seed(1)) * 3
    proc = Processors.build(params, prompt, V, [EOS], words)
    got = proc.apply_rows(logits.clone(), generated, prefixes)
    for j, prefix in enumerate(prefixes):
        alone = Processors.build(params, prompt, V, [EOS], words)
        one = alone.apply(logits[j : j + 1].clone(), generated, prefix, first=len(prefix))
        assert torch.equal(got[j], one[0]), prefix
        want = reference(logits[j].tolist(), params, prompt, generated + prefix, words, [EOS])
        torch.testing.assert_close(got[j], torch.tensor(want, dtype=torch.float32))


def test_requests_processed_together_get_the_bits_each_gets_alone():
    """A round's requests, each with its own processors (every case), some without any, and
    rows out of order: one batched pass gives each row the bits of its request's pass alone."""
    g = torch.Generator().manual_seed(2)
    prompt, words = [1, 3, 3, 9], WORDS
    cases = [*CASES, None]
    histories = [[2, 8, 2][: i % 4] + [i % V] for i in range(len(cases))]
    drafts = [[6, 7, 2, 8][: i % 5] for i in range(len(cases))]
    sizes = [len(d) + 1 for d in drafts]
    order = torch.randperm(sum(sizes), generator=g).tolist()
    rows = [order[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(cases))]
    logits = torch.randn(sum(sizes), V, generator=g) * 3

    def procs():
        return [
            None
            if kw is None
            else Processors.build(SamplingParams(max_tokens=16, **kw), prompt, V, [EOS], words)
            for kw in cases
        ]

    together = apply_processors(logits, procs(), histories, drafts, rows)
    for i, proc in enumerate(procs()):
        alone = apply_processors(logits, [proc], [histories[i]], [drafts[i]], [rows[i]])
        assert torch.equal(together[rows[i]], alone[rows[i]]), cases[i]


def test_counts_catch_up_across_rounds_and_the_input_is_left_alone():
    params = SamplingParams(frequency_penalty=1.0)
    proc = Processors.build(params, [0], V, [EOS])
    logits = torch.zeros(1, V)
    history: list[int] = []
    for step in range(4):
        history += [3, 4 + step]
        out = apply_processors(logits, [proc], [history], [[]], [[0]])
        assert out[0, 3] == -(step + 1) and out[0, 4] == -1 and out[0, 0] == 0
    assert torch.equal(logits, torch.zeros(1, V))


def test_no_processors_means_no_copy():
    logits = torch.randn(3, V)
    assert Processors.build(SamplingParams(), [1], V, [EOS]) is None
    assert apply_processors(logits, [None], [[]], [[1, 2]], [[0, 1, 2]]) is logits


def test_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="logit_bias token ids out of range"):
        Processors.build(SamplingParams(logit_bias={V: 1.0}), [1], V, [EOS])


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(min_p=1.5), "min_p"),
        (dict(logit_bias={1: 101.0}), r"logit_bias\[1\]"),
        (dict(logit_bias={-1: 1.0}), "logit_bias keys"),
        (dict(min_tokens=20, max_tokens=10), "min_tokens"),
        (dict(bad_words=[" "]), "bad_words"),
        (dict(n=0), "n must be"),
        (dict(logprobs=21), "logprobs must be"),
        (dict(logprobs_mode="final"), "logprobs_mode"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, error):
    with pytest.raises(ValueError, match=error):
        SamplingParams(**kwargs)


# ---- log-probabilities ------------------------------------------------------------------------


def test_raw_log_probs_are_the_models_softmax():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(1)) * 4
    st = SamplingTensors.from_params([SamplingParams(temperature=0.3, top_k=2)] * 4)
    torch.testing.assert_close(log_probs(logits, st, "raw"), torch.log_softmax(logits, -1))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.6, top_k=5, min_p=0.05),
        SamplingParams(temperature=1.2, top_p=0.7),
        SamplingParams(temperature=0),  # reported at temperature 1
    ],
)
def test_processed_log_probs_are_those_of_p(params):
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(2)) * 4
    st = SamplingTensors.from_params([params] * 3)
    lp = log_probs(logits, st, "processed")
    sampled = params if params.temperature else SamplingParams(temperature=1.0)
    p = process(logits, SamplingTensors.from_params([sampled] * 3)).probs().double()
    assert torch.equal(lp == -math.inf, p == 0)
    kept = p > 0
    torch.testing.assert_close(lp.double()[kept].exp(), p[kept], rtol=1e-5, atol=1e-7)


def test_token_logprobs_report_the_chosen_token_and_the_most_likely_first():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 1.0]])
    st = SamplingTensors.from_params([SamplingParams()] * 2)
    out = token_logprobs(logits, [2, 0], st, [2, 0], "raw")
    lsm = torch.log_softmax(logits, -1)
    assert out[0].token == 2 and out[0].logprob == pytest.approx(float(lsm[0, 2]))
    assert [t for t, _ in out[0].top] == [1, 2]
    assert out[0].top[0][1] == pytest.approx(float(lsm[0, 1]))
    assert out[1].top == ()
