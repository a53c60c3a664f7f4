"""``/metrics``: the server's state in the Prometheus text exposition format (version 0.0.4).

Engine state is read through ``engine.snapshot()`` alone; request totals and latency histograms
come from the ``AsyncEngine``'s stats, HTTP response counts from the routes' middleware.
"""

from __future__ import annotations

import math
from collections import Counter

from saguaro.core.snapshot import EngineSnapshot
from saguaro.server.async_engine import AsyncEngine, EngineStats, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DRAFT_STATES = ("none", "running", "restarting", "failed")
FINISH_REASONS = ("stop", "length", "abort", "error")


def _num(value: float) -> str:
    """A sample value as Prometheus writes it (NaN, +Inf, -Inf; integers exactly)."""
    if isinstance(value, int):  # counters stay exact (":g" would round them)
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    return repr(value) if math.isfinite(value) else ("+Inf" if value > 0 else "-Inf")


def _labels(**labels: object) -> str:
    """``{k="v",...}`` with the values escaped, or "" for no labels."""

    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}" if labels else ""


# A metric family: its name, type (gauge or counter), help text and (labels, value) samples.
Family = tuple[str, str, str, list[tuple[str, float]]]


def _mean(h: Histogram) -> float:
    """The mean of what ``h`` counted (NaN before anything was)."""
    return h.total / h.count if h.count else math.nan


class _Exposition:
    """Prometheus text format, one metric family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        self.lines += [f"{name}{labels} {_num(value)}" for labels, value in samples]

    def histogram(self, name: str, help_: str, h: Histogram) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        total = 0
        for bound, n in zip([*h.bounds, math.inf], h.counts, strict=True):
            total += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            self.lines.append(f"{name}_bucket{_labels(le=le)} {total}")
        self.lines += [f"{name}_sum {_num(h.total)}", f"{name}_count {total}"]


def render_metrics(ae: AsyncEngine, http: Counter[tuple[str, int]], model: str) -> str:
    """The exposition of every metric family: ``http`` counts responses by (route, status),
    ``model`` is the served model's name."""
    snap = ae.engine.snapshot()
    out = _Exposition()
    with ae.stats_lock:
        st = ae.stats
        families = [
            *_server_families(ae, snap, http, model),
            *_request_families(st, snap),
            *_speculation_families(st),
            *_cache_families(snap),
        ]
        for family in families:
            out.family(*family)
        out.histogram("saguaro_request_latency_seconds", "Arrival to finish.", st.latency)
        out.histogram("saguaro_time_to_first_token_seconds", "Arrival to first token.", st.ttft)
        out.histogram("saguaro_time_per_output_token_seconds", "Decode time per token.", st.tpot)
        out.histogram(
            "saguaro_accepted_length",
            "Tokens committed per decoding round (1 + accepted).",
            st.accepted_length,
        )
    return "\n".join(out.lines) + "\n"


def _server_families(
    ae: AsyncEngine, snap: EngineSnapshot, http: Counter[tuple[str, int]], model: str
) -> list[Family]:
    """The served model, the engine loop and the draft worker; HTTP responses by route and
    status."""
    return [
        (
            "saguaro_info",
            "gauge",
            "Served model and decoding mode (k: speculation length).",
            [(_labels(model=model, mode=snap.mode, k=snap.lookahead), 1)],
        ),
        (
            "saguaro_engine_up",
            "gauge",
            "1 while the engine loop runs.",
            [("", int(ae.running))],
        ),
        (
            "saguaro_draft_worker_state",
            "gauge",
            "Draft: none (AR), running, restarting or failed (exact either way, without "
            "speculation while not running).",
            [(_labels(state=s), int(s == snap.draft_state)) for s in DRAFT_STATES],
        ),
        (
            "saguaro_draft_worker_restarts_total",
            "counter",
            "Restarts of a failed SSD draft worker.",
            [("", snap.draft_restarts)],
        ),
        (
            "saguaro_http_requests_total",
            "counter",
            "HTTP responses by route and status code.",
            [(_labels(route=r, status=c), n) for (r, c), n in sorted(http.items())],
        ),
    ]


def _request_families(st: EngineStats, snap: EngineSnapshot) -> list[Family]:
    """Requests finished, running and waiting, and their tokens."""
    return [
        (
            "saguaro_requests_total",
            "counter",
            "Generation requests finished, by reason (abort: the client went away).",
            [(_labels(finish_reason=r), st.finished[r]) for r in FINISH_REASONS],
        ),
        (
            "saguaro_requests_running",
            "gauge",
            "Sequences in the batch.",
            [("", snap.running)],
        ),
        ("saguaro_requests_waiting", "gauge", "Sequences queued.", [("", snap.waiting)]),
        (
            "saguaro_engine_sequences",
            "gauge",
            "Requests the engine holds (finished ones leave none behind).",
            [("", snap.sequences)],
        ),
        ("saguaro_prompt_tokens_total", "counter", "Prompt tokens.", [("", st.prompt_tokens)]),
        (
            "saguaro_generation_tokens_total",
            "counter",
            "Tokens generated.",
            [("", st.generation_tokens)],
        ),
    ]


def _speculation_families(st: EngineStats) -> list[Family]:
    """Proposals and their acceptance, rounds by strategy, SSD's cache hits."""
    return [
        (
            "saguaro_mean_accepted_length",
            "gauge",
            "Mean tokens committed per decoding round, over the server's life.",
            [("", _mean(st.accepted_length))],
        ),
        (
            "saguaro_spec_draft_tokens_total",
            "counter",
            "Tokens proposed.",
            [("", st.drafted_tokens)],
        ),
        (
            "saguaro_spec_accepted_tokens_total",
            "counter",
            "Proposals accepted.",
            [("", st.accepted_tokens)],
        ),
        (
            "saguaro_rounds_total",
            "counter",
            "Decoding rounds of finished requests by the strategy that proposed (mode auto "
            "chooses it each step) and the proposals verified (k).",
            [(_labels(mode=m, k=k), n) for (m, k), n in sorted(st.rounds.items())],
        ),
        ("saguaro_ssd_rounds_total", "counter", "SSD rounds.", [("", st.ssd_rounds)]),
        (
            "saguaro_ssd_cache_hits_total",
            "counter",
            "SSD rounds whose outcome the speculation cache had prepared.",
            [("", st.ssd_hits)],
        ),
        (
            "saguaro_ssd_cache_hit_rate",
            "gauge",
            "SSD speculation-cache hit rate, over the server's life.",
            [("", st.ssd_hits / st.ssd_rounds if st.ssd_rounds else math.nan)],
        ),
    ]


def _cache_families(snap: EngineSnapshot) -> list[Family]:
    """The KV pool and the prefix cache."""
    return [
        ("saguaro_kv_blocks_total", "gauge", "KV cache blocks.", [("", snap.kv_blocks_total)]),
        (
            "saguaro_kv_blocks_free",
            "gauge",
            "Free KV cache blocks.",
            [("", snap.kv_blocks_free)],
        ),
        (
            "saguaro_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            [("", snap.prefix_hit_tokens)],
        ),
    ]
