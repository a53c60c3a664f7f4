"""The engine's target, loaded and sized: its directories (and the draft's) checked, its
tokenizer, weights and runner, the longest sequence it serves and the KV blocks it holds.

What the engine steps with is built here once; :class:`~saguaro.engine.engine.LLMEngine` adds the
scheduler, the proposer and the per-request state around it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from saguaro.config import EngineConfig, resolve_model_dirs
from saguaro.engine.graphs import graph_buckets
from saguaro.engine.model_runner import ModelRunner
from saguaro.engine.tensor_parallel import TensorParallelTarget
from saguaro.errors import IncompatibleModelsError, ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.llama import CausalLM
from saguaro.models.loader import load_model, model_exists
from saguaro.models.tokenizer import Tokenizer, has_tokenizer

log = logging.getLogger("saguaro")

GIB = 2**30


@dataclass
class LoadedTarget:
    """What :func:`load_target` builds: the models' directories, the target's tokenizer,
    config and runner (warmed up, graphs captured), its tensor-parallel ranks (None: one
    process), the longest sequence served, the ids that end a sequence and the KV blocks."""

    target_dir: Path
    draft_dir: Path | None
    tokenizer: Tokenizer
    model_config: ModelConfig
    max_model_len: int
    eos_token_ids: frozenset[int]
    num_blocks: int
    runner: ModelRunner
    tensor_parallel: TensorParallelTarget | None


def check_compatible(target_dir: Path, draft_dir: Path, tokenizer: Tokenizer) -> None:
    """Draft proposals are token ids the target scores: both must mean the same thing by them."""
    t_cfg, d_cfg = ModelConfig.from_dir(target_dir), ModelConfig.from_dir(draft_dir)
    if has_tokenizer(draft_dir):
        d_tok = Tokenizer(draft_dir)
        if d_tok.fingerprint() != tokenizer.fingerprint():
            raise IncompatibleModelsError(
                f"draft tokenizer ({draft_dir}) differs from the target's ({target_dir}): "
                f"{d_tok.vocab_size} vs {tokenizer.vocab_size} tokens, ids differ"
            )
    if t_cfg.vocab_size != d_cfg.vocab_size:
        raise IncompatibleModelsError(
            f"draft vocab_size {d_cfg.vocab_size} ({draft_dir}) != target vocab_size "
            f"{t_cfg.vocab_size} ({target_dir})"
        )


def checked_dirs(cfg: EngineConfig) -> tuple[Path, Path | None, Tokenizer]:
    """The target's and the draft's directories, both present and compatible; the target's
    tokenizer."""
    target_dir, draft_dir = resolve_model_dirs(cfg)
    if not model_exists(target_dir):
        raise ModelLoadError(f"model {str(target_dir)!r} does not exist")
    tokenizer = Tokenizer(target_dir)
    if draft_dir is not None:
        if not model_exists(draft_dir):
            raise ModelLoadError(f"draft model {str(draft_dir)!r} does not exist")
        check_compatible(target_dir, draft_dir, tokenizer)
    return target_dir, draft_dir, tokenizer


def warn_inexact(cfg: EngineConfig) -> None:
    """Warn where speculative decoding's greedy output may part from AR's (16-bit weights on
    torch's operators)."""
    if cfg.mode != "ar" and cfg.dtype != "float32" and cfg.kernels == "torch":
        # On torch's operators a token's logits depend, in their last bits, on how many
        # positions share its forward (1 in AR, K + 1 in verification): within one rounding
        # unit of the logits, which in 16-bit floats is wide enough for near-ties to go the
        # other way. saguaro's kernels compute each token alone, whatever shares its forward.
        log.warning(
            "saguaro: %s weights on torch's operators: speculative decoding samples from the "
            "target's K+1-position forwards, whose logits differ from AR's one-position "
            "forwards by rounding; its greedy output can part from AR's at near-ties "
            "(--kernels saguaro keeps them equal)",
            cfg.dtype,
        )


def kv_blocks(cfg: EngineConfig, target: CausalLM, max_model_len: int) -> int:
    """KV-cache blocks: ``num_kv_blocks``, else what ``kv_cache_gb`` holds, at most what
    ``max_num_seqs`` full sequences need and at least one: with ``b = ceil(max_model_len /
    block_size)``, ``max(b, min(b * max_num_seqs, kv_cache_gb GiB // bytes per block))``."""
    blocks_per_seq = -(-max_model_len // cfg.block_size)
    num_blocks = cfg.num_kv_blocks or max(
        blocks_per_seq,
        min(
            blocks_per_seq * cfg.max_num_seqs,
            int(cfg.kv_cache_gb * GIB) // ModelRunner.kv_bytes_per_block(target, cfg.block_size),
        ),
    )
    if num_blocks < blocks_per_seq:
        raise ValueError(
            f"num_kv_blocks={num_blocks} cannot hold one sequence of max_model_len="
            f"{max_model_len} ({blocks_per_seq} blocks of {cfg.block_size} tokens)"
        )
    return num_blocks


def kv_report(num_blocks: int, block_size: int, bytes_per_block: int, max_model_len: int) -> str:
    """The KV pool's size in words: blocks, tokens, memory and full-length sequences."""
    tokens = num_blocks * block_size
    return (
        f"KV cache {num_blocks} blocks of {block_size} tokens ({tokens} tokens, "
        f"{num_blocks * bytes_per_block / GIB:.2f} GiB): {tokens / max_model_len:.1f} sequences "
        f"of max_model_len {max_model_len}"
    )


def target_runner(
    cfg: EngineConfig,
    target: CausalLM,
    num_blocks: int,
    max_model_len: int,
    tensor_parallel: TensorParallelTarget | None,
) -> ModelRunner:
    """The target's runner, warmed up (``compile``) and its graphs captured."""
    if tensor_parallel is not None:
        runner = tensor_parallel.runner(target, num_blocks, cfg.block_size)
    else:
        buckets = graph_buckets(
            cfg.graphs, cfg.max_num_seqs, max_model_len + cfg.lookahead, cfg.num_speculative_tokens
        )
        runner = ModelRunner(
            target,
            num_blocks,
            cfg.block_size,
            cfg.device,
            cfg.compile,
            buckets=buckets,
            prefault=cfg.kv_prefault,
        )
    if cfg.compile:
        runner.warm_up()
    runner.capture_graphs((1, cfg.lookahead + 1))
    return runner


def load_target(cfg: EngineConfig) -> LoadedTarget:
    """Check the models' directories, load the target (rank 0's slices of it under tensor
    parallelism, whose ranks are stopped again if anything after their start fails), size its
    KV cache and build its runner."""
    target_dir, draft_dir, tokenizer = checked_dirs(cfg)
    warn_inexact(cfg)
    tp = TensorParallelTarget(cfg, target_dir) if cfg.tensor_parallel_size > 1 else None
    try:
        if tp is not None:
            target = tp.load()
        else:
            kernels = cfg.kernels == "saguaro"
            target = load_model(
                target_dir, cfg.dtype, cfg.device, quantization=cfg.quantization, kernels=kernels
            )
        config = target.config
        max_model_len = min(
            cfg.max_model_len or config.max_position_embeddings, config.max_position_embeddings
        )
        eos = frozenset(config.eos_token_ids) | frozenset(
            t for t in [tokenizer.eos_token_id] if t is not None
        )
        num_blocks = kv_blocks(cfg, target, max_model_len)
        runner = target_runner(cfg, target, num_blocks, max_model_len, tp)
    except BaseException:
        if tp is not None:
            tp.close()
        raise
    return LoadedTarget(
        target_dir, draft_dir, tokenizer, config, max_model_len, eos, num_blocks, runner, tp
    )
