"""Core placement for SSD on CPU: pins are counted and given back in any order."""

from __future__ import annotations

import os

import pytest
import torch

from saguaro import placement
from saguaro.config import EngineConfig


def test_overlapping_engines_share_one_placement_and_unpin_in_any_order(monkeypatch):
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cores = placement.process_cpus()  # an earlier engine of this process may still hold a pin
    if len(cores) < 2:
        pytest.skip("placement needs two cores")
    monkeypatch.setattr(placement, "_pins", 0)  # both restored after: an earlier engine's pin
    monkeypatch.setattr(placement, "_unpinned", None)  # stays as that engine left it
    try:
        os.sched_setaffinity(0, cores)
        first = EngineConfig(mode="ssd", device="cpu")
        assert first.target_cpus and first.draft_cpus
        assert not set(first.target_cpus) & set(first.draft_cpus)
        placement.pin_process(first.target_cpus, 1)  # what the first engine does
        second = EngineConfig(mode="ssd", device="cpu")
        # not planned from the pinned set: the worker would share the target's core
        assert (second.target_cpus, second.draft_cpus) == (first.target_cpus, first.draft_cpus)
        placement.pin_process(second.target_cpus, 1)
        placement.unpin_process()  # the first engine closes before the second
        assert os.sched_getaffinity(0) == set(first.target_cpus)
        placement.unpin_process()
        assert os.sched_getaffinity(0) == set(cores) and torch.get_num_threads() == threads
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def test_an_engine_that_fails_to_start_gives_its_pin_back(tmp_path):
    before = os.sched_getaffinity(0)
    missing = str(tmp_path / "missing")
    cfg = EngineConfig(model=missing, draft=missing, mode="ssd", device="cpu")
    if not cfg.target_cpus:
        pytest.skip("placement needs two cores")
    from saguaro.engine.engine import LLMEngine
    from saguaro.errors import ModelLoadError
    from saguaro.speculation.factory import make_proposer

    with pytest.raises(ModelLoadError, match="does not exist"):
        LLMEngine(cfg, make_proposer)
    assert os.sched_getaffinity(0) == before


def test_resolve_device():
    assert placement.resolve_device("cpu") == "cpu"
    assert placement.resolve_device("cuda:1") == "cuda:1"
    assert placement.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
