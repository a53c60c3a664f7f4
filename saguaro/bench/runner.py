"""`saguaro bench`: AR, SD, SSD and Hugging Face assisted generation side by side.

Every mode runs the same prompts, output length and sampling settings. Modes are interleaved per
batch of prompts (A B C A B C ...) so machine drift hits them alike; each engine is warmed up
first, outside the measurement. At temperature 0 every mode must reproduce AR's tokens exactly:
any difference is reported loudly and makes the command exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from saguaro.bench.datasets import DATASETS, Prompt, file_prompts, load_dataset, select
from saguaro.config import SAMPLING_METHODS
from saguaro.core.metrics import summarize
from saguaro.core.records import RoundRecord
from saguaro.errors import SaguaroError
from saguaro.placement import resolve_device
from saguaro.sampling import SamplingParams

BENCH_MODES = ("ar", "sd", "ssd", "hf-assisted")
SPEC_MODES = ("sd", "ssd", "hf-assisted")
WARMUP_TOKENS = 16


@dataclass(frozen=True)
class BenchConfig:
    model: str | None = None  # None: the bundled target
    draft: str | None = None  # None: the bundled draft
    modes: tuple[str, ...] = BENCH_MODES
    datasets: tuple[str, ...] = DATASETS
    prompts: str | None = None  # JSONL prompt file, benchmarked as one more dataset
    num_prompts: int = 16
    max_tokens: int = 128
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    top_p: float = 1.0  # nucleus of every request at temperature > 0
    ks: tuple[int, ...] = (4,)
    fanouts: tuple[str, ...] = ("auto",)
    saguaro_cs: tuple[float, ...] = (1.0,)
    samplings: tuple[str, ...] = ("auto",)  # sampling method(s) at T > 0
    repeats: int = 1
    seed: int = 0
    device: str = "auto"
    out: str = "bench-out"
    quick: bool = False


# --quick: under 3 minutes on a 2-core CPU with the bundled pair. Flags given explicitly win.
QUICK = dict(
    modes=("ar", "sd", "ssd"),
    datasets=("humaneval",),
    num_prompts=4,
    max_tokens=96,
    batch_sizes=(1, 4),
    temperatures=(0.0,),
    repeats=1,
)


@dataclass(frozen=True)
class Variant:
    """One engine configuration under test."""

    mode: str
    k: int | None = None  # speculation length (speculative modes)
    fanout: str | None = None  # SSD fan-out, as given on the command line
    label: str = ""
    saguaro_c: float = 1.0  # SSD's Saguaro sampling constant C
    sampling: str = "auto"  # "auto" | "rejection" | "coupled" (EngineConfig.sampling)


@dataclass
class RequestResult:
    prompt_id: str
    token_ids: list[int]
    latency_s: float  # from the batch's start, so sequential serving pays its queueing
    ttft_s: float | None
    tpot_s: float | None


@dataclass
class Generation:
    """What one backend call on one batch of prompts produced."""

    elapsed_s: float
    requests: list[RequestResult]
    records: list[list[RoundRecord]] = field(default_factory=list)  # per request (saguaro)
    target_forwards: int | None = None  # hf-assisted: target forward passes (one per round)
    predicted_speedup: float | None = None  # SSD: docs/design.md §7, relative to one verification
    ssd_stats: dict[str, Any] | None = None
    ssd_totals: dict[str, float] | None = None  # SSD: draft-side seconds during this call
    draft_failure: str | None = None


@dataclass
class Run:
    """One measured call: a variant on one batch of one cell."""

    dataset: str
    temperature: float
    batch_size: int
    variant: str
    repeat: int
    batch_index: int
    gen: Generation


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


class SaguaroBackend:
    """An `LLM` of one mode, kept for the whole bench (SSD: its draft worker too)."""

    def __init__(self, variant: Variant, cfg: BenchConfig, max_model_len: int, max_seqs: int):
        from saguaro import LLM

        self.variant = variant
        spec = variant.mode != "ar"
        self.llm = LLM(
            model=cfg.model,
            draft=cfg.draft if spec else None,
            mode=variant.mode,
            num_speculative_tokens=variant.k or 1,  # AR: unused, but must be valid
            fanout=variant.fanout or "auto",
            sampling=variant.sampling,
            saguaro_c=variant.saguaro_c,
            device=cfg.device,
            max_model_len=max_model_len,
            max_num_seqs=max_seqs,
            # Repeats and batch sizes reuse prompts: a prefix cache would flatter TTFT, and the
            # peer has none.
            enable_prefix_caching=False,
            seed=cfg.seed,
        )

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        # SSD's figures are cumulative per worker: diff them unless a restart replaced it.
        restarts = self.llm.snapshot().draft_restarts
        before = self.llm.draft_stats().get("totals")
        outs = self.llm.generate(prompts, params)
        snap = self.llm.snapshot()
        gen = Generation(
            elapsed_s=self.llm.last_run["elapsed_s"],
            requests=[
                RequestResult(
                    "",
                    o.token_ids,
                    o.metrics["latency_s"],
                    o.metrics.get("ttft_s"),
                    o.metrics.get("tpot_s"),
                )
                for o in outs
            ],
            records=[o.records for o in outs],
            draft_failure=snap.draft_failure,
        )
        stats = self.llm.draft_stats(len(prompts))
        if "totals" in stats and before is not None and snap.draft_restarts == restarts:
            gen.ssd_stats = stats
            gen.predicted_speedup = stats["predicted_speedup"]
            gen.ssd_totals = {k: v - before[k] for k, v in stats["totals"].items()}
        return gen

    def close(self) -> None:
        self.llm.close()


class _FirstTokenClock:
    """A `generate` streamer that only notes when the first generated tokens arrive (its first
    `put` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


class HFAssistedBackend:
    """transformers' assisted generation on the same checkpoints. It supports batch size 1 only,
    so a batch of b requests is served one after another."""

    def __init__(self, variant: Variant, target_dir: Path, draft_dir: Path, device: str):
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.set_verbosity_error()  # per-call deprecation chatter
        transformers.logging.disable_progress_bar()
        self.device = device
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
        self.target.to(device).eval()
        self.draft.to(device).eval()
        # The same K as our speculative modes, every round: no heuristic length schedule and no
        # confidence cut-off.
        dcfg = self.draft.generation_config
        dcfg.num_assistant_tokens = variant.k
        dcfg.num_assistant_tokens_schedule = "constant"
        dcfg.assistant_confidence_threshold = 0.0
        eos = self.target.generation_config.eos_token_id
        self.pad_id = (eos[0] if isinstance(eos, list) else eos) or 0
        self.forwards = 0
        self.target.register_forward_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.forwards += 1

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        from transformers import GenerationConfig

        self.forwards = 0
        requests = []
        start = time.perf_counter()
        for ids, p in zip(prompts, params, strict=True):
            sampling = p.temperature > 0
            if sampling:
                torch.manual_seed(p.seed)
            gcfg = GenerationConfig(
                max_new_tokens=p.max_tokens,
                do_sample=sampling,
                temperature=p.temperature if sampling else None,
                top_k=0,
                top_p=p.top_p if sampling else 1.0,
                eos_token_id=None,  # the same output length as our modes (ignore_eos)
                pad_token_id=self.pad_id,
            )
            x = torch.tensor([ids], device=self.device)
            clock = _FirstTokenClock()
            out = self.target.generate(
                x,
                attention_mask=torch.ones_like(x),
                assistant_model=self.draft,
                generation_config=gcfg,
                streamer=clock,
            )
            tokens = out[0, len(ids) :].tolist()
            now = time.perf_counter()
            first = clock.first_token_time
            tpot = (now - first) / (len(tokens) - 1) if first and len(tokens) > 1 else None
            requests.append(
                RequestResult("", tokens, now - start, first - start if first else None, tpot)
            )
        return Generation(time.perf_counter() - start, requests, target_forwards=self.forwards)

    def close(self) -> None:
        pass


# ---- configuration ----------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _floats(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def _names(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got {text!r}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="saguaro bench",
        description="Benchmark AR, SD, SSD and HF assisted generation side by side.",
    )
    # Defaults are None so --quick can tell an explicit flag from its own preset.
    p.add_argument(
        "--model", metavar="DIR", help="target model directory (default: the bundled target)"
    )
    p.add_argument(
        "--draft", metavar="DIR", help="draft model directory (default: the bundled draft)"
    )
    p.add_argument(
        "--modes", type=_names(BENCH_MODES), metavar="M,..", help="default: ar,sd,ssd,hf-assisted"
    )
    p.add_argument(
        "--datasets", type=_names(DATASETS), metavar="D,..", help="default: humaneval,heldout"
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help='JSONL file, one {"prompt": ...} a line (one more dataset)',
    )
    p.add_argument("--num-prompts", type=int, help="prompts per dataset (default 16)")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (default 128)")
    p.add_argument("--batch-sizes", type=_ints, metavar="B,..", help="default: 1,2,4,8,16")
    p.add_argument("--temperatures", type=_floats, metavar="T,..", help="default: 0,1.0")
    p.add_argument("--top-p", type=float, help="top-p of every request at T > 0 (default 1.0)")
    p.add_argument(
        "--sampling",
        type=_names(SAMPLING_METHODS),
        dest="samplings",
        metavar="S,..",
        help="sampling method(s) at T > 0, side by side: rejection,coupled (default auto: the "
        "engine's choice per mode)",
    )
    p.add_argument(
        "--k", type=_ints, metavar="K,..", dest="ks", help="speculation length(s) K (default 4)"
    )
    p.add_argument(
        "--fanout",
        nargs="+",
        dest="fanouts",
        metavar="F",
        help="SSD fan-out(s): auto | geometric | empirical | F | F_0,..,F_K (default auto)",
    )
    p.add_argument(
        "--saguaro-c",
        type=_floats,
        dest="saguaro_cs",
        metavar="C,..",
        help="SSD's Saguaro sampling constant(s) C in (0, 1] (default 1.0)",
    )
    p.add_argument("--repeats", type=int, help="passes over the prompts (default 1)")
    p.add_argument("--seed", type=int, help="prompt selection and sampling seed (default 0)")
    p.add_argument("--device", help="auto | cpu | cuda (default auto)")
    p.add_argument("--out", metavar="DIR", help="output directory (default bench-out)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a short run: humaneval, 4 prompts, 96 tokens, batch 1 and 4, temperature 0, "
        "ar/sd/ssd (explicit flags still apply)",
    )
    return p


def parse_config(argv: list[str]) -> BenchConfig:
    args = vars(build_parser().parse_args(argv))
    base = replace(BenchConfig(), **QUICK) if args["quick"] else BenchConfig()
    explicit = {k: v for k, v in args.items() if v is not None}
    if args["prompts"] and "datasets" not in explicit:
        explicit["datasets"] = ()  # a prompt file alone replaces the default datasets
    if "fanouts" in explicit:
        explicit["fanouts"] = tuple(explicit["fanouts"])
    cfg = replace(base, **explicit)
    for name in ("num_prompts", "max_tokens", "repeats"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not cfg.datasets and not cfg.prompts:
        raise ValueError("no dataset: give --datasets or --prompts")
    if not all(0.0 < c <= 1.0 for c in cfg.saguaro_cs):
        raise ValueError(f"--saguaro-c values must be in (0, 1], got {list(cfg.saguaro_cs)}")
    return cfg


def build_variants(cfg: BenchConfig) -> list[Variant]:
    """AR once; SD and HF per K; SSD per (K, fan-out) pair that fits (a fixed fan-out lists
    K+1 counts, so it pairs only with that K) and per Saguaro constant C."""
    from saguaro.config import parse_fanout

    ssd_pairs: list[tuple[int, str]] = []
    for f in cfg.fanouts:
        errors = []
        for k in cfg.ks:
            try:
                parse_fanout(f, k)
                ssd_pairs.append((k, f))
            except ValueError as e:
                errors.append(str(e))
        if len(errors) == len(cfg.ks):
            raise ValueError(errors[0])
    many_k, many_f, many_c = len(cfg.ks) > 1, len(cfg.fanouts) > 1, len(cfg.saguaro_cs) > 1
    many_s = len(cfg.samplings) > 1

    def label(
        mode: str, sampling: str, k: int | None = None, f: str | None = None, c: float | None = None
    ) -> str:
        parts = ([f"k={k}"] if k is not None and many_k else []) + (
            [f"f={f}"] if f and many_f else []
        )
        parts += [f"c={c:g}"] if c is not None and many_c else []
        parts += [sampling] if many_s and mode != "hf-assisted" else []
        return f"{mode} {' '.join(parts)}" if parts else mode

    variants = []
    for mode in cfg.modes:
        # transformers' assisted generation has its own sampler: one variant whatever the method
        samplings = cfg.samplings[:1] if mode == "hf-assisted" else cfg.samplings
        for sm in samplings:
            if mode == "ar":
                variants.append(Variant("ar", label=label("ar", sm), sampling=sm))
            elif mode == "ssd":
                variants += [
                    Variant("ssd", k, f, label("ssd", sm, k, f, c), c, sm)
                    for k, f in sorted(ssd_pairs)
                    for c in cfg.saguaro_cs
                ]
            else:
                variants += [
                    Variant(mode, k, label=label(mode, sm, k), sampling=sm) for k in cfg.ks
                ]
    return variants


# ---- prompts ----------------------------------------------------------------------------------


@dataclass
class PromptSet:
    name: str
    prompts: list[Prompt]
    token_ids: list[list[int]]
    truncated: int  # prompts cut (from the left) to fit the context


def prepare_prompts(
    cfg: BenchConfig, tokenizer: Any, max_prompt_tokens: int, count: int
) -> list[PromptSet]:
    sources = [(name, load_dataset(name)) for name in cfg.datasets]
    if cfg.prompts:
        sources.append((Path(cfg.prompts).stem, file_prompts(cfg.prompts)))
    sets = []
    for name, prompts in sources:
        chosen = select(prompts, count, cfg.seed, name)
        ids, truncated = [], 0
        for p in chosen:
            t = tokenizer.encode(p.text)
            if len(t) > max_prompt_tokens:
                truncated += 1
                bos = tokenizer.bos_token_id
                keep = t[len(t) - max_prompt_tokens :]
                t = [bos, *keep[1:]] if bos is not None and t[0] == bos else keep
            ids.append(t)
        sets.append(PromptSet(name, chosen, ids, truncated))
    return sets


def batch_count(num_prompts: int, b: int) -> int:
    """Requests measured at batch size b: the prompts, rounded up to whole batches."""
    return math.ceil(num_prompts / b) * b


def request_seed(seed: int, repeat: int, index: int) -> int:
    return seed * 1_000_003 + repeat * 65_537 + index


# ---- measurement ------------------------------------------------------------------------------


@dataclass
class Plan:
    cfg: BenchConfig
    variants: list[Variant]
    prompt_sets: list[PromptSet]

    def jobs(self) -> list[tuple[PromptSet, float, int, int, int, list[int], Variant]]:
        """(prompts, temperature, batch size, repeat, batch index, request indices, variant), in
        run order: the variants interleaved innermost."""
        out = []
        for ps in self.prompt_sets:
            for temp in self.cfg.temperatures:
                for b in self.cfg.batch_sizes:
                    n = batch_count(self.cfg.num_prompts, b)
                    for r in range(self.cfg.repeats):
                        for j, lo in enumerate(range(0, n, b)):
                            idx = list(range(lo, lo + b))
                            out += [(ps, temp, b, r, j, idx, v) for v in self.variants]
        return out


def _params(
    cfg: BenchConfig, temperature: float, repeat: int, idx: list[int]
) -> list[SamplingParams]:
    return [
        SamplingParams(
            temperature=temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            seed=request_seed(cfg.seed, repeat, i),
            ignore_eos=True,  # every mode produces exactly max_tokens tokens
        )
        for i in idx
    ]


def measure(plan: Plan, backends: dict[str, Any]) -> list[Run]:
    cfg = plan.cfg
    first = plan.prompt_sets[0]
    warm_n = min(max(cfg.batch_sizes), len(first.token_ids))
    warm = [
        replace(p, max_tokens=min(WARMUP_TOKENS, cfg.max_tokens))
        for p in _params(cfg, cfg.temperatures[0], 0, list(range(warm_n)))
    ]
    for v in plan.variants:
        backends[v.label].generate(first.token_ids[:warm_n], warm)
    runs = []
    jobs = plan.jobs()
    with tqdm(total=len(jobs), desc="bench", unit="run", file=sys.stderr) as bar:
        for ps, temp, b, r, j, idx, v in jobs:
            bar.set_postfix_str(f"{ps.name} T={temp:g} b={b} {v.label}")
            gen = backends[v.label].generate(
                [ps.token_ids[i] for i in idx], _params(cfg, temp, r, idx)
            )
            for i, req in zip(idx, gen.requests, strict=True):
                req.prompt_id = ps.prompts[i].id
            runs.append(Run(ps.name, temp, b, v.label, r, j, gen))
            bar.update()
    return runs


# ---- correctness ------------------------------------------------------------------------------


def check_greedy(runs: list[Run], variants: list[Variant]) -> dict[str, Any]:
    """At temperature 0 every variant must produce AR's tokens for every request (AR under the
    first sampling method is the reference; temperature 0 is the same under every method)."""
    reference = next((v.label for v in variants if v.mode == "ar"), None)
    if reference is None:
        return {"ok": None, "checked": 0, "mismatches": [], "note": "ar not run: not checked"}
    if not any(r.temperature == 0 for r in runs):
        return {"ok": None, "checked": 0, "mismatches": [], "note": "no temperature-0 run"}
    ar = {
        (r.dataset, r.batch_size, r.repeat, r.batch_index): r
        for r in runs
        if r.variant == reference and r.temperature == 0
    }
    checked, mismatches = 0, []
    for run in runs:
        if run.temperature != 0 or run.variant == reference:
            continue
        ref = ar[(run.dataset, run.batch_size, run.repeat, run.batch_index)]
        for want, got in zip(ref.gen.requests, run.gen.requests, strict=True):
            checked += 1
            if want.token_ids != got.token_ids:
                pairs = zip(want.token_ids, got.token_ids, strict=False)
                pos = next(
                    (i for i, (a, b) in enumerate(pairs) if a != b),
                    min(len(want.token_ids), len(got.token_ids)),
                )
                mismatches.append(
                    {
                        "variant": run.variant,
                        "dataset": run.dataset,
                        "batch_size": run.batch_size,
                        "repeat": run.repeat,
                        "prompt_id": got.prompt_id,
                        "first_difference": pos,
                        "ar_tokens": want.token_ids[pos : pos + 8],
                        "tokens": got.token_ids[pos : pos + 8],
                    }
                )
    return {"ok": not mismatches, "checked": checked, "mismatches": mismatches}


# ---- aggregation ------------------------------------------------------------------------------


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
    speedup_vs_sd: float | None = None
    predicted_speedup: float | None = None  # SSD: docs/design.md §7 over AR (see round_costs)
    draft_failures: list[str] = field(default_factory=list)
    speculation: dict[str, Any] = field(default_factory=dict)  # engine metrics (docs/design.md §10)
    ssd: dict[str, Any] | None = None  # last round's fan-out, budget, timings; policy inputs
    round_costs: dict[str, float] | None = None  # SSD: mean ms per engine round, by part
    step_costs: dict[str, float] | None = None  # saguaro modes: mean ms per engine step, by part


def round_costs(group: list[Run]) -> dict[str, float] | None:
    """Where an SSD engine round's wall time goes, in mean milliseconds per round.

    One engine round = one draft request + one batched target forward + verification; its wall
    time runs from one draft request to the next while sequences are in flight. Per round:
    ``target_forward`` is the verification forward, ``waited`` the time from sending the request
    to holding the speculation (cache lookup, backups, any unfinished cache build, messaging),
    ``target_other`` the rest (scheduling, verification arithmetic, commit). The draft's side:
    ``glue``, ``branches`` (branch decoding), ``build`` (their sum, overlapped with the target's
    forward), and on the critical path, inside ``waited``: ``handle`` (answering the request,
    ``backup`` included). What is left of ``waited`` is the build's overrun and messaging.
    ``overran``: the share of rounds whose request found the worker still building; ``cut``: the
    share whose build stopped early because the request rang (its branches are shallower).
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
    ms = 1000.0 / rounds
    out = {
        "rounds": rounds,
        "round": 1000.0 * sum(t["round_s"] for t in totals) / timed,
        "target_forward": sum(rec.target_s for rec in records) * ms,
        "waited": sum(rec.wait_s for rec in records) * ms / per_round if records else 0.0,
    }
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
    verification; ``other``: the rest (scheduling, batching inputs, committing, detokenising).
    ``outside``: the share of the step spent neither in a forward nor in drafting, i.e.
    (verify + other) / step.
    """
    records = [rec for r in group for s in r.gen.records for rec in s]
    steps = len({rec.step for rec in records})
    if not steps:
        return None
    ms = 1000.0 / steps
    out = {
        "step": sum(rec.step_s for rec in records) * ms,
        "forward": sum(rec.target_s for rec in records) * ms,
        "draft": sum(rec.draft_s for rec in records) * ms,
        "verify": sum(rec.verify_s for rec in records) * ms,
    }
    out["other"] = out["step"] - out["forward"] - out["draft"] - out["verify"]
    out["outside"] = (out["verify"] + out["other"]) / out["step"] if out["step"] else 0.0
    return out


def aggregate(runs: list[Run], variants: list[Variant]) -> list[Row]:
    by_label = {v.label: v for v in variants}
    cells: dict[tuple[str, float, int, str], list[Run]] = {}
    for run in runs:
        cells.setdefault((run.dataset, run.temperature, run.batch_size, run.variant), []).append(
            run
        )
    rows = []
    for (dataset, temp, b, label), group in cells.items():
        v = by_label[label]
        reqs = [q for r in group for q in r.gen.requests]
        tokens = sum(len(q.token_ids) for q in reqs)
        elapsed = sum(r.gen.elapsed_s for r in group)
        latencies = [q.latency_s for q in reqs]
        seq_records = [s for r in group for s in r.gen.records]
        spec = summarize(rec for s in seq_records for rec in s) if seq_records else {}
        spec.pop("accepted_histogram", None)
        mal = spec.get("mean_accepted_length")
        forwards = [r.gen.target_forwards for r in group if r.gen.target_forwards is not None]
        if forwards and sum(forwards):
            mal = tokens / sum(forwards)  # hf-assisted: tokens committed per target forward
        full = sum(bonus_counts(s)[0] for s in seq_records)
        hit = sum(bonus_counts(s)[1] for s in seq_records)
        predicted = [r.gen.predicted_speedup for r in group if r.gen.predicted_speedup]
        last_ssd = next((r.gen.ssd_stats for r in reversed(group) if r.gen.ssd_stats), None)
        rows.append(
            Row(
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
                latency_p50_s=percentile(latencies, 50),
                latency_p90_s=percentile(latencies, 90),
                mean_accepted_length=mal if v.mode in SPEC_MODES else None,
                acceptance_rate=spec.get("acceptance_rate") if v.mode in SPEC_MODES else None,
                cache_hit_rate=spec.get("cache_hit_rate"),
                bonus_accuracy=hit / full if full else None,
                predicted_speedup=_mean(predicted),
                draft_failures=sorted({r.gen.draft_failure for r in group if r.gen.draft_failure}),
                speculation=spec if v.mode in SPEC_MODES else {},
                ssd=last_ssd,
                round_costs=round_costs(group) if v.mode == "ssd" else None,
                step_costs=step_costs(group),
            )
        )
    # Speedups within a cell: over AR, and over SD with the same K.
    index = {(r.dataset, r.temperature, r.batch_size, r.mode, r.k, r.sampling): r for r in rows}
    for row in rows:
        cell = (row.dataset, row.temperature, row.batch_size)
        ar = index.get((*cell, "ar", None, row.sampling))
        sd = index.get((*cell, "sd", row.k, row.sampling))
        row.speedup_vs_ar = _ratio(row.tokens_per_s, ar.tokens_per_s if ar else None)
        if row.predicted_speedup is not None:
            row.predicted_speedup = _on_this_machine(row, ar)
        if row.mode != "ar":
            row.speedup_vs_sd = _ratio(row.tokens_per_s, sd.tokens_per_s if sd else None)
    return rows


def _on_this_machine(row: Row, ar: Row | None) -> float | None:
    """docs/design.md §7 counts time in verifications and takes an AR step to cost one, as on a
    GPU. Here an AR step costs ``ar.tpot_s`` (measured in the same cell) and a verification forward
    ``round_costs['target_forward']``, so the prediction scales by their ratio. The prediction's
    inputs (p_hit, E, T_p, T_b, T_o, the verification time) are all measured; what it leaves out
    is messaging, and that a build cut short serves shallower branches."""
    costs = row.round_costs
    if ar is None or ar.tpot_s is None or not costs or not costs["target_forward"]:
        return None
    return row.predicted_speedup * 1000.0 * ar.tpot_s / costs["target_forward"]


# ---- entry point ------------------------------------------------------------------------------


def _model_dirs(cfg: BenchConfig) -> tuple[Path, Path | None]:
    from saguaro.config import EngineConfig, resolve_model_dirs

    spec = any(m in SPEC_MODES for m in cfg.modes)
    return resolve_model_dirs(
        EngineConfig(model=cfg.model, draft=cfg.draft, mode="sd" if spec else "ar", device="cpu")
    )


def run_bench(cfg: BenchConfig, command: list[str]) -> int:
    from saguaro.bench import report
    from saguaro.models.config import ModelConfig
    from saguaro.models.tokenizer import Tokenizer

    started = time.time()
    target_dir, draft_dir = _model_dirs(cfg)
    variants = build_variants(cfg)
    # Room for the longest prompt, the output and one round of speculation.
    lookahead = max(cfg.ks) + 1 if any(v.k for v in variants) else 1
    context = min(
        ModelConfig.from_dir(d).max_position_embeddings for d in (target_dir, draft_dir) if d
    )
    max_prompt = context - cfg.max_tokens - lookahead
    if max_prompt < 1:
        raise ValueError(f"--max-tokens {cfg.max_tokens} leaves no room for a prompt ({context})")
    count = max(batch_count(cfg.num_prompts, b) for b in cfg.batch_sizes)
    prompt_sets = prepare_prompts(cfg, Tokenizer(target_dir), max_prompt, count)
    longest = max(len(t) for ps in prompt_sets for t in ps.token_ids)
    max_model_len = min(context, longest + cfg.max_tokens + lookahead)
    cfg = replace(cfg, device=resolve_device(cfg.device))

    with contextlib.ExitStack() as stack:  # closes LIFO: SSD engines restore CPU pinning in order
        backends: dict[str, Any] = {}
        for v in tqdm(variants, desc="loading", unit="engine", file=sys.stderr):
            if v.mode == "hf-assisted":
                backend: Any = HFAssistedBackend(v, target_dir, draft_dir, cfg.device)
            else:
                backend = SaguaroBackend(v, cfg, max_model_len, max(cfg.batch_sizes))
            stack.callback(backend.close)
            backends[v.label] = backend
        # After the engines exist: SSD pins this process to the target's cores, so every mode
        # is measured under the same placement.
        machine = report.machine_info()
        runs = measure(Plan(cfg, variants, prompt_sets), backends)

    correctness = check_greedy(runs, variants)
    rows = aggregate(runs, variants)
    meta = {
        "command": shlex.join(command),
        "argv": command,
        "config": asdict(cfg),
        "variants": [asdict(v) for v in variants],
        "machine": machine,
        "versions": report.versions(),
        "git": report.git_info(),
        "models": report.model_info(target_dir, draft_dir),
        "prompts": {
            ps.name: {
                "ids": [p.id for p in ps.prompts],
                "tokens_mean": sum(map(len, ps.token_ids)) / len(ps.token_ids),
                "tokens_max": max(map(len, ps.token_ids)),
                "truncated": ps.truncated,
            }
            for ps in prompt_sets
        },
        "max_model_len": max_model_len,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
    }
    paths = report.write_all(Path(cfg.out), meta, rows, runs, correctness)
    print(report.markdown_table(rows))
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if correctness["ok"] is False:
        print(report.correctness_banner(correctness), file=sys.stderr)
        return 1
    return 0


def bench_main(argv: list[str]) -> int:
    """`saguaro bench [flags]`: exit 0 on success, 1 when a mode's greedy tokens differ from
    AR's, 2 on a usage or engine error."""
    try:
        cfg = parse_config(argv)
        return run_bench(cfg, ["saguaro", "bench", *argv])
    except (SaguaroError, ValueError, ImportError) as e:
        print(f"saguaro bench: error: {e}", file=sys.stderr)
        return 2
