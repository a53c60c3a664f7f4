"""A serving benchmark's output files: ``results.json`` (settings, machine, servers, each level's
summary and every request's record), ``results.md`` (one table) and ``latency.png`` (per-token
latency against throughput, one line per engine)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from saguaro.bench.serve_stats import LevelSummary

SCHEMA = "saguaro-serve-bench/1"
JSON_INDENT = 1
JSON_DECIMALS = 6  # times in seconds to the microsecond: far below what is measured
MS = 1000.0  # latencies are recorded in seconds, shown in milliseconds
DPI = 120
PLOT_SIZE_IN = (10, 4)
LABEL_OFFSET_PT = (3, 3)  # a level's label sits this far (points) right of and above its point

COLUMNS = (
    "engine",
    "load",
    "done/failed",
    "out tok/s",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "chunk gap p50 ms",
    "chunk gap p99 ms",
    "TPOT p50 ms",
    "E2E p50 s",
    "step ms (forward), busy",
    "speculation",
)
MEDIAN_COLUMNS = (  # the table of medians over rounds (--rounds)
    "engine",
    "load",
    "rounds",
    "out tok/s, median (min-max)",
    "x first engine",
    "TPOT p50 ms, median",
    "TTFT p50 ms, median",
)


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * MS:.0f}"


def steps_cell(spec: dict[str, Any], duration_s: float) -> str:
    """saguaro's engine over a level: its mean step and the target's forward in it (ms), and
    the share of the level's time it was stepping; "-" for a server without the counters."""
    n = spec.get("steps")
    if not n or not duration_s:
        return "-"
    step, forward = spec["step_s"] / n * MS, spec["forward_s"] / n * MS
    return f"{step:.0f} ({forward:.0f}), {spec['step_s'] / duration_s:.0%}"


def speculation_cell(spec: dict[str, Any]) -> str:
    """A level's speculation in a few words: share of rounds verifying proposals (saguaro),
    acceptance, tokens per round or accepted per verification, SSD's cache hits."""
    if not spec or not spec.get("drafted"):
        return "-"
    parts = []
    if spec.get("speculating_share") is not None:
        parts.append(f"spec {spec['speculating_share']:.0%} of rounds")
    parts.append(f"acc {spec['acceptance']:.0%}")
    if spec.get("tokens_per_round") is not None:
        parts.append(f"{spec['tokens_per_round']:.2f} tok/round")
    if spec.get("accepted_per_verification") is not None:
        parts.append(f"{spec['accepted_per_verification']:.2f} acc/verif")
    if spec.get("ssd_hit_rate") is not None:
        parts.append(f"hit {spec['ssd_hit_rate']:.0%}")
    if len(spec.get("rounds_by_mode", {})) > 1:  # auto: which strategies it chose
        parts.append("/".join(f"{m} {n:.0f}" for m, n in spec["rounds_by_mode"].items()))
    return ", ".join(parts)


def _label(s: LevelSummary, rounds: bool) -> str:
    return f"{s.engine} #{s.round + 1}" if rounds else s.engine


def markdown_table(levels: list[LevelSummary]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |"
    align = "|" + "|".join([":--", ":--"] + ["--:"] * (len(COLUMNS) - 3) + [":--"]) + "|"
    rounds = any(s.round for s in levels)
    rows = [
        "| "
        + " | ".join(
            [
                _label(s, rounds),
                s.level,
                f"{s.completed}/{s.failed}" + (f" ({s.retried} retried)" if s.retried else ""),
                f"{s.output_tok_s:.1f}",
                f"{s.requests_s:.3f}",
                _ms(s.ttft_p50),
                _ms(s.ttft_p99),
                _ms(s.itl_p50),
                _ms(s.itl_p99),
                _ms(s.tpot_p50),
                f"{s.latency_p50:.2f}",
                steps_cell(s.speculation, s.duration_s),
                speculation_cell(s.speculation),
            ]
        )
        + " |"
        for s in levels
    ]
    return "\n".join([head, align, *rows]) + "\n"


def grouped(levels: list[LevelSummary]) -> dict[tuple[str, str], list[LevelSummary]]:
    """Each engine's summaries of each level (one a round), in the order first measured."""
    out: dict[tuple[str, str], list[LevelSummary]] = {}
    for s in levels:
        out.setdefault((s.engine, s.level), []).append(s)
    return out


def _median(group: list[LevelSummary], attr: str) -> float:
    return statistics.median(getattr(s, attr) for s in group)


def medians_table(levels: list[LevelSummary]) -> str:
    """Per engine and level, medians over the rounds; throughput also against the median of
    the engine listed first at that level (the baseline: --engines ar,...)."""
    groups = grouped(levels)
    first: dict[str, float] = {}
    for (_, level), group in groups.items():
        first.setdefault(level, _median(group, "output_tok_s"))
    head = "| " + " | ".join(MEDIAN_COLUMNS) + " |"
    align = "|" + "|".join([":--", ":--"] + ["--:"] * (len(MEDIAN_COLUMNS) - 2)) + "|"
    rows = []
    for (engine, level), group in groups.items():
        tok_s = [s.output_tok_s for s in group]
        median = statistics.median(tok_s)
        ratio = f"{median / first[level]:.2f}x" if first[level] else "n/a"
        cells = [engine, level, str(len(group))]
        cells += [f"{median:.1f} ({min(tok_s):.1f}-{max(tok_s):.1f})", ratio]
        cells += [_ms(_median(group, "tpot_p50")), _ms(_median(group, "ttft_p50"))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, align, *rows]) + "\n"


def markdown(meta: dict[str, Any], levels: list[LevelSummary]) -> str:
    cfg = meta["config"]
    lines = [
        "# saguaro serving benchmark",
        "",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine'].get('cpu')}, cores used {meta['cpus']}, "
        f"layout {cfg.get('layout', 'equal')}",
        f"- model {cfg['model']}, draft {cfg['draft']}, K={cfg['k']}",
        f"- {cfg['max_tokens']} output tokens a request, temperature {cfg['temperature']:g}, "
        f"ignore_eos {cfg['ignore_eos']}",
        "",
        "Chunk gap: between streamed chunks with text (saguaro sends one chunk per engine step, "
        "all the tokens it committed; llama-server one per token). TPOT: a request's time per "
        "output token after the first, (E2E - TTFT) / (tokens - 1), the inter-token latency "
        "per token, whatever a chunk carries.",
        "",
    ]
    if any(s.round for s in levels):
        lines += [
            f"Engines started {cfg['rounds']} times, taking turns; medians over the rounds:",
            "",
            medians_table(levels),
            "Every round:",
            "",
        ]
    lines.append(markdown_table(levels))
    return "\n".join(lines)


def plot(levels: list[LevelSummary], path: Path) -> None:
    """TPOT p50 and TTFT p50 against output tokens per second, one line per engine, each point
    labelled with its load level (medians over rounds where an engine ran several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=PLOT_SIZE_IN)
    for ax, attr, label in (
        (axes[0], "tpot_p50", "TPOT p50 (ms)"),
        (axes[1], "ttft_p50", "TTFT p50 (ms)"),
    ):
        groups = grouped(levels)
        for engine in dict.fromkeys(e for e, _ in groups):
            mine = [(level, g) for (e, level), g in groups.items() if e == engine]
            xs = [_median(g, "output_tok_s") for _, g in mine]
            ys = [_median(g, attr) * MS for _, g in mine]
            ax.plot(xs, ys, marker="o", label=engine)
            for (level, _), x, y in zip(mine, xs, ys, strict=True):
                ax.annotate(level, (x, y), textcoords="offset points", xytext=LABEL_OFFSET_PT)
        ax.set_xlabel("output tokens/s (all requests)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None (strict JSON has no spelling for them), and
    floats rounded to JSON_DECIMALS places (every request's chunk times are kept)."""
    if isinstance(obj, float):
        return round(obj, JSON_DECIMALS) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_all(
    out: Path,
    meta: dict[str, Any],
    levels: list[LevelSummary],
    records: dict[str, list[dict[str, Any]]],
    with_plot: bool,
) -> None:
    """results.json, results.md and (``with_plot``) latency.png under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    body = {
        "schema": SCHEMA,
        **meta,
        "levels": [s.as_dict() for s in levels],
        "requests": records,
    }
    text = json.dumps(json_safe(body), indent=JSON_INDENT, default=str, allow_nan=False)
    (out / "results.json").write_text(text + "\n")
    (out / "results.md").write_text(markdown(meta, levels))
    if with_plot and levels:
        plot(levels, out / "latency.png")
