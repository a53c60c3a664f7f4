"""Engine configuration: core placement for SSD on CPU."""

from __future__ import annotations

import os

import pytest

from saguaro import config
from saguaro.config import EngineConfig


def test_an_engine_created_while_another_holds_the_pin_gets_the_same_placement(monkeypatch):
    before = os.sched_getaffinity(0)
    cores = config.process_cpus()  # an earlier engine of this process may still hold the pin
    if len(cores) < 2:
        pytest.skip("placement needs two cores")
    monkeypatch.setattr(config, "_unpinned_cpus", None)
    try:
        os.sched_setaffinity(0, cores)
        first = EngineConfig(mode="ssd", device="cpu")
        assert first.target_cpus and first.draft_cpus
        assert not set(first.target_cpus) & set(first.draft_cpus)
        config.pin_process(first.target_cpus)  # what the first engine does
        second = EngineConfig(mode="ssd", device="cpu")
        # not planned from the pinned set: the worker would share the target's core
        assert (second.target_cpus, second.draft_cpus) == (first.target_cpus, first.draft_cpus)
    finally:
        os.sched_setaffinity(0, before)
