"""One forward's time, eager against bucketed (CUDA graphs on a GPU), per batch size and positions.

    python scripts/graph_forwards.py --model DIR [--device cuda] [--batch-sizes 1,16]
        [--positions 1,5] [--context 128] [--repeats 50] [--dtype float32]

Each line of output is one JSON object: the model, device, batch size b, positions q (1: a decode
or a draft step; K + 1: a verification), the medians in ms of ``--repeats`` forwards each way
(interleaved) and their ratio. On a GPU the bucketed forward replays a captured CUDA graph; on a
CPU it is the same static-buffer path without capture (which the engine does not use there), so
the ratio is the cost of its padding and copies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from saguaro.engine.graphs import Buckets
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from saguaro.options import cpu_list

BLOCK_SIZE = 16


def timed(runner: ModelRunner, queries: list, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    runner.forward(queries)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch-sizes", type=cpu_list, default=[1, 16])
    p.add_argument("--positions", type=cpu_list, default=[1, 5])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    device = torch.device(args.device)
    model = load_model(args.model, args.dtype, device)
    blocks_per_seq = -(-(args.context + max(args.positions)) // BLOCK_SIZE)
    num_blocks = blocks_per_seq * max(args.batch_sizes)
    buckets = Buckets.for_runner(
        max(args.batch_sizes), num_blocks * BLOCK_SIZE, tuple(args.positions)
    )
    eager = ModelRunner(model, num_blocks, BLOCK_SIZE, device)
    bucketed = ModelRunner(model, num_blocks, BLOCK_SIZE, device, buckets=buckets)
    start = time.perf_counter()
    bucketed.capture_graphs(tuple(args.positions))
    capture_s = time.perf_counter() - start
    for b in args.batch_sizes:
        for q in args.positions:
            queries = [
                eager.sequence_query(
                    list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
                    args.context,
                    [0] * q,
                    q,
                )
                for i in range(b)
            ]
            times: dict[str, list[float]] = {"eager": [], "bucketed": []}
            for runner in (eager, bucketed):  # warm both (a lazy capture, allocator pools)
                runner.forward(queries)
            for _ in range(args.repeats):
                times["eager"].append(timed(eager, queries, device))
                times["bucketed"].append(timed(bucketed, queries, device))
            e, g = (statistics.median(times[k]) for k in ("eager", "bucketed"))
            line = dict(model=args.model, device=str(device), dtype=args.dtype, b=b, q=q)
            line |= dict(eager_ms=round(e, 3), bucketed_ms=round(g, 3), ratio=round(e / g, 2))
            line |= dict(graphs=len(bucketed.static.graphs), capture_s=round(capture_s, 2))
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
