"""Measure the forward costs that decide whether SSD can pay off on this machine (one thread).

    python scripts/cost_regime.py [--target DIR] [--draft DIR] [--k 4] [--context 200]

Reports medians of: target T(1) and T_verify(K+1); draft T(1), T_glue(K+1) and one branch step
with 8 branches (the per-depth cost of decoding 8 prepared outcomes), then the two conditions of
issue 3: K * T_draft(1) >= 0.5 * T_verify(K+1) (drafting is a real cost, so hiding it matters)
and T_glue(K+1) + K * T_draft(8 branches) <= T_verify(K+1) (a cache of 8 branches fits inside
one verification).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from saguaro import bundled
from saguaro.engine.model_runner import ModelRunner, Query, token_slots
from saguaro.models.loader import load_model


def median_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def costs(model_dir: str, k: int, context: int) -> dict[str, float]:
    model = load_model(model_dir)
    bs = 16
    blocks = -(-(context + 64) // bs) + 4
    runner = ModelRunner(model, blocks, bs, "cpu")
    table = list(range(blocks))
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (context,)).tolist()
    runner.forward([runner.sequence_query(table, 0, prompt, 1)])  # fill the KV cache

    def step(n: int):
        return lambda: runner.forward([runner.sequence_query(table, context, prompt[:n], 1)])

    keys = token_slots(table, 0, context + 8, bs)
    mask = torch.zeros(8, context + 8, dtype=torch.bool)
    mask[:, :context] = True
    mask[torch.arange(8), context + torch.arange(8)] = True
    branches = Query(prompt[:8], torch.full((8,), context), keys[context:], keys, 8, mask)
    return {
        "t1": median_ms(step(1)),
        "t_k1": median_ms(step(k + 1)),
        "branch8": median_ms(lambda: runner.forward([branches])),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(bundled.TARGET_DIR))
    p.add_argument("--draft", default=str(bundled.DRAFT_DIR))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--context", type=int, default=200)
    args = p.parse_args()
    torch.set_num_threads(1)
    t, d = costs(args.target, args.k, args.context), costs(args.draft, args.k, args.context)
    k = args.k
    print(f"target: T(1) {t['t1']:.2f} ms, T_verify({k + 1}) {t['t_k1']:.2f} ms")
    print(f"draft:  T(1) {d['t1']:.2f} ms, T_glue({k + 1}) {d['t_k1']:.2f} ms, "
          f"T(8 branches) {d['branch8']:.2f} ms")
    lhs = k * d["t1"]
    print(f"K*T_draft(1) = {lhs:.2f} ms vs 0.5*T_verify = {0.5 * t['t_k1']:.2f} ms: "
          f"{'OK' if lhs >= 0.5 * t['t_k1'] else 'drafting too cheap'}")
    build = d["t_k1"] + k * d["branch8"]
    print(f"T_glue + K*T_draft(8) = {build:.2f} ms vs T_verify = {t['t_k1']:.2f} ms: "
          f"{'fits' if build <= t['t_k1'] else 'does not fit'}")


if __name__ == "__main__":
    main()
