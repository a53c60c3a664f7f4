"""Builds the proposer a mode names: the engine is handed this and never imports a strategy."""

from __future__ import annotations

from saguaro.config import EngineConfig
from saguaro.core.proposal import DraftSetup, Proposer
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model


def make_proposer(cfg: EngineConfig, setup: DraftSetup) -> Proposer:
    """SD: the draft in this process, sharing the target's block tables. SSD: a draft worker
    (spawned, or an external one joining), which raises DraftWorkerError if it does not start."""
    if cfg.mode == "sd":
        from saguaro.speculation.sd import DraftProposer

        draft = load_model(
            setup.draft_dir,
            cfg.draft_dtype,
            cfg.device,
            quantization=cfg.draft_quantization,
            kernels=cfg.kernels == "saguaro",
        )
        runner = ModelRunner(draft, setup.num_kv_blocks, cfg.block_size, cfg.device, cfg.compile)
        if cfg.compile:
            runner.warm_up()
        return DraftProposer(runner, cfg.draft_top_m, cfg.sampling)
    if cfg.mode == "ssd":
        from saguaro.speculation.ssd import SSDProposer

        return SSDProposer(cfg, str(setup.draft_dir), setup.max_model_len, setup.vocab_size)
    raise ValueError(f"mode {cfg.mode!r} has no proposer")
