"""Write the checkpoint's two models as Hugging Face directories, with a model card each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig

from saguaro.corpus import EOT
from saguaro.train.loops import SEGMENT
from saguaro.train.models import build_model, n_params
from saguaro.train.tokenizer import write_hf_tokenizer
from saguaro.train.trainer import CKPT_NAME, FIT_OPTIONS, FitConfig

ROLES = ("target", "draft")
EXPORT_META = "export.json"
EVAL_RESULTS = "eval.json"
TRAINING_META = "training.json"  # written beside each model, read by `fit --init-from`
MAX_SHARD = "16MB"  # safetensors files small enough for any repository host


def export(run_dir: Path, out: Path) -> dict[str, Any]:
    state = torch.load(run_dir / CKPT_NAME, map_location="cpu", weights_only=False)
    cfg = FitConfig.from_dict(state["config"])
    tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    vocab, eot = tok.get_vocab_size(), tok.token_to_id(EOT)
    split = json.loads((run_dir / "split.json").read_text())
    meta: dict[str, Any] = {
        "step": state["step"],
        "total_steps": cfg.total_steps,
        "tokens_seen": cfg.prior_draft_tokens + state["step"] * cfg.tokens_per_step,
        "target_tokens_seen": cfg.prior_target_tokens
        + min(state["step"], cfg.cotrain_steps) * cfg.tokens_per_step,
        "config": cfg.to_dict(),
        "replans": state.get("replans", []),
        "corpus": {
            k: split[k]
            for k in ("python", "train_files", "heldout_files", "train_tokens", "heldout_tokens")
        },
        "params": {},
    }
    for role, spec in zip(ROLES, (cfg.target, cfg.draft), strict=True):
        model = build_model(spec, vocab, eot)
        model.load_state_dict(state[role])
        model.generation_config = GenerationConfig(
            bos_token_id=eot, eos_token_id=eot, pad_token_id=eot
        )
        meta["params"][role] = n_params(model)
        d = out / role
        if d.exists():  # no stale shards from an earlier export
            shutil.rmtree(d)
        model.save_pretrained(d, max_shard_size=MAX_SHARD)
        write_hf_tokenizer(tok, d, model_max_length=model.config.max_position_embeddings)
    for role in ROLES:
        (out / role / TRAINING_META).write_text(json.dumps(meta, indent=1) + "\n")
    (run_dir / EXPORT_META).write_text(json.dumps(meta, indent=1) + "\n")
    evaluation = run_dir / EVAL_RESULTS
    metrics = json.loads(evaluation.read_text()) if evaluation.exists() else None
    if metrics is not None and metrics.get("step") != meta["step"]:
        metrics = None  # results of an older checkpoint would mislabel these weights
    write_cards(out, meta, metrics)
    return meta


def write_cards(out: Path, meta: dict[str, Any], metrics: dict[str, Any] | None) -> None:
    for role in ROLES:
        (out / role / "README.md").write_text(render_card(role, meta, metrics))


def _spec_line(spec: dict[str, int], params: int) -> str:
    return (
        f"{params / 1e6:.2f}M parameters: hidden {spec['hidden']}, {spec['layers']} layers, "
        f"{spec['heads']} heads / {spec['kv_heads']} KV heads, MLP {spec['intermediate']}"
    )


def render_card(role: str, meta: dict[str, Any], metrics: dict[str, Any] | None) -> str:
    """The README.md of `role`'s directory in an export described by `meta`: the pair, its
    data, its training with the commands that reproduce it, and the held-out evaluation
    (`metrics`; None before `eval` has run on these weights)."""
    # through FitConfig: older exports' configs name their one earlier stage `prior_fit`
    cfg = FitConfig.from_dict(meta["config"]).to_dict()
    lines = [
        *_intro_lines(role),
        *_model_lines(cfg, meta["params"]),
        *_data_lines(meta["corpus"]),
        *_training_lines(cfg, meta),
        *_reproduce_lines(cfg, meta),
        *_evaluation_lines(metrics),
    ]
    return "\n".join(lines)


def _intro_lines(role: str) -> list[str]:
    """The card's title and what the pair is."""
    other = "draft" if role == "target" else "target"
    return [
        f"# saguaro code-pair {role}",
        "",
        f"A small Llama-architecture Python code model, the {role} of a speculative-decoding "
        f"pair trained from scratch by `saguaro train-pair` (its partner is `../{other}`). Both "
        "share one tokenizer. Such a pair is a small, matched pair for experiments; it is not "
        "a useful code assistant.",
        "",
    ]


def _model_lines(cfg: dict[str, Any], params: dict[str, int]) -> list[str]:
    """The Models section: both shapes and what they share."""
    return [
        "## Models",
        "",
        f"- target: {_spec_line(cfg['target'], params['target'])}",
        f"- draft: {_spec_line(cfg['draft'], params['draft'])}",
        "- both: tied embeddings, RoPE theta 10000, RMSNorm, SiLU MLP, fp32 weights, "
        f"trained at context {cfg['ctx']}",
        "",
    ]


def _data_lines(corpus: dict[str, Any]) -> list[str]:
    """The Data section: the corpus, its split and the tokenizer."""
    return [
        "## Data",
        "",
        f"The `*.py` files of the CPython {corpus['python']} standard library (tests included, "
        "site-packages excluded), split by file: a file is held out when the first 4 bytes of "
        "the SHA-256 of its relative path, as a big-endian integer mod 1000, are below 30. "
        f"Train: {corpus['train_files']} files, {corpus['train_tokens']:,} tokens; held out: "
        f"{corpus['heldout_files']} files, {corpus['heldout_tokens']:,} tokens. Each document "
        "follows an `<|endoftext|>` token, which is also BOS, EOS and padding.",
        "",
        "Tokenizer: byte-level BPE, 8192 entries, trained on the train split with `tokenizers`. "
        "Encoding prepends `<|endoftext|>` (the post-processor and `tokenizer_config.json` "
        "agree); decoding reproduces source text byte for byte.",
        "",
    ]


def _training_lines(cfg: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The Training section: optimizer, schedule and tokens, then each setting and earlier
    stage beyond a plain run."""
    return [
        "## Training",
        "",
        f"Seed {cfg['seed']}, AdamW (betas 0.9/0.95, weight decay {cfg['weight_decay']}), "
        f"{cfg['warmup_steps']} warmup steps then cosine decay to {cfg['min_lr_ratio']} of peak, "
        f"batches of {cfg['batch']} x {cfg['ctx']} tokens. The target learns by next-token "
        + _objectives(cfg, meta)
        + f"{meta['tokens_seen']:,} tokens in all (step {meta['step']} of "
        f"{meta['total_steps']}).",
        "",
        *_rollout_lines(cfg),
        *_ditto_lines(cfg),
        *_mix_lines(cfg),
        *_lineage(cfg),
        *_replans(meta.get("replans", [])),
    ]


def _objectives(cfg: dict[str, Any], meta: dict[str, Any]) -> str:
    """The training paragraph's middle, after "The target learns by next-token ": the target's
    loss and tokens, then how the draft learned from it in this stage (co-trained, then alone
    where the stage had a draft-only phase; only alone where the stage did not train the
    target)."""
    if not cfg["tokens"]:
        return (
            f"cross-entropy, {meta['target_tokens_seen']:,} tokens, all in earlier stages: "
            "this stage trained only the draft, distilled from the fixed target (KL to the "
            f"target's softmax, peak lr {cfg['lr_draft']}), "
        )
    return (
        f"cross-entropy (peak lr {cfg['lr_target']}) for {meta['target_tokens_seen']:,} "
        "tokens. The draft is distilled from it (KL to the target's softmax, peak lr "
        f"{cfg['lr_draft']}): on each co-training step it learns from the target's logits "
        "of that same batch"
        + (", then alone against the finished target, " if cfg["draft_tokens"] else ", ")
    )


def _reproduce_lines(cfg: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The commands that replay every stage, then export and evaluate."""
    return [
        "Reproduce (CPU, hours; the run resumes where it stopped):",
        "",
        "```",
        *_fit_commands(cfg, stage_fits(meta)),
        "python -m saguaro.train --run-dir RUN export --out OUT",
        "python -m saguaro.train --run-dir RUN eval --out OUT",
        "```",
        "",
    ]


def _evaluation_lines(metrics: dict[str, Any] | None) -> list[str]:
    """The Evaluation section: `metrics`, or how to produce them."""
    head = ["## Evaluation (held-out split)", ""]
    if metrics is None:
        return [*head, "Not evaluated yet: run the `eval` command above.", ""]
    return [*head, *_metric_lines(metrics)]


def continuation(src: Path) -> dict[str, Any]:
    """The :class:`FitConfig` fields of a run that continues the export in ``src``: where it
    starts from, what that export had seen, and the `fit` arguments of every stage behind it."""
    meta = json.loads((Path(src) / "target" / TRAINING_META).read_text())
    earlier = FitConfig.from_dict(meta["config"])
    return {
        "init_from": str(src),
        "prior_target_tokens": meta["target_tokens_seen"],
        "prior_draft_tokens": meta["tokens_seen"],
        "prior_fits": [*earlier.prior_fits, stage_fits(meta)],
    }


def _rollout_lines(cfg: dict[str, Any]) -> list[str]:
    if not cfg["rollouts"]:
        return []
    target = (
        f"The target's loss adds {cfg['unlikelihood']} x the sequence-level unlikelihood of "
        "every token of a repeated 4-gram in them (-log(1 - p)), aimed at greedy loops. "
        if cfg["unlikelihood"]
        else ""
    )
    return [
        f"Each step the target also wrote {cfg['rollouts']} greedy continuations of "
        f"{cfg['rollout_tokens']} tokens after {cfg['rollout_prefix']}-token training prefixes "
        f"(`saguaro/train/rollouts.py`). {target}The draft also distilled on them, the text it "
        "has to predict when it drafts for the target"
        + (
            f", adding {cfg['rollout_ce']} x the cross-entropy of the target's greedy tokens."
            if cfg["rollout_ce"]
            else "."
        ),
        "",
    ]


def _credited(cfg: dict[str, Any], name: str, now: str, before: str) -> list[str]:
    """`now` when this stage trained the target with the setting `name`, `before` when an
    earlier stage did (a later draft-only stage keeps the target it was given)."""
    if cfg.get(name) and cfg["tokens"]:  # the target trains in phase 1 only
        return [now, ""]
    flag = f"--{name.replace('_', '-')} "
    if any(flag in f for f in cfg.get("prior_fits", [])):
        return [before, ""]
    return []


def _ditto_lines(cfg: dict[str, Any]) -> list[str]:
    how = (
        "pseudo-repetitions (`saguaro/train/loops.py`, DITTO): rows of a real prefix followed "
        f"by the real segment after it ({SEGMENT[0]} to {SEGMENT[1]} tokens) repeated, each "
        "repeat's probability trained towards a fixed fraction{lam} of the one before, so "
        "that a loop grows less likely with every turn instead of more."
    )
    now = f"The target's loss adds {cfg['ditto']} x a loss against loops on "
    before = "An earlier stage (its command is below) trained the target against loops on "
    lam = f" ({cfg['ditto_lambda']})"
    return _credited(cfg, "ditto", now + how.format(lam=lam), before + how.format(lam=""))


def _mix_lines(cfg: dict[str, Any]) -> list[str]:
    how = (
        "mixed{w} the draft's distribution into the target's text labels "
        "(`mixed_label_loss` in `saguaro/train/trainer.py`), so that where the data leave the "
        "target unsure its greedy token leans to the draft's, the choice greedy speculation "
        "accepts."
    )
    now = "This stage " + how.format(w=f" {cfg['draft_mix']} x")
    before = "An earlier stage (its command is below) " + how.format(w="")
    return _credited(cfg, "draft_mix", now, before)


def _lineage(cfg: dict[str, Any]) -> list[str]:
    if not cfg.get("init_from"):
        return []
    stages = len(cfg["prior_fits"])
    what = "an earlier export" if stages == 1 else f"the export of {stages} earlier stages"
    return [
        f"This run continued {what} (its weights, with fresh optimizers, schedules and data "
        f"order): that export had trained the target on {cfg['prior_target_tokens']:,} tokens "
        f"and the draft on {cfg['prior_draft_tokens']:,}; the totals above include them, and the "
        "settings above are the last stage's.",
        "",
    ]


def fit_args(cfg: dict[str, Any]) -> str:
    """The `fit` arguments that reproduce a run with this config."""
    args = f"--tokens {cfg['tokens']} --draft-tokens {cfg['draft_tokens']} --batch {cfg['batch']}"
    defaults = FitConfig()
    for name in (n for n in FIT_OPTIONS if n != "batch"):  # batch is always named
        if cfg.get(name, getattr(defaults, name)) != getattr(defaults, name):
            args += f" --{name.replace('_', '-')} {cfg[name]}"
    return args


def _replans(replans: list[dict[str, int]]) -> list[str]:
    lines = [
        f"- at step {r['step']}, re-planned from "
        + " and ".join(f"`{k}` {v:,}" for k, v in r.items() if k != "step")
        for r in replans
    ]
    if not lines:
        return []
    head = "The budget was re-planned during the run (the schedules follow the plan in force):"
    return [head, "", *lines, "- to the budget above", ""]


def stage_fits(meta: dict[str, Any]) -> str:
    """The `fit` invocations that replay a stage exactly, one line each: one per plan it ran
    under (a re-plan resumes the run with a new budget and the cosine continues over it), each
    stopped at the step where the next took over, and the last one where the stage stopped if
    it did not finish its plan. Runs resume bit-identically, so this is the stage's training."""
    cfg = meta["config"]
    budget = {"tokens": cfg["tokens"], "draft_tokens": cfg["draft_tokens"]}
    stop = meta["step"] if meta["step"] < meta["total_steps"] else None
    plans = [(budget, stop)]
    for r in reversed(meta.get("replans", [])):  # each names the plan in force before it
        budget = {**budget, **{k: v for k, v in r.items() if k != "step"}}
        plans.append((budget, r["step"]))
    lines = []
    for i, (budget, stop) in enumerate(reversed(plans)):
        # A resumed run takes its settings from its checkpoint: later lines name the budget.
        args = (
            fit_args({**cfg, **budget})
            if i == 0
            else f"--tokens {budget['tokens']} --draft-tokens {budget['draft_tokens']}"
        )
        lines.append(args + (f" --stop-at {stop}" if stop is not None else ""))
    return "\n".join(lines)


def _fit_commands(cfg: dict[str, Any], this_stage: str) -> list[str]:
    """`prepare` is deterministic, so every stage trains on the same split and tokenizer; each
    continues the export of the one before (its first `fit` line says from where)."""
    stages = [*cfg.get("prior_fits", []), this_stage]
    lines = []
    for i, fits in enumerate(stages, 1):
        last = i == len(stages)
        run = "python -m saguaro.train --run-dir " + ("RUN" if last else f"RUN{i}")
        lines.append(f"{run} prepare")
        for j, args in enumerate(fits.split("\n")):
            init = ""
            if j == 0 and i > 1:
                init = f" --init-from STAGE{i - 1}"
            lines.append(f"{run} fit {args}{init}")
        if not last:
            lines.append(f"{run} export --out STAGE{i}")
    return lines


def _cost_lines(c: dict[str, Any] | None) -> list[str]:
    if c is None:
        return []
    t, d, k = c["target"], c["draft"], c["k"]
    verify = t["t_k1"]
    return [
        "## Cost regime (measured with the saguaro engine)",
        "",
        f"One thread, {c['context']}-token context, medians of 30 runs, K = {k} "
        f"(`python scripts/cost_regime.py`, {c['date']}, {c['machine']}):",
        "",
        f"| model | T(1 position) | T(K+1 = {k + 1} positions) | T(8 branches, one depth) |",
        "|---|---:|---:|---:|",
        f"| target | {t['t1']:.2f} ms | {verify:.2f} ms (verify) | |",
        f"| draft | {d['t1']:.2f} ms | {d['t_k1']:.2f} ms (glue) | {d['branch8']:.2f} ms |",
        "",
        f"- `K x T_draft(1) = {c['drafting_ms']:.2f} ms` against `0.5 x T_verify = "
        f"{0.5 * verify:.2f} ms`: "
        + (
            "drafting is a real cost, so hiding it is worth doing."
            if c["drafting_is_real"]
            else "drafting is too cheap for SSD to matter."
        ),
        f"- `T_glue + K x T_draft(8 branches) = {c['build8_ms']:.2f} ms` against `T_verify = "
        f"{verify:.2f} ms`: "
        + (
            "a cache of 8 full-depth branches fits inside one verification."
            if c["cache8_fits"]
            else "a cache of 8 full-depth branches does not fit inside one verification; a "
            "draft forward is dominated by its fixed cost, so the SSD worker plans a shallower "
            "or narrower cache online (`saguaro/speculation/planner.py`)."
        ),
        "",
    ]


def _repetition_lines(m: dict[str, Any]) -> list[str]:
    if "repetition_as_given" not in m:
        return []
    given, stripped = m["repetition_as_given"], m["repetition_stripped"]
    return [
        "## Repetition",
        "",
        f"Greedy continuations by the target of {m['repetition_prompts']} HumanEval prompts, "
        f"{m['repetition_tokens']} new tokens each (saguaro's engine): "
        f"**{given['looping']:.0%} end in a loop** (their last 64 tokens repeat with a period "
        f"of at most 16 tokens), {stripped['looping']:.0%} when the prompt's trailing newline "
        f"is stripped. Distinct 4-grams per continuation, on average: "
        f"{given['distinct_4grams']:.0%} and {stripped['distinct_4grams']:.0%} (100%: no "
        "4-gram occurs twice).",
        "",
    ]


def _metric_lines(m: dict[str, Any]) -> list[str]:
    k = m["k"]
    per_pos = ", ".join(f"{i + 1}: {p:.2f}" for i, p in enumerate(m["accept_at_least"]))
    engine = ", ".join(f"{i + 1}: {p:.2f}" for i, p in enumerate(m["engine_accept_at_least"]))
    lines = [
        "| model | loss (nats/token) | perplexity |",
        "|---|---|---|",
        f"| target | {m['loss_target']:.3f} | {m['ppl_target']:.2f} |",
        f"| draft | {m['loss_draft']:.3f} | {m['ppl_draft']:.2f} |",
        "",
        f"Measured on {m['loss_tokens']:,} held-out tokens. The draft's greedy token equals the "
        f"target's at {m['top1_agreement']:.1%} of held-out positions (teacher forced).",
        "",
        f"Greedy speculative decoding at K = {k} ({m['prompts']} held-out prompts of "
        f"{m['prompt_tokens']} tokens, up to {m['gen_tokens']} new tokens each), measured with "
        f"saguaro's SD engine ({m['engine_target_steps']} target steps with K drafted tokens): "
        f"**mean accepted length {m['engine_mean_accepted_length']:.2f}** tokens per target "
        f"step, bonus included. Share of steps accepting at least i drafted tokens: {engine}. "
        "Simulated directly with the two models by the definition (no KV cache), as a "
        f"cross-check: {m['mean_accepted_length']:.2f} over {m['target_steps']} target steps "
        f"(at least i: {per_pos}).",
        "",
        *_cost_lines(m.get("costs")),
        *_repetition_lines(m),
        "## Greedy samples (target)",
        "",
        "A prompt that ends in a newline leaves a lone newline token where training text "
        "almost always has the newline merged with the next line's indentation (`\\n   ` is one "
        "token), so these small models continue such prompts worse than prompts that stop "
        "at the end of a line.",
        "",
    ]
    for s in m["samples"]:
        lines += ["```text", s["prompt"] + s["target"], "```", ""]
    lines += ["## Greedy samples (draft)", ""]
    for s in m["samples"][:2]:
        lines += ["```text", s["prompt"] + s["draft"], "```", ""]
    return lines
