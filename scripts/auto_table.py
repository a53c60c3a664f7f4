"""Mode auto against the fixed modes, per cell, from `saguaro bench` results.

    python scripts/auto_table.py RESULTS.json [RESULTS.json ...]

One markdown row per (batch, temperature, layout): AR, the best fixed configuration that ran, and
auto, in output tok/s and in decode speed (1 / TPOT), with the share of auto's rounds per choice.
"equal": every mode on all the cores; "paper": AR and SD held to one core ("1 core" variants)
beside SSD (target on one core, draft on the other) and auto with ``auto_cores="own"``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ONE_CORE = " 1 core"
MIN_SHARE = 0.02  # choices below this share of auto's rounds are left out
HEADER = (
    "| batch | T | layout | AR tok/s | best fixed, tok/s | auto tok/s | auto / best | auto / AR "
    "| best fixed by 1/TPOT | auto / best (1/TPOT) | auto / AR (1/TPOT) | AR s.e. | auto's rounds |"
)


def layout_rows(variants: dict[str, dict], layout: str) -> dict[str, dict]:
    if layout == "paper":
        return {k: r for k, r in variants.items() if k.endswith(ONE_CORE) or r["mode"] == "ssd"}
    return {k: r for k, r in variants.items() if not k.endswith(ONE_CORE)}


def spread(rates: list[float]) -> str:
    """AR's standard error over its batches, relative (different prompts: an upper bound on
    the machine's noise, not an estimate of it)."""
    if len(rates) < 2:
        return "-"
    return f"{statistics.stdev(rates) / statistics.mean(rates) / len(rates) ** 0.5:.0%}"


def row(b: int, t: float, layout: str, pick: dict[str, dict], rates: dict) -> str | None:
    auto = next((r for r in pick.values() if r["mode"] == "auto"), None)
    ar_label = next((k for k, r in pick.items() if r["mode"] == "ar"), None)
    if auto is None or ar_label is None:
        return None
    ar = pick[ar_label]
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
        f"{ar['tpot_s'] / auto['tpot_s']:.2f}", spread(rates[(t, b, ar_label)]), choices,
    ]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(paths: list[str]) -> None:
    print(HEADER)
    print("|---:|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|")
    for path in paths:
        data = json.loads(Path(path).read_text())
        rates: dict[tuple, list[float]] = defaultdict(list)
        for r in data["runs"]:
            key = (r["temperature"], r["batch_size"], r["variant"])
            rates[key].append(r["output_tokens"] / r["elapsed_s"])
        cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
        for r in data["results"]:
            cells[(r["temperature"], r["batch_size"])][r["variant"]] = r
        for (t, b), variants in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            for layout in ("equal", "paper"):
                line = row(b, t, layout, layout_rows(variants, layout), rates)
                if line:
                    print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
