"""The bench's settings: :class:`BenchConfig`, whose fields are also its command-line options
(:mod:`saguaro.options` generates them), the ``--quick`` preset, and the parsing of
comma-separated lists such as ``--batch-sizes 1,4`` or ``--sampling rejection,coupled``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saguaro.bench.datasets import DATASETS, DEFAULT_DATASETS
from saguaro.config import DTYPES, MODES, SAMPLING_METHODS
from saguaro.models.catalog import DEFAULT_MODEL
from saguaro.options import OptionParser, add_options, flag, from_args, opt, show
from saguaro.placement import resolve_device

# SSD's Saguaro sampling constant C lies in (0, 1] (docs/design.md §6).
SAGUARO_C_MAX = 1.0


# Peers outside this package, run only when asked for: llama.cpp's own AR through
# llama-cpp-python ("llama.cpp"), and its draft-model speculative decoding through the
# llama-speculative-simple binary ("llama.cpp-sd", needs --llama-cpp-bin). Both need the ``peer``
# extra (llama-cpp-python, gguf) and read the models as GGUF files written by
# saguaro.bench.gguf_export.
PEER_MODES: tuple[str, ...] = ("llama.cpp", "llama.cpp-sd")
# SD with no draft model (draft="lookup": copies from the context alone), run only when named.
LOOKUP_MODE = "lookup"
# transformers' assisted generation on the same checkpoints, run only when named: it needs both
# models as Hugging Face checkpoints of one vocabulary, which the default pair's GGUF files are not.
HF_MODE = "hf-assisted"
# Every engine mode.
DEFAULT_MODES: tuple[str, ...] = MODES
BENCH_MODES: tuple[str, ...] = (*DEFAULT_MODES, HF_MODE, LOOKUP_MODE, *PEER_MODES)
# Modes that speculate (their rounds have tokens per round, acceptance, ...).
SPEC_MODES: tuple[str, ...] = tuple(m for m in BENCH_MODES if m not in ("ar", "llama.cpp"))
# Modes that read the draft model.
DRAFT_MODEL_MODES: tuple[str, ...] = tuple(m for m in SPEC_MODES if m != LOOKUP_MODE)
# Weights of the GGUF files: f32 reproduces saguaro's f32 greedy tokens (up to near-ties).
LLAMA_CPP_DTYPES: tuple[str, ...] = ("f32", "f16")
# eager: every forward eagerly; compiled: torch.compile (EngineConfig.compile); graphs: on a GPU,
# bucketed forwards replayed as CUDA graphs (EngineConfig.enforce_eager off).
FORWARDS: tuple[str, ...] = ("eager", "compiled", "graphs")


def positive_ints(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); each value >= 1."""
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def non_negative_ints(text: str) -> tuple[int, ...]:
    """``"0,2"`` -> (0, 2); each value >= 0."""
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def non_negative_floats(text: str) -> tuple[float, ...]:
    """``"0,0.7,1"`` -> (0.0, 0.7, 1.0); each value >= 0."""
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def names_of(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A parser of ``"a,b"`` -> ("a", "b") that accepts only names in ``allowed``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(allowed)}, got {text!r}")
        return names

    return parse


# --quick: a short run (one dataset, few prompts, two batch sizes, greedy only, no transformers).
# Options given explicitly win over it.
QUICK: dict[str, Any] = dict(
    modes=("ar", "sd", "ssd", "auto"),
    datasets=("humaneval",),
    num_prompts=4,
    max_tokens=96,
    batch_sizes=(1, 4),
    temperatures=(0.0,),
    repeats=1,
)
_QUICK_HELP = (
    "a short run: "
    + ", ".join(f"{flag(name)} {show(v)}" for name, v in QUICK.items())
    + " (options given explicitly still apply)"
)


@dataclass(frozen=True)
class BenchConfig:
    """What one ``saguaro bench`` run measures. Each field is the option ``--field-name`` (some
    also have a shorter alias, e.g. ``--k`` for ``ks``); list-valued fields take comma-separated
    values, ``fanouts`` space-separated ones (a fan-out itself may contain commas)."""

    model: str | None = opt(
        None,
        f"target model directory, GGUF file or name (default: {DEFAULT_MODEL})",
        metavar="DIR",
    )
    draft: str | None = opt(
        None,
        "draft model directory or name (default with the default target: its trained draft)",
        metavar="DIR",
    )
    modes: tuple[str, ...] = opt(
        DEFAULT_MODES,
        f"modes run side by side, of {','.join(BENCH_MODES)} ({LOOKUP_MODE}: sd with no draft "
        f"model, copies from the context alone; it and the peers {','.join(PEER_MODES)} only "
        "when named)",
        parse=names_of(BENCH_MODES),
        metavar="M,..",
    )
    datasets: tuple[str, ...] = opt(
        DEFAULT_DATASETS,
        f"built-in prompt sets, of {','.join(DATASETS)}",
        parse=names_of(DATASETS),
        metavar="D,..",
    )
    prompts: str | None = opt(
        None, 'JSONL file, one {"prompt": ...} a line (one more dataset)', metavar="FILE"
    )
    num_prompts: int = opt(16, "prompts per dataset")
    max_tokens: int = opt(128, "output tokens per request")
    batch_sizes: tuple[int, ...] = opt(
        (1, 2, 4, 8, 16), "batch sizes", parse=positive_ints, metavar="B,.."
    )
    temperatures: tuple[float, ...] = opt(
        (0.0, 1.0), "temperatures", parse=non_negative_floats, metavar="T,.."
    )
    top_p: float = opt(1.0, "top-p of every request at T > 0")
    ks: tuple[int, ...] = opt(
        (4,), "speculation length(s) K", flags=("--k",), parse=positive_ints, metavar="K,.."
    )
    largest_k_only: tuple[str, ...] = opt(
        (),
        "modes run at the largest --k only (auto: its K_max, beside SD swept over every K)",
        parse=names_of(BENCH_MODES),
        metavar="M,..",
        advanced=True,
    )
    fanouts: tuple[str, ...] = opt(
        ("auto",),
        "SSD fan-out(s), space-separated: auto | geometric | empirical | F | F_0,..,F_K",
        flags=("--fanout",),
        metavar="F",
        several=True,
    )
    saguaro_cs: tuple[float, ...] = opt(
        (SAGUARO_C_MAX,),
        f"SSD's Saguaro sampling constant(s) C in (0, {SAGUARO_C_MAX:g}]",
        flags=("--saguaro-c",),
        parse=non_negative_floats,
        metavar="C,..",
        advanced=True,
    )
    samplings: tuple[str, ...] = opt(
        ("auto",),
        "sampling method(s) at T > 0, side by side, e.g. rejection,coupled (auto: the engine's "
        "choice per mode)",
        flags=("--sampling",),
        parse=names_of(SAMPLING_METHODS),
        metavar="S,..",
        advanced=True,
    )
    repeats: int = opt(1, "passes over the prompts", advanced=True)
    seed: int = opt(0, "prompt selection and sampling seed")
    device: str = opt("auto", "auto | cpu | cuda[:N], as for the engine")
    draft_device: str | None = opt(
        None,
        "ssd and auto: the draft worker's device, e.g. cuda:1 for a GPU of its own (the "
        "paper's layout; default: the engine's choice)",
        advanced=True,
    )
    out: str = opt("bench-out", "output directory", metavar="DIR")
    quick: bool = opt(False, _QUICK_HELP)
    synthetic_acceptance: float | None = opt(
        None,
        "benchmarks only: verification accepts each proposed token with this probability and "
        "commits the target's argmax after, whatever the models say (speed at a chosen "
        "acceptance on random weights); output is not the target's, so the greedy check is "
        "skipped",
        metavar="RATE",
        advanced=True,
    )
    forwards: tuple[str, ...] = opt(
        ("eager",),
        "saguaro's forwards, side by side: eager, compiled (EngineConfig.compile), graphs (CUDA "
        "graphs, a GPU only: EngineConfig.enforce_eager off)",
        parse=names_of(FORWARDS),
        metavar="F,..",
        advanced=True,
    )
    dtypes: tuple[str, ...] = opt(
        ("float32",),
        "saguaro's weights and activations, side by side (EngineConfig.dtype); each dtype's "
        "modes are checked against its own AR and compared with it",
        parse=names_of(DTYPES),
        metavar="D,..",
        advanced=True,
    )
    draft_dtypes: tuple[str, ...] = opt(
        (),
        "the draft's weights and activations in sd and ssd, side by side (EngineConfig."
        "draft_dtype; default: the variant's dtype); the output stays the target's, so these "
        "are checked against AR of the target's dtype",
        parse=names_of(DTYPES),
        metavar="D,..",
        advanced=True,
    )
    draft_lookups: tuple[int, ...] = opt(
        (),
        "the context lookup, side by side: of the draft chains in sd, ssd and auto (EngineConfig."
        "draft_lookup), of the copies in lookup (EngineConfig.copy_lookup); the shortest n-gram "
        "copied, 0 none; default: the engine's",
        parse=non_negative_ints,
        metavar="N,..",
        advanced=True,
    )
    draft_head_tokens: tuple[int, ...] = opt(
        (),
        "the draft's LM head cut to its N likeliest tokens in sd, ssd and auto, side by side "
        "(EngineConfig.draft_head_tokens; 0: the whole head; default: the engine's)",
        parse=non_negative_ints,
        metavar="N,..",
        advanced=True,
    )
    draft_stop_belows: tuple[float, ...] = opt(
        (),
        "the draft chains' confidence stop in sd, ssd and auto, side by side (EngineConfig."
        "draft_stop_below; 0: none; default: the engine's)",
        parse=non_negative_floats,
        metavar="P,..",
        advanced=True,
    )
    tensor_parallel_sizes: tuple[int, ...] = opt(
        (1,),
        "tensor-parallel sizes of saguaro's target, side by side (EngineConfig."
        "tensor_parallel_size)",
        flags=("--tensor-parallel-size",),
        parse=positive_ints,
        metavar="N,..",
        advanced=True,
    )
    one_core_baselines: bool = opt(
        False,
        "also run AR and SD on one core with one thread, labelled '1 core' (by default every "
        "mode computes on all the cores SSD's target and draft use together)",
        advanced=True,
    )
    llama_cpp_bin: str | None = opt(
        None,
        "directory holding llama.cpp's llama-speculative-simple binary (mode llama.cpp-sd)",
        metavar="DIR",
        advanced=True,
    )
    llama_cpp_cache: str = opt(
        "~/.cache/saguaro/gguf",
        "where the models' GGUF files are written once",
        metavar="DIR",
        advanced=True,
    )
    llama_cpp_dtype: str = opt(
        "f32",
        f"llama.cpp peers' weights where a checkpoint is written as GGUF: "
        f"{' | '.join(LLAMA_CPP_DTYPES)} (a model directory's own GGUF file runs as it is)",
        metavar="DTYPE",
        advanced=True,
    )
    llama_cpp_threads: int | None = opt(
        None, "llama.cpp peers' threads (default: the cores this process may run on)", advanced=True
    )

    def __post_init__(self) -> None:
        for name in ("num_prompts", "max_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag(name)} must be >= 1")
        if self.llama_cpp_dtype not in LLAMA_CPP_DTYPES:
            raise ValueError(f"--llama-cpp-dtype must be one of {', '.join(LLAMA_CPP_DTYPES)}")
        if self.llama_cpp_threads is not None and self.llama_cpp_threads < 1:
            raise ValueError("--llama-cpp-threads must be >= 1")
        if "llama.cpp-sd" in self.modes and not self.llama_cpp_bin:
            raise ValueError("mode llama.cpp-sd needs --llama-cpp-bin DIR (llama.cpp's binaries)")
        if not self.datasets and not self.prompts:
            raise ValueError("no dataset: give --datasets or --prompts")
        if "graphs" in self.forwards and not resolve_device(self.device).startswith("cuda"):
            raise ValueError("--forwards graphs replays CUDA graphs: it needs --device cuda")
        rate = self.synthetic_acceptance
        if rate is not None and not 0 <= rate <= 1:
            raise ValueError(f"--synthetic-acceptance must be in [0, 1], got {rate}")
        if not all(0.0 < c <= SAGUARO_C_MAX for c in self.saguaro_cs):
            raise ValueError(
                f"--saguaro-c values must be in (0, {SAGUARO_C_MAX:g}], got {list(self.saguaro_cs)}"
            )


def build_parser() -> OptionParser:
    """One option per BenchConfig field, in field order. Options left out stay None, so that
    --quick can tell them from its own preset."""
    p = OptionParser(
        prog="saguaro bench",
        description="Benchmark AR, SD, SSD and HF assisted generation side by side.",
    )
    add_options(p, BenchConfig)
    return p


def parse_config(argv: list[str]) -> BenchConfig:
    """The config of ``saguaro bench ARGV``: a prompt file alone replaces the default datasets;
    ``--quick`` fills in what was not given; the dataclass defaults the rest."""
    args = build_parser().parse_args(argv)
    if args.prompts and args.datasets is None:
        args.datasets = ()
    for name, value in (QUICK if args.quick else {}).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return from_args(BenchConfig, args)
