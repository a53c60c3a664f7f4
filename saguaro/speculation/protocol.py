"""The target <-> draft-worker message protocol (one request and one reply per round).

::

    target (rank 0)                               draft worker (rank 1)
    HELLO(WorkerConfig)           ───────────────>
    (both, if WorkerConfig.lane: open the device lane)
                                                    load draft, allocate KV
                                  <───────────────  READY(vocab_size)
    ROUND(RoundRequest)           ───────────────>  apply outcomes; per sequence: cache hit,
                                                    or backup (neural: decode now; fast: n-gram)
                                  <───────────────  SPEC(RoundReply)
                                                    build the speculation cache for the
                                                    outcomes of the round just sent, until
                                                    done, the doorbell rings, or the idle
                                                    bell does (the target released every
                                                    sequence: abandon the build)
    ... the target verifies while the worker builds ...
    ROUND ...
    FEED(Feed)                    ───────────────>  (a step the target ran without asking: AR,
                                                    SD or copies) take its tokens, settle the
                                                    shadow chains they decide, read the context
                                                    and draft new shadow chains until the
                                                    doorbell rings; no reply
    SHUTDOWN                      ───────────────>  exit

A request carries, per sequence, the tokens committed since the worker last heard of it (the
whole prompt for a new sequence): ``s_1..s_k, t`` after a round, from which the worker reads the
outcome ``(k, t)``. The reply carries, per sequence, the next speculation and, at temperature > 0,
the exact q it was sampled from as (id, probability) pairs of the draft's top-M tokens (none at
temperature 0: greedy proposals are point masses).

FEED is sent only where the worker has cores (or a GPU) of its own, before each step the target
runs without SSD: the worker stays current instead of catching up on the target's time when SSD
is next chosen, and measures its draft for free. Its shadow chain for a sequence is the
speculation a miss would get (a neural backup, greedy or coupled), which the target's next
committed tokens accept or reject exactly as a verification would: position j is tried when
the chain's first j tokens were committed, and hit when its (j + 1)-th was too. The worker adds
the counts to the bells ``shadow_bell("tried", j)`` and ``shadow_bell("hits", j)``, which the
target reads as the draft's acceptance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from saguaro.sampling import SamplingParams, SparseQ
from saguaro.speculation.ngram import Lookup

if TYPE_CHECKING:
    from saguaro.config import EngineConfig

HELLO, READY, ROUND, SPEC, SHUTDOWN, ERROR, FEED = range(7)
# The channel bell the target rings when it has released every sequence it sent (requests that
# finished or were aborted): no message follows, since there is nothing left to ask.
IDLE_BELL = "saguaro/idle"


def shadow_bell(kind: str, j: int) -> str:
    """The bell counting shadow chains' position ``j`` (0-based) tried or hit (``kind``)."""
    return f"saguaro/shadow-{kind}/{j}"


def lane_between(target_device: str, worker_device: str) -> bool:
    """Whether target and worker exchange tensors over a device lane: both on GPUs, different
    ones (NCCL cannot connect two processes on one GPU)."""
    t, w = torch.device(target_device), torch.device(worker_device)
    return t.type == w.type == "cuda" and (t.index or 0) != (w.index or 0)


@dataclass
class WorkerConfig:
    """What the worker needs to know of the engine's settings, sent with HELLO."""

    draft_dir: str
    k: int  # speculation length K
    fanout: str | list[int]  # "auto" | "geometric" | "empirical" | fixed F_0..F_K
    budget: int | None  # branches per sequence; None = sized online to fit a verification
    saguaro_c: float  # Saguaro sampling constant C in (0, 1]
    top_m: int  # the draft samples from its top-M tokens
    max_model_len: int
    max_num_seqs: int
    block_size: int
    dtype: str  # the draft's (EngineConfig.draft_dtype)
    quantization: str  # the draft's (EngineConfig.draft_quantization)
    head_tokens: int  # rows the draft's LM head keeps, 0 all (EngineConfig.draft_head_tokens)
    kernels: bool  # saguaro's kernels (EngineConfig.kernels == "saguaro")
    device: str
    cpus: list[int] | None  # CPU affinity of the worker process
    num_threads: int | None
    seed: int
    compile: bool  # torch.compile the draft's forward
    graphs: bool = False  # bucketed forwards replay CUDA graphs (EngineConfig.graphs_on)
    # The replies' tensors go GPU to GPU over the channel's device lane (both ends on GPUs, not
    # the same one); otherwise the worker sends them from its host memory.
    lane: bool = False
    lookup: Lookup | None = None  # copies from the context in the draft's chains (§3)
    stop_below: float = 0.0  # chains and branches stop before an unsure draft row (§3, "Stops")
    prefault: bool = False  # write the KV pool's pages at start (EngineConfig.kv_prefault)

    @classmethod
    def from_engine(
        cls, cfg: EngineConfig, draft_dir: str | os.PathLike[str], max_model_len: int
    ) -> WorkerConfig:
        """The worker's settings from the engine's (the one place that maps them);
        ``max_model_len`` is the engine's resolved context length."""
        return cls(
            draft_dir=str(draft_dir),
            k=cfg.num_speculative_tokens,
            fanout=cfg.fanout,
            budget=cfg.cache_budget,
            saguaro_c=cfg.saguaro_c,
            top_m=cfg.draft_top_m,
            max_model_len=max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            block_size=cfg.block_size,
            dtype=cfg.draft_dtype,
            quantization=cfg.draft_quantization,
            head_tokens=cfg.draft_head_tokens,
            kernels=cfg.kernels == "saguaro",
            device=cfg.draft_device or cfg.device,
            cpus=cfg.draft_cpus,
            num_threads=cfg.draft_threads,
            seed=cfg.seed,
            compile=cfg.compile,
            graphs=cfg.graphs_on(cfg.draft_device or cfg.device),
            lane=lane_between(cfg.device, cfg.draft_device or cfg.device),
            lookup=Lookup.of(cfg.draft_lookup),
            stop_below=cfg.draft_stop_below or 0.0,
            prefault=cfg.kv_prefault,
        )


@dataclass
class SeqUpdate:
    seq_id: int
    new_tokens: list[int]  # committed since the last request (whole prompt for a new sequence)
    # Sent with a new sequence only: the request's settings (None: greedy), and what its
    # logits processors need beyond them (saguaro.sampling.processors.Processors.build), so that
    # the draft proposes what the target's processors allow.
    params: SamplingParams | None = None
    num_prompt: int = 0  # new_tokens[:num_prompt] is the prompt
    stop_ids: list[int] = field(default_factory=list)  # held back while under min_tokens
    bad_words: list[tuple[int, ...]] = field(default_factory=list)  # tokenized
    seed: int = 0  # the request's seed: keys the draft's noise (saguaro.sampling.noise)
    coupled: bool = False  # the request's method: coupled sampling, else rejection sampling
    new: bool = False


@dataclass
class RoundRequest:
    updates: list[SeqUpdate]
    dropped: list[int] = field(default_factory=list)  # finished or aborted sequences
    backup: str = "neural"  # backup for misses this round: "neural" | "fast"
    verify_s: float | None = None  # target's last verification forward (seconds)
    window_s: float | None = None  # target's time from our last reply to this request


@dataclass
class Feed:
    """A step the target ran without SSD: what it committed, as a round's request has it."""

    updates: list[SeqUpdate]
    dropped: list[int] = field(default_factory=list)


@dataclass
class SeqSpec:
    seq_id: int
    tokens: list[int]
    q: SparseQ | None  # [len(tokens), M] exact q; None = point masses (greedy draft, n-gram)
    hit: bool | None  # None for a new sequence (nothing could be prepared yet)
    backup: str | None  # backup used on a miss


@dataclass
class RoundReply:
    specs: list[SeqSpec]
    fanout: list[int]  # F_0..F_d of the cache being built next
    budget: int
    depth: int  # d <= K: tokens per cached branch
    handle_s: float  # from this request's arrival to this reply (backups included)
    build_s: float  # duration of the last cache build (glue + branch decoding)
    glue_s: float
    branch_s: float
    backup_s: float  # time spent on backups before this reply
    idle_s: float = 0.0  # how long the worker waited for this request after its last build
    cut: bool = False  # the last build stopped early: this request was already on its way
    # the last plan's inputs and prediction (CacheBuilder.plan_figures); empty before one
    plan: dict[str, float | list[float]] = field(default_factory=dict)
