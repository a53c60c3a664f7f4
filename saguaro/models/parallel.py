"""Tensor parallelism inside one model: which slice of each weight a rank holds, and the two
collectives that put the slices back together.

With N ranks (Megatron-style), rank r of a layer holds:

- attention: query heads ``[r H/N, (r+1) H/N)`` and KV heads ``[r Hkv/N, (r+1) Hkv/N)`` of the
  fused QKV projection (column-parallel: rows of the weight), and the matching input columns of
  the output projection (row-parallel). Attention is per head, so rank r computes its heads'
  attention alone, from its own KV cache; the output projection gives a partial sum over heads,
  and one all-reduce (sum) completes it: ``o = sum_r W_o[:, cols_r] a_r``.
- MLP: rows ``[r I/N, (r+1) I/N)`` of gate and up (column-parallel), the matching columns of down
  (row-parallel), then an all-reduce. SiLU(gate) * up is elementwise, so it never needs the
  other ranks' columns.
- embedding and LM head: vocabulary rows ``[r Vp, (r+1) Vp)``, with ``Vp = ceil(V/N)`` (the last
  rank's rows past V are zeros). A rank embeds the ids in its range and zeros the others; the
  all-reduce sums the one non-zero row per token. Each rank scores its vocabulary rows; an
  all-gather concatenates the ``[m, Vp]`` slices and the padding columns are cut off.

Norms and rotary tables are replicated. Every rank adds the same floats in the same reduction, so
TP = N equals TP = 1 up to float reassociation of the sums (not bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from saguaro.models.config import ModelConfig


@dataclass(frozen=True)
class TensorParallel:
    """One rank's place in a tensor-parallel group. ``group`` runs the collectives; a group of
    one (``size == 1``) needs none and every method is the identity."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None

    def split(self, total: int, what: str) -> tuple[int, int]:
        """This rank's ``[start, end)`` of ``total`` items split evenly (``what`` names them in
        the error when ``total`` does not divide)."""
        if total % self.size:
            raise ValueError(
                f"tensor_parallel_size={self.size} does not divide {what} ({total}); choose a "
                f"size that divides it"
            )
        part = total // self.size
        return self.rank * part, (self.rank + 1) * part

    def check(self, cfg: ModelConfig) -> None:
        """Raise ValueError unless ``cfg`` splits evenly over this group (heads, KV heads and
        MLP columns; the vocabulary is padded instead). KV heads are not replicated: a size
        that does not divide them is refused."""
        self.split(cfg.num_key_value_heads, "the number of KV heads")
        self.split(cfg.num_attention_heads, "the number of attention heads")
        self.split(cfg.intermediate_size, "intermediate_size")

    def vocab_rows(self, vocab_size: int) -> tuple[int, int]:
        """This rank's ``[start, start + Vp)`` of the padded vocabulary (``Vp = ceil(V/N)``)."""
        part = -(-vocab_size // self.size)
        return self.rank * part, (self.rank + 1) * part

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.size > 1:
            self.group.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.group.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()
