"""One request's sampling can never take the batch down: extreme parameters are computed as
their limits, and a failure inside one request's verification ends that request alone."""

from __future__ import annotations

import pytest
import torch

from saguaro import LLM, SamplingParams
from saguaro.engine.verification import NON_FINITE_LOGITS
from saguaro.sampling import round as round_module

PROMPTS = ["def add(a, b):", "x", "import os\n", "for i in range(10):"]
VICTIM = "# " + "a long prompt that marks its request by its positions " * 2


def normal_params(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=["ar", "sd"])
def llm(request, tiny_llama, tiny_draft):
    draft = str(tiny_draft) if request.param == "sd" else None
    return LLM(model=str(tiny_llama), draft=draft, mode=request.param, max_model_len=256)


@pytest.fixture(scope="module")
def reference(llm):
    return [llm.generate(p, normal_params(i))[0].token_ids for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize(
    "extreme, limit",
    [
        (dict(temperature=1e-38), dict(temperature=0)),  # vanishing temperature: argmax
        (dict(temperature=1.0, top_p=1e-50), dict(temperature=0)),  # only the top token
        (dict(temperature=0.8, top_k=2**63, seed=5), dict(temperature=0.8, seed=5)),  # off
    ],
)
def test_extreme_values_are_their_limits_and_leave_others_alone(llm, reference, extreme, limit):
    base = dict(max_tokens=12, ignore_eos=True)
    expected = llm.generate(VICTIM, SamplingParams(**limit, **base))[0].token_ids
    params = [normal_params(i) for i in range(len(PROMPTS))]
    outs = llm.generate([VICTIM, *PROMPTS], [SamplingParams(**extreme, **base), *params])
    assert outs[0].token_ids == expected and outs[0].finish_reason == "length"
    assert [o.token_ids for o in outs[1:]] == reference


def _poison_rows(llm, monkeypatch):
    """Make the target's logits NaN for queries past position 40 (only VICTIM gets there)."""
    runner = llm.engine.runner
    forward = runner.forward

    def poisoned(queries):
        logits = forward(queries).clone()
        offset = 0
        for q in queries:
            if q.num_logits and int(q.positions[0]) >= 40:
                logits[offset : offset + q.num_logits] = torch.nan
            offset += q.num_logits
        return logits

    monkeypatch.setattr(runner, "forward", poisoned)


def test_non_finite_logits_fail_that_request_only(llm, reference, monkeypatch):
    _poison_rows(llm, monkeypatch)
    params = [normal_params(i) for i in range(len(PROMPTS))]
    outs = llm.generate([VICTIM, *PROMPTS], [normal_params(99), *params])
    assert outs[0].finish_reason == "error" and outs[0].error == NON_FINITE_LOGITS
    assert outs[0].token_ids == []
    assert [o.token_ids for o in outs[1:]] == reference
    assert not llm.engine.has_unfinished()


def test_an_exception_in_one_requests_verification_fails_it_alone(llm, reference, monkeypatch):
    """Whatever raises inside verification: the batch is retried request by request, and only
    the request that still raises ends, with an error that names no internals."""
    real = round_module.verify
    poison_seed = 666

    def fragile(logits, st, tokens, num, seeds, *rest):
        if bool((seeds == poison_seed).any()):
            raise RuntimeError("/secret/path/kernel.cpp:12 boom")
        return real(logits, st, tokens, num, seeds, *rest)

    monkeypatch.setattr(round_module, "verify", fragile)
    params = [normal_params(i) for i in range(len(PROMPTS))]
    victim = SamplingParams(temperature=0.8, seed=poison_seed, max_tokens=12)
    outs = llm.generate([VICTIM, *PROMPTS], [victim, *params])
    assert outs[0].finish_reason == "error"
    assert outs[0].error == "sampling failed (RuntimeError)"
    assert [o.token_ids for o in outs[1:]] == reference
