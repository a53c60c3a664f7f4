"""Engine configuration: core placement for SSD on CPU."""

from __future__ import annotations

import os

import pytest

from saguaro import config
from saguaro.config import EngineConfig


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two cores")
def test_an_engine_created_while_another_holds_the_pin_gets_the_same_placement(monkeypatch):
    monkeypatch.setattr(config, "_unpinned_cpus", None)
    before = os.sched_getaffinity(0)
    first = EngineConfig(mode="ssd", device="cpu")
    assert first.target_cpus and first.draft_cpus
    assert not set(first.target_cpus) & set(first.draft_cpus)
    try:
        config.pin_process(first.target_cpus)  # what the first engine does
        second = EngineConfig(mode="ssd", device="cpu")
        # not planned from the pinned set: the worker would share the target's core
        assert (second.target_cpus, second.draft_cpus) == (first.target_cpus, first.draft_cpus)
    finally:
        os.sched_setaffinity(0, before)
