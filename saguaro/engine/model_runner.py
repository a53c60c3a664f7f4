"""Model runner: owns one model and its paged KV pool, turns queries
(:class:`saguaro.core.query.Query`) into one batched forward."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from saguaro.core.query import Query, token_slots
from saguaro.engine.graphs import Buckets, StaticForwards
from saguaro.models.layers import AttentionMetadata
from saguaro.models.llama import CausalLM

# Tokens per query in :meth:`ModelRunner.warm_up`: more than one, so the multi-token graphs are
# the ones compiled (a compiled graph specialises on a dimension of size 1).
WARM_UP_TOKENS = 3
# Graphs one compiled forward may hold: every kind of forward of :meth:`ModelRunner.warm_up`
# (about ten) for each model sharing the code (a target and its draft in one process), with room.
# torch's default (8) is per function, and past it the forward silently runs eagerly.
COMPILED_VARIANTS_LIMIT = 64
# Bytes a KV pool starts on: what torch gives its own CPU tensors, for the C kernels' vector loads.
ALIGNMENT = 64
COMPILE_OPTIONS = {"dynamic": True, "options": {"cpp_wrapper": True}}


@dataclass
class StepInputs:
    """One forward's inputs, flat over its queries (see :class:`AttentionMetadata`)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T]
    key_slots: torch.Tensor  # [b, L]
    mask: torch.Tensor  # [b, 1, Q, L]
    query_index: torch.Tensor | None  # [b, Q]
    out_index: torch.Tensor | None  # [T]
    logits_index: torch.Tensor  # [m]


def kv_pool(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, prefault: bool = False
) -> torch.Tensor:
    """One layer's K or V pool, zeros.

    On the CPU the zeros come from ``calloc`` (NumPy's ``zeros``), whose large blocks are pages
    the OS maps zeroed on first touch: a pool costs time and memory as it fills, where
    ``torch.zeros`` writes, and makes resident, every byte of it at start-up. ``prefault``
    writes them at once (a server: memory flat from its start, no page faults mid-request).
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = math.prod(shape) * dtype.itemsize
    raw = np.zeros(size + ALIGNMENT, dtype=np.uint8)
    if prefault:
        raw.fill(0)
    start = -raw.ctypes.data % ALIGNMENT
    return torch.from_numpy(raw[start : start + size]).view(dtype).view(shape)


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        device: str | torch.device,
        compile: bool = False,
        compile_options: dict | None = None,
        buckets: Buckets | None = None,
        prefault: bool = False,
    ) -> None:
        self.model = model
        # Compiled: one graph per kind of forward, with symbolic token and key counts, so a new
        # batch size or context length does not recompile; the kernels are called from C++
        # (inductor's cpp_wrapper) rather than from Python, which is most of what a small
        # forward costs beyond its matrix products (docs/bench/forwards/compile_variants.py).
        # inference_mode tensors cannot enter a compiled graph that writes the KV cache;
        # no_grad serves both paths.
        self._forward = model
        if compile:
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, COMPILED_VARIANTS_LIMIT)
            # compile_options: torch.compile's keywords in place of these (the experiments of
            # docs/bench/forwards/compile_variants.py; the engine passes none).
            self._forward = torch.compile(model, **(compile_options or COMPILE_OPTIONS))
        self.config = model.config
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        # A tensor-parallel rank caches its own KV heads only.
        # The bucketed path's padding writes one row past the pool (its scratch slot).
        rows = self.num_slots + (buckets is not None)
        shape = (rows, model.num_kv_heads, self.config.head_dim)
        pool = partial(kv_pool, shape, model.embed_tokens.dtype, self.device, prefault)
        self.kv_caches = [(pool(), pool()) for _ in range(self.config.num_hidden_layers)]
        # Forwards that fit a bucket run over static buffers, as CUDA graphs on a GPU.
        self.static = (
            None
            if buckets is None
            else StaticForwards(
                self._forward,
                self.kv_caches,
                buckets,
                self.config.vocab_size,
                scratch=self.num_slots,
                device=self.device,
            )
        )

    @staticmethod
    def kv_bytes_per_block(model: CausalLM, block_size: int) -> int:
        cfg = model.config
        elem = model.embed_tokens.dtype.itemsize
        per_token = 2 * cfg.num_hidden_layers * model.num_kv_heads * cfg.head_dim * elem
        return per_token * block_size

    def sequence_query(
        self, block_table: list[int], start: int, token_ids: list[int], num_logits: int
    ) -> Query:
        """Causal query for tokens at indices ``[start, start + len(token_ids))`` of a sequence
        whose tokens before ``start`` already have KV."""
        end = start + len(token_ids)
        keys = token_slots(block_table, 0, end, self.block_size)
        positions = np.arange(start, end, dtype=np.int64)
        return Query(token_ids, positions, keys[start:], keys, num_logits)

    def fork_query(self, block_table: list[int], context: int, token_ids: list[int]) -> Query:
        """One token per branch, every branch forked after the first ``context`` tokens of
        ``block_table`` (all at position ``context``), each seeing that context and itself, with
        logits at each: the shape of one depth of SSD's branches."""
        m = len(token_ids)
        keys = token_slots(block_table, 0, context + m, self.block_size)
        mask = np.concatenate([np.ones((m, context), dtype=bool), np.eye(m, dtype=bool)], axis=1)
        positions = np.full(m, context, dtype=np.int64)
        return Query(token_ids, positions, keys[context:], keys, m, mask)

    def warm_up(self) -> None:
        """Run each kind of forward once, so that a compiled runner compiles now rather than
        inside a request or a timed build: prefill from an empty cache (logits at every token,
        the last one or none), decode, verification, a batch of mixed lengths, masked branches.
        A compiled graph specialises on dimensions of size 0 and 1 and on equal sizes, so each
        kind runs with one and with two sequences, and with keys before its tokens. Writes KV
        only into the first two blocks, which no sequence holds yet: call it before serving."""
        table = [0, 1]
        width = min(WARM_UP_TOKENS, self.block_size)
        tokens = [0] * width
        q = self.sequence_query
        branches = self.fork_query(table, width, tokens)
        for n in (1, 2):
            for start, length in ((0, width), (width, 1), (width, width)):
                # Logits at every token (verification), the last only (a prompt's final chunk)
                # or none (an earlier chunk): a count of 0 or 1 is its own graph.
                for num_logits in sorted({length, 1, 0}):
                    self.forward([q(table, start, tokens[:length], num_logits)] * n)
            self.forward([branches] * n)
        self.forward([q(table, width, tokens, width), q(table, width, tokens[:1], 1)])

    def forward(self, queries: Seq[Query]) -> torch.Tensor:
        """Run all queries in one forward; return float32 logits ``[sum num_logits, V]`` in
        query order."""
        return self.run(self.prepare(queries))

    @property
    def capture_s(self) -> float:
        """Seconds this runner has spent capturing graphs (0 without them): what a timed region
        that captured on first use subtracts to learn what its forwards cost."""
        return self.static.capture_s if self.static is not None else 0.0

    def capture_graphs(self, positions: tuple[int, ...]) -> None:
        """On a GPU with buckets, capture now the graphs of forwards of ``positions`` tokens per
        sequence (decode: 1, verification: K + 1) at every batch and key bucket."""
        if self.static is not None:
            buckets = self.static.buckets
            shapes = [
                buckets.shape(b, q, keys)
                for b in buckets.batch
                for q in positions
                for keys in buckets.keys
            ]
            self.static.capture([s for s in shapes if s is not None])

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """One forward over prepared inputs (CPU tensors, moved to the device here), through
        its bucket's static buffers where it fits one."""
        shape = self.static.shape_of(inputs.mask) if self.static is not None else None
        if shape is not None:
            return self.static.run(
                shape,
                inputs.input_ids,
                inputs.positions,
                inputs.slot_mapping,
                inputs.key_slots,
                inputs.mask,
                _padded_rows(inputs),
                inputs.logits_index,
            )
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=inputs.slot_mapping.to(dev),
            key_slots=inputs.key_slots.to(dev),
            mask=inputs.mask.to(dev),
            query_index=_to(inputs.query_index, dev),
            out_index=_to(inputs.out_index, dev),
            rows=_padded_rows(inputs),
        )
        with torch.no_grad():
            return self._forward(
                inputs.input_ids.to(dev),
                inputs.positions.to(dev),
                meta,
                self.kv_caches,
                inputs.logits_index.to(dev),
            )

    def prepare(self, queries: Seq[Query]) -> StepInputs:
        """The flat tensors of one forward, on the CPU (a tensor-parallel rank 0 sends them to
        the other ranks as they are). Built as NumPy arrays and handed to torch without a copy:
        a step's metadata is a few small arrays, and NumPy's cost per operation on them is a
        fraction of torch's. Laid out with whole-batch operations (a step may hold thousands of
        queries), the given masks alone copied one by one."""
        b = len(queries)
        q_lens = np.fromiter((len(q.token_ids) for q in queries), dtype=np.int64, count=b)
        k_lens = np.fromiter((len(q.key_slots) for q in queries), dtype=np.int64, count=b)
        n_q, n_k = int(q_lens.max()), int(k_lens.max())
        key_slots = np.zeros((b, n_k), dtype=np.int64)
        key_slots[np.arange(n_k) < k_lens[:, None]] = np.concatenate([q.key_slots for q in queries])
        mask = _causal_masks(q_lens, k_lens, n_q, n_k)[:, None]
        for i, q in enumerate(queries):
            if q.mask is not None:
                mask[i, 0, : q_lens[i], : k_lens[i]] = q.mask
        query_index = out_index = None
        if (q_lens != n_q).any():
            filled = np.arange(n_q) < q_lens[:, None]  # [b, Q]: the real query rows
            index = np.zeros((b, n_q), dtype=np.int64)
            index[filled] = np.arange(int(q_lens.sum()))
            query_index = torch.from_numpy(index)
            out_index = torch.from_numpy(np.flatnonzero(filled))
        num_logits = np.fromiter((q.num_logits for q in queries), dtype=np.int64, count=b)
        return StepInputs(
            input_ids=torch.tensor([t for q in queries for t in q.token_ids], dtype=torch.int64),
            positions=torch.from_numpy(np.concatenate([q.positions for q in queries])),
            slot_mapping=torch.from_numpy(np.concatenate([q.slots for q in queries])),
            key_slots=torch.from_numpy(key_slots),
            mask=torch.from_numpy(mask),
            query_index=query_index,
            out_index=out_index,
            logits_index=torch.from_numpy(_last_rows(np.cumsum(q_lens), num_logits)),
        )


def _causal_masks(q_lens: np.ndarray, k_lens: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
    """[b, Q, L]: query j of sequence i sees keys 0 .. k_lens[i] - q_lens[i] + j; a padded query
    row (j >= q_lens[i]) sees key 0 only, so its softmax stays finite (its output is dropped)."""
    row = np.arange(n_q)[None, :, None]
    key = np.arange(n_k)[None, None, :]
    ql, kl = q_lens[:, None, None], k_lens[:, None, None]
    causal = (key <= kl - ql + row) & (key < kl) & (row < ql)
    return causal | ((row >= ql) & (key == 0))


def _last_rows(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The flat rows ``ends[i] - counts[i] .. ends[i] - 1`` of every i, in order (int64)."""
    firsts = np.repeat(ends - counts, counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return firsts + np.arange(int(counts.sum()), dtype=np.int64) - starts


def _padded_rows(inputs: StepInputs) -> torch.Tensor:
    """Each token's row of the padded [b, Q] layout."""
    if inputs.out_index is not None:
        return inputs.out_index
    return torch.arange(len(inputs.input_ids))


def _to(t: torch.Tensor | None, dev: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(dev)


# The context a timed forward attends to: a typical served length, short enough for any pool.
TIMING_CONTEXT = 128


def time_forward(runner: ModelRunner, num_seqs: int, positions: int) -> float:
    """Seconds of one forward of ``num_seqs`` queries of ``positions`` tokens each (logits at
    every one, as a verification), after ``TIMING_CONTEXT`` tokens of context. Every query uses
    the pool's first blocks, so this writes KV only there: call it before serving."""
    context = max(0, min(TIMING_CONTEXT, runner.num_slots - positions))
    blocks = list(range(-(-(context + positions) // runner.block_size)))
    query = runner.sequence_query(blocks, context, [0] * positions, positions)
    clock = ForwardClock(runner)
    runner.forward([query] * num_seqs)
    clock.stop()
    return clock.seconds()


class ForwardClock:
    """The seconds a stretch of ``runner``'s work took (a forward; a branch depth's forward and
    draws; a backup), less any graph captured in it on first use (the next forward of that
    bucket only replays it).

    On a GPU the host returns from a forward once its kernels are queued, so the host's clock
    alone times the launches. The clock also records CUDA events around the forward and reads
    them when asked, by which time the step has waited for the GPU anyway (its outcome's copy to
    the host): the forward took from its start to the GPU finishing it, or the host's time if
    that is longer."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.capture_start, self.captured = runner, runner.capture_s, 0.0
        self.events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if runner.device.type == "cuda":
            self.stream = torch.cuda.current_stream(runner.device)
            self.events = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            self.events[0].record(self.stream)
        self.start = time.perf_counter()
        self.host_s: float | None = None

    def stop(self) -> None:
        """The forward has returned (on a GPU: been queued)."""
        if self.events is not None:
            self.events[1].record(self.stream)
        self.host_s = time.perf_counter() - self.start
        self.captured = self.runner.capture_s - self.capture_start

    def seconds(self) -> float:
        if self.host_s is None:
            raise RuntimeError("ForwardClock.seconds before stop")
        elapsed = self.host_s
        if self.events is not None:
            start, end = self.events
            end.synchronize()
            elapsed = max(elapsed, start.elapsed_time(end) / 1000)
        return max(0.0, elapsed - self.captured)
