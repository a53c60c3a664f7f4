"""The run plan: which engine configurations (variants) run, on which batches of which prompts, in
which order, and with which sampling parameters per request."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from saguaro.bench.config import HF_MODE, LOOKUP_MODE, PEER_MODES, BenchConfig
from saguaro.bench.prompts import PromptSet
from saguaro.config import parse_fanout
from saguaro.sampling import SamplingParams

# A request's seed is seed * SEED_STRIDE + repeat * REPEAT_STRIDE + index: distinct for every
# (seed, repeat, index) while index < REPEAT_STRIDE and repeat * REPEAT_STRIDE + index <
# SEED_STRIDE (e.g. 15 repeats of up to 65 537 requests each).
REPEAT_STRIDE = 65_537
SEED_STRIDE = 1_000_003


# Modes that also run with their target held to one core with --one-core-baselines: the paper's
# layout, where the target has the same cores in every mode and SSD's draft one more (auto's
# SSD worker has the next core; its AR and SD steps stay on the first).
ONE_CORE_MODES = ("ar", "sd", "auto", LOOKUP_MODE)
# saguaro's modes with a draft model, whose precision --draft-dtypes varies
DRAFT_MODES = ("sd", "ssd", "auto")

# Modes that sample with their own sampler, not saguaro's (one variant whatever --sampling says).
OWN_SAMPLER_MODES = (HF_MODE, *PEER_MODES)


@dataclass(frozen=True)
class Variant:
    """One engine configuration under test."""

    mode: str
    k: int | None = None  # speculation length (speculative modes)
    fanout: str | None = None  # SSD fan-out, as given on the command line
    label: str = ""
    saguaro_c: float = 1.0  # SSD's Saguaro sampling constant C
    sampling: str = "auto"  # "auto" | "rejection" | "coupled" (EngineConfig.sampling)
    forwards: str = "eager"  # saguaro's forwards: one of saguaro.bench.config.FORWARDS
    one_core: bool = False  # AR/SD held to one core and one thread (a labelled extra)
    tensor_parallel_size: int = 1  # ranks of saguaro's target
    dtype: str = "float32"  # saguaro's weights and activations (EngineConfig.dtype)
    draft_dtype: str | None = None  # the draft's (EngineConfig.draft_dtype); None: dtype
    # EngineConfig.draft_lookup (lookup mode: copy_lookup); None: the engine's default
    draft_lookup: int | None = None
    draft_stop_below: float | None = None  # EngineConfig.draft_stop_below; None: the default
    # EngineConfig.draft_head_tokens (0: the whole head); None: the engine's default
    draft_head_tokens: int | None = None

    @property
    def setup(self) -> tuple[str, str, int, bool]:
        """What a mode's speedup is measured under: a mode is compared with AR (and SD) of the
        same forwards, dtype, tensor-parallel size and core budget."""
        return self.forwards, self.dtype, self.tensor_parallel_size, self.one_core


def _ks_of(cfg: BenchConfig, mode: str) -> tuple[int, ...]:
    """The speculation lengths ``mode`` runs with: only the largest where --largest-k-only names
    it."""
    return (max(cfg.ks),) if mode in cfg.largest_k_only else cfg.ks


def _ssd_pairs(cfg: BenchConfig) -> list[tuple[int, str]]:
    """SSD's (K, fan-out) pairs that fit; a fan-out that fits no K is an error."""
    pairs: list[tuple[int, str]] = []
    for f in cfg.fanouts:
        errors: list[str] = []
        for k in _ks_of(cfg, "ssd"):
            try:
                parse_fanout(f, k)
                pairs.append((k, f))
            except ValueError as e:
                errors.append(str(e))
        if len(errors) == len(_ks_of(cfg, "ssd")):
            raise ValueError(errors[0])
    return pairs


def _label(
    cfg: BenchConfig,
    mode: str,
    sampling: str,
    k: int | None = None,
    f: str | None = None,
    c: float | None = None,
) -> str:
    """A variant's name: its mode and those of K, fan-out, C and sampling method that vary in
    this run."""
    parts = [f"k={k}"] if k is not None and len(cfg.ks) > 1 else []
    parts += [f"f={f}"] if f and len(cfg.fanouts) > 1 else []
    parts += [f"c={c:g}"] if c is not None and len(cfg.saguaro_cs) > 1 else []
    parts += [sampling] if len(cfg.samplings) > 1 and mode not in OWN_SAMPLER_MODES else []
    return f"{mode} {' '.join(parts)}" if parts else mode


def _setups(cfg: BenchConfig, own: bool) -> list[tuple[str, int, str]]:
    """The (forwards, tensor-parallel size, dtype) settings a mode runs under; one where the mode
    has its own sampler and forwards (``own``)."""
    if own:
        return [(cfg.forwards[0], 1, "float32")]
    return [
        (fw, tp, dt) for dt in cfg.dtypes for tp in cfg.tensor_parallel_sizes for fw in cfg.forwards
    ]


def _setup_tail(cfg: BenchConfig, fw: str, tp: int, dt: str) -> str:
    """The label's suffix naming those of forwards, tensor-parallel size and dtype that vary in
    this run."""
    tail = f" {fw}" if len(cfg.forwards) > 1 else ""
    tail += f" tp={tp}" if len(cfg.tensor_parallel_sizes) > 1 else ""
    tail += f" {dt}" if len(cfg.dtypes) > 1 else ""
    return tail


def _mode_variants(
    cfg: BenchConfig, mode: str, sm: str, tail: str, ssd_pairs: list[tuple[int, str]]
) -> list[Variant]:
    """``mode``'s variants under sampling method ``sm``: one for AR and llama.cpp, one per (K,
    fan-out, C) for SSD, one per K otherwise; each label ends with ``tail``."""
    if mode in ("ar", "llama.cpp"):
        return [Variant(mode, label=_label(cfg, mode, sm) + tail, sampling=sm)]
    if mode == "ssd":
        return [
            Variant("ssd", k, f, _label(cfg, "ssd", sm, k, f, c) + tail, c, sm)
            for k, f in sorted(ssd_pairs)
            for c in cfg.saguaro_cs
        ]
    return [
        Variant(mode, k, label=_label(cfg, mode, sm, k) + tail, sampling=sm)
        for k in _ks_of(cfg, mode)
    ]


def _expand_draft_and_core(cfg: BenchConfig, mode: str, found: list[Variant]) -> list[Variant]:
    """``found`` per draft dtype, draft lookup, draft head and draft stop threshold where given
    and ``mode`` has them, plus their one-core copies with --one-core-baselines."""
    if cfg.draft_dtypes and mode in DRAFT_MODES:
        found = [
            replace(v, draft_dtype=d, label=f"{v.label} draft {d}")
            for v in found
            for d in cfg.draft_dtypes
        ]
    if cfg.draft_lookups and mode in (*DRAFT_MODES, LOOKUP_MODE):
        found = [
            replace(v, draft_lookup=n, label=f"{v.label} lookup {n}")
            for v in found
            for n in cfg.draft_lookups
        ]
    if cfg.draft_head_tokens and mode in DRAFT_MODES:
        found = [
            replace(v, draft_head_tokens=n, label=f"{v.label} head {n or 'whole'}")
            for v in found
            for n in cfg.draft_head_tokens
        ]
    if cfg.draft_stop_belows and mode in DRAFT_MODES:
        found = [
            replace(v, draft_stop_below=p, label=f"{v.label} stop {p:g}")
            for v in found
            for p in cfg.draft_stop_belows
        ]
    if cfg.one_core_baselines and mode in ONE_CORE_MODES:
        found += [replace(v, one_core=True, label=f"{v.label} 1 core") for v in found]
    return found


def build_variants(cfg: BenchConfig) -> list[Variant]:
    """AR and llama.cpp once; SD, HF and llama.cpp-sd per K; SSD per (K, fan-out) pair that fits
    (a fixed fan-out lists K+1 counts, so it pairs only with that K) and per Saguaro constant C.
    Each of these per sampling method, except HF and the llama.cpp peers, which have their own
    samplers. A label names a variant by its mode and only the settings that vary in this run."""
    ssd_pairs = _ssd_pairs(cfg)
    variants: list[Variant] = []
    for mode in cfg.modes:
        # transformers' assisted generation and the llama.cpp peers have their own samplers and
        # forwards: one variant whatever the method
        own = mode in OWN_SAMPLER_MODES
        for sm in cfg.samplings[:1] if own else cfg.samplings:
            for fw, tp, dt in _setups(cfg, own):
                tail = "" if own else _setup_tail(cfg, fw, tp, dt)
                found = [
                    replace(v, forwards=fw, tensor_parallel_size=tp, dtype=dt)
                    for v in _mode_variants(cfg, mode, sm, tail, ssd_pairs)
                ]
                variants += _expand_draft_and_core(cfg, mode, found)
    return variants


def batch_count(num_prompts: int, b: int) -> int:
    """Requests measured at batch size b: the prompts, rounded up to whole batches."""
    return math.ceil(num_prompts / b) * b


def request_seed(seed: int, repeat: int, index: int) -> int:
    return seed * SEED_STRIDE + repeat * REPEAT_STRIDE + index


def request_params(
    cfg: BenchConfig, temperature: float, repeat: int, idx: list[int]
) -> list[SamplingParams]:
    """The sampling parameters of requests ``idx`` in pass ``repeat``: the same for every variant,
    and every request produces exactly ``max_tokens`` tokens."""
    return [
        SamplingParams(
            temperature=temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            seed=request_seed(cfg.seed, repeat, i),
            ignore_eos=True,  # every mode produces exactly max_tokens tokens
        )
        for i in idx
    ]


@dataclass(frozen=True)
class Job:
    """One call to measure: a variant on one batch of prompts."""

    prompts: PromptSet
    temperature: float
    batch_size: int
    repeat: int
    batch_index: int
    indices: list[int]  # the requests' positions in ``prompts``
    variant: Variant


@dataclass
class Plan:
    cfg: BenchConfig
    variants: list[Variant]
    prompt_sets: list[PromptSet]

    def jobs(self) -> list[Job]:
        """Every call, in run order: per prompt set, temperature, batch size, repeat and batch,
        the variants one after another (interleaved innermost, so drift hits them alike), in an
        order shuffled per batch (seeded): what one variant's run leaves behind for the next
        (after an SSD variant, the next run's first forward was measured 20% slower at batch 1)
        falls on every variant alike, not always on the one listed after it."""
        rng = random.Random(self.cfg.seed)
        out = []
        for ps in self.prompt_sets:
            for temp in self.cfg.temperatures:
                for b in self.cfg.batch_sizes:
                    n = batch_count(self.cfg.num_prompts, b)
                    for r in range(self.cfg.repeats):
                        for j, lo in enumerate(range(0, n, b)):
                            idx = list(range(lo, lo + b))
                            order = list(self.variants)
                            rng.shuffle(order)
                            out += [Job(ps, temp, b, r, j, idx, v) for v in order]
        return out
