"""A run's output files: results.json (schema ``SCHEMA``: the figures plus everything needed to
reproduce them), results.md (the tables of :mod:`saguaro.bench.tables` on a page with the run's
provenance) and the plots of :mod:`saguaro.bench.plots`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from saguaro.bench.aggregate import Row
from saguaro.bench.measure import Run
from saguaro.bench.plots import PLOTS, write_plots
from saguaro.bench.tables import (
    correctness_banner,
    markdown_table,
    round_table,
    step_table,
    summary_table,
)

__all__ = ["PLOTS", "SCHEMA", "markdown", "results_json", "write_all"]

SCHEMA = "saguaro-bench/1"
JSON_INDENT = 1
SHORT_REVISION = 12  # hex digits of the git revision shown in results.md
MEGA, KILO = 1e6, 1e3


def _machine_line(meta: dict[str, Any]) -> str:
    """GPU or CPU model, cores, the cores every mode computes on, platform and start load."""
    m = meta["machine"]
    where = f"GPU {m['gpu']}" if m["gpu"] else f"{m['cpu'] or 'CPU'}"
    cpus = f", {m['cpu_count']} cores" if m["cpu_count"] else ""
    pinned = f" (every mode on cores {m['cpus']}; SSD: target and draft on their own)"
    load = m["load_average"]
    load_text = f", load average {load[0]:.1f} at start" if load else ""  # the 1-minute one
    return f"{where}{cpus}{pinned if m['cpus'] else ''}, {m['platform']}{load_text}"


def _count(n: int) -> str:
    return f"{n / MEGA:.1f}M" if n >= MEGA else f"{n / KILO:.1f}K"


def markdown(meta: dict[str, Any], rows: list[Row], correctness: dict[str, Any]) -> str:
    """results.md: the greedy check's banner, the run's provenance and definitions, the tables,
    and the plots."""
    models = meta["models"]
    model_text = ", ".join(
        f"{role} `{Path(i['path']).name}` ({_count(i['params'])} params)"
        for role, i in models.items()
    )
    git = meta["git"]
    rev = (
        f"{git['revision'][:SHORT_REVISION]}{' (dirty)' if git['dirty'] else ''}"
        if git
        else "unknown"
    )
    failures = sorted({f for r in rows for f in r.draft_failures})
    lines = [
        "# saguaro bench",
        "",
        correctness_banner(correctness),
        "",
        f"- command: `{meta['command']}`",
        f"- machine: {_machine_line(meta)}",
        f"- models: {model_text}",
        f"- revision {rev}, torch {meta['versions']['torch']}, "
        f"transformers {meta['versions']['transformers']}, {meta['started_at']}",
        f"- {meta['config']['max_tokens']} output tokens per request; tok/s counts output "
        "tokens over wall time; latencies run from the batch's start; hf-assisted serves a batch "
        "one request at a time (transformers supports batch size 1 only).",
        "- acc. len: tokens committed per round (1 + accepted / rounds); bonus acc.: of rounds "
        "that accepted all K proposals, the share whose next round hit the cache; predicted: "
        "docs/design.md §7 speedup over AR from SSD's online estimates, its verification-time unit "
        "converted to this machine's AR step (AR's TPOT over SSD's verification forward after "
        "the prompt's round, in the same cell), and set against the achieved rate a token after "
        "the first (AR's TPOT over SSD's: the prompt, equal work for both, left out).",
    ]
    lines += [f"- **draft failure (fell back to AR): {f}**" for f in failures]
    failed = meta.get("failed", {})
    lines += [f"- **{v} failed, not in the tables: {e}**" for v, e in failed.items()]
    lines += ["", "**Summary** (output tok/s in total)", ""]
    lines += [summary_table(rows), markdown_table(rows), step_table(rows), round_table(rows)]
    lines += [f"![{p.removesuffix('.png')}]({p})" for p in PLOTS]
    return "\n".join(lines) + "\n"


def results_json(
    meta: dict[str, Any], rows: list[Row], runs: list[Run], correctness: dict[str, Any]
) -> dict[str, Any]:
    """The content of results.json: the schema, ``meta`` (command, config, provenance), the
    greedy check, one entry per row and one per measured call."""
    return {
        "schema": SCHEMA,
        **meta,
        "correctness": correctness,
        "results": [asdict(r) for r in rows],
        "runs": [
            {
                "dataset": r.dataset,
                "temperature": r.temperature,
                "batch_size": r.batch_size,
                "variant": r.variant,
                "repeat": r.repeat,
                "batch_index": r.batch_index,
                "elapsed_s": r.gen.elapsed_s,
                "output_tokens": sum(len(q.token_ids) for q in r.gen.requests),
                "prompt_ids": [q.prompt_id for q in r.gen.requests],
            }
            for r in runs
        ],
        "files": {"markdown": "results.md", "plots": list(PLOTS)},
    }


def write_all(
    out: Path,
    meta: dict[str, Any],
    rows: list[Row],
    runs: list[Run],
    correctness: dict[str, Any],
) -> list[Path]:
    """Write the plots, results.json and results.md into ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(rows, out)
    results = results_json(meta, rows, runs, correctness)
    (out / "results.json").write_text(json.dumps(results, indent=JSON_INDENT) + "\n")
    (out / "results.md").write_text(markdown(meta, rows, correctness))
    return [out / "results.json", out / "results.md", *plots]
