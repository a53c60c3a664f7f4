"""saguaro's CPU kernels: each computes what torch computes (within float32 reassociation), and a
row's result is the same bits whatever else shares the call (other rows, their number, threads).
Bitwise equality here is what the kernels guarantee by construction (one fixed operation order per
row), not an accident of one CPU's matrix library."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from saguaro.kernels import build, ops
from saguaro.kernels.ops import PackedWeight
from saguaro.models.layers import Rotary, apply_rope
from saguaro.models.quant import SCHEMES, dequantize, quantize
from tests.kernels.rows import assert_each_row_is_its_own

N, K = 74, 128  # 74 = 18 tiles of 4 columns and a tail of 2; K = 4 blocks of 32
# every tile height and remainder of both paths (AVX-512: tiles of 4 rows, one tile up to 8;
# AVX2: of 6)
ROW_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16)
# float32 reassociation over K = 128 products of unit-scale values
SUM_TOLERANCE = 1e-4


def weights() -> dict[str, PackedWeight]:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen)
    out = {
        "f32": PackedWeight("f32", w, N, K),
        "bf16": PackedWeight("bf16", w.bfloat16(), N, K),
    }
    out.update({scheme: quantize(w, scheme) for scheme in SCHEMES})
    return out


@pytest.mark.parametrize("name", list(weights()))
def test_linear_equals_the_dense_product_and_each_row_is_its_own(name):
    w = weights()[name]
    x = torch.randn(max(ROW_COUNTS), K, generator=torch.Generator().manual_seed(1))
    full = assert_each_row_is_its_own(x, w, ROW_COUNTS, threads=1)
    want = x @ dequantize(w).T
    assert (full - want).abs().max() < SUM_TOLERANCE * want.abs().max()


def test_the_avx2_path_computes_the_generic_codes_bits():
    """Without AVX-512 the linear layers run intrinsics over 8-lane halves instead of GCC's
    16-lane vectors: the same chains by construction. Both builds (and this CPU's own) must give
    every row the same bits, in every format and at every tile height, so a token's logits do not
    depend on the x86 vendor or its vector width."""
    avx2 = build.build((*build.BASE_FLAGS, "-march=x86-64-v3"))
    generic = build.build((*build.BASE_FLAGS, "-march=x86-64-v3", "-DSAGUARO_GENERIC"))
    x = torch.randn(max(ROW_COUNTS), K, generator=torch.Generator().manual_seed(2))
    for name, w in weights().items():
        for m in ROW_COUNTS:
            want = ops.linear(x[:m], w, generic)
            assert torch.equal(ops.linear(x[:m], w, avx2), want), (name, m)
            assert torch.equal(ops.linear(x[:m], w), want), (name, m)


def test_bfloat16_and_column_tails():
    """Output widths that leave a tail of columns (n mod 4 != 0) and bfloat16 activations."""
    w = torch.randn(7, 64)
    x = torch.randn(3, 64).bfloat16()
    got = ops.linear(x, PackedWeight("f32", w, 7, 64))
    assert torch.allclose(got, x.float() @ w.T, atol=1e-4)


def test_rms_norm_matches_torch_and_is_per_row():
    x = torch.randn(9, 64)
    got = ops.rms_norm(x, 1e-6)
    assert torch.allclose(got, F.rms_norm(x, (64,), eps=1e-6), atol=1e-6)
    assert torch.equal(ops.rms_norm(x[3:4], 1e-6), got[3:4])


def test_rms_norm_scales_by_its_weight_as_two_operations_would():
    x, w = torch.randn(9, 64), torch.randn(64)
    assert torch.equal(ops.rms_norm(x, 1e-6, w), ops.rms_norm(x, 1e-6) * w)


def test_rope_cache_rotates_like_torch_and_writes_the_cache():
    """One layer's RoPE and cache writes in one call: the queries and keys torch's apply_rope
    gives (up to a fused multiply-add's rounding), the values as they are, each token's results
    the same bits alone as among others, and nothing written for a slot outside the cache."""
    t, heads, kv_heads, d, slots = 5, 6, 2, 32, 12
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=gen)
    angles = Rotary(d, 64, 10000.0, None).cos_sin(torch.tensor([3, 9, 4, 0, 7]), torch.float32)
    cos, sin = angles
    where = torch.tensor([4, 0, 11, 7, 2])
    k_cache, v_cache = torch.zeros(slots, kv_heads, d), torch.zeros(slots, kv_heads, d)
    q = ops.rope_cache(qkv, cos, sin, where, k_cache, v_cache, heads)
    q_ref, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q_ref, k_ref = apply_rope(angles, q_ref.view(t, heads, d), k.view(t, kv_heads, d))
    torch.testing.assert_close(q, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k_cache[where], k_ref, atol=1e-6, rtol=0)
    assert torch.equal(v_cache[where], v.view(t, kv_heads, d))
    others = [s for s in range(slots) if s not in where.tolist()]
    assert not k_cache[others].any() and not v_cache[others].any()
    k_alone, v_alone = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    alone = ops.rope_cache(qkv[2:3], cos[2:3], sin[2:3], where[2:3], k_alone, v_alone, heads)
    assert torch.equal(alone, q[2:3]) and torch.equal(k_alone[11], k_cache[11])
    with pytest.raises(ValueError, match="outside"):
        ops.rope_cache(qkv, cos, sin, where + 1, k_alone.zero_(), v_alone, heads)
    assert not k_alone.any()


# The kernels' e^x (exp8) against float64: a few units in the last place of float32.
EXP_REL_ERROR = 8 * 2.0**-24


@pytest.mark.parametrize("width", [16, 21])  # whole vectors, and a tail of 5
def test_silu_mul(width):
    gate_up = torch.randn(5, 2 * width, generator=torch.Generator().manual_seed(1)) * 30
    gate, up = gate_up.split(width, dim=-1)
    want = F.silu(gate.double()) * up.double()
    got = ops.silu_mul(gate_up).double()
    assert ((got - want).abs() <= EXP_REL_ERROR * want.abs() + 1e-30).all()
    edges = torch.tensor([[float("nan"), -1e4, 1e4, 0.0, 100.0, -100.0, 88.0, -88.0]])
    out = ops.silu_mul(torch.cat([edges, torch.ones_like(edges)], dim=1))[0]
    assert out[0].isnan() and out[1].abs() < 1e-30 and out[2] == 1e4 and out[3] == 0
    assert out[4] == 100 and out[5].abs() < 1e-30 and out[6] == 88 and out[7].abs() < 1e-30


def attention_case(dtype: torch.dtype, heads: int = 4):
    """Two sequences over a paged cache: 3 and 1 queries, 10 and 6 visible keys, causal; two
    key-value heads, each shared by heads / 2 query heads."""
    gen = torch.Generator().manual_seed(2)
    slots, kv_heads, d = 40, 2, 16
    k_cache = torch.randn(slots, kv_heads, d, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, d, generator=gen).to(dtype)
    key_slots = torch.tensor([list(range(10)), [*range(20, 26)] + [0] * 4])
    mask = torch.zeros(2, 1, 3, 10, dtype=torch.bool)
    for j in range(3):
        mask[0, 0, j, : 8 + j] = True
    mask[1, 0, 0, :6] = True
    rows = torch.tensor([0, 1, 2, 3])  # tokens 0-2: sequence 0's rows; token 3: sequence 1's row 0
    q = torch.randn(4, heads, d, generator=gen)
    return q, k_cache, v_cache, key_slots, mask, rows


# 40: scores tens apart, so that some weights e^(s - max) underflow to zero
@pytest.mark.parametrize("scale", [0.25, 40.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [4, 12])  # groups of 2, and of 6 (scored 4, then 2)
def test_attention_matches_sdpa_and_a_query_alone(dtype, scale, heads):
    q, k_cache, v_cache, key_slots, mask, rows = attention_case(dtype, heads)
    got = ops.attention(q, k_cache, v_cache, key_slots, mask, rows, scale)
    for t, (b, j) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0)]):
        keys = k_cache[key_slots[b]].float().transpose(0, 1)  # [Hkv, L, D]
        values = v_cache[key_slots[b]].float().transpose(0, 1)
        want = F.scaled_dot_product_attention(
            q[t].unsqueeze(1), keys, values, attn_mask=mask[b, :, j : j + 1], scale=scale,
            enable_gqa=True,
        ).squeeze(1)  # fmt: skip
        assert torch.allclose(got[t], want, atol=1e-5), t
    # token 2 alone: the same keys in the same order, so the same bits
    alone = ops.attention(
        q[2:3], k_cache, v_cache, key_slots[:1], mask[:1, :, 2:3], torch.tensor([0]), scale
    )
    assert torch.equal(alone[0], got[2])


def test_shapes_the_kernels_cannot_take_are_refused():
    with pytest.raises(ValueError, match="linear kernel"):
        ops.linear(torch.randn(2, 40), PackedWeight("f32", torch.randn(3, 40), 3, 40))
    with pytest.raises(ValueError, match="norm kernel"):
        ops.rms_norm(torch.randn(2, 24), 1e-6)
    # the kernel reads no minimum for q8 (w = d q): a weight that needs one would be misread
    with pytest.raises(ValueError, match="symmetric"):
        codes, scales = torch.zeros(3, 32, dtype=torch.int8), torch.ones(3, 1)
        PackedWeight("q8", codes, 3, 32, 32, scales, torch.full((3, 1), 0.5)).check()
    # scales and minima are float32, as the kernel reads them: a cast module's would be misread
    with pytest.raises(ValueError, match="float32"):
        PackedWeight("q8", codes, 3, 32, 32, scales.half(), scales.half() * 0).check()
    with pytest.raises(ValueError, match="float32"):
        nibbles = torch.zeros(3, 16, dtype=torch.uint8)
        q4 = PackedWeight("q4", nibbles, 3, 32, 32, scales.bfloat16(), scales.bfloat16())
        ops.linear(torch.ones(1, 32), q4)
    q, k_cache, v_cache, key_slots, mask, rows = attention_case(torch.float32)
    with pytest.raises(ValueError, match="attention kernel"):
        ops.attention(q[..., :8], k_cache[..., :8], v_cache[..., :8], key_slots, mask, rows, 1.0)
    with pytest.raises(ValueError, match="gumbel kernel"):
        ops.gumbel_argmax(torch.randn(2, 8), torch.zeros(3), torch.zeros(2), torch.zeros(2), 4)
    with pytest.raises(ValueError, match="hash kernel"):
        ops.hash_words(
            torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 1, None
        )
