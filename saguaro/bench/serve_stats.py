"""What the serving benchmark computes from its requests and the servers' ``/metrics``: each
request's record, percentiles, inter-chunk latencies, a load level's summary, and speculation
counters (saguaro's and llama-server's Prometheus families) differenced over a level."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

P50, P99 = 50.0, 99.0
PERCENT = 100.0

# One Prometheus sample line: ``name{labels} value`` (labels optional; a timestamp may follow).
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# saguaro's families (saguaro.server.metrics) and llama-server's (its --metrics endpoint).
SAGUARO_DRAFTED = "saguaro_spec_draft_tokens_total"
SAGUARO_ACCEPTED = "saguaro_spec_accepted_tokens_total"
SAGUARO_ROUNDS = "saguaro_rounds_total"
SAGUARO_SSD_ROUNDS = "saguaro_ssd_rounds_total"
SAGUARO_SSD_HITS = "saguaro_ssd_cache_hits_total"
SAGUARO_TOKENS = "saguaro_generation_tokens_total"
SAGUARO_STEPS = "saguaro_engine_steps_total"
SAGUARO_STEP_S = "saguaro_engine_step_seconds_total"
SAGUARO_PROPOSE_S = "saguaro_engine_propose_seconds_total"
SAGUARO_FORWARD_S = "saguaro_engine_forward_seconds_total"
LLAMA_DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
LLAMA_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
LLAMA_DRAFTS = "llamacpp:spec_decode_num_drafts_total"
LLAMA_TOKENS = "llamacpp:tokens_predicted_total"
LLAMA_DECODES = "llamacpp:n_decode_total"


@dataclass
class RequestRecord:
    """One streamed request as the client saw it; times in seconds."""

    index: int
    ok: bool
    sent_s: float  # when it was sent, from the level's start
    latency_s: float  # sent to the last byte of the response
    ttft_s: float | None  # sent to the first chunk with content
    chunk_s: list[float] = field(default_factory=list)  # each content chunk's arrival, from sent
    output_tokens: int = 0  # the server's usage count (content chunks where it gives none)
    prompt_tokens: int = 0
    error: str = ""
    retries: int = 0  # sends again after a stale kept-alive connection (serve_client)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / PERCENT
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def chunk_gaps(chunk_s: Sequence[float]) -> list[float]:
    """The gaps between successive content chunks: what a streaming reader waits between two
    pieces of text (the first chunk's wait is the TTFT, not a gap)."""
    return [b - a for a, b in zip(chunk_s, chunk_s[1:], strict=False)]


def tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first, over the whole request; None below two tokens.
    Unlike a chunk gap it does not depend on how many tokens a server sends per chunk."""
    if r.ttft_s is None or r.output_tokens < 2:
        return None
    return (r.latency_s - r.ttft_s) / (r.output_tokens - 1)


@dataclass
class LevelSummary:
    """One engine at one load level: throughput and latency percentiles (seconds)."""

    engine: str
    level: str  # "c=4" (fixed concurrency) or "rate=2/s" (Poisson arrivals)
    concurrency: int | None
    rate: float | None
    completed: int
    failed: int
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    output_tok_s: float
    requests_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    tpot_p50: float
    tpot_p99: float
    latency_p50: float
    latency_p99: float
    chunks_per_token: float  # content chunks / output tokens: 1 where a server sends a token each
    retried: int  # requests sent again after a stale connection (serve_client)
    speculation: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    round: int = 0  # which start of the engine measured it (ServeBenchConfig.rounds)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Distinct error messages kept in a summary (the rest are counted in ``failed`` only).
MAX_ERRORS_KEPT = 5


def summarize(
    engine: str,
    records: list[RequestRecord],
    duration_s: float,
    concurrency: int | None = None,
    rate: float | None = None,
) -> LevelSummary:
    """A level's summary over its completed requests (failed ones are counted, not timed)."""
    done = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    chunks = sum(len(r.chunk_s) for r in done)
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    gaps = [g for r in done for g in chunk_gaps(r.chunk_s)]
    tpots = [t for r in done if (t := tpot(r)) is not None]
    latencies = [r.latency_s for r in done]
    per_s = 1.0 / duration_s if duration_s > 0 else math.nan
    level = f"c={concurrency}" if rate is None else f"rate={rate:g}/s"
    return LevelSummary(
        engine=engine,
        level=level,
        concurrency=concurrency,
        rate=rate,
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration_s,
        output_tokens=tokens,
        prompt_tokens=sum(r.prompt_tokens for r in done),
        output_tok_s=tokens * per_s,
        requests_s=len(done) * per_s,
        ttft_p50=percentile(ttfts, P50),
        ttft_p99=percentile(ttfts, P99),
        itl_p50=percentile(gaps, P50),
        itl_p99=percentile(gaps, P99),
        tpot_p50=percentile(tpots, P50),
        tpot_p99=percentile(tpots, P99),
        latency_p50=percentile(latencies, P50),
        latency_p99=percentile(latencies, P99),
        chunks_per_token=chunks / tokens if tokens else math.nan,
        retried=sum(1 for r in records if r.retries),
        errors=sorted({r.error for r in records if not r.ok})[:MAX_ERRORS_KEPT],
    )


def parse_prometheus(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, keyed by ``name{labels}`` as written
    (``name`` alone where it has no labels); comments and unparsable lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def labelled(samples: dict[str, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of family ``name``, keyed by their labels as sorted (name, value) pairs."""
    out = {}
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name:
            out[tuple(sorted(_LABEL.findall(rest)))] = value
    return out


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def saguaro_speculation(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """saguaro's decoding over a level: rounds by the strategy that proposed them (mode auto
    chooses each step), the share of rounds that verified proposals, acceptance, tokens
    committed per round and SSD's cache hit rate. Counted when requests finish, so the
    difference covers exactly the level's requests."""
    rounds: dict[str, float] = {}
    drafted_rounds = 0.0
    earlier = labelled(before, SAGUARO_ROUNDS)
    for labels, value in labelled(after, SAGUARO_ROUNDS).items():
        n = value - earlier.get(labels, 0.0)
        named = dict(labels)
        mode = named.get("mode", "?")
        rounds[mode] = rounds.get(mode, 0.0) + n
        drafted_rounds += n if int(named.get("k", "0")) > 0 else 0.0
    total = sum(rounds.values())
    drafted = _delta(before, after, SAGUARO_DRAFTED)
    accepted = _delta(before, after, SAGUARO_ACCEPTED)
    return {
        "rounds": total,
        "rounds_by_mode": {m: n for m, n in sorted(rounds.items()) if n},
        "speculating_share": _ratio(drafted_rounds, total),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": _ratio(accepted, drafted),
        "tokens_per_round": _ratio(_delta(before, after, SAGUARO_TOKENS), total),
        "ssd_hit_rate": _ratio(
            _delta(before, after, SAGUARO_SSD_HITS), _delta(before, after, SAGUARO_SSD_ROUNDS)
        ),
        **saguaro_steps(before, after),
    }


def saguaro_steps(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The engine's steps over a level and their seconds: in all, proposing and in the
    target's forward (the rest is the engine's own Python). Against the level's duration,
    ``step_s`` is how busy the engine kept the cores."""
    return {
        "steps": _delta(before, after, SAGUARO_STEPS),
        "step_s": _delta(before, after, SAGUARO_STEP_S),
        "propose_s": _delta(before, after, SAGUARO_PROPOSE_S),
        "forward_s": _delta(before, after, SAGUARO_FORWARD_S),
    }


def llama_speculation(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """llama-server's draft over a level: proposals, acceptance and verification steps (its
    n_decode counter excludes speculative decodes, so a speculating share is not derivable)."""
    drafted = _delta(before, after, LLAMA_DRAFTED)
    accepted = _delta(before, after, LLAMA_ACCEPTED)
    drafts = _delta(before, after, LLAMA_DRAFTS)
    return {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": _ratio(accepted, drafted),
        "verifications": drafts,
        "accepted_per_verification": _ratio(accepted, drafts),
        "decodes": _delta(before, after, LLAMA_DECODES),
    }


def speculation(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The speculation counters of whichever server wrote ``after`` (empty for neither)."""
    if any(k.startswith("saguaro_") for k in after):
        return saguaro_speculation(before, after)
    if any(k.startswith("llamacpp:") for k in after):
        return llama_speculation(before, after)
    return {}
