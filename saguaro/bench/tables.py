"""The Markdown tables of results.md: per (dataset, temperature) the full table, a one-line-per-
cell summary, the step and SSD round breakdowns, and the greedy check's banner."""

from __future__ import annotations

from typing import Any

from saguaro.bench.aggregate import MS_PER_S, Row

# Leading columns of a table that are left-aligned as text; the rest are numbers, right-aligned.
LEFT_COLUMNS = 2  # the full table: batch, mode; the summary: dataset, T
CELL_KEY_COLUMNS = 4  # the breakdowns: dataset, T, batch, mode (_cell_key)
# Mismatches listed in the correctness banner; results.json has them all.
BANNER_MISMATCHES = 20

COLUMNS = (
    ("batch", "batch_size", "{}"),
    ("mode", "variant", "{}"),
    ("tok/s", "tokens_per_s", "{:.1f}"),
    ("tok/s/req", "request_tokens_per_s", "{:.1f}"),
    ("TPOT ms", "tpot_s", "ms"),
    ("TTFT ms", "ttft_s", "ms"),
    ("p50 s", "latency_p50_s", "{:.2f}"),
    ("p90 s", "latency_p90_s", "{:.2f}"),
    ("acc. len", "mean_accepted_length", "{:.2f}"),
    ("hit rate", "cache_hit_rate", "{:.0%}"),
    ("bonus acc.", "bonus_accuracy", "{:.0%}"),
    ("× AR", "speedup_vs_ar", "{:.2f}×"),
    ("× SD", "speedup_vs_sd", "{:.2f}×"),
    ("predicted × AR", "predicted_speedup", "{:.2f}×"),
    ("auto's rounds", "choices", "{}"),
)


def _align(columns: int, text_columns: int) -> str:
    """A Markdown header separator: the first ``text_columns`` left-aligned, the rest right."""
    return "|" + "|".join("---" if i < text_columns else "---:" for i in range(columns)) + "|"


def _cell(value: Any, fmt: str) -> str:
    """``value`` formatted by ``fmt`` (a format string, or "ms" for seconds shown in ms); "–"
    for None."""
    if value is None:
        return "–"
    if fmt == "ms":
        return f"{value * MS_PER_S:.1f}"
    return fmt.format(value)


def markdown_table(rows: list[Row]) -> str:
    """One table per (dataset, temperature), rows by batch size then mode."""
    parts = []
    groups: dict[tuple[str, float], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.dataset, r.temperature), []).append(r)
    for (dataset, temp), group in groups.items():
        parts.append(f"**{dataset}, temperature {temp:g}**\n")
        parts.append("| " + " | ".join(c[0] for c in COLUMNS) + " |")
        parts.append(_align(len(COLUMNS), LEFT_COLUMNS))
        for r in sorted(group, key=lambda r: r.batch_size):
            cells = [_cell(getattr(r, attr), fmt) for _, attr, fmt in COLUMNS]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def summary_table(rows: list[Row]) -> str:
    """One line per (dataset, temperature, batch): total tok/s of every variant side by side, then
    SSD against SD and AR with its hit rate and the accepted lengths. Ready for a README."""
    variants = list(dict.fromkeys(r.variant for r in rows))
    cells: dict[tuple[str, float, int], dict[str, Row]] = {}
    for r in rows:
        cells.setdefault((r.dataset, r.temperature, r.batch_size), {})[r.variant] = r
    ssd = next((v for v in variants if v.startswith("ssd")), None)
    sd = next((v for v in variants if v.startswith("sd")), None)
    head = ["dataset", "T", "batch", *(f"{v} tok/s" for v in variants)]
    if ssd:
        spec = " / ".join(v for v in variants if v != "ar")
        head += [f"{ssd} × {sd}" if sd else None, f"{ssd} × ar", "hit rate", f"acc. len ({spec})"]
        head = [h for h in head if h]
    lines = [
        "| " + " | ".join(head) + " |",
        _align(len(head), LEFT_COLUMNS),
    ]
    for (dataset, temp, batch), by in sorted(cells.items()):
        line = [dataset, f"{temp:g}", str(batch)]
        line += [_cell(by[v].tokens_per_s if v in by else None, "{:.1f}") for v in variants]
        if ssd:
            row = by.get(ssd)
            if sd:
                line.append(_cell(row.speedup_vs_sd if row else None, "{:.2f}×"))
            line.append(_cell(row.speedup_vs_ar if row else None, "{:.2f}×"))
            line.append(_cell(row.cache_hit_rate if row else None, "{:.0%}"))
            lengths = [by[v].mean_accepted_length for v in variants if v in by and v != "ar"]
            line.append(" / ".join(_cell(x, "{:.2f}") for x in lengths))
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


ROUND_COLUMNS = (
    ("round", "round"),
    ("target fwd", "target_forward"),
    ("target other", "target_other"),
    ("waited", "waited"),
    ("draft glue", "glue"),
    ("draft branches", "branches"),
    ("handle", "handle"),
    ("of which backup", "backup"),
)


def plan_cell(ssd: dict) -> str:
    """The worker's last plan: budget B and depth d, and what chose them (ms): the target's
    window W(d) it planned against, the build's fixed part (glue) and one depth's forward."""
    if ssd.get("budget") is None:
        return "–"
    head = f"{ssd['budget']}, {ssd['depth']}"
    plan = ssd.get("plan")
    if not plan:  # a fixed fan-out or budget: nothing planned
        return head
    window = plan["window_ms"][ssd["depth"] - 1]
    return f"{head}: {window:.0f}, {plan['fixed_ms']:.0f}, {plan['depth_ms']:.0f}"


def round_table(rows: list[Row]) -> str:
    """SSD's round, part by part (ms), beside the predicted and achieved speedups over AR."""
    ssd = [r for r in rows if r.round_costs]
    if not ssd:
        return ""
    head = ["dataset", "T", "batch", "mode", *(c[0] for c in ROUND_COLUMNS)]
    head += [
        "verify fwd, after the prompt",
        "build overran",
        "build cut",
        "plan B, d: W(d), fixed, depth ms",
        "hit rate",
        "predicted × AR",
        "achieved × AR, a token after the first",
        "achieved / predicted",
    ]
    caption = (
        "**SSD round breakdown** (mean ms per engine round; the draft's glue and branches "
        "overlap the target's forward; its answer (*handle*, backups included) falls inside "
        "*waited*, the rest of which is the build's overrun and messaging; a build is cut "
        "short when the target's request rings during it; *target fwd* counts each request's "
        "first round, whose forward also reads its prompt, *verify fwd* leaves those out)"
    )
    body = []
    for r in _by_cell(ssd):
        c = r.round_costs
        cells = _cell_key(r) + [f"{c[key]:.1f}" for _, key in ROUND_COLUMNS]
        cells += [
            _cell(c.get("verify_forward"), "{:.1f}"),
            f"{c['overran']:.0%}",
            f"{c['cut']:.0%}",
            plan_cell(r.ssd or {}),
            _cell(r.cache_hit_rate, "{:.0%}"),
            _cell(r.predicted_speedup, "{:.2f}×"),
            _cell(r.decode_speedup_vs_ar, "{:.2f}×"),
            _cell(
                r.decode_speedup_vs_ar / r.predicted_speedup
                if r.decode_speedup_vs_ar is not None and r.predicted_speedup
                else None,
                "{:.0%}",
            ),
        ]
        body.append(cells)
    return _part_table(caption, head, body)


STEP_COLUMNS = (
    ("step", "step"),
    ("target forward", "forward"),
    ("draft", "draft"),
    ("sampling + verify", "verify"),
    ("other", "other"),
)


def step_table(rows: list[Row]) -> str:
    """Every saguaro mode's engine step, part by part (ms), and the share outside the models."""
    measured = [r for r in rows if r.step_costs]
    if not measured:
        return ""
    head = ["dataset", "T", "batch", "mode", *(c[0] for c in STEP_COLUMNS), "outside models"]
    caption = (
        "**Step breakdown** (mean ms per decoding step; *draft* is SD's drafting or SSD's wait "
        "for the worker; *outside models* is (sampling + verify + other) / step)"
    )
    body = [
        _cell_key(r)
        + [f"{r.step_costs[key]:.1f}" for _, key in STEP_COLUMNS]
        + [f"{r.step_costs['outside']:.1%}"]
        for r in _by_cell(measured)
    ]
    return _part_table(caption, head, body)


def _by_cell(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.dataset, r.temperature, r.batch_size, r.variant))


def _cell_key(r: Row) -> list[str]:
    return [r.dataset, f"{r.temperature:g}", str(r.batch_size), r.variant]


def _part_table(caption: str, head: list[str], body: list[list[str]]) -> str:
    """A captioned table whose first four columns (the cell) are text and the rest numbers."""
    lines = [
        caption + "\n",
        "| " + " | ".join(head) + " |",
        _align(len(head), CELL_KEY_COLUMNS),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join([*lines, ""])


def correctness_banner(correctness: dict[str, Any]) -> str:
    """One line when the greedy check passed or did not run; a quoted warning listing the
    mismatches when it failed."""
    if correctness["ok"] is None:
        return f"Greedy correctness check: not run ({correctness['note']})."
    if correctness["ok"]:
        return (
            f"Greedy correctness check: passed. All {correctness['checked']} temperature-0 "
            "requests of every mode produced exactly AR's tokens."
        )
    lines = [
        f"> **⚠️ CORRECTNESS FAILURE: {len(correctness['mismatches'])} of "
        f"{correctness['checked']} temperature-0 requests differ from AR.** "
        "The figures of these modes are not valid measurements of exact decoding.",
        ">",
    ]
    shown = BANNER_MISMATCHES
    for m in correctness["mismatches"][:shown]:
        lines.append(
            f"> - `{m['variant']}` on {m['dataset']} `{m['prompt_id']}` (batch {m['batch_size']}, "
            f"repeat {m['repeat']}): first difference at token {m['first_difference']}: "
            f"AR {m['ar_tokens']} vs {m['tokens']}"
        )
    if len(correctness["mismatches"]) > shown:
        lines.append(f"> - ... {len(correctness['mismatches']) - shown} more in results.json")
    return "\n".join(lines)
