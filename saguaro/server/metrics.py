"""``/metrics``: the server's state in the Prometheus text exposition format, written by
``prometheus_client``.

Each server has a registry of its own (:func:`metrics_registry`), not the process's default one,
so that several apps in one process (tests start many) keep their metrics apart. Its one
collector reads the state when scraped: the engine's through ``engine.snapshot()`` alone, request
totals and latency histograms from the ``AsyncEngine``'s stats, HTTP response counts from the
routes' middleware.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from saguaro.core.snapshot import EngineSnapshot
from saguaro.server.async_engine import AsyncEngine, EngineStats, Histogram

# The text format prometheus_client's generate_latest writes for metric names like these
# (ASCII, no escaping needed): version 0.0.4, whatever newer version the library announces.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DRAFT_STATES = ("none", "running", "restarting", "failed")
FINISH_REASONS = ("stop", "length", "abort", "error")
INF_BUCKET = "+Inf"


def _mean(h: Histogram) -> float:
    """The mean of what ``h`` counted (NaN before anything was)."""
    return h.total / h.count if h.count else math.nan


def _labelled(
    family: GaugeMetricFamily | CounterMetricFamily,
    samples: Iterable[tuple[tuple[object, ...], float]],
) -> Metric:
    """``family`` with one sample per (label values, value)."""
    for values, value in samples:
        family.add_metric([str(v) for v in values], value)
    return family


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    """``h`` as cumulative buckets; each bound written as before the library (``le="1"``)."""
    bounds = [f"{b:g}" for b in h.bounds] + [INF_BUCKET]
    buckets = list(zip(bounds, itertools.accumulate(h.counts), strict=True))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.total)


class SaguaroCollector(Collector):
    """Every metric family of one server, read at each scrape: ``http`` counts responses by
    (route, status), ``model`` is the served model's name."""

    def __init__(self, ae: AsyncEngine, http: Counter[tuple[str, int]], model: str) -> None:
        self.ae = ae
        self.http = http
        self.model = model

    def collect(self) -> Iterable[Metric]:
        snap = self.ae.engine.snapshot()
        with self.ae.stats_lock:  # the loop thread writes the stats
            st = self.ae.stats
            return [
                *self._server_families(snap),
                *_request_families(st, snap),
                *_speculation_families(st),
                *_cache_families(snap),
                *_step_families(snap),
                *_latency_families(st),
            ]

    def _server_families(self, snap: EngineSnapshot) -> list[Metric]:
        """The served model, the engine loop and the draft worker; HTTP responses by route and
        status."""
        info = GaugeMetricFamily(
            "saguaro_info",
            "Served model and decoding mode (k: speculation length).",
            labels=["model", "mode", "k"],
        )
        states = GaugeMetricFamily(
            "saguaro_draft_worker_state",
            "Draft: none (AR), running, restarting or failed (exact either way, without "
            "speculation while not running).",
            labels=["state"],
        )
        http = CounterMetricFamily(
            "saguaro_http_requests_total",
            "HTTP responses by route and status code.",
            labels=["route", "status"],
        )
        return [
            _labelled(info, [((self.model, snap.mode, snap.lookahead), 1)]),
            GaugeMetricFamily(
                "saguaro_engine_up", "1 while the engine loop runs.", value=int(self.ae.running)
            ),
            _labelled(states, [((s,), int(s == snap.draft_state)) for s in DRAFT_STATES]),
            CounterMetricFamily(
                "saguaro_draft_worker_restarts_total",
                "Restarts of a failed SSD draft worker.",
                value=snap.draft_restarts,
            ),
            _labelled(http, sorted(self.http.items())),
        ]


def metrics_registry(
    ae: AsyncEngine, http: Counter[tuple[str, int]], model: str
) -> CollectorRegistry:
    """A registry of this server's own, holding its collector (see the module's docstring)."""
    registry = CollectorRegistry()
    registry.register(SaguaroCollector(ae, http, model))
    return registry


def _request_families(st: EngineStats, snap: EngineSnapshot) -> list[Metric]:
    """Requests finished, running and waiting, and their tokens."""
    finished = CounterMetricFamily(
        "saguaro_requests_total",
        "Generation requests finished, by reason (abort: the client went away).",
        labels=["finish_reason"],
    )
    return [
        _labelled(finished, [((r,), st.finished[r]) for r in FINISH_REASONS]),
        GaugeMetricFamily("saguaro_requests_running", "Sequences in the batch.", snap.running),
        GaugeMetricFamily("saguaro_requests_waiting", "Sequences queued.", snap.waiting),
        GaugeMetricFamily(
            "saguaro_engine_sequences",
            "Requests the engine holds (finished ones leave none behind).",
            snap.sequences,
        ),
        CounterMetricFamily("saguaro_prompt_tokens_total", "Prompt tokens.", st.prompt_tokens),
        CounterMetricFamily(
            "saguaro_generation_tokens_total", "Tokens generated.", st.generation_tokens
        ),
    ]


def _speculation_families(st: EngineStats) -> list[Metric]:
    """Proposals and their acceptance, rounds by strategy, SSD's cache hits."""
    rounds = CounterMetricFamily(
        "saguaro_rounds_total",
        "Decoding rounds of finished requests by the strategy that proposed (mode auto "
        "chooses it each step) and the proposals verified (k).",
        labels=["mode", "k"],
    )
    return [
        GaugeMetricFamily(
            "saguaro_mean_accepted_length",
            "Mean tokens committed per decoding round, over the server's life.",
            _mean(st.accepted_length),
        ),
        CounterMetricFamily(
            "saguaro_spec_draft_tokens_total", "Tokens proposed.", st.drafted_tokens
        ),
        CounterMetricFamily(
            "saguaro_spec_accepted_tokens_total", "Proposals accepted.", st.accepted_tokens
        ),
        _labelled(rounds, sorted(st.rounds.items())),
        CounterMetricFamily("saguaro_ssd_rounds_total", "SSD rounds.", st.ssd_rounds),
        CounterMetricFamily(
            "saguaro_ssd_cache_hits_total",
            "SSD rounds whose outcome the speculation cache had prepared.",
            st.ssd_hits,
        ),
        GaugeMetricFamily(
            "saguaro_ssd_cache_hit_rate",
            "SSD speculation-cache hit rate, over the server's life.",
            st.ssd_hits / st.ssd_rounds if st.ssd_rounds else math.nan,
        ),
    ]


def _cache_families(snap: EngineSnapshot) -> list[Metric]:
    """The KV pool and the prefix cache."""
    return [
        GaugeMetricFamily("saguaro_kv_blocks_total", "KV cache blocks.", snap.kv_blocks_total),
        GaugeMetricFamily("saguaro_kv_blocks_free", "Free KV cache blocks.", snap.kv_blocks_free),
        CounterMetricFamily(
            "saguaro_prefix_cache_hit_tokens_total",
            "Prompt tokens served from the prefix cache.",
            snap.prefix_hit_tokens,
        ),
    ]


def _step_families(snap: EngineSnapshot) -> list[Metric]:
    """The engine's steps and where their time went: over a window, step seconds against the
    window's length is how busy the engine was, forward seconds against step seconds the share
    of its work in the target's forward."""
    t = snap.times
    return [
        CounterMetricFamily("saguaro_engine_steps_total", "Engine steps.", snap.num_steps),
        CounterMetricFamily(
            "saguaro_engine_step_seconds_total", "Seconds in engine steps.", t.step_s
        ),
        CounterMetricFamily(
            "saguaro_engine_propose_seconds_total",
            "Seconds of the steps spent proposing (the draft, or choosing a strategy).",
            t.propose_s,
        ),
        CounterMetricFamily(
            "saguaro_engine_forward_seconds_total",
            "Seconds of the steps spent in the target's forward.",
            t.forward_s,
        ),
    ]


def _latency_families(st: EngineStats) -> list[Metric]:
    """Request latency, time to the first token, time per output token, tokens per round."""
    return [
        _histogram("saguaro_request_latency_seconds", "Arrival to finish.", st.latency),
        _histogram("saguaro_time_to_first_token_seconds", "Arrival to first token.", st.ttft),
        _histogram("saguaro_time_per_output_token_seconds", "Decode time per token.", st.tpot),
        _histogram(
            "saguaro_accepted_length",
            "Tokens committed per decoding round (1 + accepted).",
            st.accepted_length,
        ),
    ]
