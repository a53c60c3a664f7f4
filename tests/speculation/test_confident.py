"""Confident targets at temperature > 0: rows whose float32 softmax rounds to one-hot are still
sampled, not treated as greedy. No mode may commit a token the target gives probability below
1e-7 (AR's rate for that is ~1e-7 per token: never, over these few hundred tokens)."""

from __future__ import annotations

import math

import pytest
import torch

from saguaro import LLM, SamplingParams
from tests.conftest import SMALL_VOCAB

TEMPERATURES = (0.3, 0.5, 1.0)
IMPROBABLE = 1e-7
MODES = {
    "ar": dict(mode="ar", sampling="rejection"),
    "sd": dict(mode="sd", sampling="rejection"),
    "ssd hit": dict(mode="ssd", sampling="rejection", fanout=[3, 2, 2, 3]),
    "ssd miss, neural backup": dict(mode="ssd", sampling="rejection", fanout="0", backup="neural"),
    "ssd miss, fast backup": dict(mode="ssd", sampling="rejection", fanout="0", backup="fast"),
    "coupled ar": dict(mode="ar", sampling="coupled"),
    "coupled ssd": dict(mode="ssd", sampling="coupled", fanout=[3, 2, 2, 3]),
}


def committed_logprobs(target_dir, sequences: list[list[int]], temperature: float) -> torch.Tensor:
    """float64 log p(x_i | x_<i) of every token after the prompt, from the reference model."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(target_dir).double().eval()
    out = []
    with torch.no_grad():
        for prompt_len, seq in sequences:
            logits = ref(torch.tensor([seq])).logits[0, prompt_len - 1 : -1] / temperature
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq[prompt_len:])[:, None])
            out.append(lp[:, 0])
    return torch.cat(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODES))
def test_no_mode_commits_improbable_tokens(confident_pair, name):
    target, draft = confident_pair
    kw = dict(MODES[name])
    if kw["mode"] != "ar":
        kw.update(draft=str(draft), num_speculative_tokens=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, SMALL_VOCAB - 1, (3,), generator=g).tolist() for _ in range(24)]
    with LLM(model=str(target), max_model_len=64, **kw) as llm:
        for temperature in TEMPERATURES:
            params = [
                SamplingParams(temperature=temperature, seed=i, max_tokens=12, ignore_eos=True)
                for i in range(len(prompts))
            ]
            outs = llm.generate(prompts, params)
            seqs = [(len(p), p + o.token_ids) for p, o in zip(prompts, outs, strict=True)]
            lp = committed_logprobs(target, seqs, temperature)
            worst = float(lp.min())
            assert worst > math.log(IMPROBABLE), (
                f"{name}, T={temperature}: committed a token of probability {math.exp(worst):.1e}"
            )
            if kw["mode"] != "ar":  # the draft did propose tokens the target rejects
                assert llm.last_run["drafted"] > llm.last_run["accepted"] > 0 or (
                    llm.last_run["drafted"] > 0 and llm.last_run["accepted"] == 0
                )
