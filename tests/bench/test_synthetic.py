"""Synthetic acceptance (saguaro.bench.synthetic): its accepted lengths follow the truncated
geometric law of its rate, its next token is the target's argmax after them, the bench applies it
to speculative modes only, and no engine or request setting reaches it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from saguaro.bench import bench_main
from saguaro.bench.synthetic import synthetic_verifier
from saguaro.config import EngineConfig
from saguaro.sampling import SamplingParams
from saguaro.sampling.probs import SamplingTensors
from saguaro.sampling.round import Round
from tests.bench.conftest import args
from tests.stats import tv_distance, tv_noise_floor

N, K, V = 20_000, 4, 11


def _round(num_draft: torch.Tensor) -> Round:
    n = len(num_draft)
    return Round(
        st=SamplingTensors.from_params([SamplingParams(temperature=0)] * n),
        draft_tokens=torch.zeros(n, K, dtype=torch.int64),
        num_draft=num_draft,
        seeds=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n, dtype=torch.int64),
        rows=torch.arange(n * (K + 1)).view(n, K + 1),
    )


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.8, 1.0])
def test_accepted_lengths_follow_the_truncated_geometric_law(rate):
    num_draft = torch.full((N,), K)
    num_draft[: N // 4] = 2  # a quarter proposed fewer tokens: their k stops at 2
    logits = torch.randn(N * (K + 1), V, generator=torch.Generator().manual_seed(1))
    result = synthetic_verifier(rate, seed=0)(logits, _round(num_draft))
    k = result.num_accepted
    assert (k <= num_draft).all() and not result.invalid.any()
    rows = torch.arange(N) * (K + 1) + k
    assert torch.equal(result.next_token, logits[rows].argmax(dim=-1))
    for cut, part in ((2, k[: N // 4]), (K, k[N // 4 :])):
        law = torch.tensor([rate**j * (1 - rate) for j in range(cut)] + [rate**cut])
        counts = torch.bincount(part, minlength=cut + 1)
        assert tv_distance(counts, law) < tv_noise_floor(cut + 1, len(part)), (rate, cut)


def test_no_engine_or_request_setting_reaches_it():
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    names |= {f.name for f in dataclasses.fields(SamplingParams)}
    assert not [n for n in names if "synthetic" in n]
    with pytest.raises(ValueError, match="lies in"):
        synthetic_verifier(1.5, seed=0)


def test_the_bench_runs_speculation_at_the_rate_asked(
    tiny_llama, tiny_draft, prompt_file, tmp_path
):
    """A random draft of a random target, accepted every time at rate 1, and at rate 0.5 the
    first proposal accepted in some rounds and not in others (one fresh generator per round
    would draw the same every round); the greedy check is skipped, since the text is no longer
    the target's."""
    for rate in (1.0, 0.5):
        out = tmp_path / f"out-{rate}"
        argv = args(
            tiny_llama, tiny_draft, prompt_file, out, "--k", "3", "--modes", "ar,sd",
            "--batch-sizes", "1", "--temperatures", "0", "--max-tokens", "40",
            "--synthetic-acceptance", str(rate),
        )  # fmt: skip
        assert bench_main(argv) == 0
        res = json.loads((out / "results.json").read_text())
        sd = {r["variant"]: r for r in res["results"]}["sd"]
        if rate == 1.0:
            assert sd["acceptance_rate"] == 1.0
        else:
            per_position = sd["speculation"]["per_position_acceptance"]
            assert 0 < per_position[0] < 1, per_position
        assert res["correctness"]["note"] == "synthetic acceptance"
