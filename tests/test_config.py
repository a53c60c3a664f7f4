"""Engine configuration: validation and derived settings."""

from __future__ import annotations

import pytest

from saguaro.config import EngineConfig


def test_sampling_auto_is_coupled_for_ssd_and_rejection_otherwise():
    assert EngineConfig(mode="ar", device="cpu").sampling == "rejection"
    assert EngineConfig(mode="sd", device="cpu").sampling == "rejection"
    assert EngineConfig(mode="ssd", device="cpu", pin_cpus=False).sampling == "coupled"
    assert EngineConfig(mode="ssd", device="cpu", sampling="rejection").sampling == "rejection"
    with pytest.raises(ValueError, match="sampling"):
        EngineConfig(sampling="gumbel")
