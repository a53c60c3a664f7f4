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
from saguaro.kernels.ops import PackedWeight
from saguaro.models.quant import SCHEMES, dequantize, quantize

# Dense weight dtypes the linear kernel reads as they are.
DENSE_FORMATS = {torch.float32: "f32", torch.bfloat16: "bf16"}


class KernelLinear(nn.Module):
    """``y = x W^T (+ b)`` with W a :class:`PackedWeight`; y in x's dtype."""

    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight.check()
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
    weights: dict[str, PackedWeight] | None = None,
    everywhere: bool = True,
) -> list[str]:
    """Put ``model`` (a loaded :class:`saguaro.models.llama.CausalLM`) on saguaro's kernels: every
    linear layer becomes a :class:`KernelLinear`, from ``weights[name]`` where given (a GGUF
    file's blocks) and otherwise from its dense weight as ``scheme`` says; with ``everywhere``,
    norms, SwiGLU and attention switch to their kernels too. Returns the modules whose shapes the
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
        setattr(parent, leaf, KernelLinear(w, bias))
    for name, module in model.named_modules():
        if everywhere and hasattr(module, "kernels"):
            module.kernels = kernel_fits(module)
            if not module.kernels:
                on_torch.append(name)
    return on_torch
