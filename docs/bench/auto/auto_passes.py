"""AR and auto (cores shared with SSD's worker) alternating on the same prompts, in one process:
each pass's seconds, auto's steps by choice in it, and the CPU seconds its worker used.

    python docs/bench/auto/auto_passes.py [--passes 6] [--batch 64] [--tokens 32] \\
        [--temperature 0.7]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from saguaro import LLM, SamplingParams
from saguaro.bench.datasets import humaneval_prompts
from saguaro.models.catalog import resolve_model

TICK = os.sysconf("SC_CLK_TCK")
UTIME, STIME = 11, 12  # fields of /proc/PID/stat after the command name, from 0 (state)


def children_cpu_s() -> float:
    """User and system seconds of this process's children (the worker)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            total += (int(fields[UTIME]) + int(fields[STIME])) / TICK
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passes", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    a = p.parse_args()
    target = resolve_model("smollm2-135m-instruct")
    draft = resolve_model("smollm2-135m-instruct-draft")
    prompts = [x.text for x in humaneval_prompts()[: a.batch]]
    params = SamplingParams(temperature=a.temperature, max_tokens=a.tokens, seed=0, ignore_eos=True)
    ar = LLM(model=str(target), mode="ar")
    auto = LLM(model=str(target), draft=str(draft), num_speculative_tokens=4)
    before: dict[str, int] = {}
    for rep in range(a.passes):
        for name, llm in (("ar", ar), ("auto", auto)):
            cpu, start = children_cpu_s(), time.perf_counter()
            llm.generate(prompts, params)
            row = {"pass": rep, "mode": name, "s": round(time.perf_counter() - start, 2)}
            row["worker_cpu_s"] = round(children_cpu_s() - cpu, 2)
            if name == "auto":
                steps = auto.draft_stats(a.batch).get("auto", {}).get("steps", {})
                row["steps"] = {k: v - before.get(k, 0) for k, v in steps.items()}
                before = dict(steps)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
