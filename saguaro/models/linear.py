"""Linear layers run by saguaro's own kernels (:mod:`saguaro.kernels`), dense or quantized, and
the switch that puts a loaded model on them.

On the CPU every product, norm, SwiGLU and attention of a model on these kernels computes a
row's result in an order fixed by the row alone, so a token's logits are the same bits whatever
shares its forward (the kernels' header argues it). On other devices a quantized layer
dequantizes its weight for each call (exact, not fast) and the rest runs on torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from saguaro.kernels import ops
from saguaro.kernels.interleave import interleave
from saguaro.kernels.ops import PackedWeight
from saguaro.models.quant import SCHEMES, concat_rows, dequantize, exact_q8, quantize

# Dense weight dtypes the linear kernel reads as they are.
DENSE_FORMATS = {torch.float32: "f32", torch.bfloat16: "bf16"}


class KernelLinear(nn.Module):
    """``y = x W^T (+ b)`` with W a :class:`PackedWeight`; y in x's dtype."""

    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight.check()
        weight = interleave(weight)  # the layout the kernel reads fastest, the same bytes
        self.fmt, self.n, self.k, self.group = weight.fmt, weight.n, weight.k, weight.group
        self.register_buffer("codes", weight.codes)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def weight(self) -> PackedWeight:
        return PackedWeight(
            self.fmt, self.codes, self.n, self.k, self.group, self.scales, self.mins
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if x.device.type == "cpu":
            y = ops.linear(x.reshape(-1, self.k), self.weight).to(x.dtype).view(*shape[:-1], self.n)
        else:
            y = F.linear(x, dequantize(self.weight).to(x.dtype))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in={self.k}, out={self.n}, format={self.fmt}, group={self.group}"


class PartsLinear(nn.Module):
    """A fused layer whose parts the file stores in different formats (a Q4_K query beside a
    Q6_K value, say): each part its own :class:`KernelLinear`, their outputs side by side in
    the fused order, then the bias."""

    def __init__(self, parts: list[PackedWeight], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(KernelLinear(p) for p in parts)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias


def kernel_linear(
    weight: PackedWeight | list[PackedWeight], bias: torch.Tensor | None
) -> KernelLinear | PartsLinear:
    """One module for a weight, or for a fused weight's parts: concatenated where they share a
    format and group, side by side otherwise."""
    if isinstance(weight, PackedWeight):
        return KernelLinear(weight, bias)
    if len({(p.fmt, p.group) for p in weight}) == 1:
        return KernelLinear(concat_rows(weight), bias)
    return PartsLinear(weight, bias)


class PackedEmbedding(nn.Module):
    """A token embedding held as a quantized :class:`PackedWeight` (row t: token t), the tied LM
    head's own blocks where there is one: a looked-up row is dequantized, which gives exactly
    the float32 row of the dense table it replaces (that table being those blocks
    dequantized), then cast to ``dtype``."""

    def __init__(self, weight: PackedWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.fmt, self.n, self.k, self.group = weight.fmt, weight.n, weight.k, weight.group
        self.register_buffer("codes", weight.codes)  # the same tensors: no copy
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[flat]

        rows = PackedWeight(
            self.fmt, self.codes[flat], len(flat), self.k, self.group, take(self.scales),
            take(self.mins),
        )  # fmt: skip
        return dequantize(rows).to(self.dtype).view(*ids.shape, self.k)

    def extra_repr(self) -> str:
        return f"tokens={self.n}, dim={self.k}, format={self.fmt}, group={self.group}"


def packed_embedding(model: nn.Module, weights: dict[str, PackedWeight]) -> PackedEmbedding | None:
    """The model's embedding held packed where that changes none of its rows: a GGUF file's own
    blocks (``weights["embed_tokens"]``), or a float32 table that int8 groups of 32 hold exactly
    (one dequantized from Q8_0, as SmolLM2's is in its draft); None otherwise, and where a tied
    head on dense weights holds the table anyway. It spares the dense table: 4 bytes a weight
    for a byte and a 32nd of a scale, or for nothing where the blocks are the tied head's."""
    dense = model.embed_tokens
    if dense.tp.size > 1:
        return None
    if "embed_tokens" in weights:
        return PackedEmbedding(weights["embed_tokens"], dense.dtype)
    head = model.lm_head
    if model.config.tie_word_embeddings and not (
        isinstance(head, KernelLinear) and head.weight.quantized
    ):
        return None
    w = exact_q8(dense.weight.data)
    return None if w is None else PackedEmbedding(w, dense.dtype)


def packed(weight: torch.Tensor, scheme: str) -> PackedWeight:
    """A dense [n, k] weight as it is ("none") or quantized by ``scheme``."""
    n, k = weight.shape
    if scheme != "none":
        return quantize(weight, scheme)
    fmt = DENSE_FORMATS.get(weight.dtype)
    if fmt is None:
        raise ValueError(
            f"saguaro's kernels read float32 and bfloat16 weights, not {weight.dtype}; use "
            f"--kernels torch for {weight.dtype}"
        )
    return PackedWeight(fmt, weight.detach().contiguous(), n, k)


def kernel_fits(module: nn.Module) -> bool:
    """Whether a norm or attention module's shapes suit its kernel (SwiGLU's always do)."""
    if hasattr(module, "head_dim"):
        return ops.fits_head(module.head_dim)
    if hasattr(module, "eps"):
        return ops.fits_rows(module.weight.shape[0])
    return True


def use_kernels(
    model: nn.Module,
    scheme: str = "none",
    weights: dict[str, PackedWeight | list[PackedWeight]] | None = None,
    everywhere: bool = True,
) -> list[str]:
    """Put ``model`` (a loaded :class:`saguaro.models.llama.CausalLM`) on saguaro's kernels: every
    linear layer becomes a :class:`KernelLinear`, from ``weights[name]`` where given (a GGUF
    file's blocks; a list: a fused layer's parts, :func:`kernel_linear`) and otherwise from its
    dense weight as ``scheme`` says; with ``everywhere``, norms, SwiGLU and attention switch to
    their kernels too. Returns the modules whose shapes the
    kernels do not take (widths not a multiple of 32 or heads of 16), which stay on torch: the
    model's logits are then not batch-invariant."""
    if scheme != "none" and scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; choose none or one of {list(SCHEMES)}")
    weights = weights or {}
    on_torch = []
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear: nn.Linear = getattr(parent, leaf)
        if name not in weights and not ops.fits_linear(linear.in_features):
            if scheme != "none":
                raise ValueError(
                    f"{name}: input width {linear.in_features} is not a multiple of {ops.BLOCK}, "
                    f"so it cannot be quantized ({scheme})"
                )
            on_torch.append(name)
            continue
        w = weights.get(name) or packed(linear.weight.data, scheme)
        bias = None if linear.bias is None else linear.bias.data
        setattr(parent, leaf, kernel_linear(w, bias))
    embedding = packed_embedding(model, weights)
    if embedding is not None:
        model.embed_tokens = embedding
    for name, module in model.named_modules():
        if everywhere and hasattr(module, "kernels"):
            module.kernels = kernel_fits(module)
            if not module.kernels:
                on_torch.append(name)
    return on_torch
