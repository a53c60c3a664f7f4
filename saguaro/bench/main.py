"""`saguaro bench`: AR, SD, SSD and Hugging Face assisted generation side by side.

Every mode runs the same prompts, output length and sampling settings. Modes are interleaved per
batch of prompts (A B C A B C ...) so machine drift hits them alike; each engine is warmed up
first, outside the measurement. At temperature 0 every mode must reproduce AR's tokens exactly:
any difference is reported loudly and makes the command exit 1.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from saguaro.bench import prompts, provenance, report
from saguaro.bench.aggregate import Row, aggregate
from saguaro.bench.backends import (
    Backend,
    HFAssistedBackend,
    SaguaroBackend,
    check_hf_pair,
    peer_backend,
)
from saguaro.bench.check import check_greedy, not_checked
from saguaro.bench.config import (
    DRAFT_MODEL_MODES,
    HF_MODE,
    PEER_MODES,
    BenchConfig,
    parse_config,
)
from saguaro.bench.measure import measure
from saguaro.bench.plan import Plan, Variant, batch_count, build_variants
from saguaro.bench.prompts import PromptSet
from saguaro.bench.tables import correctness_banner, markdown_table
from saguaro.config import EngineConfig, resolve_model_dirs
from saguaro.models.config import ModelConfig
from saguaro.models.tokenizer import Tokenizer
from saguaro.placement import resolve_device

# Exit codes of `saguaro bench`.
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
TIMESTAMP = "%Y-%m-%dT%H:%M:%S%z"  # ISO 8601 with the UTC offset


def model_dirs(cfg: BenchConfig) -> tuple[Path, Path | None]:
    """The target's and (if any mode speculates) the draft's directory, the default pair's
    where not given."""
    spec = any(m in DRAFT_MODEL_MODES for m in cfg.modes)
    return resolve_model_dirs(
        EngineConfig(model=cfg.model, draft=cfg.draft, mode="sd" if spec else "ar", device="cpu")
    )


def load_backends(
    cfg: BenchConfig,
    plan: Plan,
    target_dir: Path,
    draft_dir: Path | None,
    max_model_len: int,
    stack: contextlib.ExitStack,
) -> dict[str, Backend]:
    """One backend per variant, by label, each closed by ``stack``."""
    backends: dict[str, Backend] = {}
    for v in tqdm(plan.variants, desc="loading", unit="engine", file=sys.stderr):
        if v.mode == HF_MODE:
            assert draft_dir is not None  # a speculative mode resolves a draft
            backend: Backend = HFAssistedBackend(v, target_dir, draft_dir, cfg.device)
        elif v.mode in PEER_MODES:
            backend = peer_backend(v, cfg, target_dir, draft_dir, max_model_len)
        else:
            backend = SaguaroBackend(v, cfg, max_model_len, max(cfg.batch_sizes))
        stack.callback(backend.close)
        backends[v.label] = backend
    return backends


@dataclass(frozen=True)
class _Prepared:
    """What the measurement runs on: the plan, the models' directories and the engines' context
    length."""

    plan: Plan
    target_dir: Path
    draft_dir: Path | None
    max_model_len: int


def _lookahead(cfg: BenchConfig, variants: list[Variant]) -> int:
    """Tokens a request may need past its prompt and output: one round of speculation, K
    proposals and the bonus token (AR: the one token of a step)."""
    return max(cfg.ks) + 1 if any(v.k for v in variants) else 1


def _load_prompts(
    cfg: BenchConfig, target_dir: Path, context: int, lookahead: int
) -> list[PromptSet]:
    """The prompt sets, each prompt cut to leave room in ``context`` for the output and
    ``lookahead``; enough prompts for whole batches at every batch size."""
    max_prompt = context - cfg.max_tokens - lookahead
    if max_prompt < 1:
        raise ValueError(f"--max-tokens {cfg.max_tokens} leaves no room for a prompt ({context})")
    count = max(batch_count(cfg.num_prompts, b) for b in cfg.batch_sizes)
    return prompts.prepare_prompts(cfg, Tokenizer(target_dir), max_prompt, count)


def _prepare(cfg: BenchConfig) -> _Prepared:
    """Resolve the models, build the variants and load the prompts: the plan (its config with
    the device resolved) and the context length its engines need."""
    target_dir, draft_dir = model_dirs(cfg)
    if HF_MODE in cfg.modes:
        assert draft_dir is not None  # a speculative mode resolves a draft
        check_hf_pair(target_dir, draft_dir)
    variants = build_variants(cfg)
    lookahead = _lookahead(cfg, variants)
    context = min(
        ModelConfig.from_dir(d).max_position_embeddings for d in (target_dir, draft_dir) if d
    )
    prompt_sets = _load_prompts(cfg, target_dir, context, lookahead)
    longest = max(len(t) for ps in prompt_sets for t in ps.token_ids)
    max_model_len = min(context, longest + cfg.max_tokens + lookahead)
    cfg = replace(cfg, device=resolve_device(cfg.device))
    return _Prepared(Plan(cfg, variants, prompt_sets), target_dir, draft_dir, max_model_len)


def _metadata(
    prep: _Prepared,
    command: list[str],
    machine: dict[str, Any],
    started: float,
    failed: dict[str, str],
) -> dict[str, Any]:
    """The report's provenance: command, config, variants, machine, versions, models, prompts,
    timing and the variants that failed."""
    return {
        "command": shlex.join(command),
        "argv": command,
        "config": asdict(prep.plan.cfg),
        "variants": [asdict(v) for v in prep.plan.variants],
        "machine": machine,
        "versions": provenance.versions(),
        "git": provenance.git_info(),
        "models": provenance.model_info(prep.target_dir, prep.draft_dir),
        "prompts": prompts.summary(prep.plan.prompt_sets),
        "max_model_len": prep.max_model_len,
        "started_at": time.strftime(TIMESTAMP, time.localtime(started)),
        "duration_s": time.time() - started,
        "failed": failed,
    }


def _exit_code(
    rows: list[Row], paths: list[Path], correctness: dict[str, Any], failed: bool
) -> int:
    """Print the results table and where they were written (and any greedy mismatch): the exit
    code."""
    print(markdown_table(rows))
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if correctness["ok"] is False:
        print(correctness_banner(correctness), file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_ERROR if failed else EXIT_OK


def run_bench(cfg: BenchConfig, command: list[str]) -> int:
    """Load the prompts and engines, measure, check, aggregate and write the report; the exit
    code."""
    started = time.time()
    prep = _prepare(cfg)
    plan, cfg = prep.plan, prep.plan.cfg
    with contextlib.ExitStack() as stack:
        backends = load_backends(
            cfg, plan, prep.target_dir, prep.draft_dir, prep.max_model_len, stack
        )
        machine = provenance.machine_info()
        measured = measure(plan, backends)
    runs = measured.runs
    variants = [v for v in plan.variants if v.label not in measured.failed]

    correctness = (
        check_greedy(runs, variants)
        if cfg.synthetic_acceptance is None
        else not_checked("synthetic acceptance")
    )
    rows = aggregate(runs, variants)
    meta = _metadata(prep, command, machine, started, measured.failed)
    paths = report.write_all(Path(cfg.out), meta, rows, runs, correctness)
    return _exit_code(rows, paths, correctness, bool(measured.failed))


def bench_main(argv: list[str]) -> int:
    """`saguaro bench [flags]`: exit 0 on success, 1 when a mode's greedy tokens differ from
    AR's, 2 when a variant failed and was dropped from the results written (a usage or engine
    error also exits 2: saguaro.errors.run_command)."""
    return run_bench(parse_config(argv), ["saguaro", "bench", *argv])
