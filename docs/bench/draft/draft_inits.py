"""Which target layers a draft should start from: equal short distillations, compared on
held-out rollouts.

Each candidate is cut from the target (saguaro.train.draft_model), trained for the same steps on
the first rollouts of RUN_DIR, and scored on the last ``--heldout`` sequences: the acceptance
proxy sum_x min(p, q) (the expected acceptance of one draft position, on the head's tokens) and
top-1 agreement, before and after training.

    python docs/bench/draft/draft_inits.py --target DIR --run-dir RUN --steps 30 \
        --layers 0,1,2,3 0,1,2,29 0,10,20,29
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from saguaro.train.distill import DistillConfig, Distiller, distill_loss, layer_list, mean_stats
from saguaro.train.trainer import lr_lambda


def score(run: Distiller, indices: list[int], size: int = 8) -> dict[str, float]:
    rows = []
    with torch.no_grad():
        for i in range(0, len(indices), size):
            ids, mask, loss_at, p = run.batch(indices[i : i + size])
            rows.append(distill_loss(p, run.draft.lm_head(run.draft(ids, mask)[loss_at]))[1])
    return mean_stats(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, required=True, help="holds rollouts/")
    p.add_argument("--layers", type=layer_list, nargs="+", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--heldout", type=int, default=24, help="last sequences (rollouts, not answers) scored"
    )
    p.add_argument("--head-tokens", type=int, default=8192)
    p.add_argument("--lr", type=float, default=DistillConfig().lr)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for layers in args.layers:
        cfg = DistillConfig(layers=layers, head_tokens=args.head_tokens, lr=args.lr, epochs=1)
        run = Distiller(args.target, args.run_dir / "no-checkpoint", cfg, "cpu", args.run_dir)
        n = len(run.data.sequences)
        heldout = list(range(n - args.heldout, n))
        before = score(run, heldout)
        train = [b for b in run.plan if not set(b) & set(heldout)]
        start = time.perf_counter()
        # The schedule spans these steps only: warmup, then the cosine to a tenth.
        run.plan = train[: args.steps]
        run.sched = torch.optim.lr_scheduler.LambdaLR(
            run.opt, lr_lambda(cfg.warmup_steps, args.steps, 0.1)
        )
        while not run.done:
            run.train_step()
        seconds = time.perf_counter() - start
        after = score(run, heldout)
        print(
            json.dumps(
                {
                    "layers": layers,
                    "steps": args.steps,
                    "seconds": round(seconds, 1),
                    "before": before,
                    "after": after,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
