"""BenchConfig from the command line: the --quick preset, list-valued options, validation."""

from __future__ import annotations

import pytest

from saguaro.bench.config import BENCH_MODES, BenchConfig, build_parser, parse_config
from saguaro.config import MODES


def test_quick_preset_yields_to_explicit_flags():
    cfg = parse_config(["--quick", "--max-tokens", "16"])
    assert (
        cfg.max_tokens == 16
        and cfg.batch_sizes == (1, 4)
        and cfg.modes == ("ar", "sd", "ssd", "auto")
    )
    assert cfg.temperatures == (0.0,) and cfg.datasets == ("humaneval",)
    assert parse_config(["--prompts", "x.jsonl"]).datasets == ()
    assert parse_config(["--quick", "--prompts", "x.jsonl"]).datasets == ()
    with pytest.raises(ValueError, match="saguaro-c"):
        parse_config(["--saguaro-c", "0"])


def test_list_options_keep_their_syntax():
    cfg = parse_config(
        ["--k", "2,4", "--fanout", "auto", "2,1,1", "--batch-sizes", "1,2",
         "--temperatures", "0,0.7", "--sampling", "rejection,coupled", "--modes", "ar,ssd"]
    )  # fmt: skip
    assert cfg.ks == (2, 4) and cfg.fanouts == ("auto", "2,1,1")
    assert cfg.batch_sizes == (1, 2) and cfg.temperatures == (0.0, 0.7)
    assert cfg.samplings == ("rejection", "coupled") and cfg.modes == ("ar", "ssd")
    assert parse_config([]) == BenchConfig()
    for bad in (["--batch-sizes", "0"], ["--modes", "ar,beam"], ["--sampling", "greedy"]):
        with pytest.raises(SystemExit):
            parse_config(bad)


def test_help_comes_from_the_fields():
    """Defaults are appended from the dataclass (in the options' own syntax); modes come from the
    engine's."""
    text = build_parser().format_help()
    assert "(default: 1,2,4,8,16)" in text and "(default: 16)" in text
    assert BENCH_MODES[: len(MODES)] == MODES
