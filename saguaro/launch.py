"""Commands build engines and requests from their command-line options here: ``generate``,
``serve``, ``chat`` and ``bench`` share the options and their meaning."""

from __future__ import annotations

import argparse
from typing import Any

from saguaro.options import add_options, from_args, given

# The CLI generates greedily, and longer than the API's default of 16 tokens.
CLI_SAMPLING_DEFAULTS = {"temperature": 0.0, "max_tokens": 128}


def engine_options(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """Every EngineConfig field as an option (saguaro.options), but ``exclude``."""
    from saguaro.config import EngineConfig

    add_options(p.add_argument_group("engine"), EngineConfig, exclude=exclude)


def sampling_options(p: argparse.ArgumentParser) -> None:
    from saguaro import SamplingParams

    add_options(
        p.add_argument_group("sampling"),
        SamplingParams,
        exclude=("stop_token_ids", "sampling"),  # a request-level override only
        defaults=CLI_SAMPLING_DEFAULTS,
    )


def build_llm(args: argparse.Namespace, exclude: tuple[str, ...] = ()) -> Any:
    """An LLM from the engine options given (``exclude``: options that mean something else in
    this command)."""
    from saguaro import LLM
    from saguaro.config import EngineConfig

    kwargs = given(EngineConfig, args)
    return LLM(**{k: v for k, v in kwargs.items() if k not in exclude})


def sampling_params(args: argparse.Namespace) -> Any:
    from saguaro import SamplingParams

    return from_args(SamplingParams, args)
