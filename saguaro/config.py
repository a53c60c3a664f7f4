"""Engine configuration: one validated dataclass, the single source of truth for every setting."""

from __future__ import annotations

import logging
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from saguaro.kernels import build
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.options import (
    BASIC,
    KERNELS,
    MEMORY,
    PLACEMENT,
    SAMPLING,
    SPECULATION,
    SSD,
    check_choices,
    cpu_list,
    opt,
)
from saguaro.placement import process_cpus, resolve_device
from saguaro.sampling.params import RequestMethod
from saguaro.sampling.sampler import DEFAULT_TOP_M

log = logging.getLogger("saguaro")

FANOUT_MODES = ("auto", "geometric", "empirical")
# SD's confidence stop on CPU: a verification position there costs about a quarter of a decode,
# so a proposal its draft is less than even odds on costs more than it is expected to commit
# (docs/bench/draft, "Copies from the context, and a confidence stop": 0.5 to 0.9 measured
# alike).
CPU_STOP_BELOW = 0.5
# The draft's head by default: on the Qwen2.5-Coder 0.5B the whole 151,936-row head is a third of
# a step and these rows keep 98.8% of the target's greedy code tokens, 96.7% of its chat tokens
# (docs/bench/qwen-pair, "A cut head for the draft").
DRAFT_HEAD_TOKENS = 32768
# The draft that is no model: SD proposes copies from the context alone (copy_lookup's rule).
LOOKUP_DRAFT = "lookup"


def parse_fanout(spec: str, K: int) -> list[int] | str:
    """Parse a ``--fanout`` value: a mode name (``auto``, ``geometric``, ``empirical``), a
    comma-separated list of exactly K+1 non-negative integers F_0..F_K, or one non-negative integer
    used at every position (``0`` prepares nothing: every round misses)."""
    text = spec.strip().lower()
    if text in FANOUT_MODES:
        return text
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"invalid fan-out {spec!r}: expected one of {', '.join(FANOUT_MODES)}, "
            f"an integer, or {K + 1} comma-separated integers F_0..F_{K}"
        ) from None
    if any(v < 0 for v in values):
        raise ValueError(f"invalid fan-out {spec!r}: values must be non-negative")
    if len(values) == 1:
        return values * (K + 1)
    if len(values) != K + 1:
        raise ValueError(
            f"invalid fan-out {spec!r}: got {len(values)} values, need K+1 = {K + 1} (F_0..F_{K})"
        )
    return values


Mode = Literal["ar", "sd", "ssd", "auto"]
Dtype = Literal["float32", "bfloat16", "float16"]
SamplingMethod = Literal["auto", RequestMethod]
Backup = Literal["auto", "neural", "fast"]
DraftWorker = Literal["spawn", "external"]
AutoCores = Literal["shared", "own"]
Quantization = Literal["auto", "none", "gguf", "int4", "int4-g64", "int4-g128", "int8"]
Kernels = Literal["auto", "saguaro", "torch"]

MODES: tuple[str, ...] = typing.get_args(Mode)
SAMPLING_METHODS: tuple[str, ...] = typing.get_args(SamplingMethod)
DTYPES: tuple[str, ...] = typing.get_args(Dtype)


@dataclass
class EngineConfig:
    """Every engine setting, validated once. ``saguaro generate | serve | chat | bench`` take each
    field as ``--field-name`` (saguaro.options)."""

    model: str | None = opt(
        None,
        "target model directory or GGUF file, or a name in $SAGUARO_MODELS (default: "
        f"{DEFAULT_MODEL}, which saguaro fetch-pair brings)",
        group=BASIC,
    )
    draft: str | None = opt(
        None,
        "draft model directory, GGUF file or name (default with sd/ssd and the default model: "
        f"{DEFAULT_DRAFT}); {LOOKUP_DRAFT}: no draft model, sd "
        "proposes copies from the context alone (--draft-lookup's rule)",
        group=BASIC,
    )
    mode: Mode | None = opt(
        None,
        "decoding: autoregressive (ar), speculative (sd), SSD, or auto: each step the one the "
        "cost model predicts fastest for the running batch, with its K (default: auto when a "
        "draft is given, else ar)",
        group=BASIC,
    )
    auto_ssd: bool = opt(
        True,
        "auto: SSD is among the choices (its worker takes cores of its own on CPU); without it "
        "auto chooses between AR and SD on every core",
        group=SPECULATION,
        advanced=True,
    )
    ar_fallback: bool = opt(
        False,
        "sd (with a draft model) and ssd: before each step, an AR step instead where auto's "
        "cost model predicts AR commits more tokens a second for the running batch (under "
        "load, say), so that the mode never serves less than AR; ssd then also loads the "
        "draft in this process, to time it (on by default in serve)",
        group=SPECULATION,
    )
    auto_cores: AutoCores = opt(
        "shared",
        "auto (and ssd with --ar-fallback) with SSD on CPU: shared: AR and SD steps compute on "
        "every core (the idle worker's too) and SSD steps leave the worker its core; own: the "
        "target keeps its own cores in every mode, the worker has the next (the paper's layout), "
        "and while SSD is not chosen it is sent the batch's tokens and measures the draft",
        group=PLACEMENT,
        advanced=True,
    )
    num_speculative_tokens: int = opt(
        4, "speculation length K", flags=("--k",), metavar="K", group=SPECULATION
    )
    dtype: Dtype = opt("float32", "weights and activations", group=KERNELS)
    draft_dtype: Dtype | None = opt(
        None,
        "sd/ssd: the draft's weights and activations (default: dtype); any precision keeps the "
        "output exact: the draft only proposes, and verification holds whatever model "
        "proposed",
        group=KERNELS,
        advanced=True,
    )
    quantization: Quantization = opt(
        "auto",
        "the target's linear weights: gguf runs a GGUF file's blocks as they are; "
        "int4 (groups of 32; int4-g64, int4-g128) and int8 (per channel) quantize at load; "
        "none keeps them dense in dtype; auto: gguf where the model is a .gguf file or a "
        "directory holding model.gguf (saguaro import-gguf keeps it) and the kernels are "
        "saguaro's, else none",
        group=KERNELS,
        advanced=True,
    )
    draft_quantization: Quantization = opt(
        "auto",
        "sd/ssd: the draft's linear weights, as --quantization, but auto quantizes a draft "
        "without a GGUF file to int8 on saguaro's kernels (any keeps the output exact)",
        group=KERNELS,
        advanced=True,
    )
    kernels: Kernels = opt(
        "auto",
        "saguaro: saguaro's CPU kernels, whose result for a token does not depend on what shares "
        "its forward (speculative greedy output equals AR's in every precision); torch: torch's "
        "operators; auto: saguaro on CPU unless --compile",
        group=KERNELS,
        advanced=True,
    )
    device: str = opt(
        "auto", "auto | cpu | cuda[:N] (auto: cuda if available, else cpu)", group=PLACEMENT
    )
    max_model_len: int | None = opt(
        None, "context length (default: the model's)", metavar="N", group=MEMORY
    )
    max_num_seqs: int = opt(16, "sequences in one batch", group=MEMORY, advanced=True)
    max_num_batched_tokens: int = opt(
        2048, "tokens in one forward (prefill is chunked to it)", group=MEMORY, advanced=True
    )
    block_size: int = opt(16, "tokens per KV block", group=MEMORY, advanced=True)
    num_kv_blocks: int | None = opt(
        None,
        "KV blocks (default: max_num_seqs full-length sequences, within kv_cache_gb)",
        group=MEMORY,
        advanced=True,
    )
    kv_cache_gb: float = opt(
        4.0,
        "memory cap for the target's KV pool when num_kv_blocks is unset",
        group=MEMORY,
        advanced=True,
    )
    kv_prefault: bool = opt(
        False,
        "write every page of the KV pools at start-up, the draft's too: resident from the "
        "start, so RSS stays flat and no request pays the first touch (saguaro serve: on)",
        group=MEMORY,
        advanced=True,
    )
    enable_prefix_caching: bool = opt(
        True, "share KV blocks of common prompt prefixes", group=MEMORY, advanced=True
    )
    seed: int = opt(0, "seeds requests that name none", group=SAMPLING)
    num_threads: int | None = opt(
        None,
        "torch intra-op threads (default: one per core the target uses)",
        flags=("--threads",),
        metavar="N",
        group=PLACEMENT,
    )
    compile: bool = opt(
        False,
        "compile the models' forwards with torch.compile (inductor, kernels called from C++): "
        "fewer, fused kernels per step; every kind of forward compiles at start (minutes the "
        "first time, then read from inductor's disk cache)",
        group=KERNELS,
        advanced=True,
    )
    enforce_eager: bool = opt(
        False,
        "on a GPU: run every forward eagerly; otherwise decode, verification and the draft's "
        "forwards are padded to batch, position and key buckets and each bucket replays one "
        "CUDA graph (one target rank)",
        group=KERNELS,
        advanced=True,
    )
    tensor_parallel_size: int = opt(
        1,
        "ranks the target is split over (heads, MLP columns, vocabulary): rank 0 is this "
        "process, the others its children; on GPUs one device each (device, device+1, ...), on "
        "CPU one share of the target's cores each",
        group=PLACEMENT,
        advanced=True,
    )
    tensor_parallel_timeout_s: float = opt(
        120.0,
        "tensor parallel: a rank silent this long inside a forward ends the engine",
        group=PLACEMENT,
        advanced=True,
    )
    draft_head_tokens: int = opt(
        DRAFT_HEAD_TOKENS,
        "sd/ssd: the draft's LM head keeps the rows of its N likeliest tokens (by frequency in "
        "the code corpus): a draft step reads fewer weights, the output stays exact; 0: the "
        "whole head",
        metavar="N",
        group=SPECULATION,
        advanced=True,
    )
    draft_top_m: int = opt(
        DEFAULT_TOP_M,
        "sd/ssd: the draft samples from its top-M tokens",
        group=SPECULATION,
        advanced=True,
    )
    # 0 by default: the default pair's draft agrees with its target more often than a copy does,
    # while a weaker draft gains from copies (the SmolLM2 pair: 2); docs/bench/qwen-pair.
    draft_lookup: int = opt(
        0,
        "sd/ssd: where the context's last N or more tokens occurred before in it, the draft's "
        "chain copies the token that followed (a point mass, no draft forward); 0: never",
        group=SPECULATION,
        advanced=True,
    )
    copy_lookup: int = opt(
        2,
        "copies alone (draft='lookup', auto's lookup rounds): where the context's last N or more "
        "tokens occurred before in it, propose the tokens that followed; 0: auto never copies "
        "alone",
        group=SPECULATION,
        advanced=True,
    )
    draft_stop_below: float | None = opt(
        None,
        "sd/ssd: a chain stops before a drafted proposal (after its first) whose draft row gives "
        "its likeliest token less than this probability, saving its draft forward and its "
        f"verification position; 0: never (default: {CPU_STOP_BELOW} on CPU, where a "
        "verification position costs a sizeable part of a decode; 0 on a GPU)",
        group=SPECULATION,
        advanced=True,
    )
    # coupled where an SSD worker runs, whose cache it serves better and whose text it keeps
    # across auto's switches; rejection for AR and SD, where it accepts more (docs/sampling.md).
    sampling: SamplingMethod = opt(
        "auto",
        "how T > 0 is sampled exactly: rejection sampling, or coupled (a seed gives the same text "
        "in every mode); auto: coupled where an SSD worker runs (ssd, auto), rejection otherwise",
        group=SAMPLING,
        advanced=True,
    )
    # --- SSD (mode="ssd") ---
    fanout: str | list[int] = opt(
        "auto", "ssd: auto | geometric | empirical | F_0,..,F_K branches per outcome", group=SSD
    )
    cache_budget: int | None = opt(
        None,
        "ssd: branches per sequence (default: sized online to fit a verification)",
        group=SSD,
        advanced=True,
    )
    saguaro_c: float = opt(
        1.0,
        "ssd: Saguaro sampling constant C in (0, 1]; 1 = plain sampling",
        group=SSD,
        advanced=True,
    )
    backup: Backup = opt("auto", "ssd: what a cache miss falls back on", group=SSD, advanced=True)
    draft_worker: DraftWorker = opt(
        "spawn",
        "ssd: spawn a local worker, or wait for an external one (saguaro draft-worker)",
        group=SSD,
        advanced=True,
    )
    draft_addr: str = opt(
        "127.0.0.1", "ssd: rendezvous address (the target hosts it)", group=SSD, advanced=True
    )
    draft_port: int = opt(0, "ssd: rendezvous port (0: a free port)", group=SSD, advanced=True)
    draft_timeout_s: float = opt(
        60.0, "ssd: a worker silent this long is given up on", group=SSD, advanced=True
    )
    draft_restarts: int = opt(
        3, "ssd: a failed worker is restarted at most this many times", group=SSD, advanced=True
    )
    draft_restart_backoff_s: float = opt(
        1.0, "ssd: wait before the first restart (doubles each time)", group=SSD, advanced=True
    )
    draft_device: str | None = opt(
        None, "ssd: the worker's device (default: device)", group=PLACEMENT, advanced=True
    )
    pin_cpus: bool = opt(
        True, "ssd on CPU: pin target and worker to disjoint cores", group=PLACEMENT, advanced=True
    )
    target_cpus: list[int] | None = opt(
        None,
        "cores the target computes on, e.g. 0 or 0-3 (default: ssd on CPU: the first; "
        "otherwise every core of the process)",
        parse=cpu_list,
        group=PLACEMENT,
        advanced=True,
    )
    draft_cpus: list[int] | None = opt(
        None,
        "ssd: cores for the worker, e.g. 1 or 2-3 (default: the next)",
        parse=cpu_list,
        group=PLACEMENT,
        advanced=True,
    )
    draft_threads: int | None = opt(
        None, "ssd: the worker's torch threads (default: its cores)", group=PLACEMENT, advanced=True
    )

    def __post_init__(self) -> None:
        check_choices(self)
        self._check_mode()
        self._check_sizes()
        self._resolve_backends()
        self._check_speculation()
        self._place_on_cpus()
        if self.device.startswith("cuda"):
            self._place_on_gpus()

    def _check_mode(self) -> None:
        """The mode (default: from the draft) and what a lookup draft allows."""
        if self.mode is None:
            self.mode = ("sd" if self.draft == LOOKUP_DRAFT else "auto") if self.draft else "ar"
        if self.draft == LOOKUP_DRAFT and self.mode not in ("ar", "sd"):
            raise ValueError(
                f"draft={LOOKUP_DRAFT!r} runs no draft model: mode sd only, got {self.mode!r}"
            )
        if self.draft == LOOKUP_DRAFT and self.copy_lookup < 1:
            raise ValueError(f"draft={LOOKUP_DRAFT!r} copies by copy_lookup's rule: need it >= 1")

    def _check_sizes(self) -> None:
        """Counts and lengths that must be positive."""
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.tensor_parallel_size < 1 or self.tensor_parallel_timeout_s <= 0:
            raise ValueError(
                "tensor_parallel_size must be >= 1 and tensor_parallel_timeout_s > 0, got "
                f"{self.tensor_parallel_size} and {self.tensor_parallel_timeout_s}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")

    def _resolve_backends(self) -> None:
        """The device, the draft's dtype and the kernels (``auto`` resolved), and the
        combinations they refuse."""
        self.device = resolve_device(self.device)
        self.draft_dtype = self.draft_dtype or self.dtype
        if self.kernels == "auto":
            # the kernels read float32 and bfloat16; --compile compiles torch's operators
            half = "float16" in (self.dtype, self.draft_dtype)
            on_torch = self.compile or self.device != "cpu" or half
            if not on_torch and (error := build.build_error()) is not None:
                log.warning("saguaro's CPU kernels cannot be built (%s): torch's operators", error)
                on_torch = True
            self.kernels = "torch" if on_torch else "saguaro"
        if self.tensor_parallel_size > 1 and self.quantization not in ("auto", "none"):
            raise ValueError(
                f"quantization={self.quantization} is not split over tensor-parallel ranks; use "
                "none (or auto) with tensor_parallel_size > 1"
            )
        if self.kernels == "saguaro" and self.compile:
            raise ValueError("--compile compiles torch's operators; use it with --kernels torch")

    def _check_speculation(self) -> None:
        """Speculation's settings: sampling (``auto`` resolved), the draft's, the fan-out."""
        if not 0 < self.saguaro_c <= 1:
            raise ValueError(f"saguaro_c must be in (0, 1], got {self.saguaro_c}")
        if self.sampling == "auto":
            self.sampling = "coupled" if self.uses_worker else "rejection"
        if self.draft_restarts < 0 or self.draft_restart_backoff_s < 0:
            raise ValueError("draft_restarts and draft_restart_backoff_s must be >= 0")
        if self.draft_head_tokens < 0:
            raise ValueError(
                f"draft_head_tokens must be >= 0 (0: the whole head), got {self.draft_head_tokens}"
            )
        if self.draft_top_m < 1:
            raise ValueError(f"draft_top_m must be >= 1, got {self.draft_top_m}")
        if self.draft_stop_below is None:
            self.draft_stop_below = CPU_STOP_BELOW if self.device == "cpu" else 0.0
        if not 0 <= self.draft_stop_below <= 1:
            raise ValueError(f"draft_stop_below must be in [0, 1], got {self.draft_stop_below}")
        for name in ("draft_lookup", "copy_lookup"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: no lookup), got {getattr(self, name)}")
        if self.cache_budget is not None and self.cache_budget < 0:
            raise ValueError(f"cache_budget must be >= 0, got {self.cache_budget}")
        if isinstance(self.fanout, str):
            self.fanout = parse_fanout(self.fanout, self.num_speculative_tokens)
        elif len(self.fanout) != self.num_speculative_tokens + 1 or min(self.fanout) < 0:
            raise ValueError(
                f"fanout must list K+1={self.num_speculative_tokens + 1} non-negative counts, "
                f"got {self.fanout}"
            )

    def _place_on_cpus(self) -> None:
        """Cores for the target and SSD's worker: shared where asked, else (SSD on the CPU,
        pinned) the worker on a core of its own."""
        if self.shares_cores:
            cores = process_cpus()
            self.target_cpus = self.target_cpus or cores
            self.draft_cpus = self.draft_cpus or cores[-1:]
            self.draft_threads = self.draft_threads or len(self.draft_cpus)
        elif self.uses_worker and self.device == "cpu" and self.pin_cpus:
            cores = process_cpus()
            if len(cores) >= 2:
                # The target's ranks take one core each while a core is left for the worker.
                ranks = min(self.tensor_parallel_size, len(cores) - 1)
                self.target_cpus = self.target_cpus or cores[:ranks]
                self.draft_cpus = (
                    self.draft_cpus or [c for c in cores if c not in self.target_cpus][:1]
                )
                self.draft_threads = self.draft_threads or len(self.draft_cpus)

    def _place_on_gpus(self) -> None:
        """The target's ranks on consecutive GPUs from ``device``; SSD's worker, unless told, on
        the GPU after them (the paper's layout). On the target's own GPU the worker cannot hide
        its drafting: one GPU runs one process's kernels at a time (docs/bench/gpu)."""
        first = torch.device(self.device).index or 0
        last = first + self.tensor_parallel_size - 1
        visible = torch.cuda.device_count()
        if last >= visible:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} on {self.device} needs "
                f"GPUs cuda:{first}..cuda:{last}; {visible} are visible"
            )
        if not self.uses_worker or self.draft_device is not None:
            return
        if last + 1 < visible:
            self.draft_device = f"cuda:{last + 1}"
        else:
            log.warning(
                "saguaro: SSD's draft worker shares cuda:%d with the target; one GPU runs one "
                "process's kernels at a time, so its drafting cannot overlap verification "
                "(--draft-device names another GPU)",
                last,
            )

    @property
    def uses_worker(self) -> bool:
        """An SSD draft worker runs: mode ssd, or auto with SSD among its choices."""
        return self.mode == "ssd" or (self.mode == "auto" and self.auto_ssd)

    @property
    def chooses_steps(self) -> bool:
        """Whether auto's cost model chooses how each step runs: mode auto, or sd and ssd with
        ``ar_fallback`` (between AR and their own speculation)."""
        return self.mode == "auto" or (self.mode in ("sd", "ssd") and self.ar_fallback)

    @property
    def worker_owns_cores(self) -> bool:
        """SSD's worker computes where the target does not: a GPU of its own, or CPU cores the
        target's threads are kept off (the paper's layout). What it does while AR, SD or copy
        steps run then costs the target nothing."""
        if not self.uses_worker:
            return False
        if self.device.startswith("cuda"):
            return (self.draft_device or self.device) != self.device
        if not self.target_cpus or not self.draft_cpus:
            return False
        return not set(self.target_cpus) & set(self.draft_cpus)

    @property
    def shares_cores(self) -> bool:
        """Mode auto (or ssd with ``ar_fallback``) on CPU whose target computes on the worker's
        cores while SSD is not running (``auto_cores`` shared; one target rank, at least two
        cores)."""
        return (
            self.chooses_steps
            and self.uses_worker
            and self.auto_cores == "shared"
            and self.device == "cpu"
            and self.pin_cpus
            and self.tensor_parallel_size == 1
            and len(process_cpus()) >= 2
        )

    def graphs_on(self, device: str) -> bool:
        """Whether a model on ``device`` runs the forwards that fit a bucket over static buffers
        as CUDA graphs (saguaro.engine.graphs): on a GPU, unless enforce_eager."""
        return device.startswith("cuda") and not self.enforce_eager

    @property
    def graphs(self) -> bool:
        """The target's (and an in-process draft's) forwards replay graphs; a target split over
        ranks runs eagerly."""
        return self.graphs_on(self.device) and self.tensor_parallel_size == 1

    @property
    def lookahead(self) -> int:
        """Token slots a sequence may write beyond its committed length in one round."""
        return 0 if self.mode == "ar" else self.num_speculative_tokens


def resolve_model_dirs(cfg: EngineConfig) -> tuple[Path, Path | None]:
    """Directories or names in the models directory (saguaro.models.catalog) to paths; the
    default pair where no model is given; no draft directory for ``draft="lookup"``."""
    target = resolve_model(cfg.model or DEFAULT_MODEL)
    if cfg.draft == LOOKUP_DRAFT:
        return target, None
    if cfg.mode == "ar":
        return target, resolve_model(cfg.draft) if cfg.draft else None
    if cfg.draft:
        return target, resolve_model(cfg.draft)
    if cfg.model is None:
        return target, resolve_model(DEFAULT_DRAFT)
    raise ValueError(f"mode {cfg.mode!r} needs a draft model (draft=DIR)")


def paper_layout(mode: str, cpus: typing.Sequence[int]) -> dict[str, typing.Any]:
    """The EngineConfig fields that run ``mode`` in the paper's layout on ``cpus``: the target on
    the first core with one thread. Where an SSD worker runs (ssd, auto) it takes the next core
    and the target never computes there (``auto_cores`` own), which places the target first."""
    if mode in ("ssd", "auto"):
        return {"auto_cores": "own"}
    return {"target_cpus": list(cpus[:1]), "num_threads": 1}
