"""Command-line options come from the settings dataclasses: one definition per setting."""

from __future__ import annotations

import dataclasses

import pytest

from saguaro.config import EngineConfig
from saguaro.launch import CLI_SAMPLING_DEFAULTS, engine_options, sampling_options
from saguaro.options import OptionParser, add_options, cpu_list, from_args, given, opt
from saguaro.sampling import SamplingParams


def _parser() -> OptionParser:
    p = OptionParser()
    engine_options(p, exclude=("seed",))
    sampling_options(p)
    return p


def test_every_engine_setting_is_an_option_and_no_default_is_restated():
    p = _parser()
    dests = {a.dest for a in p._actions}
    assert {f.name for f in dataclasses.fields(EngineConfig)} - {"seed"} <= dests
    args = p.parse_args([])
    # Nothing given: the dataclass's own defaults apply.
    assert given(EngineConfig, args) == {}
    assert from_args(SamplingParams, args) == SamplingParams(**CLI_SAMPLING_DEFAULTS)


def test_options_parse_to_the_fields_types():
    args = _parser().parse_args(
        "--mode ssd --k 3 --no-pin-cpus --draft-cpus 1-2 --fanout 2,1,1,1 --dtype bfloat16 "
        "--no-enable-prefix-caching --threads 2 --stop a --stop b --temperature 0.5".split()
    )
    kw = given(EngineConfig, args)
    assert kw == {
        "mode": "ssd",
        "num_speculative_tokens": 3,
        "pin_cpus": False,
        "draft_cpus": [1, 2],
        "fanout": "2,1,1,1",
        "dtype": "bfloat16",
        "enable_prefix_caching": False,
        "num_threads": 2,
    }
    cfg = EngineConfig(device="cpu", **kw)
    assert cfg.fanout == [2, 1, 1, 1]
    params = from_args(SamplingParams, args)
    assert params.stop == ["a", "b"] and params.temperature == 0.5


def test_literal_choices_are_enforced_on_the_command_line_and_in_the_dataclass():
    with pytest.raises(SystemExit):
        _parser().parse_args(["--mode", "beam"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match="backup must be one of"):
        EngineConfig(backup="none")


def test_a_field_without_opt_is_not_an_option():
    @dataclasses.dataclass
    class Settings:
        shown: int = opt(3, "an option")
        hidden: int = 4

    p = OptionParser()
    add_options(p, Settings)
    assert p.parse_args(["--shown", "5"]).shown == 5
    with pytest.raises(SystemExit):
        p.parse_args(["--hidden", "5"])


def test_cpu_list():
    assert cpu_list("0") == [0]
    assert cpu_list("1,3") == [1, 3]
    assert cpu_list("2-4,7") == [2, 3, 4, 7]
