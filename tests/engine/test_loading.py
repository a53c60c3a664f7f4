"""The target's sizing: max_model_len within the model's positions, and the KV pool between one
sequence and max_num_seqs of them, else what kv_cache_gb holds."""

from __future__ import annotations

import pytest

from saguaro.config import EngineConfig
from saguaro.engine.loading import GIB, kv_blocks, load_target
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model

BLOCK = 16


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_model(tiny_llama)


def config(tiny_llama, **kw) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama), device="cpu", block_size=BLOCK, **kw)


def test_the_pool_holds_max_num_seqs_sequences_at_most(tiny_llama, target):
    cfg = config(tiny_llama, max_num_seqs=3, kv_cache_gb=1.0)
    assert kv_blocks(cfg, target, 100) == 3 * 7  # ceil(100 / 16) blocks a sequence


def test_the_pool_is_what_kv_cache_gb_holds_and_one_sequence_at_least(tiny_llama, target):
    per_block = ModelRunner.kv_bytes_per_block(target, BLOCK)
    cfg = config(tiny_llama, max_num_seqs=64, kv_cache_gb=10 * per_block / GIB)
    assert kv_blocks(cfg, target, 64) == 10
    assert kv_blocks(cfg, target, 16 * 12) == 12  # less than one sequence: one sequence


def test_num_kv_blocks_wins_unless_it_cannot_hold_one_sequence(tiny_llama, target):
    assert kv_blocks(config(tiny_llama, num_kv_blocks=5), target, 64) == 5
    with pytest.raises(ValueError, match="num_kv_blocks=3 cannot hold one sequence"):
        kv_blocks(config(tiny_llama, num_kv_blocks=3), target, 64)


def test_load_target_caps_max_model_len_at_the_models_positions(tiny_llama):
    loaded = load_target(config(tiny_llama, max_model_len=10**6))
    assert loaded.max_model_len == loaded.model_config.max_position_embeddings
    assert loaded.tensor_parallel is None and loaded.draft_dir is None
    assert loaded.runner.num_slots == loaded.num_blocks * BLOCK
