"""Bucketed forwards over static buffers, replayed as CUDA graphs on a GPU.

A small model's forward on a GPU costs its kernel launches more than its arithmetic: a decode
step of a 30-layer model is some 400 launches of microseconds each, and the draft's forwards,
the smallest, are the most launch-bound. A CUDA graph records one forward's launches once and
replays them as one, but it replays fixed shapes reading fixed addresses. So a forward is padded
to a *bucket* (:class:`Shape`): ``B >= b`` sequences, ``Q >= max q_i`` positions each and
``L >= max L_i`` keys, from the bucket lists of :class:`Buckets`, and its inputs are copied into
static buffers that every bucket's graph reads as prefixes. Forwards beyond the largest bucket
(long prefill chunks, batches past ``max_batch``) run eagerly.

Layout. Sequence ``i``'s ``j``-th token takes static row ``i * Q + j``. A padding row (``j >= q_i``
or ``i >= b``) scores token 0 at position 0, writes its K and V into the *scratch slot* (one cache
row past the pool, which the block manager never hands out) and attends to its sequence's first
key only, so its softmax stays finite; its output is dropped. A real row's padded key columns
point at the scratch slot and are masked out.

Why padding changes no real logit: every row of a linear layer, norm and SwiGLU is computed from
that row alone; attention mixes a row only with its own sequence's keys through its own mask row,
and a masked key has weight exactly 0 (exp(-inf)); the only cache rows padding writes are the
scratch slot's, which no real row's mask admits. So each real row's logits are the unpadded
forward's, up to the rounding of a different product shape on torch's kernels, and bit for bit
on saguaro's batch-invariant CPU kernels (tests/engine/test_graphs.py checks both).

On the CPU the same static path runs without capture (that is how CI tests it); the engine uses
it on CUDA only, unless ``enforce_eager``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from saguaro.kernels.transfer import upload
from saguaro.models.layers import AttentionMetadata

# Bucket ladders: powers of two, then the largest value itself.
MIN_KEY_BUCKET = 256
# Position buckets up to this many tokens per sequence: decode, verification, and SSD's branch
# forwards, whose query is every branch of a sequence (up to its budget, 64); longer queries are
# prefill chunks, which run eagerly.
MAX_GRAPH_POSITIONS = 64
# Rows (B * Q) one graph scores at most: the static logits buffer holds this many rows of the
# vocabulary (150k x 4 bytes each).
MAX_GRAPH_ROWS = 512
MAX_GRAPH_BATCH = 64

ForwardFn = Callable[..., torch.Tensor]  # CausalLM.forward's signature


def ladder(largest: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``largest``, then ``largest``."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return (*sizes, largest)


@dataclass(frozen=True)
class Shape:
    """One bucket: ``batch`` sequences of ``positions`` tokens attending to ``keys`` keys."""

    batch: int
    positions: int
    keys: int

    @property
    def rows(self) -> int:
        return self.batch * self.positions


@dataclass(frozen=True)
class Buckets:
    batch: tuple[int, ...]
    positions: tuple[int, ...]
    keys: tuple[int, ...]

    @classmethod
    def for_runner(
        cls, max_num_seqs: int, max_keys: int, exact_positions: tuple[int, ...] = ()
    ) -> Buckets:
        """Ladders up to the runner's limits; ``exact_positions`` (a verification's K + 1) are
        buckets of their own, so the forward run most often is not padded."""
        positions = set(ladder(MAX_GRAPH_POSITIONS)) | {
            p for p in exact_positions if p <= MAX_GRAPH_POSITIONS
        }
        return cls(
            batch=ladder(min(max_num_seqs, MAX_GRAPH_BATCH)),
            positions=tuple(sorted(positions)),
            keys=ladder(max(max_keys, MIN_KEY_BUCKET), MIN_KEY_BUCKET),
        )

    def shape(self, batch: int, positions: int, keys: int) -> Shape | None:
        """The smallest bucket holding a forward of these sizes, or None (it runs eagerly)."""
        sizes = []
        for ladder_, n in ((self.batch, batch), (self.positions, positions), (self.keys, keys)):
            fit = next((s for s in ladder_ if s >= n), None)
            if fit is None:
                return None
            sizes.append(fit)
        shape = Shape(*sizes)
        return shape if shape.rows <= MAX_GRAPH_ROWS else None

    @property
    def max_rows(self) -> int:
        return min(MAX_GRAPH_ROWS, self.batch[-1] * self.positions[-1])


def graph_buckets(enabled: bool, max_num_seqs: int, max_keys: int, k: int) -> Buckets | None:
    """A runner's buckets where its forwards replay graphs (``enabled``), with a verification's
    K + 1 positions a bucket of its own; None runs every forward eagerly."""
    return Buckets.for_runner(max_num_seqs, max_keys, (k + 1,)) if enabled else None


class StaticForwards:
    """A model's forward over static buffers, one CUDA graph per bucket (captured on first use or
    by :meth:`capture`), or run directly on a CPU. ``forward`` is the runner's (eager or
    compiled) model call; ``scratch`` the cache row padding writes to."""

    def __init__(
        self,
        forward: ForwardFn,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        buckets: Buckets,
        vocab_size: int,
        scratch: int,
        device: torch.device,
    ) -> None:
        self.forward, self.kv_caches, self.buckets = forward, kv_caches, buckets
        self.scratch, self.device = scratch, device
        rows, keys = buckets.max_rows, buckets.keys[-1]
        batch = buckets.batch[-1]

        def buffer(n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        self.input_ids = buffer(rows, torch.int64)
        self.positions = buffer(rows, torch.int64)
        self.slot_mapping = buffer(rows, torch.int64)
        self.key_slots = buffer(batch * keys, torch.int64)
        self.mask = buffer(rows * keys, torch.bool)
        self.capturing = device.type == "cuda"
        # Graphs write their logits here; uncaptured forwards return their own.
        held = rows if self.capturing else 0
        self.logits = buffer(held * vocab_size, torch.float32).view(held, vocab_size)
        self.graphs: dict[Shape, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capturing else None
        # Seconds spent capturing, so far: a forward that captured its bucket on first use took
        # this much longer than its replays will, and online cost estimates subtract it.
        self.capture_s = 0.0

    def shape_of(self, mask: torch.Tensor) -> Shape | None:
        """The bucket of a forward with this (padded) mask [b, 1, Q, L], or None."""
        b, _, q, keys = mask.shape
        return self.buckets.shape(b, q, keys)

    @torch.no_grad()
    def run(
        self,
        shape: Shape,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        key_slots: torch.Tensor,
        mask: torch.Tensor,
        padded_rows: torch.Tensor,
        logits_index: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits ``[m, V]`` of one forward in ``shape``. Its tensors are the runner's
        (:class:`saguaro.engine.model_runner.StepInputs`, on the CPU): ``padded_rows`` [T] is each
        token's row of the [b, Q] layout, ``logits_index`` [m] the tokens whose logits are
        wanted."""
        b, _, q, keys = mask.shape
        self._pad(shape)
        rows = (padded_rows // q) * shape.positions + padded_rows % q  # rows of [B, Q]
        wanted = rows.index_select(0, logits_index)
        rows, input_ids, positions, slot_mapping, key_slots, wanted = upload(
            (rows, input_ids, positions, slot_mapping, key_slots, wanted), self.device
        )
        (mask,) = upload((mask,), self.device)
        self.input_ids.index_copy_(0, rows, input_ids)
        self.positions.index_copy_(0, rows, positions)
        self.slot_mapping.index_copy_(0, rows, slot_mapping)
        key_view, mask_view = self._views(shape)
        key_view[:b, :keys] = key_slots
        mask_view[:b, :, :q, :keys] = mask
        return self._launch(shape).index_select(0, wanted)

    @torch.no_grad()
    def capture(self, shapes: list[Shape]) -> None:
        """Capture these buckets' graphs now (largest first, so later ones fit in the memory the
        first reserved), rather than inside a request."""
        if self.capturing:
            for shape in sorted(set(shapes), key=lambda s: s.rows * s.keys, reverse=True):
                if shape not in self.graphs:
                    self._pad(shape)
                    self._capture(shape)

    def _views(self, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
        """The key slots [B, L] and mask [B, 1, Q, L] of a bucket: prefixes of the flat buffers,
        so every bucket's graph reads the same memory."""
        n_keys = shape.batch * shape.keys
        key_view = self.key_slots[:n_keys].view(shape.batch, shape.keys)
        n_mask = shape.rows * shape.keys
        mask_view = self.mask[:n_mask].view(shape.batch, 1, shape.positions, shape.keys)
        return key_view, mask_view

    def _pad(self, shape: Shape) -> None:
        """Every row of the bucket a padding row: token 0 at position 0 writing the scratch slot,
        every key the scratch slot, only the first visible."""
        n = shape.rows
        self.input_ids[:n].zero_()
        self.positions[:n].zero_()
        self.slot_mapping[:n].fill_(self.scratch)
        key_view, mask_view = self._views(shape)
        key_view.fill_(self.scratch)
        mask_view.zero_()
        mask_view[..., 0] = True

    def _compute(self, shape: Shape) -> torch.Tensor:
        n = shape.rows
        key_view, mask_view = self._views(shape)
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:n],
            key_slots=key_view,
            mask=mask_view,
            query_index=None,
            out_index=None,
        )
        return self.forward(self.input_ids[:n], self.positions[:n], meta, self.kv_caches, None)

    def _launch(self, shape: Shape) -> torch.Tensor:
        if not self.capturing:
            return self._compute(shape)
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self._capture(shape)
        graph.replay()
        return self.logits[: shape.rows]

    def _capture(self, shape: Shape) -> torch.cuda.CUDAGraph:
        """Record one bucket's forward, its logits copied into the shared logits buffer. Run
        once first, on the buffers as they are: lazy initialisation inside the libraries must
        not happen during capture. Both runs write only the cache rows the buffers name."""
        start = time.perf_counter()
        out = self.logits[: shape.rows]
        out.copy_(self._compute(shape))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out.copy_(self._compute(shape))
        self.graphs[shape] = graph
        torch.cuda.synchronize(self.device)  # the warm-up run's kernels belong to the capture
        self.capture_s += time.perf_counter() - start
        return graph
