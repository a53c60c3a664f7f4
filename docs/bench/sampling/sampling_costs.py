"""Time the sampling core's per-step work at real vocabulary sizes: the row-wise argmax / max /
top-k of :mod:`saguaro.sampling.reduce` against PyTorch's own CPU kernels, in one process,
interleaved.

    python docs/bench/sampling/sampling_costs.py [--threads 1] [--rounds 5] [--out DIR]

Each case is what one decoding step asks of the logits: greedy verification of K + 1 rows, the
greedy and T = 0.8 target distribution (``process``), and a draft's proposals (greedy and
T = 0.8, top-M) for a batch of rows. Prints a markdown table of median milliseconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

import torch

from saguaro.sampling import SamplingParams, SamplingTensors, process, propose, reduce, seed_tensor
from saguaro.sampling.verify import verify_greedy
from saguaro.train.costs import median_ms

VOCABS = (8_192, 32_000, 128_256, 151_936)
K = 4  # speculation length: verification scores K + 1 rows
TOP_M = 64


@contextmanager
def torch_kernels(on: bool):
    """PyTorch's own argmax / max(dim) / topk everywhere ``reduce`` is used, when ``on``."""
    if not on:
        yield
        return
    with (
        mock.patch.object(reduce, "_numpy_view", lambda x: None),
        mock.patch.object(reduce, "TOPK_MIN_BLOCKS_PER_K", float("inf")),
    ):
        yield


def cases(vocab: int) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(vocab)
    rows = K + 1
    logits = torch.randn(rows, vocab, generator=g) * 3
    drafts = torch.randint(0, vocab, (1, K), generator=g)
    num = torch.tensor([K])
    idx = torch.arange(rows)[None]
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * rows)
    warm = SamplingTensors.from_params([SamplingParams(temperature=0.8)] * rows)
    branches = torch.randn(16, vocab, generator=g) * 3
    seeds16, pos16 = seed_tensor([7] * 16), torch.arange(16)
    greedy16 = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 16)
    warm16 = SamplingTensors.from_params([SamplingParams(temperature=0.8)] * 16)
    return {
        f"verify greedy, {rows} rows": lambda: verify_greedy(logits, drafts, num, idx),
        f"target dist greedy, {rows} rows": lambda: process(logits, greedy),
        f"target dist T=0.8, {rows} rows": lambda: process(logits, warm),
        "draft propose greedy, 16 rows": lambda: propose(branches, greedy16, seeds16, pos16, TOP_M),
        "draft propose T=0.8, 16 rows": lambda: propose(branches, warm16, seeds16, pos16, TOP_M),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[tuple[int, str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for vocab in VOCABS:
            for name, fn in cases(vocab).items():
                for torch_on in (True, False):
                    with torch_kernels(torch_on):
                        results.setdefault((vocab, name, torch_on), []).append(median_ms(fn))
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = [
        f"`python docs/bench/sampling/sampling_costs.py --threads {args.threads} "
        f"--rounds {args.rounds}`",
        "",
        f"{stamp} · {platform.machine()}, {torch.get_num_threads()} thread(s) · "
        f"torch {torch.__version__} · medians of {args.rounds} interleaved rounds",
        "",
        "| vocab | step | torch argmax/max/topk ms | saguaro.sampling.reduce ms | speedup |",
        "|---:|---|---:|---:|---:|",
    ]
    rows = []
    for vocab in VOCABS:
        for name in cases(vocab):
            before = statistics.median(results[(vocab, name, True)])
            after = statistics.median(results[(vocab, name, False)])
            rows.append({"vocab": vocab, "step": name, "torch_ms": before, "reduce_ms": after})
            speedup = before / after
            lines.append(f"| {vocab} | {name} | {before:.3f} | {after:.3f} | {speedup:.2f}× |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text + "\n")
        (args.out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
