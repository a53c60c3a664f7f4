"""Soak: one ``saguaro serve`` under thousands of mixed requests at a fixed concurrency, its draft
worker SIGKILLed under load, a tenth of its clients leaving mid-stream; then SIGTERM with streams
in flight. It passes when no valid request failed, every greedy text equals what the same server
gave serving one request at a time, the KV cache is empty again, the worker came back after each
kill, its anonymous memory (the heap, where a leak shows; the weights are file pages mapped as
they are read) grew less than ``--rss-growth`` after warm-up, and the server drained and exited
(128 + SIGTERM).
The workload is :mod:`saguaro.bench.soak_jobs`. Output: results.json and results.md in ``--out``.

    saguaro soak --requests 2000 --concurrency 64 --out docs/bench/soak
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from saguaro.bench import provenance
from saguaro.bench.serve_client import client, closed_loop
from saguaro.bench.serve_engines import Launch, Server, engine_spec, running
from saguaro.bench.serve_stats import P50, P99, PERCENT, parse_prometheus, percentile
from saguaro.bench.soak_jobs import (
    Job,
    Outcome,
    expected_text,
    plan,
    problem,
    references_needed,
    send,
)
from saguaro.distributed.processes import alive, children
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL
from saguaro.options import add_options, cpu_list, from_args, opt
from saguaro.placement import process_cpus

RSS_EVERY_S = 5.0  # between two samples of the server's memory
RESTART_WAIT_S = 300.0  # for the worker to be back after the last kill (it reloads the draft)
DRAIN_STREAMS = 4  # streams in flight when SIGTERM arrives
DRAIN_MAX_TOKENS = 64
DRAIN_AFTER_S = 1.0  # SIGTERM this long after the drain's streams were sent
DRAIN_EXIT_S = 120.0  # the server must exit this long after SIGTERM
DRAIN_REASONS = ("stop", "length", "abort")  # abort: still in flight when the grace ran out
# saguaro serve ends a drain by re-raising SIGTERM: it exits as shells report a signal's end.
SIGTERM_EXIT = 128 + signal.SIGTERM
KIB_PER_MIB = 1024


@dataclass(frozen=True)
class SoakConfig:
    """One soak; each field is the option ``--field-name``."""

    model: str = opt(DEFAULT_MODEL, "target model: a name in $SAGUARO_MODELS or a path")
    draft: str = opt(DEFAULT_DRAFT, "draft model")
    mode: str = opt("auto", "saguaro serve --mode (one that runs a draft worker: ssd or auto)")
    k: int = opt(4, "proposals per round")
    requests: int = opt(2000, "requests in the soak")
    concurrency: int = opt(64, "clients in a closed loop")
    kills: int = opt(2, "SIGKILLs of the draft worker, evenly spread over the soak")
    warmup_share: float = opt(
        0.1, "share of the soak's requests before the RSS baseline is taken", metavar="F"
    )
    rss_growth: float = opt(
        0.01, "growth of anonymous RSS after warm-up that fails the soak", metavar="F"
    )
    context_per_slot: int = opt(512, "tokens of context per sequence (--max-model-len)")
    cpus: list[int] | None = opt(
        None, "cores the server is pinned to (default: those this process may use)", parse=cpu_list
    )
    seed: int = opt(0, "the workload's draws and request seeds")
    startup_timeout_s: float = opt(600.0, "how long the server may take to answer")
    request_timeout_s: float = opt(900.0, "how long one request may take")
    out: str = opt("soak-out", "output directory", metavar="DIR")

    def __post_init__(self) -> None:
        if self.mode not in ("ssd", "auto"):
            raise ValueError("--mode must run a draft worker: ssd or auto")
        if self.requests < 1 or self.concurrency < 1 or self.kills < 0:
            raise ValueError("--requests and --concurrency must be >= 1, --kills >= 0")
        if not 0 < self.warmup_share < 1:
            raise ValueError("--warmup-share must lie in (0, 1)")


MEMORY_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}  # /proc/PID/status


def memory_mib(pid: int) -> dict[str, float]:
    """``pid``'s resident memory in MiB: all of it, anonymous, and file pages."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name = MEMORY_FIELDS.get(line.split(":", 1)[0])
            if name is not None:
                out[name] = int(line.split()[1]) / KIB_PER_MIB
    return out


def rss_mib(pid: int) -> float:
    return memory_mib(pid)["rss"]


@dataclass
class Soak:
    """A soak in progress: the server, the jobs done and what was sampled along the way."""

    cfg: SoakConfig
    server: Server
    done: int = 0
    kills_sent: int = 0
    baseline: dict[str, float] | None = None  # the server's memory at the warm-up's end

    def __post_init__(self) -> None:
        self.rss: list[dict[str, float]] = []
        self.start = time.perf_counter()

    def sample_rss(self) -> None:
        pid = self.server.proc.pid
        workers = [w for w in children(pid) if alive(w)]
        entry = {"t_s": time.perf_counter() - self.start, "done": self.done}
        entry |= {f"server_{k}_mib": v for k, v in memory_mib(pid).items()}
        with contextlib.suppress(OSError, KeyError):
            entry["worker_rss_mib"] = sum(rss_mib(w) for w in workers)
        self.rss.append(entry)

    def finished_one(self) -> None:
        """Book a finished request: the warm-up's end takes the RSS baseline, and each
        ``requests / (kills + 1)`` requests the worker is killed."""
        self.done += 1
        cfg = self.cfg
        if self.baseline is None and self.done >= cfg.warmup_share * cfg.requests:
            self.baseline = memory_mib(self.server.proc.pid)
            self.sample_rss()
        due = self.done * (cfg.kills + 1) // cfg.requests
        if self.kills_sent < min(due, cfg.kills):
            workers = children(self.server.proc.pid)
            for w in workers:
                with contextlib.suppress(ProcessLookupError):  # gone since it was listed
                    os.kill(w, signal.SIGKILL)
            self.kills_sent += bool(workers)  # none yet: back from the last kill; next one


async def _closed_loop(soak: Soak, jobs: list[Job]) -> list[Outcome]:
    """Every job sent by ``--concurrency`` clients in turn, RSS sampled meanwhile."""
    cfg, server = soak.cfg, soak.server
    api = client(server.url, cfg.request_timeout_s)

    async def one(job: Job) -> Outcome:
        out = await send(api, server.model_id, job)
        soak.finished_one()
        return out

    async def sampler() -> None:
        while True:
            soak.sample_rss()
            await asyncio.sleep(RSS_EVERY_S)

    async with api:
        sampling = asyncio.create_task(sampler())
        outcomes = await closed_loop(jobs, cfg.concurrency, one)
        sampling.cancel()
    soak.sample_rss()
    return sorted(outcomes, key=lambda o: o.job.index)


async def _one_at_a_time(server: Server, jobs: list[Job], timeout_s: float) -> list[Outcome]:
    async with client(server.url, timeout_s) as api:
        return [await send(api, server.model_id, job) for job in jobs]


def quiet_references(
    server: Server, jobs: list[Job], timeout_s: float
) -> dict[tuple[bool, str, int], str]:
    """The texts the greedy and stop jobs are checked against, served one at a time."""
    outs = asyncio.run(_one_at_a_time(server, references_needed(jobs), timeout_s))
    for out in outs:
        if not out.ok:
            raise RuntimeError(f"a request of the quiet pass failed: {out.error}")
    return {out.job.reference_key: out.texts[0] for out in outs}


def metrics(server: Server) -> dict[str, float]:
    return parse_prometheus(server.metrics_text())


def worker_back(m: dict[str, float], kills: int) -> bool:
    return (
        m.get("saguaro_draft_worker_restarts_total", 0.0) >= kills
        and m.get('saguaro_draft_worker_state{state="running"}', 0.0) > 0
    )


def wait_restarted(soak: Soak, probe: Job) -> dict[str, float]:
    """The server's metrics once the worker is back from every kill (a restart is due at an
    engine step once its backoff passed, so one request at a time keeps the engine stepping),
    or when ``RESTART_WAIT_S`` ran out."""
    deadline = time.perf_counter() + RESTART_WAIT_S
    m = metrics(soak.server)
    while not worker_back(m, soak.kills_sent) and time.perf_counter() < deadline:
        asyncio.run(_one_at_a_time(soak.server, [probe], soak.cfg.request_timeout_s))
        m = metrics(soak.server)
    return m


async def _streams_then_sigterm(server: Server, jobs: list[Job], timeout_s: float) -> list[Outcome]:
    async with client(server.url, timeout_s) as api:
        tasks = [asyncio.create_task(send(api, server.model_id, job)) for job in jobs]
        await asyncio.sleep(DRAIN_AFTER_S)
        server.proc.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*tasks))


def ended(out: Outcome) -> bool:
    """A drained stream ended with a final chunk: finished, or ended by the server when its
    shutdown grace ran out (finish reason "abort")."""
    return out.ok and len(out.reasons) == 1 and out.reasons[0] in DRAIN_REASONS


def drain(server: Server, timeout_s: float) -> dict[str, Any]:
    """SIGTERM with ``DRAIN_STREAMS`` sampled streams in flight: each must end with a finish
    reason, the server must exit within ``DRAIN_EXIT_S``, its worker with it."""
    prompt = "Write a long Python module with several functions."
    jobs = [
        Job(-1 - i, "sampled", True, prompt, True, DRAIN_MAX_TOKENS, i)
        for i in range(DRAIN_STREAMS)
    ]
    workers = children(server.proc.pid)
    sent = time.perf_counter()
    outs = asyncio.run(_streams_then_sigterm(server, jobs, timeout_s))
    try:
        code: int | None = server.proc.wait(DRAIN_EXIT_S)
    except subprocess.TimeoutExpired:
        code = None
    return {
        "exit_code": code,
        "exit_s": time.perf_counter() - sent - DRAIN_AFTER_S,
        "streams_ended": sum(ended(o) for o in outs),
        "finish_reasons": [o.reasons for o in outs],
        "worker_left": [w for w in workers if alive(w)],
    }


def kv_empty(m: dict[str, float]) -> bool:
    """No sequence left running, every KV block free again."""
    free, total = m.get("saguaro_kv_blocks_free"), m.get("saguaro_kv_blocks_total")
    return free == total and m.get("saguaro_requests_running") == 0


def drained_cleanly(drained: dict[str, Any]) -> bool:
    """Every stream ended with a finish reason, the server exited on SIGTERM, no worker left."""
    return (
        drained["exit_code"] == SIGTERM_EXIT
        and drained["streams_ended"] == DRAIN_STREAMS
        and not drained["worker_left"]
    )


def summarize(
    soak: Soak,
    outcomes: list[Outcome],
    references: dict[tuple[bool, str, int], str],
    m: dict[str, float],
    drained: dict[str, Any],
) -> dict[str, Any]:
    """The soak's figures and its checks, each True when it held."""
    problems = [
        {"index": o.job.index, "kind": o.job.kind, "problem": p}
        for o in outcomes
        if (p := problem(o, references)) is not None
    ]
    answered = [o for o in outcomes if o.ok]
    tokens = sum(o.completion_tokens for o in answered)
    latencies = [o.latency_s for o in answered]
    end = {k: soak.rss[-1][f"server_{k}_mib"] for k in MEMORY_FIELDS.values()}
    base = soak.baseline or end
    growth = {k: (end[k] - base[k]) / base[k] for k in end}
    wall_s = soak.rss[-1]["t_s"]
    checks = {
        "no valid request failed": not problems,
        "worker back after every kill": worker_back(m, soak.kills_sent),
        "KV cache empty": kv_empty(m),
        "anonymous RSS growth under bound": growth["anon"] < soak.cfg.rss_growth,
        "drained and exited on SIGTERM": drained_cleanly(drained),
    }
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "requests": len(outcomes),
        "kinds": dict(Counter(o.job.kind for o in outcomes)),
        "problems": problems,
        "exact_checked": sum(expected_text(o.job, references) is not None for o in outcomes),
        "json_cut_at_max_tokens": sum(
            o.job.kind == "json" and o.reasons == ["length"] for o in outcomes
        ),
        "kills": soak.kills_sent,
        "restarts": m.get("saguaro_draft_worker_restarts_total"),
        "memory_baseline_mib": base,
        "memory_end_mib": end,
        "memory_growth_percent": {k: PERCENT * g for k, g in growth.items()},
        "output_tokens": tokens,
        "wall_s": wall_s,
        "output_tok_s": tokens / wall_s,
        "latency_p50_s": percentile(latencies, P50),
        "latency_p99_s": percentile(latencies, P99),
        "drain": drained,
    }


def _growth(s: dict[str, Any]) -> str:
    """The server's memory after warm-up and at the end, per kind."""
    base, end, pct = s["memory_baseline_mib"], s["memory_end_mib"], s["memory_growth_percent"]
    return ", ".join(
        f"{kind} {base[kind]:.0f} -> {end[kind]:.0f} MiB ({pct[kind]:+.2f}%)"
        for kind in MEMORY_FIELDS.values()
    )


def write(out: Path, meta: dict[str, Any], summary: dict[str, Any], rss: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "summary": summary, "rss": rss}
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    rows = [
        f"| {name} | {'yes' if held else '**no**'} |" for name, held in summary["checks"].items()
    ]
    s = summary
    lines = [
        f"# Soak, {meta['date']}",
        "",
        f"`{' '.join(meta['command'])}`",
        "",
        f"{s['requests']} requests ({', '.join(f'{k} {v}' for k, v in s['kinds'].items())}); "
        f"{s['exact_checked']} compared with the quiet server's text; {s['kills']} worker kills, "
        f"{s['restarts']:.0f} restarts; {s['output_tokens']} tokens in {s['wall_s']:.0f} s "
        f"({s['output_tok_s']:.1f} tok/s); after warm-up, {_growth(s)}; drain exit "
        f"{s['drain']['exit_code']} after {s['drain']['exit_s']:.1f} s.",
        "",
        "| check | held |",
        "|---|---|",
        *rows,
        "",
    ]
    if s["problems"]:
        lines += ["Problems:", "", *(f"- {p}" for p in s["problems"]), ""]
    (out / "results.md").write_text("\n".join(lines))


def launch_of(cfg: SoakConfig) -> Launch:
    cpus = tuple(cfg.cpus or process_cpus())
    return Launch(
        cfg.model, cfg.draft, cfg.k, cfg.concurrency, cfg.context_per_slot, cpus, len(cpus)
    )


def run(cfg: SoakConfig, argv: list[str]) -> dict[str, Any]:
    """The soak, start to drain; writes its files and returns its summary."""
    launch = launch_of(cfg)
    spec = engine_spec(cfg.mode, launch)
    jobs = plan(cfg.requests, cfg.seed)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["saguaro", "soak", *argv],
        "config": asdict(cfg),
        "argv": list(spec.argv),
        "machine": provenance.machine_info(),
        "versions": provenance.versions(),
        "git": provenance.git_info(),
    }
    out = Path(cfg.out)
    with running(spec, launch.cpus, out / "logs", cfg.startup_timeout_s) as server:
        references = quiet_references(server, jobs, cfg.request_timeout_s)
        print(f"{len(references)} quiet references; soak of {len(jobs)} requests", flush=True)
        soak = Soak(cfg, server)
        outcomes = asyncio.run(_closed_loop(soak, jobs))
        probe = references_needed(jobs)[0]
        m = wait_restarted(soak, probe)
        soak.sample_rss()  # the end's memory, idle: what the soak left, not a step's buffers
        drained = drain(server, cfg.request_timeout_s)
    summary = summarize(soak, outcomes, references, m, drained)
    write(out, meta, summary, soak.rss)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``saguaro soak [options]``: 0 when every check held, 1 when one did not,
    2 for bad settings."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="saguaro soak",
        description="Soak a saguaro server with mixed requests, draft worker kills and client "
        "disconnects, then check that nothing was lost or changed.",
    )
    add_options(parser, SoakConfig)
    try:
        cfg = from_args(SoakConfig, parser.parse_args(argv))
    except ValueError as e:
        print(f"saguaro soak: error: {e}", file=sys.stderr)
        return 2
    summary = run(cfg, argv)
    print((Path(cfg.out) / "results.md").read_text())
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
