"""Counter-based randomness: every uniform a request uses is a hash of where it is used.

A uniform is a pure function ``u(seed, position, purpose)`` of the request's seed, the absolute
position of the token it decides (its index in the sequence, prompt included) and what it
decides (:class:`Purpose`). Nothing is consumed from a stream, so:

* a seeded request draws the same uniforms alone or in any batch, in any row order, on any
  device, in any process (the SSD draft worker computes the draft's noise itself);
* there is no per-request generator state to create, carry, ship or free.

Why this stays exact in speculative decoding: the token committed at position i is decided by
the draft token proposed there (drawn with ``u(seed, i, DRAFT)`` from q given the prefix),
``u(seed, i, ACCEPT)`` and ``u(seed, i, SAMPLE)``. The prefix is a function of the noise at
positions ``< i`` only (a round's outcome never depends on proposals after its first rejection),
so the three uniforms at i are independent of the prefix and of each other, which is all the
rejection-sampling argument in :mod:`saguaro.sampling.verify` needs. Speculation that is thrown
away and later redrawn at the same position reuses the same draft uniform; that is harmless,
because a discarded proposal never influenced what was committed.

The hash is SplitMix64's finaliser (a bijection of 64-bit words with full avalanche), applied
to the seed, then to the position and purpose folded in; the top 53 bits become a float64 in
(0, 1), never exactly 0 or 1. Arithmetic is int64 with two's-complement wrap-around, which
PyTorch has on CPU and CUDA; a test checks it against the same hash in Python integers.
"""

from __future__ import annotations

import enum
import math

import torch

from saguaro.kernels import build, ops

MASK64 = (1 << 64) - 1
MANTISSA_BITS = 53  # a float64 represents every multiple of 2^-53 in [0, 1) exactly
# SplitMix64's increment and finaliser multipliers (Steele, Lea, Flood 2014).
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


class Purpose(enum.IntEnum):
    """What a uniform decides; each purpose is an independent stream per (seed, position)."""

    ACCEPT = 1  # the acceptance test of the proposal at this position
    SAMPLE = 2  # the target's sample at this position (AR, recovery or bonus token)
    DRAFT = 3  # the draft's proposal at this position
    GUMBEL = 4  # coupled sampling: one Gumbel variable per vocabulary entry at this position


def as_int64(value: int) -> int:
    """A Python int in [-2^63, 2^64) as the int64 with the same low 64 bits."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (``>>`` is arithmetic on signed tensors)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * as_int64(MIX1)
    x = (x ^ _shr(x, 27)) * as_int64(MIX2)
    return x ^ _shr(x, 31)


def hash_words(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    purpose: int,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 words ``mix(mix(mix(seed + G) + pos * G) + purpose * G)``, with a vocabulary
    column folded in by one more ``mix(h + column * G)``; broadcast over the inputs. On the CPU
    saguaro's kernel computes the same bits in one pass (a few element-wise torch operators
    cost more than the hash itself at the sizes sampling asks for). Inputs on different devices
    are hashed on the one that is not the CPU (a worker's positions are built on the host, its
    vocabulary ids are where the logits are): the words are the same bits on any device."""
    inputs = [t for t in (seeds, positions, columns) if t is not None]
    device = next((t.device for t in inputs if t.device.type != "cpu"), seeds.device)
    if any(t.device != device for t in inputs):
        seeds, positions = seeds.to(device), positions.to(device)
        columns = None if columns is None else columns.to(device)
        inputs = [t for t in (seeds, positions, columns) if t is not None]
    if not build.serves(*inputs):
        return hash_words_torch(seeds, positions, purpose, columns)
    parts = [t.to(torch.int64) for t in torch.broadcast_tensors(*inputs)]
    return ops.hash_words(parts[0], parts[1], int(purpose), parts[2] if len(parts) > 2 else None)


def hash_words_torch(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    purpose: int,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`hash_words` in torch's int64 operators, on any device."""
    g = as_int64(GOLDEN)
    h = _mix(seeds.to(torch.int64) + g)
    h = _mix(h + positions.to(torch.int64) * g)
    h = _mix(h + as_int64(int(purpose) * GOLDEN))
    return h if columns is None else _mix(h + columns.to(torch.int64) * g)


def _unit(words: torch.Tensor) -> torch.Tensor:
    return (_shr(words, 64 - MANTISSA_BITS).double() + 0.5) * 2.0**-MANTISSA_BITS


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, purpose: Purpose) -> torch.Tensor:
    """float64 uniforms in (0, 1), one per broadcast element of ``seeds`` and ``positions``.

    ``seeds`` are int64 (:func:`as_int64` of the request seed); the result is on their device.
    """
    return _unit(hash_words(seeds, positions, purpose))


# The largest Gumbel value a uniform in (0, 1) with 53 bits can give: -log(-log(1 - 2^-54)).
GUMBEL_MAX = -math.log(-math.log1p(-(2.0 ** -(MANTISSA_BITS + 1))))


def gumbels(seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """float64 standard Gumbel variables ``g(seed, position)[token] = -log(-log u)``, one per
    broadcast element; every value is at most :data:`GUMBEL_MAX`."""
    u = _unit(hash_words(seeds, positions, Purpose.GUMBEL, tokens))
    return -(-u.log()).log()


def seed_tensor(seeds: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """[n] int64 keys for request seeds in [-2^63, 2^64)."""
    return torch.tensor([as_int64(s) for s in seeds], dtype=torch.int64, device=device)


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded ``seed`` (n > 1): sample 0 keeps the
    seed, so n = 1 draws what it always drew; the others step by the golden ratio's word, which
    the noise then mixes, so no two samples of a request share a stream."""
    return seed if index == 0 else as_int64(seed + index * GOLDEN)
