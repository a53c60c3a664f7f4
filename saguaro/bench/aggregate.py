"""From runs to rows: one :class:`Row` per variant and cell (dataset, temperature, batch size),
with throughput, latencies, the speculation metrics (docs/design.md §11), speedups within the
cell, and where an engine step's and an SSD round's time goes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from saguaro.bench.config import SPEC_MODES
from saguaro.bench.measure import Run
from saguaro.bench.plan import Variant
from saguaro.core.metrics import summarize
from saguaro.core.records import RoundRecord

MS_PER_S = 1000.0
P50, P90 = 50, 90  # the latency percentiles a row reports


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def bonus_counts(records: list[RoundRecord]) -> tuple[int, int]:
    """(SSD rounds that accepted every proposal and were followed by another round, how many of
    those following rounds hit the cache). A record's `hit` says whether *its* speculation was
    prepared, i.e. whether the previous round's outcome (K, bonus token) was predicted."""
    full = hits = 0
    for prev, nxt in zip(records, records[1:], strict=False):
        if nxt.hit is not None and prev.num_drafted and prev.num_accepted == prev.num_drafted:
            full += 1
            hits += bool(nxt.hit)
    return full, hits


MIN_CHOICE_SHARE = 0.01  # choices that ran fewer rounds are left out of a row's summary


@dataclass
class Row:
    """One variant in one cell (dataset, temperature, batch size), over all its runs."""

    dataset: str
    temperature: float
    batch_size: int
    variant: str
    mode: str
    sampling: str
    k: int | None
    fanout: str | None
    requests: int
    output_tokens: int
    elapsed_s: float
    tokens_per_s: float  # in total: all output tokens / all wall time
    request_tokens_per_s: float | None  # per request: its tokens / its latency, averaged
    ttft_s: float | None
    tpot_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    mean_accepted_length: float | None
    acceptance_rate: float | None
    cache_hit_rate: float | None
    bonus_accuracy: float | None  # P(cache hit | previous round accepted all K)
    speedup_vs_ar: float | None = None
    decode_speedup_vs_ar: float | None = None  # AR's TPOT over this row's: the prompt left out
    speedup_vs_sd: float | None = None
    predicted_speedup: float | None = None  # SSD: docs/design.md §7 over AR (see round_costs)
    draft_failures: list[str] = field(default_factory=list)
    speculation: dict[str, Any] = field(default_factory=dict)  # engine metrics (docs/design.md §11)
    ssd: dict[str, Any] | None = None  # last round's fan-out, budget, timings; policy inputs
    round_costs: dict[str, float] | None = None  # SSD: mean ms per engine round, by part
    step_costs: dict[str, float] | None = None  # saguaro modes: mean ms per engine step, by part

    @property
    def choices(self) -> str | None:
        """Mode auto: the share of rounds each choice (mode:k) ran, largest first."""
        if self.mode != "auto":
            return None
        shares = sorted(self.speculation.get("choices", {}).items(), key=lambda kv: -kv[1])
        return " ".join(f"{c} {share:.0%}" for c, share in shares if share >= MIN_CHOICE_SHARE)


def round_costs(group: list[Run]) -> dict[str, float] | None:
    """Where an SSD engine round's wall time goes, in mean milliseconds per round.

    One engine round = one draft request + one batched target forward + verification; its wall
    time runs from one draft request to the next while sequences are in flight. Per round:
    ``target_forward`` is the verification forward, ``waited`` the time from sending the request
    to holding the speculation (cache lookup, backups, any unfinished cache build, messaging),
    ``target_other`` the rest (scheduling, verification arithmetic, commit):
    round = target_forward + waited + target_other. The draft's side:
    ``glue``, ``branches`` (branch decoding), ``build`` (their sum, overlapped with the target's
    forward), and on the critical path, inside ``waited``: ``handle`` (answering the request,
    ``backup`` included). What is left of ``waited`` is the build's overrun and messaging.
    ``overran``: the share of rounds whose request found the worker still building; ``cut``: the
    share whose build stopped early because the request rang (its branches are shallower).
    ``verify_forward``: the target's forward in a sequence's rounds after its first, whose forward
    also reads the prompt (``target_forward`` counts both): a verification's steady cost.
    """
    totals = [r.gen.ssd_totals for r in group]
    if any(t is None for t in totals):
        return None
    rounds = sum(t["rounds"] for t in totals)
    timed = sum(t["timed_rounds"] for t in totals)
    if not rounds or not timed:
        return None
    records = [rec for r in group for s in r.gen.records for rec in s]
    # Every sequence of a round records the round's forward share and its wait.
    per_round = len(records) / rounds
    ms = MS_PER_S / rounds
    out = {
        "rounds": rounds,
        "round": MS_PER_S * sum(t["round_s"] for t in totals) / timed,
        "target_forward": sum(rec.target_s for rec in records) * ms,
        "waited": sum(rec.wait_s for rec in records) * ms / per_round if records else 0.0,
    }
    later = [rec for r in group for s in r.gen.records for rec in s[1:]]
    out["verify_forward"] = (
        MS_PER_S * per_round * sum(rec.target_s for rec in later) / len(later)
        if later
        else out["target_forward"]
    )
    out["target_other"] = out["round"] - out["target_forward"] - out["waited"]
    for name in ("glue", "branches", "build", "backup", "handle"):
        key = "branch_s" if name == "branches" else f"{name}_s"
        out[name] = sum(t[key] for t in totals) * ms
    out["overran"] = sum(t["overran"] for t in totals) / rounds
    out["cut"] = sum(t["cut"] for t in totals) / rounds
    return out


def step_costs(group: list[Run]) -> dict[str, float] | None:
    """Where a saguaro engine step's wall time goes, in mean milliseconds per decoding step.

    ``forward``: the target's forward; ``draft``: getting the proposals (SD: the draft's
    forwards and sampling; SSD: the wait for the worker's reply); ``verify``: sampling and
    verification; ``other``: the rest (scheduling, batching inputs, committing, detokenising),
    so step = forward + draft + verify + other. ``outside``: the share of the step spent neither
    in a forward nor in drafting, i.e. (verify + other) / step.
    """
    records = [rec for r in group for s in r.gen.records for rec in s]
    steps = len({rec.step for rec in records})
    if not steps:
        return None
    ms = MS_PER_S / steps
    out = {
        "step": sum(rec.step_s for rec in records) * ms,
        "forward": sum(rec.target_s for rec in records) * ms,
        "draft": sum(rec.draft_s for rec in records) * ms,
        "verify": sum(rec.verify_s for rec in records) * ms,
    }
    out["other"] = out["step"] - out["forward"] - out["draft"] - out["verify"]
    out["outside"] = (out["verify"] + out["other"]) / out["step"] if out["step"] else 0.0
    return out


def _speculation(
    group: list[Run], tokens: int
) -> tuple[dict[str, Any], float | None, float | None]:
    """The runs' speculation summary (:func:`~saguaro.core.metrics.summarize`, without its
    histogram), their mean accepted length (where the backend counts target forwards, as
    hf-assisted does: ``tokens`` committed per forward) and their bonus accuracy
    (:func:`bonus_counts`: hits over rounds that accepted every proposal; None: no such round)."""
    seq_records = [s for r in group for s in r.gen.records]
    spec = summarize(rec for s in seq_records for rec in s) if seq_records else {}
    spec.pop("accepted_histogram", None)
    mal = spec.get("mean_accepted_length")
    forwards = [r.gen.target_forwards for r in group if r.gen.target_forwards is not None]
    if forwards and sum(forwards):
        mal = tokens / sum(forwards)
    full = sum(bonus_counts(s)[0] for s in seq_records)
    hit = sum(bonus_counts(s)[1] for s in seq_records)
    return spec, mal, hit / full if full else None


def _row(key: tuple[str, float, int, str], v: Variant, group: list[Run]) -> Row:
    """The row of one variant's runs in one cell, before the speedups (which need the cell's
    other rows)."""
    dataset, temp, b, label = key
    reqs = [q for r in group for q in r.gen.requests]
    tokens = sum(len(q.token_ids) for q in reqs)
    elapsed = sum(r.gen.elapsed_s for r in group)
    latencies = [q.latency_s for q in reqs]
    spec, mal, bonus = _speculation(group, tokens)
    predicted = [r.gen.predicted_speedup for r in group if r.gen.predicted_speedup]
    last_ssd = next((r.gen.ssd_stats for r in reversed(group) if r.gen.ssd_stats), None)
    speculative = v.mode in SPEC_MODES
    return Row(
        dataset=dataset,
        temperature=temp,
        batch_size=b,
        variant=label,
        mode=v.mode,
        sampling=v.sampling,
        k=v.k,
        fanout=v.fanout,
        requests=len(reqs),
        output_tokens=tokens,
        elapsed_s=elapsed,
        tokens_per_s=tokens / elapsed,
        request_tokens_per_s=_mean(
            [len(q.token_ids) / q.latency_s for q in reqs if q.latency_s > 0]
        ),
        ttft_s=_mean([q.ttft_s for q in reqs if q.ttft_s is not None]),
        tpot_s=_mean([q.tpot_s for q in reqs if q.tpot_s is not None]),
        latency_p50_s=percentile(latencies, P50),
        latency_p90_s=percentile(latencies, P90),
        mean_accepted_length=mal if speculative else None,
        acceptance_rate=spec.get("acceptance_rate") if speculative else None,
        cache_hit_rate=spec.get("cache_hit_rate"),
        bonus_accuracy=bonus,
        predicted_speedup=_mean(predicted),
        draft_failures=sorted({r.gen.draft_failure for r in group if r.gen.draft_failure}),
        speculation=spec if speculative else {},
        ssd=last_ssd,
        round_costs=round_costs(group) if v.mode == "ssd" else None,
        step_costs=step_costs(group),
    )


def aggregate(runs: list[Run], variants: list[Variant]) -> list[Row]:
    """One row per (dataset, temperature, batch size, variant), cells in the order the runs
    first reached them and variants in their declared order within a cell; then each row's
    speedups over AR and over SD with the same K (and the same sampling method) in its cell,
    under the same setup (:attr:`Variant.setup`: forwards, dtype, tensor-parallel size, core
    budget)."""
    by_label = {v.label: v for v in variants}
    cells: dict[tuple[str, float, int, str], list[Run]] = {}
    for run in runs:
        cells.setdefault((run.dataset, run.temperature, run.batch_size, run.variant), []).append(
            run
        )
    rank = {v.label: i for i, v in enumerate(variants)}
    first = {key[:3]: i for i, key in reversed(list(enumerate(cells)))}
    ordered = sorted(cells, key=lambda key: (first[key[:3]], rank[key[3]]))
    rows = [_row(key, by_label[key[3]], cells[key]) for key in ordered]
    index = {
        (
            r.dataset,
            r.temperature,
            r.batch_size,
            by_label[r.variant].setup,
            r.mode,
            r.k,
            r.sampling,
        ): r
        for r in rows
    }
    for row in rows:
        cell = (row.dataset, row.temperature, row.batch_size, by_label[row.variant].setup)
        ar = index.get((*cell, "ar", None, row.sampling))
        sd = index.get((*cell, "sd", row.k, row.sampling))
        row.speedup_vs_ar = _ratio(row.tokens_per_s, ar.tokens_per_s if ar else None)
        row.decode_speedup_vs_ar = _ratio(ar.tpot_s if ar else None, row.tpot_s)
        if row.predicted_speedup is not None:
            row.predicted_speedup = on_this_machine(row, ar)
        if row.mode != "ar":
            row.speedup_vs_sd = _ratio(row.tokens_per_s, sd.tokens_per_s if sd else None)
    return rows


def on_this_machine(row: Row, ar: Row | None) -> float | None:
    """docs/design.md §7 counts time in verifications and takes an AR step to cost one, as on a
    GPU. Here an AR step costs ``ar.tpot_s`` (measured in the same cell, the prompt left out) and a
    verification forward ``round_costs['verify_forward']`` (likewise), so the prediction scales by
    their ratio:
    predicted × (AR step ms) / (verification forward ms). The prediction's inputs (p_hit, E, T_p,
    T_b, T_o, the verification time) are all measured; what it leaves out is messaging, and that a
    build cut short serves shallower branches."""
    costs = row.round_costs
    # results written before verify_forward existed carry target_forward alone
    forward = costs and costs.get("verify_forward", costs["target_forward"])
    if ar is None or ar.tpot_s is None or not forward:
        return None
    return row.predicted_speedup * MS_PER_S * ar.tpot_s / forward
