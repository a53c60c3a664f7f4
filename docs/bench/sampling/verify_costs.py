"""Time one greedy verification round, coupled and rejection sampling, at real vocabulary sizes.

    python docs/bench/sampling/verify_costs.py [--repeats 50]

Each round scores K + 1 = 5 positions per sequence; the target accepts three proposals and
rejects the fourth. Prints median milliseconds as JSON; run it from two checkouts in turn to
compare them.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from saguaro.sampling import SamplingParams, SamplingTensors, seed_tensor, verify
from saguaro.sampling.coupled import verify_coupled
from saguaro.train.costs import median_ms

K = 4
ACCEPTED = 3
VOCABS = (8_192, 128_256)
BATCHES = (1, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {}
    for vocab in VOCABS:
        for n in BATCHES:
            gen = torch.Generator().manual_seed(vocab + n)
            logits = torch.randn(n * (K + 1), vocab, generator=gen)
            best = logits.argmax(dim=-1).view(n, K + 1)
            proposals = best[:, :K].clone()
            proposals[:, ACCEPTED] = (proposals[:, ACCEPTED] + 1) % vocab
            num = torch.full((n,), K)
            st = SamplingTensors.from_params([SamplingParams(temperature=0)] * n)
            seeds, pos = seed_tensor(list(range(n))), torch.full((n,), 100)
            round_args = (logits, st, proposals, num, seeds, pos)
            rounds = {
                "coupled": partial(verify_coupled, *round_args),
                "rejection": partial(verify, *round_args),
            }
            for method, fn in rounds.items():
                assert fn().num_accepted.tolist() == [ACCEPTED] * n
                out[f"{method} vocab={vocab} seqs={n}"] = round(median_ms(fn, args.repeats), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
