"""Mode auto against the fixed modes, per cell, from `saguaro bench` results.

    python docs/bench/auto/auto_table.py RESULTS.json [RESULTS.json ...]

One markdown row per (batch, temperature, layout): AR, the best fixed configuration that ran, and
auto, in output tok/s and in decode speed (1 / TPOT), with the share of auto's rounds per choice,
and the 95% intervals of auto / best and auto / AR: a bootstrap over the prompt batches, each batch
of auto paired with the other's on the same prompts in the same pass (tokens over seconds of the
resampled batches).
"equal": every mode on all the cores; "paper": AR and SD held to one core ("1 core" variants)
beside SSD (target on one core, draft on the other) and auto with ``auto_cores="own"``.
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ONE_CORE = " 1 core"
MIN_SHARE = 0.02  # choices below this share of auto's rounds are left out
RESAMPLES = 2000  # bootstrap resamples of the paired batches
HEADER = (
    "| batch | T | layout | AR tok/s | best fixed, tok/s | auto tok/s | auto / best | auto / AR "
    "| best fixed by 1/TPOT | auto / best (1/TPOT) | auto / AR (1/TPOT) | auto / best, 95% "
    "| auto / AR, 95% | auto's rounds |"
)


def layout_rows(variants: dict[str, dict], layout: str) -> dict[str, dict]:
    if layout == "paper":
        return {k: r for k, r in variants.items() if k.endswith(ONE_CORE) or r["mode"] == "ssd"}
    return {k: r for k, r in variants.items() if not k.endswith(ONE_CORE)}


def interval(auto: dict[tuple, tuple], other: dict[tuple, tuple]) -> str:
    """The paired bootstrap interval of auto / other over batches run by both; each run is
    (output tokens, seconds), keyed by (pass, batch)."""
    keys = sorted(set(auto) & set(other))
    if len(keys) < 2:
        return "-"
    rng, ratios = random.Random(0), []
    for _ in range(RESAMPLES):
        pick = [rng.choice(keys) for _ in keys]
        a_tok, a_s, r_tok, r_s = (
            sum(runs[k][i] for k in pick) for runs in (auto, other) for i in (0, 1)
        )
        ratios.append((a_tok / a_s) / (r_tok / r_s))
    ratios.sort()
    return f"{ratios[int(0.025 * RESAMPLES)]:.2f}-{ratios[int(0.975 * RESAMPLES) - 1]:.2f}"


def row(b: int, t: float, layout: str, pick: dict[str, dict], runs: dict) -> str | None:
    auto = next((r for r in pick.values() if r["mode"] == "auto"), None)
    ar_label = next((k for k, r in pick.items() if r["mode"] == "ar"), None)
    if auto is None or ar_label is None:
        return None
    ar, auto_label = pick[ar_label], next(k for k, r in pick.items() if r is auto)
    fixed = {k: r for k, r in pick.items() if r["mode"] != "auto"}
    best = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    best_decode = min(fixed, key=lambda k: fixed[k]["tpot_s"])
    shares = sorted(auto.get("speculation", {}).get("choices", {}).items(), key=lambda kv: -kv[1])
    choices = " ".join(f"{c} {s:.0%}" for c, s in shares if s >= MIN_SHARE)
    cells = [
        b, f"{t:g}", layout, f"{ar['tokens_per_s']:.1f}",
        f"{best} {fixed[best]['tokens_per_s']:.1f}", f"{auto['tokens_per_s']:.1f}",
        f"{auto['tokens_per_s'] / fixed[best]['tokens_per_s']:.2f}",
        f"{auto['tokens_per_s'] / ar['tokens_per_s']:.2f}", best_decode,
        f"{fixed[best_decode]['tpot_s'] / auto['tpot_s']:.2f}",
        f"{ar['tpot_s'] / auto['tpot_s']:.2f}",
        interval(runs[(t, b, auto_label)], runs[(t, b, best)]),
        interval(runs[(t, b, auto_label)], runs[(t, b, ar_label)]), choices,
    ]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(paths: list[str]) -> None:
    print(HEADER)
    print("|---:|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|")
    for path in paths:
        data = json.loads(Path(path).read_text())
        runs: dict[tuple, dict[tuple, tuple]] = defaultdict(dict)
        for r in data["runs"]:
            key = (r["temperature"], r["batch_size"], r["variant"])
            runs[key][(r["repeat"], r["batch_index"])] = (r["output_tokens"], r["elapsed_s"])
        cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
        for r in data["results"]:
            cells[(r["temperature"], r["batch_size"])][r["variant"]] = r
        for (t, b), variants in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            for layout in ("equal", "paper"):
                line = row(b, t, layout, layout_rows(variants, layout), runs)
                if line:
                    print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
