"""Direct evaluation of an exported pair: held-out loss, greedy acceptance, samples."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from saguaro.train.costs import cost_regime
from saguaro.train.data import load_tokens
from saguaro.train.export import EVAL_RESULTS, EXPORT_META, write_cards

# HumanEval-style prompts. HumanEval's own end in a newline, which splits the newline from the
# indentation that BPE merges it with in training ("\n   " is one token); both kinds are shown.
SAMPLE_PROMPTS = (
    "def fibonacci(n):",
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same '
    'backwards."""\n',
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef list_python_files(root):",
)


def _even_starts(n_tokens: int, length: int, count: int) -> list[int]:
    """`count` window starts spread over the stream: deterministic and order-free."""
    last = n_tokens - length - 1
    return [int(s) for s in np.linspace(0, last, num=count, dtype=np.int64)]


@torch.no_grad()
def heldout_loss(
    target: PreTrainedModel, draft: PreTrainedModel, tokens: np.ndarray, ctx: int, windows: int
) -> dict[str, float]:
    nll_t = nll_d = agree = 0.0
    count = 0
    for start in _even_starts(tokens.size, ctx, windows):
        w = torch.from_numpy(tokens[start : start + ctx + 1].astype(np.int64))[None]
        x, y = w[:, :-1], w[:, 1:].reshape(-1)
        lt = target(input_ids=x).logits.reshape(-1, target.config.vocab_size).float()
        ld = draft(input_ids=x).logits.reshape(-1, draft.config.vocab_size).float()
        nll_t += F.cross_entropy(lt, y, reduction="sum").item()
        nll_d += F.cross_entropy(ld, y, reduction="sum").item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        count += y.numel()
    return {
        "loss_target": nll_t / count,
        "loss_draft": nll_d / count,
        "ppl_target": math.exp(nll_t / count),
        "ppl_draft": math.exp(nll_d / count),
        "top1_agreement": agree / count,
        "loss_tokens": count,
    }


def _greedy_next(model: PreTrainedModel, ids: list[int]) -> int:
    return int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())


@torch.no_grad()
def greedy_acceptance(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    k: int,
    gen_tokens: int,
    eot_id: int,
) -> dict[str, Any]:
    """Greedy SD by definition: the draft proposes k tokens, the target keeps the longest prefix
    equal to its own greedy choices plus one token of its own (correction or bonus)."""
    accepted: list[int] = []
    for prompt in prompts:
        ids = list(prompt)
        while len(ids) - len(prompt) < gen_tokens:
            proposal: list[int] = []
            for _ in range(k):
                proposal.append(_greedy_next(draft, ids + proposal))
            logits = target(input_ids=torch.tensor([ids + proposal])).logits[0]
            choices = logits[len(ids) - 1 :].argmax(-1).tolist()  # k + 1 greedy tokens
            n = 0
            while n < k and proposal[n] == choices[n]:
                n += 1
            accepted.append(n)
            ids += proposal[:n] + [choices[n]]
            if eot_id in ids[len(prompt) :]:
                break
    return {"k": k, **_acceptance(accepted, k)}


def _acceptance(accepted: list[int], k: int, prefix: str = "") -> dict[str, Any]:
    """Target steps, mean accepted length (bonus included) and the share of steps accepting at
    least i drafted tokens, from each step's number of accepted tokens."""
    counts = np.array(accepted)
    return {
        f"{prefix}target_steps": int(counts.size),
        f"{prefix}mean_accepted_length": float(counts.mean() + 1),
        f"{prefix}accept_at_least": [float((counts >= i).mean()) for i in range(1, k + 1)],
    }


def engine_acceptance(out: Path, prompts: list[list[int]], k: int, gen_tokens: int) -> dict:
    """The same measurement with saguaro's own synchronous SD (greedy, KV-cached, batched). Rounds
    the engine shortened below K at the length limit are left out, so every counted round had
    the same chance to accept K."""
    from saguaro import LLM, SamplingParams

    longest = max(map(len, prompts)) + gen_tokens + k + 1
    with LLM(
        model=str(out / "target"),
        draft=str(out / "draft"),
        mode="sd",
        num_speculative_tokens=k,
        max_model_len=longest,
        max_num_seqs=len(prompts),
        seed=0,
    ) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=gen_tokens))
        rounds = [r for o in outs for r in o.records if r.num_drafted == k]
    return _acceptance([r.num_accepted for r in rounds], k, prefix="engine_")


def loop_period(tokens: list[int], tail: int = 64, max_period: int = 16) -> int | None:
    """The smallest p <= ``max_period`` with ``tokens[i] == tokens[i - p]`` for each of the last
    ``tail`` tokens (the text has collapsed into a loop of p tokens), or None."""
    if len(tokens) < tail + 1:
        return None
    start = len(tokens) - tail
    for p in range(1, min(max_period, start) + 1):
        if all(tokens[i] == tokens[i - p] for i in range(start, len(tokens))):
            return p
    return None


def distinct_share(tokens: list[int], n: int = 4) -> float:
    """Distinct n-grams over all n-grams: near 1 for varied text, low once it repeats itself."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def repetition(out: Path, count: int | None = None, gen_tokens: int = 128) -> dict[str, Any]:
    """Greedy continuations by the target (the engine, AR) of the first ``count`` HumanEval
    prompts (all 164 by default), as given and with their trailing newline stripped (see
    ``SAMPLE_PROMPTS``): the share that end in a loop (:func:`loop_period` over the last 64
    tokens) and the mean share of distinct 4-grams."""
    from saguaro import LLM, SamplingParams
    from saguaro.bench.datasets import humaneval_prompts

    texts = [p.text for p in humaneval_prompts()][:count]
    result: dict[str, Any] = {"repetition_prompts": len(texts), "repetition_tokens": gen_tokens}
    with LLM(model=str(out / "target"), seed=0) as llm:
        room = llm.engine.max_model_len - gen_tokens
        params = SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True)
        for name, variant in (("as_given", texts), ("stripped", [t.rstrip() for t in texts])):
            ids = [llm.tokenizer.encode(t)[-room:] for t in variant]
            outs = [o.token_ids for o in llm.generate(ids, params)]
            result[f"repetition_{name}"] = {
                "looping": sum(loop_period(o) is not None for o in outs) / len(outs),
                "distinct_4grams": float(np.mean([distinct_share(o) for o in outs])),
            }
    return result


def evaluate(run_dir: Path, out: Path, windows: int, n_prompts: int, k: int) -> dict[str, Any]:
    meta = json.loads((run_dir / EXPORT_META).read_text())
    ctx = meta["config"]["ctx"]
    # Load exactly what ships, through transformers, as a user would.
    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft").eval()
    hf_tok = AutoTokenizer.from_pretrained(out / "target")
    raw_tok = Tokenizer.from_file(str(out / "target" / "tokenizer.json"))
    eot_id = target.config.eos_token_id

    tokens = load_tokens(run_dir / "heldout.bin")
    metrics: dict[str, Any] = {"step": meta["step"]}
    metrics |= heldout_loss(target, draft, tokens, ctx, windows)

    prompt_len, gen = 128, 64
    starts = _even_starts(tokens.size, prompt_len + gen, n_prompts)
    prompts = [[int(t) for t in tokens[s : s + prompt_len]] for s in starts]
    metrics |= greedy_acceptance(target, draft, prompts, k, gen, eot_id)
    metrics |= engine_acceptance(out, prompts, k, gen)
    metrics |= {"prompts": n_prompts, "prompt_tokens": prompt_len, "gen_tokens": gen}

    samples = []
    for text in SAMPLE_PROMPTS:
        ids = hf_tok(text, return_tensors="pt").input_ids
        # Both tokenizer front ends must agree, BOS included.
        assert ids[0].tolist() == raw_tok.encode(text).ids, "tokenizer files disagree"
        sample = {"prompt": text}
        for role, model in (("target", target), ("draft", draft)):
            new = model.generate(ids, max_new_tokens=96, do_sample=False)[0, ids.size(1) :]
            sample[role] = hf_tok.decode(new, skip_special_tokens=True)
        samples.append(sample)
    metrics["samples"] = samples
    metrics |= repetition(out)
    # Last, on an otherwise idle process: these are timings.
    metrics["costs"] = cost_regime(out / "target", out / "draft")

    (run_dir / EVAL_RESULTS).write_text(json.dumps(metrics, indent=1) + "\n")
    write_cards(out, meta, metrics)
    return metrics
