"""The timed loop: warm every backend up outside the measurement, then run the plan's jobs in
order (the variants interleaved per batch, A B C A B C ..., so machine drift hits them alike)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from tqdm import tqdm

from saguaro.bench.backends import Backend, Generation
from saguaro.bench.plan import Plan, request_params

# Output tokens of each warm-up request (at most max_tokens): a few rounds of every mode, so that
# first-call costs (allocation, lazy initialisation) fall outside the measurement.
WARMUP_TOKENS = 16


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


def warm_up(plan: Plan, backends: dict[str, Backend]) -> None:
    """One unmeasured call per variant: a batch of the first prompts, as large as the largest
    measured batch, at the first temperature."""
    cfg = plan.cfg
    first = plan.prompt_sets[0]
    warm_n = min(max(cfg.batch_sizes), len(first.token_ids))
    warm = [
        replace(p, max_tokens=min(WARMUP_TOKENS, cfg.max_tokens))
        for p in request_params(cfg, cfg.temperatures[0], 0, list(range(warm_n)))
    ]
    for v in plan.variants:
        backends[v.label].generate(first.token_ids[:warm_n], warm)


def measure(plan: Plan, backends: dict[str, Backend]) -> list[Run]:
    """Warm up, then one :class:`Run` per job of the plan, in its order."""
    warm_up(plan, backends)
    runs = []
    jobs = plan.jobs()
    with tqdm(total=len(jobs), desc="bench", unit="run", file=sys.stderr) as bar:
        for job in jobs:
            ps, temp, v = job.prompts, job.temperature, job.variant
            bar.set_postfix_str(f"{ps.name} T={temp:g} b={job.batch_size} {v.label}")
            gen = backends[v.label].generate(
                [ps.token_ids[i] for i in job.indices],
                request_params(plan.cfg, temp, job.repeat, job.indices),
            )
            for i, req in zip(job.indices, gen.requests, strict=True):
                req.prompt_id = ps.prompts[i].id
            runs.append(
                Run(ps.name, temp, job.batch_size, v.label, job.repeat, job.batch_index, gen)
            )
            bar.update()
    return runs
