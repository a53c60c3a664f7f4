"""Builds the proposer a mode names: the engine is handed this and never imports a strategy."""

from __future__ import annotations

from saguaro.config import EngineConfig
from saguaro.core.proposal import DraftSetup, Proposer
from saguaro.engine.graphs import graph_buckets
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from saguaro.speculation.auto import AutoProposer, Threads
from saguaro.speculation.lookup import LookupProposer
from saguaro.speculation.ngram import Lookup
from saguaro.speculation.sd import DraftProposer
from saguaro.speculation.ssd import SSDProposer
from saguaro.speculation.supervisor import Supervised


def make_proposer(cfg: EngineConfig, setup: DraftSetup) -> Proposer:
    """SD: the draft in this process, sharing the target's block tables. SSD: a supervised draft
    worker (spawned, or an external one joining), which raises DraftWorkerError if it does not
    start. auto: both (SSD where ``auto_ssd``), chosen between step by step; SD and SSD with
    ``ar_fallback``: the same chooser, between AR and their own. SD with no draft model
    (``draft="lookup"``): copies from the context alone."""
    if cfg.mode == "sd" and setup.draft_dir is None:
        lookup = Lookup.of(cfg.copy_lookup)
        assert lookup is not None  # EngineConfig refuses draft="lookup" with copy_lookup 0
        return LookupProposer(lookup)
    if cfg.chooses_steps:
        return _chooser(cfg, setup)
    if cfg.mode == "sd":
        return _in_process(cfg, setup)
    if cfg.mode == "ssd":
        return _worker(cfg, setup)
    raise ValueError(f"mode {cfg.mode!r} has no proposer")


def _chooser(cfg: EngineConfig, setup: DraftSetup) -> AutoProposer:
    """auto's proposer; for SD and SSD with ``ar_fallback``, its choices cut to AR and theirs
    (SSD's keeps the in-process draft to time it)."""
    sd = _in_process(cfg, setup)
    try:
        ssd = _worker(cfg, setup) if cfg.uses_worker else None
    except BaseException:
        sd.close()
        raise
    auto = cfg.mode == "auto"
    return AutoProposer(
        sd,
        ssd,
        cfg.num_speculative_tokens,
        cfg.max_num_seqs,
        _shared_threads(cfg),
        Lookup.of(cfg.copy_lookup) if auto else None,
        modes=None if auto else ("ar", cfg.mode),
        feeds=cfg.worker_owns_cores,
    )


def _shared_threads(cfg: EngineConfig) -> Threads | None:
    """auto on shared cores: every target core's thread for AR and SD, the worker's left out
    for SSD (EngineConfig.shares_cores)."""
    if not cfg.shares_cores or cfg.target_cpus is None or cfg.draft_cpus is None:
        return None
    own = [c for c in cfg.target_cpus if c not in cfg.draft_cpus]
    return Threads(other=cfg.num_threads or len(cfg.target_cpus), ssd=max(1, len(own)))


def _in_process(cfg: EngineConfig, setup: DraftSetup) -> DraftProposer:
    draft = load_model(
        setup.draft_dir,
        cfg.draft_dtype,
        cfg.device,
        quantization=cfg.draft_quantization,
        kernels=cfg.kernels == "saguaro",
        draft=True,
        head_tokens=cfg.draft_head_tokens,
    )
    k = cfg.num_speculative_tokens
    buckets = graph_buckets(cfg.graphs, cfg.max_num_seqs, setup.max_model_len + k, k)
    runner = ModelRunner(
        draft,
        setup.num_kv_blocks,
        cfg.block_size,
        cfg.device,
        cfg.compile,
        buckets=buckets,
        prefault=cfg.kv_prefault,
    )
    if cfg.compile:
        runner.warm_up()
    runner.capture_graphs((1,))  # the proposing forwards, at start rather than inside a request
    lookup = Lookup.of(cfg.draft_lookup)
    return DraftProposer(runner, cfg.draft_top_m, cfg.sampling, lookup, cfg.draft_stop_below)


def _worker(cfg: EngineConfig, setup: DraftSetup) -> Supervised:
    def start() -> SSDProposer:
        return SSDProposer(cfg, str(setup.draft_dir), setup.max_model_len, setup.vocab_size)

    return Supervised(
        start, cfg.num_speculative_tokens, cfg.draft_restarts, cfg.draft_restart_backoff_s
    )
