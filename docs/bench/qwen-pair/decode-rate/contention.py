"""Does the draft, computing on the other core, slow the target's forward? SSD's layout puts
the target on core 0 and the draft worker on core 1; this times the target's forward (one
thread, after 200 cached tokens, at 1 and 3 positions) alone, then beside a process that runs
the draft's 3-position forward in a loop on core 1, then alone again.

    PYTHONPATH=. python docs/bench/qwen-pair/decode-rate/contention.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.train.costs import ForwardTimer

CONTEXT = 200
REPEATS = 15
TARGET_CORE, DRAFT_CORE = 0, 1
DRAFT_POSITIONS = 3  # a glue over a hit's [t, b_1, b_2]
LOOP_S = 40.0  # the draft's loop outlasts the target's load and timing


def timer(name: str, core: int) -> ForwardTimer:
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {core})
    return ForwardTimer(Path(resolve_model(name)), CONTEXT, kernels=True)


def draft_loop(ready: Path) -> None:
    t = timer(DEFAULT_DRAFT, DRAFT_CORE)
    query = t.runner.sequence_query(t.table, t.context, t.prompt[:DRAFT_POSITIONS], DRAFT_POSITIONS)
    ready.touch()
    times, end = [], time.monotonic() + LOOP_S
    while time.monotonic() < end:
        start = time.perf_counter()
        t.runner.forward([query])
        times.append(time.perf_counter() - start)
    print(f"draft loop: {len(times)} forwards, median {statistics.median(times) * 1e3:.1f} ms")


def target_ms(label: str) -> None:
    t = timer(DEFAULT_MODEL, TARGET_CORE)
    one, three = t.positions_ms(1, REPEATS), t.positions_ms(3, REPEATS)
    print(f"target {label}: 1 position {one:.1f} ms, 3 positions {three:.1f} ms", flush=True)


def main() -> None:
    if sys.argv[1:] == ["draft"]:
        draft_loop(Path(os.environ["READY"]))
        return
    target_ms("alone")
    ready = Path(f"/tmp/saguaro-contention-{os.getpid()}")
    env = {**os.environ, "READY": str(ready)}
    loop = subprocess.Popen([sys.executable, __file__, "draft"], env=env)
    while not ready.exists():
        time.sleep(0.5)
    target_ms("beside the draft's loop")
    loop.wait()
    ready.unlink()
    target_ms("alone again")


if __name__ == "__main__":
    main()
