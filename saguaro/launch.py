"""Commands build engines and requests from their command-line options here: ``generate``,
``serve``, ``chat`` and ``bench`` share the options and their meaning."""

from __future__ import annotations

import argparse

from saguaro.api import LLM
from saguaro.config import EngineConfig
from saguaro.options import SAMPLING, OptionParser, add_options, from_args, given
from saguaro.sampling import SamplingParams

# The CLI generates greedily, and longer than the API's default of 16 tokens. SamplingParams (and
# so the Python API and the HTTP server) keeps temperature 1.0, as vLLM and OpenAI do; both
# temperature texts say so.
CLI_SAMPLING_DEFAULTS = {"temperature": 0.0, "max_tokens": 128}


def engine_options(p: OptionParser, exclude: tuple[str, ...] = ()) -> None:
    """Every EngineConfig field as an option (saguaro.options), but ``exclude``."""
    add_options(p, EngineConfig, exclude=exclude)


def sampling_options(p: OptionParser) -> None:
    add_options(
        p,
        SamplingParams,
        exclude=("stop_token_ids", "sampling"),  # a request-level override only
        defaults=CLI_SAMPLING_DEFAULTS,
        group=SAMPLING,
    )


def build_llm(args: argparse.Namespace, exclude: tuple[str, ...] = ()) -> LLM:
    """An LLM from the engine options given (``exclude``: options that mean something else in
    this command)."""
    kwargs = given(EngineConfig, args)
    return LLM(**{k: v for k, v in kwargs.items() if k not in exclude})


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return from_args(SamplingParams, args)
