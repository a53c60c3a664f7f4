"""Serving benchmark: real servers, one at a time, driven through the OpenAI API.

For each engine named (``saguaro serve`` in a mode: ar, sd, ssd, auto; llama.cpp's
``llama-server`` alone, ``llama.cpp``, or with its draft, ``llama.cpp-sd``) the benchmark starts
the server on the same cores, waits until it answers, sends one warm-up request, then replays
ShareGPT's held-out first user turns as streamed chat completions at each load level (a fixed
concurrency, or Poisson arrivals at a rate), each level on prompts of its own (no prefix cache
carries over from one level to the next). Per engine and level it reports completed and failed
requests, output tokens/s, requests/s, TTFT, chunk gaps, TPOT (the inter-token latency per
token) and end-to-end latency percentiles, and the speculation the server's ``/metrics``
counted over the level. Output: results.json, results.md and latency.png in ``--out``.

    python -m saguaro.bench.serve --engines ar,sd,llama.cpp --concurrency 1,4,16 \\
        --num-requests 8,16,32 --max-tokens 128 --llama-server PATH --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from saguaro.bench import provenance
from saguaro.bench.config import names_of, non_negative_floats, positive_ints
from saguaro.bench.datasets import DATASETS, file_prompts, load_dataset, select
from saguaro.bench.serve_client import RequestShape, fixed_concurrency, poisson_arrivals
from saguaro.bench.serve_engines import (
    ENGINES,
    LAYOUTS,
    LLAMA_AR,
    LLAMA_SD,
    Launch,
    Server,
    engine_spec,
    running,
)
from saguaro.bench.serve_report import MS, steps_cell, write_all
from saguaro.bench.serve_stats import (
    LevelSummary,
    RequestRecord,
    parse_prometheus,
    speculation,
    summarize,
)
from saguaro.errors import SaguaroError
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL
from saguaro.options import add_options, cpu_list, from_args, opt
from saguaro.placement import process_cpus

WARMUP_MAX_TOKENS = 8  # the warm-up request only has to touch every path once
VERSION_TIMEOUT_S = 10  # for `llama-server --version`


@dataclass(frozen=True)
class ServeBenchConfig:
    """What one serving benchmark measures; each field is the option ``--field-name``."""

    engines: tuple[str, ...] = opt(
        ("ar", "sd", "ssd"),
        f"servers under test, one after another, of {','.join(ENGINES)} (the first four: "
        f"saguaro serve --mode M; {LLAMA_AR}: llama-server; {LLAMA_SD}: llama-server with "
        "the draft)",
        parse=names_of(ENGINES),
        metavar="E,..",
    )
    model: str = opt(DEFAULT_MODEL, "target model: a name in $SAGUARO_MODELS or a path")
    draft: str = opt(DEFAULT_DRAFT, "draft model of the speculative engines")
    k: int = opt(4, "proposals per round: saguaro's --k, llama-server's --spec-draft-n-max")
    dataset: str = opt("sharegpt", f"built-in prompt set, of {','.join(DATASETS)}", metavar="NAME")
    prompts: str | None = opt(
        None, 'JSONL file, one {"prompt": ...} a line (instead of --dataset)', metavar="FILE"
    )
    max_prompt_chars: int = opt(
        1000,
        "prompts longer than this are left out (ShareGPT's first turns reach 100k chars)",
        metavar="N",
    )
    concurrency: tuple[int, ...] = opt(
        (1, 4, 16),
        "fixed-concurrency levels (clients in a closed loop)",
        parse=positive_ints,
        metavar="C,..",
    )
    request_rates: tuple[float, ...] = opt(
        (),
        "Poisson-arrival levels, requests per second (after the concurrency levels)",
        parse=non_negative_floats,
        metavar="R,..",
    )
    num_requests: tuple[int, ...] = opt(
        (8, 16, 32),
        "requests per level: one count for every level, or one per level in order",
        parse=positive_ints,
        metavar="N,..",
    )
    max_tokens: int = opt(128, "output tokens a request asks for")
    temperature: float = opt(0.0, "sampling temperature of every request")
    ignore_eos: bool = opt(True, "generate max_tokens whatever the model says (comparable work)")
    seed: int = opt(0, "prompt selection and request seeds (request i: seed + i)")
    cpus: list[int] | None = opt(
        None,
        "cores every server is pinned to, e.g. 0-1 (default: those this process may use)",
        parse=cpu_list,
    )
    threads: int | None = opt(None, "llama-server's threads (default: one per core of --cpus)")
    layout: str = opt(
        "equal",
        "equal: every server computes on all of --cpus; paper: every target on the first core of "
        "--cpus with one thread (llama-server pinned there, its draft too), SSD's and auto's "
        "draft worker on the next (the layout of SSD's paper)",
        metavar="NAME",
    )
    slots: int | None = opt(
        None,
        "sequences a server serves at once: saguaro's --max-num-seqs, llama-server's -np "
        "(default: the largest concurrency level)",
    )
    context_per_slot: int = opt(2048, "tokens of context per sequence (saguaro --max-model-len)")
    llama_server: str = opt("llama-server", "llama.cpp's llama-server binary", metavar="PATH")
    saguaro_args: str = opt(
        "", "more options for every saguaro serve, as one string", metavar="ARGS"
    )
    llama_args: str = opt("", "more options for every llama-server, as one string", metavar="ARGS")
    startup_timeout_s: float = opt(600.0, "how long a server may take to answer")
    request_timeout_s: float = opt(900.0, "how long one request may take")
    rounds: int = opt(
        1,
        "times every engine is started and measured, the engines taking turns (ar, sd, ar, "
        "sd, ...): on a shared machine a server run later than another meets other neighbours, "
        "so ratios are read from medians over rounds",
    )
    plot: bool = opt(True, "write latency.png (matplotlib)")
    out: str = opt("serve-bench-out", "output directory", metavar="DIR")

    def __post_init__(self) -> None:
        levels = len(self.concurrency) + len(self.request_rates)
        if len(self.num_requests) not in (1, levels):
            raise ValueError(
                f"--num-requests takes one count or one per level ({levels}), "
                f"got {len(self.num_requests)}"
            )
        if any(r <= 0 for r in self.request_rates):
            raise ValueError("--request-rates must be > 0")
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}")
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}")
        for name in ("k", "max_tokens", "max_prompt_chars", "context_per_slot", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")


@dataclass(frozen=True)
class Level:
    """One load level: a fixed concurrency or a Poisson rate, and its prompts."""

    concurrency: int | None
    rate: float | None
    prompts: list[str]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="saguaro bench-serve",
        description="Benchmark OpenAI-compatible servers (saguaro serve, llama-server) under load.",
    )
    add_options(p, ServeBenchConfig)
    return p


def parse_config(argv: list[str]) -> ServeBenchConfig:
    return from_args(ServeBenchConfig, build_parser().parse_args(argv))


def prompt_texts(cfg: ServeBenchConfig, count: int) -> list[str]:
    """``count`` prompts drawn reproducibly from the dataset (or file), short ones only."""
    pool = file_prompts(cfg.prompts) if cfg.prompts else load_dataset(cfg.dataset)
    short = [p for p in pool if len(p.text) <= cfg.max_prompt_chars]
    name = Path(cfg.prompts).stem if cfg.prompts else cfg.dataset
    return [p.text for p in select(short, count, cfg.seed, name)]


def levels_of(cfg: ServeBenchConfig) -> tuple[list[Level], str]:
    """The load levels, each with prompts of its own, and the warm-up prompt."""
    loads = [(c, None) for c in cfg.concurrency] + [(None, r) for r in cfg.request_rates]
    counts = list(cfg.num_requests) * (len(loads) if len(cfg.num_requests) == 1 else 1)
    texts = prompt_texts(cfg, 1 + sum(counts))
    levels, at = [], 1
    for (c, r), n in zip(loads, counts, strict=True):
        levels.append(Level(c, r, texts[at : at + n]))
        at += n
    return levels, texts[0]


def launch_of(cfg: ServeBenchConfig) -> Launch:
    cpus = tuple(cfg.cpus or process_cpus())
    return Launch(
        model=cfg.model,
        draft=cfg.draft,
        k=cfg.k,
        slots=cfg.slots or max([*cfg.concurrency, 1]),
        context_per_slot=cfg.context_per_slot,
        cpus=cpus,
        threads=cfg.threads or len(cpus),
        llama_server=cfg.llama_server,
        saguaro_args=tuple(shlex.split(cfg.saguaro_args)),
        llama_args=tuple(shlex.split(cfg.llama_args)),
        layout=cfg.layout,
    )


def shape_of(cfg: ServeBenchConfig) -> RequestShape:
    return RequestShape(
        cfg.max_tokens, cfg.temperature, cfg.seed, cfg.ignore_eos, cfg.request_timeout_s
    )


def run_level(
    server: Server, level: Level, shape: RequestShape
) -> tuple[LevelSummary, list[RequestRecord]]:
    """One level against a warm server: its summary (with the speculation ``/metrics`` counted
    over it) and its requests' records."""
    before = parse_prometheus(server.metrics_text())
    url, model = server.url, server.model_id
    if level.concurrency is not None:
        load = fixed_concurrency(url, model, level.prompts, level.concurrency, shape)
    else:
        load = poisson_arrivals(url, model, level.prompts, level.rate or 0.0, shape)
    records, duration = asyncio.run(load)
    after = parse_prometheus(server.metrics_text())
    summary = summarize(server.spec.name, records, duration, level.concurrency, level.rate)
    summary.speculation = speculation(before, after)
    return summary, records


def warm_up(server: Server, prompt: str, shape: RequestShape) -> None:
    """One short request, unmeasured: first-use costs (page faults on the weights, lazy
    set-up) land here rather than in the first level."""
    short = dataclasses.replace(shape, max_tokens=min(shape.max_tokens, WARMUP_MAX_TOKENS))
    records, _ = asyncio.run(fixed_concurrency(server.url, server.model_id, [prompt], 1, short))
    if not records[0].ok:
        raise RuntimeError(f"{server.spec.name}: the warm-up request failed: {records[0].error}")


def _print_level(s: LevelSummary) -> None:
    print(
        f"  {s.engine:14s} {s.level:10s} {s.completed}/{s.failed} done/failed, "
        f"{s.output_tok_s:6.1f} tok/s, TTFT p50 {s.ttft_p50 * MS:7.0f} ms, "
        f"TPOT p50 {s.tpot_p50 * MS:6.0f} ms, {s.duration_s:6.1f} s, "
        f"step ms (forward), busy: {steps_cell(s.speculation, s.duration_s)}",
        flush=True,
    )


def bench_engine(
    name: str, cfg: ServeBenchConfig, levels: list[Level], warmup: str, round_: int = 0
) -> tuple[dict[str, Any], list[LevelSummary], dict[str, list[dict[str, Any]]]]:
    """Start one engine's server, warm it, run every level, stop it (``round_``: which of
    ``cfg.rounds``; its summaries, records and server entry carry it where there are several)."""
    launch, shape = launch_of(cfg), shape_of(cfg)
    spec = engine_spec(name, launch)
    tag = f" #{round_ + 1}" if cfg.rounds > 1 else ""
    print(f"{spec.name}{tag}: starting: {shlex.join(spec.argv)}", flush=True)
    summaries, records = [], {}
    logs = Path(cfg.out) / "logs"
    with running(spec, launch.cpus_of(spec), logs, cfg.startup_timeout_s, tag) as server:
        print(f"{spec.name}: answered after {server.startup_s:.1f} s", flush=True)
        warm_up(server, warmup, shape)
        for level in levels:
            summary, recs = run_level(server, level, shape)
            summary.round = round_
            _print_level(summary)
            summaries.append(summary)
            records[f"{spec.name}{tag} {summary.level}"] = [dataclasses.asdict(r) for r in recs]
        info = {
            "argv": server.argv,
            "startup_s": server.startup_s,
            "model_id": server.model_id,
            # the machine may be shared: the load when this engine ended qualifies its figures
            "load_average_after": list(os.getloadavg()),
        }
    return {spec.name + tag: info}, summaries, records


def llama_version(binary: str) -> str | None:
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout + done.stderr).strip() or None


def meta_of(cfg: ServeBenchConfig, argv: list[str]) -> dict[str, Any]:
    uses_llama = any(e in (LLAMA_AR, LLAMA_SD) for e in cfg.engines)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["python", "-m", "saguaro.bench.serve", *argv],
        "config": dataclasses.asdict(cfg),
        "cpus": list(launch_of(cfg).cpus),
        "machine": provenance.machine_info(),
        "versions": provenance.versions(),
        "git": provenance.git_info(),
        "llama_server_version": llama_version(cfg.llama_server) if uses_llama else None,
        "servers": {},
    }


# What stops one engine (a server that will not start or answer, a model llama-server cannot
# read) without stopping the engines after it.
ENGINE_FAILURES = (SaguaroError, ValueError, RuntimeError, TimeoutError, OSError)


def run(cfg: ServeBenchConfig, argv: list[str]) -> tuple[list[LevelSummary], dict[str, str]]:
    """Every engine at every level, and the engines that failed with why; the output files are
    rewritten after each engine, so a run cut short keeps what it measured."""
    levels, warmup = levels_of(cfg)
    meta = meta_of(cfg, argv)
    meta["failed_engines"] = failed = {}
    summaries: list[LevelSummary] = []
    records: dict[str, list[dict[str, Any]]] = {}
    start = time.perf_counter()
    turns = [(r, name) for r in range(cfg.rounds) for name in cfg.engines]
    for round_, name in turns:
        if name in failed:  # an engine that could not start is not started again
            continue
        try:
            info, mine, recs = bench_engine(name, cfg, levels, warmup, round_)
        except ENGINE_FAILURES as e:
            print(f"{name}: failed: {e}", file=sys.stderr, flush=True)
            failed[name] = str(e)
        else:
            meta["servers"].update(info)
            summaries += mine
            records.update(recs)
        meta["wall_s"] = time.perf_counter() - start
        write_all(Path(cfg.out), meta, summaries, records, cfg.plot)
    return summaries, failed


def main(argv: list[str] | None = None) -> int:
    """``python -m saguaro.bench.serve [options]``: 0 when every request of every engine and
    level completed, 1 when a request or an engine failed, 2 for bad settings or prompts."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_config(argv)
        summaries, failed = run(cfg, argv)
    except (ImportError, ValueError) as e:  # bad settings, or a dataset that cannot load
        print(f"saguaro bench-serve: error: {e}", file=sys.stderr)
        return 2
    print(f"results in {cfg.out}/results.md")
    return 1 if failed or any(s.failed for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
