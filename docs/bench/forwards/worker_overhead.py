"""The SSD draft worker's time outside its forwards, per cache build.

    python docs/bench/forwards/worker_overhead.py [--builds 300] [--window-ms 13] [--compile] \\
        [--fanout F]

Runs a worker in this process on the default draft (one thread, greedy), feeds it rounds whose
outcome is always a cache hit (every proposal accepted, the draft's top candidate as the bonus
token) with a fixed target window, and reports per planned build: its duration, the part spent
inside the draft's forwards and the rest (planning, candidate ranking, queries, sampling). Run it
from two checkouts in turn to compare them; a fixed ``--fanout`` (F_0..F_K) builds the same
cache every time, where the planner's choice of B and d may differ between runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from saguaro.config import EngineConfig
from saguaro.models.catalog import DEFAULT_DRAFT, resolve_model
from saguaro.speculation import protocol as P
from saguaro.speculation.worker import DraftWorker
from saguaro.train.costs import time_forwards

PROMPT_LEN = 200
WARM_UP_BUILDS = 40  # the planner's timings and hit statistics settle first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=300)
    parser.add_argument("--window-ms", type=float, default=13.0, help="the target's window")
    parser.add_argument("--compile", action="store_true", help="compiled draft forwards")
    parser.add_argument("--fanout", default="auto", help="EngineConfig.fanout (default: planned)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = EngineConfig(
        device="cpu",
        dtype="float32",
        compile=args.compile,
        pin_cpus=False,
        max_num_seqs=1,
        fanout=args.fanout,
    )
    worker = DraftWorker(
        P.WorkerConfig.from_engine(engine, str(resolve_model(DEFAULT_DRAFT)), max_model_len=2048)
    )
    inside = {"forwards": 0.0}
    time_forwards(worker.runner, inside, "forwards")
    prompt = [(i * 37) % 500 + 10 for i in range(PROMPT_LEN)]
    worker.handle(P.RoundRequest([P.SeqUpdate(0, prompt, new=True)]))
    worker.build_pending()
    window = args.window_ms / 1e3

    def one_build() -> tuple[float, float]:
        seq = worker.seqs[0]
        bonus = seq.ranked[len(seq.spec)][0]
        update = P.SeqUpdate(0, seq.spec + [bonus])
        worker.handle(P.RoundRequest([update], window_s=window, verify_s=window))
        inside["forwards"] = 0.0
        start = time.perf_counter()
        worker.build_pending()
        return time.perf_counter() - start, inside["forwards"]

    for _ in range(WARM_UP_BUILDS):
        one_build()
    builds = [one_build() for _ in range(args.builds)]
    b = worker.builder
    print(
        json.dumps(
            {
                "build_ms": 1e3 * statistics.mean(t for t, _ in builds),
                "forwards_ms": 1e3 * statistics.mean(f for _, f in builds),
                "outside_forwards_ms": 1e3 * statistics.mean(t - f for t, f in builds),
                "budget": b.budget,
                "depth": b.depth,
            }
        )
    )


if __name__ == "__main__":
    main()
