"""Engine configuration: validation and derived settings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from saguaro import placement
from saguaro.config import CPU_STOP_BELOW, LOOKUP_DRAFT, EngineConfig, resolve_model_dirs
from saguaro.errors import ModelLoadError
from saguaro.kernels import build


def test_sampling_auto_is_coupled_for_ssd_and_rejection_otherwise():
    assert EngineConfig(mode="ar", device="cpu").sampling == "rejection"
    assert EngineConfig(mode="sd", device="cpu").sampling == "rejection"
    assert EngineConfig(mode="ssd", device="cpu", pin_cpus=False).sampling == "coupled"
    assert EngineConfig(mode="ssd", device="cpu", sampling="rejection").sampling == "rejection"
    with pytest.raises(ValueError, match="sampling"):
        EngineConfig(sampling="gumbel")


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
        (dict(tensor_parallel_timeout_s=0), "tensor_parallel_timeout_s > 0"),
        (dict(tensor_parallel_size=2, quantization="int4"), "not split over tensor-parallel"),
    ],
)
def test_bad_tensor_parallel_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs fewer than two GPUs")
def test_tensor_parallel_ranks_need_a_gpu_each():
    with pytest.raises(ValueError, match=r"needs GPUs cuda:0..cuda:1; \d are visible"):
        EngineConfig(device="cuda", tensor_parallel_size=2)


@pytest.mark.parametrize("visible", [1, 2, 3])
def test_ssds_worker_takes_the_gpu_after_the_targets_or_warns_that_it_shares(
    monkeypatch, caplog, visible
):
    """The paper's layout by default: the draft on a GPU of its own where one is left. (Only
    the configuration: no GPU is touched.)"""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = EngineConfig(mode="ssd", device="cuda:0")
    assert cfg.draft_device == (None if visible == 1 else "cuda:1")
    assert ("shares cuda:0" in caplog.text) == (visible == 1)
    assert EngineConfig(mode="ssd", device="cuda:0", draft_device="cuda:0").draft_device == "cuda:0"
    assert EngineConfig(mode="sd", device="cuda:0").draft_device is None


@pytest.mark.skipif(len(placement.process_cpus()) < 2, reason="SSD pins on two cores or more")
def test_ssd_on_cpu_leaves_the_worker_a_core_after_the_ranks():
    cfg = EngineConfig(mode="ssd", device="cpu", tensor_parallel_size=4)
    cores = placement.process_cpus()
    assert cfg.target_cpus == cores[: min(4, len(cores) - 1)]
    assert cfg.draft_cpus == [c for c in cores if c not in cfg.target_cpus][:1]


def test_kernels_auto_is_saguaros_on_cpu_and_torchs_where_they_cannot_run():
    assert EngineConfig(device="cpu").kernels == "saguaro"
    assert EngineConfig(device="cpu", compile=True).kernels == "torch"
    assert EngineConfig(device="cpu", draft_dtype="float16").kernels == "torch"
    with pytest.raises(ValueError, match="--kernels torch"):
        EngineConfig(device="cpu", compile=True, kernels="saguaro")


def test_kernels_auto_takes_torchs_operators_with_one_line_where_the_kernels_cannot_build(
    monkeypatch, caplog, capsys
):
    monkeypatch.setattr(build, "build_error", lambda: "no C compiler was found")
    with caplog.at_level(logging.WARNING, logger="saguaro"):
        assert EngineConfig(device="cpu").kernels == "torch"
    assert [r.getMessage() for r in caplog.records] == [
        "saguaro's CPU kernels cannot be built (no C compiler was found): torch's operators"
    ]
    assert build.main() == 0  # the installer goes on
    assert "cannot be built here (no C compiler was found)" in capsys.readouterr().out


def test_the_kernels_name_a_missing_compiler(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ModelLoadError, match="need a C compiler"):
        build.compile_library(Path("unused.so"), [])


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(draft_lookup=-1), r"draft_lookup must be >= 0"),
        (dict(copy_lookup=-1), r"copy_lookup must be >= 0"),
        (dict(draft_head_tokens=-1), r"draft_head_tokens must be >= 0"),
        (dict(draft_stop_below=1.5), r"draft_stop_below must be in \[0, 1\]"),
        (dict(draft_stop_below=-0.1), r"draft_stop_below must be in \[0, 1\]"),
    ],
)
def test_bad_draft_chain_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(mode="ssd"), r"runs no draft model: mode sd only, got 'ssd'"),
        (dict(mode="auto"), r"runs no draft model: mode sd only, got 'auto'"),
        (dict(copy_lookup=0), r"copies by copy_lookup's rule: need it >= 1"),
    ],
)
def test_the_lookup_draft_is_for_sd_with_copies(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(draft=LOOKUP_DRAFT, **fields)


def test_the_lookup_draft_means_sd_and_no_draft_directory(tmp_path):
    cfg = EngineConfig(model=str(tmp_path), draft=LOOKUP_DRAFT)
    assert cfg.mode == "sd"
    assert resolve_model_dirs(cfg) == (tmp_path, None)


def test_the_confidence_stop_defaults_to_the_cpus_threshold():
    assert EngineConfig(device="cpu").draft_stop_below == CPU_STOP_BELOW
    assert EngineConfig(device="cpu", draft_stop_below=0).draft_stop_below == 0
