"""The PNG plots of a run (matplotlib, Agg backend: no display needed): speedup over AR, the
throughput-latency frontier, and acceptance by batch size."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from saguaro.bench.aggregate import Row

PLOTS = ("speedup.png", "frontier.png", "acceptance.png")

DPI = 120
PANEL_W_IN = 5  # width of one panel (inches) in the frontier and acceptance grids
PANEL_H_IN = 3.8  # height of one panel (inches) in the speedup and frontier plots
ACCEPTANCE_PANEL_H_IN = 3  # shorter: one row of panels per metric (ACCEPTANCE_PANELS)
SPEEDUP_W_IN = 10  # the speedup plot is one column, as wide as two panels
BAR_GROUP_WIDTH = 0.8  # share of a group's x slot its bars fill (the rest separates groups)
PARITY = 1.0  # speedup over AR of AR itself: the reference line
REFERENCE_LINE = dict(color="0.5", lw=0.8, ls="--")  # grey, thin, dashed
LABEL_OFFSET_PT = (3, 3)  # batch-size labels sit this far (points) right of and above their point
LINE_STYLES = ["-", "--", ":", "-."]  # one per temperature, cycled
RATE_YLIM = (0, 1.05)  # rates lie in [0, 1]; the margin keeps markers at 1 visible
LOG_BASE = 2  # batch sizes are usually powers of two
AXES_CENTRE = (0.5, 0.5)  # in axes coordinates, where (0, 0) and (1, 1) are opposite corners


def _no_data(ax: Any, text: str) -> None:
    ax.text(*AXES_CENTRE, text, ha="center", va="center", transform=ax.transAxes)
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
    ax.set_xscale("log", base=LOG_BASE)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")


def plot_speedup(rows: list[Row], path: Path) -> None:
    """Bars: speedup over AR per mode, for each (dataset, batch size), one panel per
    temperature; SSD's predicted speedup (hatched) beside its achieved one."""
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows})
    fig, axes = plt.subplots(
        len(temps), 1, figsize=(SPEEDUP_W_IN, PANEL_H_IN * len(temps)), squeeze=False
    )
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
        width = BAR_GROUP_WIDTH / bars
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
        ax.axhline(PARITY, **REFERENCE_LINE)
        ax.set_xticks(range(len(groups)), [f"{d}\nb={b}" for d, b in groups])
        ax.set_ylabel("speedup over AR")
        ax.set_title(f"output tok/s relative to AR, temperature {temp:g}")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_frontier(rows: list[Row], path: Path) -> None:
    """One panel per (temperature, dataset): total throughput against median request latency,
    one line per mode through its batch sizes."""
    import matplotlib.pyplot as plt

    temps = sorted({r.temperature for r in rows})
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    fig, axes = plt.subplots(
        len(temps),
        len(datasets),
        figsize=(PANEL_W_IN * len(datasets), PANEL_H_IN * len(temps)),
        squeeze=False,
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
                        xytext=LABEL_OFFSET_PT,
                        textcoords="offset points",
                    )
            ax.set_xlabel("p50 request latency (s)")
            ax.set_ylabel("total output tok/s")
            ax.set_title(f"{dataset}, temperature {temp:g}")
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
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
    styles = dict(zip(temps, LINE_STYLES * len(temps), strict=False))
    labels = list(dict.fromkeys(r.variant for r in rows if r.mode != "ar"))
    colors = _colors(rows)
    sizes = sorted({r.batch_size for r in rows})
    fig, axes = plt.subplots(
        len(ACCEPTANCE_PANELS),
        len(datasets),
        figsize=(PANEL_W_IN * len(datasets), ACCEPTANCE_PANEL_H_IN * len(ACCEPTANCE_PANELS)),
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
                ax.set_ylim(*RATE_YLIM)
            ax.set_ylabel(ylabel)
            ax.set_title(dataset, fontsize="medium")
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_plots(rows: list[Row], out: Path) -> list[Path]:
    """Every plot of PLOTS, in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [out / name for name in PLOTS]
    for plot, path in zip((plot_speedup, plot_frontier, plot_acceptance), paths, strict=True):
        plot(rows, path)
    return paths
