"""The run plan: variants and their labels, and the interleaved job order."""

from __future__ import annotations

import pytest
import torch

from saguaro.bench.config import parse_config
from saguaro.bench.plan import Plan, batch_count, build_variants, request_seed
from saguaro.bench.prompts import PromptSet


def test_variants_per_k_fanout_and_c():
    full = parse_config(
        ["--k", "2,4", "--fanout", "auto", "2,1,1", "--modes", "ar,sd,ssd,auto,hf-assisted"]
    )
    labels = [v.label for v in build_variants(full)]
    assert labels == [
        "ar", "sd k=2", "sd k=4", "ssd k=2 f=2,1,1", "ssd k=2 f=auto", "ssd k=4 f=auto",
        "auto k=2", "auto k=4", "hf-assisted k=2", "hf-assisted k=4",
    ]  # fmt: skip
    swept = build_variants(parse_config(["--modes", "ssd", "--saguaro-c", "1,0.5"]))
    assert [(v.label, v.saguaro_c) for v in swept] == [("ssd c=1", 1.0), ("ssd c=0.5", 0.5)]


def test_draft_heads_run_side_by_side_in_the_draft_modes_only():
    cfg = parse_config(["--modes", "ar,sd", "--k", "4", "--draft-head-tokens", "0,32768"])
    got = [(v.label, v.draft_head_tokens) for v in build_variants(cfg)]
    assert got == [("ar", None), ("sd head whole", 0), ("sd head 32768", 32768)]


def test_jobs_interleave_variants_per_batch():
    cfg = parse_config(["--modes", "ar,sd", "--batch-sizes", "2", "--num-prompts", "3"])
    variants = build_variants(cfg)
    ps = PromptSet("p", [], [[1]] * batch_count(3, 2), 0)
    jobs = Plan(cfg, variants, [ps]).jobs()
    assert batch_count(3, 2) == 4  # rounded up to whole batches
    per_temperature = 2 * len(variants)  # two batches of 2, each run by every variant
    assert len(jobs) == len(cfg.temperatures) * per_temperature
    assert sorted(j.variant.label for j in jobs[:2]) == sorted(j.variant.label for j in jobs[2:4])
    assert sorted(j.variant.label for j in jobs[:2]) == ["ar", "sd"]
    assert [j.indices for j in jobs[:4:2]] == [[0, 1], [2, 3]]
    assert len({request_seed(0, r, i) for r in range(3) for i in range(100)}) == 300


def test_each_batch_runs_every_variant_once_in_a_seeded_shuffled_order():
    cfg = parse_config(["--modes", "ar,sd,ssd,auto", "--batch-sizes", "1", "--num-prompts", "8"])
    variants = [v.label for v in build_variants(cfg)]
    ps = PromptSet("p", [], [[1]] * 8, 0)
    jobs = Plan(cfg, build_variants(cfg), [ps]).jobs()
    orders = [tuple(j.variant.label for j in jobs[i : i + 4]) for i in range(0, len(jobs), 4)]
    assert all(sorted(o) == sorted(variants) for o in orders)
    # no variant always follows the same one
    assert len({o.index("ssd") for o in orders}) > 1
    assert [j.variant.label for j in Plan(cfg, build_variants(cfg), [ps]).jobs()] == [
        j.variant.label for j in jobs
    ]  # the seed fixes the order


def test_forwards_and_one_core_baselines_are_labelled_variants():
    cfg = parse_config(
        ["--modes", "ar,sd,ssd,hf-assisted", "--forwards", "eager,compiled", "--one-core-baselines"]
    )
    got = [(v.label, v.forwards == "compiled", v.one_core) for v in build_variants(cfg)]
    assert got == [
        ("ar eager", False, False), ("ar eager 1 core", False, True),
        ("ar compiled", True, False), ("ar compiled 1 core", True, True),
        ("sd eager", False, False), ("sd eager 1 core", False, True),
        ("sd compiled", True, False), ("sd compiled 1 core", True, True),
        ("ssd eager", False, False), ("ssd compiled", True, False),
        ("hf-assisted", False, False),  # its own forwards: one variant
    ]  # fmt: skip
    plain = build_variants(parse_config([]))
    assert all(v.tensor_parallel_size == 1 for v in plain)
    assert all(v.forwards == "eager" and not v.one_core for v in plain)


def test_lookup_is_sd_without_a_draft_model_run_only_when_named():
    assert "lookup" not in {v.mode for v in build_variants(parse_config([]))}
    cfg = parse_config(["--modes", "ar,lookup", "--draft-lookups", "1,2", "--one-core-baselines"])
    got = [(v.label, v.draft_lookup, v.one_core) for v in build_variants(cfg)]
    assert got == [
        ("ar", None, False), ("ar 1 core", None, True),
        ("lookup lookup 1", 1, False), ("lookup lookup 2", 2, False),
        ("lookup lookup 1 1 core", 1, True), ("lookup lookup 2 1 core", 2, True),
    ]  # fmt: skip


def test_graphs_need_a_gpu():
    if torch.cuda.is_available():
        assert parse_config(["--forwards", "eager,graphs", "--device", "cuda"]).forwards
    with pytest.raises(ValueError, match="--forwards graphs replays CUDA graphs"):
        parse_config(["--forwards", "eager,graphs", "--device", "cpu"])


def test_tensor_parallel_sizes_are_side_by_side_variants_of_saguaro_modes_only():
    cfg = parse_config(["--modes", "ar,ssd,llama.cpp", "--tensor-parallel-size", "1,2"])
    got = [(v.label, v.tensor_parallel_size) for v in build_variants(cfg)]
    assert got == [
        ("ar tp=1", 1), ("ar tp=2", 2), ("ssd tp=1", 1), ("ssd tp=2", 2),
        ("llama.cpp", 1),  # its own engine: one variant
    ]  # fmt: skip


def test_dtypes_are_side_by_side_variants_with_their_own_setup():
    cfg = parse_config(["--modes", "ar,sd,llama.cpp", "--dtypes", "float32,bfloat16"])
    variants = build_variants(cfg)
    got = [(v.label, v.dtype) for v in variants]
    assert got == [
        ("ar float32", "float32"), ("ar bfloat16", "bfloat16"),
        ("sd float32", "float32"), ("sd bfloat16", "bfloat16"),
        ("llama.cpp", "float32"),  # its own weights (--llama-cpp-dtype): one variant
    ]  # fmt: skip
    setups = {v.label: v.setup for v in variants}
    assert setups["sd bfloat16"] == setups["ar bfloat16"] != setups["ar float32"]
    assert all(v.dtype == "float32" for v in build_variants(parse_config([])))


def test_draft_dtypes_vary_the_speculative_modes_only_within_their_targets_setup():
    cfg = parse_config(["--modes", "ar,sd,ssd", "--draft-dtypes", "float32,bfloat16"])
    variants = build_variants(cfg)
    got = [(v.label, v.dtype, v.draft_dtype) for v in variants]
    assert got == [
        ("ar", "float32", None),
        ("sd draft float32", "float32", "float32"), ("sd draft bfloat16", "float32", "bfloat16"),
        ("ssd draft float32", "float32", "float32"), ("ssd draft bfloat16", "float32", "bfloat16"),
    ]  # fmt: skip
    # the output is the target's: a bfloat16 draft is compared with (and checked against) AR
    assert len({v.setup for v in variants}) == 1
    assert all(v.draft_dtype is None for v in build_variants(parse_config(["--modes", "sd"])))


def test_largest_k_only_and_autos_paper_layout():
    cfg = parse_config(
        ["--modes", "ar,sd,auto", "--k", "1,4", "--largest-k-only", "auto", "--one-core-baselines"]
    )
    got = [(v.label, v.k, v.one_core) for v in build_variants(cfg)]
    assert got == [
        ("ar", None, False), ("ar 1 core", None, True),
        ("sd k=1", 1, False), ("sd k=4", 4, False), ("sd k=1 1 core", 1, True),
        ("sd k=4 1 core", 4, True), ("auto k=4", 4, False), ("auto k=4 1 core", 4, True),
    ]  # fmt: skip
