"""How much of the target's output a reduced draft head covers, by head size.

The head's tokens are chosen as `saguaro train-draft` chooses them (the target's expected output
mass over the rollouts, ``saguaro.train.draft_model.head_ids``) from all shards of RUN_DIR but
the last, and scored on the last: the target's probability mass inside the head (the most any
draft with that head can be accepted at temperature 1) and how often its argmax lies inside (the
same bound for greedy decoding).

    python docs/bench/draft/head_coverage.py --run-dir RUN --sizes 4096,8192,16384
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from saguaro.train.draft_data import ROLLOUT_DIR
from saguaro.train.draft_model import head_ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--sizes", default="4096,8192,16384")
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    shards = sorted((args.run_dir / ROLLOUT_DIR).glob("shard-*.pt"))
    if len(shards) < 2:
        raise SystemExit("needs at least two rollout shards")
    train = [torch.load(s) for s in shards[:-1]]
    test = torch.load(shards[-1])
    ids = [t for s in train for t in s["top_ids"]]
    logp = [t for s in train for t in s["top_logp"]]
    for size in map(int, args.sizes.split(",")):
        inside = torch.zeros(args.vocab, dtype=torch.bool)
        inside[head_ids(ids, logp, size, args.vocab)] = True
        mass = argmax = positions = 0.0
        for top, lp in zip(test["top_ids"], test["top_logp"], strict=True):
            mass += (lp.float().exp() * inside[top.long()]).sum().item()
            argmax += inside[top[:, 0].long()].sum().item()
            positions += top.shape[0]
        row = {"head_tokens": size, "p_mass_inside": mass / positions}
        row |= {"argmax_inside": argmax / positions, "train_shards": len(train)}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
