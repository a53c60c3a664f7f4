"""Per-forward times of saguaro and llama.cpp on the same models and threads, side by side.

For each thread count, the forwards a speculative round is made of, after ``--context`` cached
tokens: the target at each of ``--positions`` (1: decode; K + 1: verification), the draft at 1
position (a draft step) and B branches (a branch depth of the SSD cache, B from
``--branches``). llama.cpp runs them through ``llama-bench`` on the models written as GGUF
(``pp n @ d context``: n tokens in one batch after ``context`` cached ones; its K + 1 and
B-token batches are causal and ask for the last token's logits only, where saguaro's
verification and branches ask for every row's, so the comparison favours llama.cpp there).
saguaro times its model runner on its own kernels (the engine's default: a .gguf model's
blocks, or a directory's where it keeps ``model.gguf``, which llama.cpp then runs too, the very
file), and on torch's operators eager and compiled (dense float32).
Rounds interleave the two engines so that a noisy machine slows both alike; the figures are the
medians over rounds, and each round's figure is itself a median of many forwards.

    python scripts/llamacpp_peer.py --bin /work/llamacpp/build/bin [--threads 1,2] \\
        [--positions 1,5] [--rounds 3] [--forwards kernels,eager,compiled] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from saguaro.bench.backends import peer_gguf
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.train.costs import ForwardTimer

FORWARDS = ("kernels", "eager", "compiled")


def kinds(model: str, positions: list[int], branches: list[int]) -> list[tuple[str, int]]:
    """(label, tokens) of each timed forward of ``model`` ("target" or "draft")."""
    steps = [(f"{n} position{'s' * (n > 1)}", n) for n in positions]
    return steps if model == "target" else steps[:1] + [(f"{b} branches", b) for b in branches]


def llama_bench(binary: Path, gguf: Path, sizes: list[int], context: int, threads: int, reps: int):
    """Milliseconds of one batch of n tokens after ``context`` cached ones, for each n."""
    cmd = [
        str(binary), "-m", str(gguf), "-p", ",".join(map(str, sizes)), "-n", "0",
        "-d", str(context), "-t", str(threads), "-r", str(reps), "-o", "json",
    ]  # fmt: skip
    print("$", shlex.join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["n_prompt"]: r["avg_ns"] / 1e6 for r in json.loads(out)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="directory of llama.cpp's binaries (llama-bench)")
    p.add_argument("--model", default=str(resolve_model(DEFAULT_MODEL)))
    p.add_argument("--draft", default=str(resolve_model(DEFAULT_DRAFT)))
    p.add_argument("--cache", default="~/.cache/saguaro/gguf", help="where GGUF files are kept")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument(
        "--positions", default="1,5", help="the target's positions a forward (1; K + 1 = 5)"
    )
    p.add_argument("--branches", default="8,16", help="branch counts, comma-separated")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repetitions", type=int, default=10, help="llama-bench -r per round")
    # A draft with a reduced output vocabulary (draft_vocab_size) has no GGUF llama.cpp loads.
    p.add_argument("--models", default="target,draft", help="of target,draft, comma-separated")
    p.add_argument("--forwards", default=",".join(FORWARDS), help="saguaro's, comma-separated")
    p.add_argument("--out", help="directory for results.json and results.md")
    a = p.parse_args()
    forwards = a.forwards.split(",")
    if unknown := set(forwards) - set(FORWARDS):
        p.error(f"--forwards: unknown {sorted(unknown)}; choose from {list(FORWARDS)}")
    threads = [int(t) for t in a.threads.split(",")]
    branches = [int(b) for b in a.branches.split(",")]
    positions = [int(n) for n in a.positions.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    if max(threads) > len(cpus):
        p.error(f"--threads {a.threads}: this process has {len(cpus)} cores")
    binary = Path(a.bin) / "llama-bench"
    models = {m: d for m, d in (("target", a.model), ("draft", a.draft)) if m in a.models}
    ggufs = {m: peer_gguf(Path(d), a.cache, "f32") for m, d in models.items()}
    timers = {
        (m, fw): ForwardTimer(d, a.context, compile=fw == "compiled", kernels=fw == "kernels")
        for m, d in models.items()
        for fw in forwards
    }
    # samples[(model, kind, threads, engine)] = one figure per round
    samples: dict[tuple[str, str, int, str], list[float]] = {}
    for r in range(a.rounds):
        for t in threads:
            os.sched_setaffinity(0, cpus[:t])  # llama-bench inherits the cores
            torch.set_num_threads(t)
            for m in models:
                ks = kinds(m, positions, branches)
                sizes = [n for _, n in ks]
                peer = llama_bench(binary, ggufs[m], sizes, a.context, t, a.repetitions)
                for label, n in ks:
                    samples.setdefault((m, label, t, "llama.cpp"), []).append(peer[n])
                    for fw in forwards:
                        timer = timers[(m, fw)]
                        ms = timer.positions_ms(n) if "position" in label else timer.branches_ms(n)
                        samples.setdefault((m, label, t, fw), []).append(ms)
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    os.sched_setaffinity(0, cpus)

    rows = []
    for (m, label, t, engine), values in samples.items():
        if engine == "llama.cpp":
            peer = statistics.median(values)
            row = {"model": m, "forward": label, "threads": t, "llama.cpp_ms": peer}
            for fw in forwards:
                ms = statistics.median(samples[(m, label, t, fw)])
                row[f"{fw}_ms"], row[f"{fw}_x"] = ms, ms / peer
            rows.append(row)
    header = "| model | forward | threads | llama.cpp ms | " + " | ".join(
        f"saguaro {fw} ms | × llama.cpp" for fw in forwards
    )
    lines = [header + " |", "|---|---|---:|---:|" + "---:|---:|" * len(forwards)]
    for row in rows:
        cells = [row["model"], row["forward"], str(row["threads"]), f"{row['llama.cpp_ms']:.2f}"]
        cells += [f"{row[f'{fw}_ms']:.2f} | {row[f'{fw}_x']:.2f}×" for fw in forwards]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "command": shlex.join(["python", *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": f"{platform.processor() or platform.machine()}, {len(cpus)} cores",
            "torch": torch.__version__,
            "context": a.context,
            "rounds": a.rounds,
        }
        (out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
        (out / "results.md").write_text(
            f"`{meta['command']}`\n\n{meta['date']} · {meta['machine']} · torch {meta['torch']} · "
            f"context {a.context} · medians of {a.rounds} interleaved rounds\n\n{table}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
