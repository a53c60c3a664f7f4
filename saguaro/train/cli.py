"""saguaro train-pair (python -m saguaro.train) {prepare,fit,export,eval}: train the project's
small code pair from scratch; every step is rerunnable and resumes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from saguaro.placement import resolve_device

DEFAULT_RUN_DIR = Path("train_run")


def _parser() -> argparse.ArgumentParser:
    from saguaro.train.trainer import FIT_OPTIONS, FitConfig

    defaults = FitConfig()
    p = argparse.ArgumentParser(prog="saguaro train-pair", description=__doc__)
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help="data and checkpoints")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    sub = p.add_subparsers(dest="command", required=True)

    prep = sub.add_parser("prepare", help="split the stdlib, train the tokenizer, tokenise")
    prep.add_argument("--root", type=Path, default=None, help="corpus root (default: stdlib)")
    prep.add_argument("--vocab-size", type=int, default=8192)
    prep.add_argument("--heldout-permille", type=int, default=30)

    fit = sub.add_parser("fit", help="train (or resume) both models")
    fit.add_argument("--tokens", type=int, help=f"co-training budget (default {defaults.tokens})")
    fit.add_argument(
        "--draft-tokens", type=int, help=f"draft-only budget (default {defaults.draft_tokens})"
    )
    for name, text in FIT_OPTIONS.items():
        default = getattr(defaults, name)
        flag = f"--{name.replace('_', '-')}"
        fit.add_argument(flag, type=type(default), default=default, help=text)
    fit.add_argument("--minutes", type=float, default=None, help="stop (and save) after this")
    fit.add_argument("--stop-at", type=int, default=None, help="stop (and save) at this step")
    fit.add_argument("--ckpt-minutes", type=float, default=10.0)
    fit.add_argument(
        "--init-from", type=Path, default=None, help="continue an export (DIR/target, DIR/draft)"
    )
    fit.add_argument("--device", default="auto", type=resolve_device, help="auto | cpu | cuda")

    exp = sub.add_parser("export", help="write both HF model dirs from the latest checkpoint")
    exp.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/draft")

    ev = sub.add_parser("eval", help="held-out loss, acceptance, samples; updates the cards")
    ev.add_argument("--out", type=Path, required=True, help="dir holding target/ and draft/")
    ev.add_argument("--windows", type=int, default=64, help="held-out windows for the loss")
    ev.add_argument("--prompts", type=int, default=24, help="held-out prompts for acceptance")
    ev.add_argument("--k", type=int, default=5)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "prepare":
        from saguaro.corpus import stdlib_root
        from saguaro.train.data import PrepareConfig, prepare

        root = args.root or stdlib_root()
        stats = prepare(PrepareConfig(root, args.run_dir, args.vocab_size, args.heldout_permille))
        print(json.dumps(stats))
    elif args.command == "fit":
        from saguaro.train.trainer import FIT_OPTIONS, FitConfig, Trainer

        # Budgets given on the command line also re-plan a resumed run; the rest of a
        # resumed run's config comes from its checkpoint.
        budget = {
            k: v
            for k, v in (("tokens", args.tokens), ("draft_tokens", args.draft_tokens))
            if v is not None
        }
        prior = {}
        if args.init_from is not None:
            from saguaro.train.export import continuation

            prior = continuation(args.init_from)
        cfg = FitConfig(**prior, **{name: getattr(args, name) for name in FIT_OPTIONS})
        trainer = Trainer(args.run_dir, cfg, args.device, budget)
        print(f"plan: {json.dumps(trainer.cfg.to_dict())}; at step {trainer.step}", flush=True)
        print(json.dumps(trainer.fit(args.minutes, args.ckpt_minutes, stop_at=args.stop_at)))
        done = " (done)" if trainer.done else ""
        print(f"step {trainer.step}/{trainer.cfg.total_steps}{done}")
    elif args.command == "export":
        from saguaro.train.export import export

        export(args.run_dir, args.out)
    elif args.command == "eval":
        from saguaro.train.evaluate import evaluate

        print(json.dumps(evaluate(args.run_dir, args.out, args.windows, args.prompts, args.k)))
    return 0
