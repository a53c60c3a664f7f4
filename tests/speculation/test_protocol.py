"""The worker's settings are mapped from the engine's in one place."""

from __future__ import annotations

import dataclasses

from saguaro.config import EngineConfig
from saguaro.speculation import protocol as P


def test_worker_config_from_engine_maps_every_field():
    engine = EngineConfig(
        num_speculative_tokens=3,
        fanout=[4, 3, 2, 1],
        cache_budget=9,
        saguaro_c=0.5,
        draft_top_m=32,
        max_num_seqs=5,
        block_size=8,
        dtype="float32",
        draft_dtype="bfloat16",
        draft_quantization="int8",
        draft_head_tokens=4096,
        device="cpu",
        draft_device="cuda:1",
        draft_cpus=[2, 3],
        draft_threads=2,
        seed=7,
        pin_cpus=False,
        compile=True,
        draft_lookup=3,
        draft_stop_below=0.25,
        kv_prefault=True,
    )
    cfg = P.WorkerConfig.from_engine(engine, "/models/draft", max_model_len=300)
    assert dataclasses.asdict(cfg) == dict(
        draft_dir="/models/draft",
        k=3,
        fanout=[4, 3, 2, 1],
        budget=9,
        saguaro_c=0.5,
        top_m=32,
        max_model_len=300,
        max_num_seqs=5,
        block_size=8,
        dtype="bfloat16",
        quantization="int8",
        head_tokens=4096,
        kernels=False,  # --compile runs torch's operators
        device="cuda:1",
        cpus=[2, 3],
        num_threads=2,
        seed=7,
        compile=True,
        graphs=True,  # its own GPU, enforce_eager off
        lane=False,  # the target is on the CPU
        lookup=dict(min_ngram=3, max_ngram=4),
        stop_below=0.25,
        prefault=True,
    )
    eager = dataclasses.replace(engine, enforce_eager=True)
    assert not P.WorkerConfig.from_engine(eager, "d", max_model_len=300).graphs
    never = dataclasses.replace(engine, draft_lookup=0)
    assert P.WorkerConfig.from_engine(never, "d", max_model_len=300).lookup is None


def test_the_worker_runs_on_the_engines_device_unless_told_otherwise():
    engine = EngineConfig(device="cpu", pin_cpus=False)
    cfg = P.WorkerConfig.from_engine(engine, "d", max_model_len=64)
    assert cfg.device == "cpu" and cfg.fanout == "auto" and cfg.budget is None


def test_the_draft_runs_in_the_engines_dtype_unless_told_otherwise():
    engine = EngineConfig(device="cpu", pin_cpus=False, dtype="bfloat16")
    assert P.WorkerConfig.from_engine(engine, "d", max_model_len=64).dtype == "bfloat16"
    engine = EngineConfig(device="cpu", pin_cpus=False, draft_dtype="float16")
    assert engine.dtype == "float32"
    assert P.WorkerConfig.from_engine(engine, "d", max_model_len=64).dtype == "float16"


def test_a_device_lane_joins_two_different_gpus_only():
    assert P.lane_between("cuda:0", "cuda:1") and P.lane_between("cuda", "cuda:2")
    assert not P.lane_between("cuda", "cuda:0")  # one GPU: NCCL cannot pair it with itself
    assert not P.lane_between("cpu", "cuda:1") and not P.lane_between("cpu", "cpu")
