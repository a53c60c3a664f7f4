"""The timed loop: warm every backend up outside the measurement, then run the plan's jobs in
order (the variants interleaved per batch, A B C A B C ..., so machine drift hits them alike).
A variant whose backend raises (a peer binary's exit, an engine error) stops there: the error is
kept, its runs are dropped, and the other variants go on, so one failure costs no one else's
measurements."""

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


@dataclass
class Measured:
    """The runs of the variants that completed, and the error of each that did not."""

    runs: list[Run]
    failed: dict[str, str]


def _failure(label: str, err: Exception, failed: dict[str, str]) -> None:
    failed[label] = f"{type(err).__name__}: {err}"
    print(f"saguaro bench: {label} failed and is dropped: {failed[label]}", file=sys.stderr)


def warm_up(plan: Plan, backends: dict[str, Backend], failed: dict[str, str]) -> None:
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
        try:
            backends[v.label].generate(first.token_ids[:warm_n], warm)
        except Exception as err:  # noqa: BLE001 (any failure of one variant; kept, not hidden)
            _failure(v.label, err, failed)


def measure(plan: Plan, backends: dict[str, Backend]) -> Measured:
    """Warm up, then one :class:`Run` per job of the plan, in its order, for every variant
    that does not fail."""
    failed: dict[str, str] = {}
    warm_up(plan, backends, failed)
    runs = []
    jobs = plan.jobs()
    with tqdm(total=len(jobs), desc="bench", unit="run", file=sys.stderr) as bar:
        for job in jobs:
            ps, temp, v = job.prompts, job.temperature, job.variant
            bar.update()
            if v.label in failed:
                continue
            bar.set_postfix_str(f"{ps.name} T={temp:g} b={job.batch_size} {v.label}")
            try:
                gen = backends[v.label].generate(
                    [ps.token_ids[i] for i in job.indices],
                    request_params(plan.cfg, temp, job.repeat, job.indices),
                )
            except Exception as err:  # noqa: BLE001 (as in warm_up)
                _failure(v.label, err, failed)
                continue
            for i, req in zip(job.indices, gen.requests, strict=True):
                req.prompt_id = ps.prompts[i].id
            runs.append(
                Run(ps.name, temp, job.batch_size, v.label, job.repeat, job.batch_index, gen)
            )
    return Measured([r for r in runs if r.variant not in failed], failed)
