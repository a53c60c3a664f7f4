/* GGUF's block formats run as stored: integer dot products of the weights' codes with the
 * activation rounded to int8, row by row.
 *
 * Formats (``codes`` is a weight row's blocks byte for byte, as the file holds them):
 *   Q4_K, Q5_K  super-blocks of 256: float16 d and dmin, eight 6-bit sub-block scales s_j and
 *               minima m_j (32 weights each), 4- or 5-bit codes q; w = d s_j q - dmin m_j.
 *   Q6_K        super-blocks of 256: sixteen int8 scales s_j (16 weights each), 6-bit codes,
 *               float16 d; w = d s_j (q - 32).
 *   Q5_0, Q5_1  blocks of 32: float16 d (and m), 5-bit codes; w = d (q - 16), or d q + m.
 *   Q8_0        blocks of 32: float16 d, signed 8-bit codes; w = d q.
 *
 * The activation. Each row x of the input is rounded by blocks of its own (256 weights for the
 * super-block formats, 32 for the others): a block's scale is e = max|x| / 127 and its codes
 * p = rint(x * 127 / max|x|), so x ~ e p with |p| <= 127. A row's codes depend on that row
 * alone, so a row's result never depends on what else shares the call (batch invariance).
 *
 * The dot product of a weight row with an activation row, for one super-block of Q4_K:
 *   sum_i w_i x_i ~ sum_j sum_{i in j} (d s_j q_i - dmin m_j) e p_i
 *                 = (d e) sum_j s_j (sum_{i in j} q_i p_i)  -  (dmin e) sum_j m_j P_j,
 * with P_j = sum_{i in j} p_i (precomputed with the activation). Both sums over j are integers,
 * exact in int32 (|q p| <= 63 * 127, at most 256 of them times |s_j| <= 128), so the float
 * work is a handful of operations per 256 weights instead of one per weight. Q6_K's offset is
 * the same shape: (d e) sum_j s_j (sum q_i p_i - 32 P_j); Q5_1's minimum m e P per block.
 *
 * Exactness of the order. Integer sums are exact in any order; the float steps are fixed.
 * Q4_K and Q5_K: a super-block's integer sums are one number however the vector code splits
 * them, the row path's 8 lanes (lane l: bytes 4l .. 4l + 3 of every 32 weights, as vpmaddubsw +
 * vpmaddwd give them) or the four-row tiles' words (below): I = sum_j s_j sum_{i in j} q_i p_i
 * and M = sum_j m_j P_j, folded per super-block, in order, f = fmaf(d e, (float) I, f) and
 * c = fmaf(dmin e, (float) M, c); the result is f - c. Q6_K: I = sum_j s_j (sum_{i in j} q_i
 * p_i - 32 P_j), folded per super-block, f = fmaf(d e, (float) I, f); the result f. Q5_0 and
 * Q8_0 likewise: a block's I = sum (q - 16) p (Q8_0: sum q p), folded into two chains by the
 * block's parity, f_(b mod 2) = fmaf(d e, (float) I, f_(b mod 2)), the result f_0 + f_1 (the
 * four-row tiles fold two blocks a step). Q5_1 keeps the row path's 8 lanes as floats: per
 * block, in block order, f_l = fma(d e, (float) lane_l, f_l), its minimum in one float, c =
 * fmaf(m e, P, c), and the result tree(f) + c, tree((0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then
 * 0+1). The generic C below computes exactly these sums and steps, so the AVX2 and
 * generic builds give the same bits, and so does a row whatever tile it sits in. Where the CPU
 * has VNNI (vpdpbusd, vpdpwssd) the four-row tiles add the same products with fewer
 * instructions (group_rows4): the same integers, so the same bits again.
 * Calls of AMX_MIN_ROWS rows or more take AMX's tiles where the CPU has them (amx_kernels.c):
 * the same integers and float steps once more.
 *
 * K-quants interleaved (FMT_Q4K_X4, FMT_Q6K_X4; saguaro.kernels.interleave). The four-row
 * tiles below spend more on transposing four rows' codes into their registers than on
 * multiplying them once a verification's five rows share them; a weight loaded to run here has
 * its rows' bytes permuted once, four rows a strip, so that the transpose is already done:
 * super-block sb of strip s (rows 4s .. 4s + 3) is four rows' worth of bytes at (s * blocks +
 * sb) times that. Q4_K: the four rows' 16-byte headers (d, dmin, scales) in row order, then for
 * each pair i of groups (codes bytes 32i .. 32i + 31) and each 8-byte word c of it, the four
 * rows' word c: byte b of row j's word c of pair i at X4_HEADS + 128 i + 32 c + 8 j + b. Q6_K:
 * the low nibbles' 16 words, then the high bits' 8, each word of rows 0-3 (word c of row j at
 * 32 c + 8 j of its part); scales 0-7 of rows 0-3 (8 bytes a row), then 8-15; the four d's. The
 * same bytes, so the same sums and bits. Q5_0 (FMT_Q50_X4), per block of 32: the four rows' d,
 * their qh (4 bytes a row), then the codes' two words, each of rows 0-3 (word c of row j at
 * X4_ROWS * 6 + 32 c + 8 j). Q8_0 (FMT_Q80_X4), per block of 32: the four rows' d, then the
 * codes' four words, each of rows 0-3 (word c of row j at X4_ROWS * 2 + 32 c + 8 j).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_kernels.h"

/* Weights are asked for this many bytes ahead of the block being multiplied, a line or so per
 * block: a steady stream the memory system keeps up with (a whole row at a time, some 7 KB for
 * a Q6_K row of 8,960, overflows the outstanding misses and stalls). */
#ifndef PREFETCH_BYTES /* the build sets it per CPU vendor (build.py) */
#define PREFETCH_BYTES 4096
#endif
enum { LINE = 64 };
/* Calls with at least this many activation rows go to the AMX tiles where they can (below it
 * the tiles' fixed 16 rows cost more than the rows they save). */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 16
#endif

#if defined(__AVX2__) && !defined(SAGUARO_GENERIC)
#define QUANT_AVX2 1
/* Groups and rows unrolled: a group's shifts and shuffle masks are then constants. (Not in the
 * generic build, whose unrolled scalar lanes take GCC minutes to compile.) */
#define UNROLL _Pragma("GCC unroll 8")
#define KEEP(v) __asm__("" : "+x"(v))
#else
#define UNROLL
#define KEEP(v)
#endif
/* VNNI (AVX-512's on 256-bit registers, or AVX-VNNI): vpdpbusd adds four u8 x s8 products into
 * each int32 lane, vpdpwssd two int16 x int16 ones; the four-row tiles take them where the
 * integers they sum are the same (group_rows4, block_dot4). */
#if defined(QUANT_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QUANT_VNNI 1
#define DPBUSD _mm256_dpbusd_epi32
#define DPWSSD _mm256_dpwssd_epi32
#elif defined(QUANT_AVX2) && defined(__AVXVNNI__)
#define QUANT_VNNI 1
#define DPBUSD _mm256_dpbusd_avx_epi32
#define DPWSSD _mm256_dpwssd_avx_epi32
#endif

/* ---- The activation, rounded row by row ---- */

static float f16_to_f32(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b, 2);
    return _cvtsh_ss(h);
}

/* Block [x, x + n) of a row: its scale, and its codes into p. */
#ifdef QUANT_AVX2
/* The same bits as the generic version: max is exact, and vcvtps2dq rounds half to even, as
 * rintf does in the default rounding mode. n is a multiple of 32. */
static float round_block(const float *x, int64_t n, int8_t *p) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n; i += 32) {
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), inv));
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                                  _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(p + i), _mm256_permutevar8x32_epi32(packed, order));
    }
    return amax / 127.0f;
}
#else
static float round_block(const float *x, int64_t n, int8_t *p) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; i++) p[i] = (int8_t)rintf(x[i] * inv);
    return amax / 127.0f;
}
#endif

/* Rows of x [m, k] rounded by blocks of `block` into one buffer; rows[r] points into it. */
static void *round_rows(const float *x, int64_t m, int64_t k, int64_t block, XRow *rows) {
    const int64_t blocks = k / block;
    const size_t per_row = (size_t)k + sizeof(float) * blocks + sizeof(int16_t) * (k / SUB) +
                           sizeof(int16_t) * (k / SMALL) + 64;
    uint8_t *buf = malloc(per_row * (size_t)m);
    if (buf == NULL) return NULL;
    for (int64_t r = 0; r < m; r++) {
        uint8_t *base = buf + per_row * r;
        int8_t *p = (int8_t *)base;
        float *e = (float *)(((uintptr_t)(base + k) + 3) & ~(uintptr_t)3);
        int16_t *sum16 = (int16_t *)(e + blocks), *sum32 = sum16 + k / SUB;
        for (int64_t b = 0; b < blocks; b++)
            e[b] = round_block(x + r * k + b * block, block, p + b * block);
        for (int64_t j = 0; j < k / SUB; j++) {
            int32_t s = 0;
            for (int i = 0; i < SUB; i++) s += p[j * SUB + i];
            sum16[j] = (int16_t)s;
        }
        for (int64_t j = 0; j < k / SMALL; j++)
            sum32[j] = (int16_t)(sum16[2 * j] + sum16[2 * j + 1]);
        rows[r] = (XRow){p, e, sum16, sum32};
    }
    return buf;
}

/* ---- Unpacking ---- */

/* Q4_K / Q5_K's eight 6-bit scales and minima from their 12 bytes, as four words: bytes 0-7
 * the scales, 8-15 the minima. Scale j < 4 is the low 6 bits of byte j, minimum j < 4 those of
 * byte j + 4; scale and minimum j >= 4 take the nibbles of byte j + 4 below the top 2 bits of
 * bytes j - 4 and j. */
QINLINE void scales_k4(const uint8_t *q, uint32_t v[4]) {
    enum { LOW6 = 0x3f3f3f3f, LOW4 = 0x0f0f0f0f, LOW2 = 0x03030303 };
    uint32_t u[3];
    memcpy(u, q, 12);
    v[0] = u[0] & LOW6;
    v[1] = (u[2] & LOW4) | (((u[0] >> 6) & LOW2) << 4);
    v[2] = u[1] & LOW6;
    v[3] = ((u[2] >> 4) & LOW4) | (((u[1] >> 6) & LOW2) << 4);
}

/* The lane sums' fixed tree. */
static float tree8(const float f[QLANES]) {
    float t[4], u[2];
    for (int l = 0; l < 4; l++) t[l] = f[l] + f[l + 4];
    for (int l = 0; l < 2; l++) u[l] = t[l] + t[l + 2];
    return u[0] + u[1];
}

#ifdef QUANT_AVX2
typedef __m256i Codes; /* 32 codes of one group, as unsigned or signed bytes */
typedef __m256i IntLanes;
typedef __m256i Scale16; /* a group's scales: 16 int16, one per pair of bytes */
typedef __m256 Lanes;

QINLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 bits -> 32 bytes, 0xFF where the bit is set (byte i <- bit i). */
QINLINE __m256i bits_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
}

/* Lanes of sum q_i p_i (q unsigned, at most 63) times the group's 16-bit scales. */
QINLINE IntLanes dot_scaled(Codes q, const int8_t *p, Scale16 s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(p)), s);
}

/* Lanes of sum q_i p_i for signed q, given |q| and q (its signs go onto p: vpsignb). */
QINLINE IntLanes dot_signed(Codes absq, Codes q, const int8_t *p) {
    const __m256i sp = _mm256_sign_epi8(load32(p), q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(absq, sp), _mm256_set1_epi16(1));
}

QINLINE IntLanes zero_lanes(void) { return _mm256_setzero_si256(); }
QINLINE IntLanes add_lanes(IntLanes a, IntLanes b) { return _mm256_add_epi32(a, b); }
QINLINE IntLanes sub_lanes(IntLanes a, IntLanes b) { return _mm256_sub_epi32(a, b); }
QINLINE IntLanes times32(IntLanes a) { return _mm256_slli_epi32(a, 5); }
QINLINE Lanes fold(Lanes f, float de, IntLanes acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(de), _mm256_cvtepi32_ps(acc), f);
}
QINLINE Lanes zero_f(void) { return _mm256_setzero_ps(); }

/* Two float chains (Q4_K's / Q5_K's f and c) in lanes 0 and 1. */
typedef __m128 Chains;
QINLINE Chains zero_chains(void) { return _mm_setzero_ps(); }
/* f = fma(d e, (float) sum(a), f) and c = fma(dmin e, (float) sum(b), c) at once; dd: [d, dmin]
 * as float16 (a super-block's first 4 bytes). */
QINLINE Chains fold_chains(Chains fc, const uint8_t *dd, float e, IntLanes a, IntLanes b) {
    uint32_t h;
    memcpy(&h, dd, 4);
    const __m256i ab = _mm256_hadd_epi32(a, b); /* [a01 a23 b01 b23 | a45 a67 b45 b67] */
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(ab), _mm256_extracti128_si256(ab, 1));
    t = _mm_hadd_epi32(t, t); /* [sum a, sum b, ...] */
    const __m128 de = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)h)), _mm_set1_ps(e));
    return _mm_fmadd_ps(de, _mm_cvtepi32_ps(t), fc);
}
QINLINE float chains_result(Chains fc) {
    return _mm_cvtss_f32(_mm_sub_ss(fc, _mm_movehdup_ps(fc)));
}
QINLINE int32_t sum_lanes(IntLanes a) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
QINLINE float tree_lanes(Lanes f) {
    float t[QLANES];
    _mm256_storeu_ps(t, f);
    return tree8(t);
}

/* Lanes l of a[2l] b[2l] + a[2l + 1] b[2l + 1] for 16 int16 a (in a register) and b (memory). */
QINLINE IntLanes pair_sums(__m256i a, const int16_t *b) { return _mm256_madd_epi16(a, load32(b)); }

/* A super-block's 16-bit scales: Q4_K's / Q5_K's eight in both halves of a register, each
 * group's taken by one byte shuffle; Q6_K's sixteen (groups 0-3 from the first eight, 4-7
 * from the last), each group's two (first 16 weights, last 16) by one shuffle. */
typedef struct {
    __m256i lo, hi;
} Scales;

/* Made from the words in registers: reading them back as bytes through memory would stall on
 * store forwarding every super-block. */
QINLINE Scales scales_of8(const uint32_t v[4]) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)v[1], (int)v[0]));
    const __m256i both = _mm256_permute2x128_si256(w, w, 0x00);
    return (Scales){both, both};
}

QINLINE Scales scales_of16(const int8_t *sc) {
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    return (Scales){_mm256_permute2x128_si256(v, v, 0x00), _mm256_permute2x128_si256(v, v, 0x11)};
}

/* Group g's scale from scales_of8: int16 g everywhere. */
QINLINE Scale16 scale_k4(Scales s, int g) {
    const __m256i pick = _mm256_set1_epi16((short)(0x0100 + 0x0202 * g));
    return _mm256_shuffle_epi8(s.lo, pick);
}

/* Group g's scales from scales_of16: int16 2g' in the first half, 2g' + 1 in the second. */
QINLINE Scale16 scale_q6(Scales s, int g) {
    const int j = 2 * (g % 4);
    const __m256i pick = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * j)),
                                           _mm_set1_epi16((short)(0x0100 + 0x0202 * (j + 1))));
    return _mm256_shuffle_epi8(g < 4 ? s.lo : s.hi, pick);
}

QINLINE Scale16 scale_ones(void) { return _mm256_set1_epi16(1); }

/* Q4_K's / Q5_K's minima paired for pair_sums: m_l, m_l for l = 0..7. */
QINLINE __m256i minima_pairs(const uint32_t v[4]) {
    const __m128i m8 = _mm_set_epi32(0, 0, (int)v[3], (int)v[2]);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

/* The 32 codes of group g (0..7) of a Q4_K / Q5_K super-block, unsigned. */
QINLINE Codes group_k(const uint8_t *qs, const uint8_t *qh, int g) {
    const __m256i v = load32(qs + 32 * (g / 2));
    const __m256i low = _mm256_set1_epi8(0xF);
    Codes q = (g & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low) : _mm256_and_si256(v, low);
    if (qh != NULL) {
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(load32(qh), g), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    }
    return q;
}

/* The 32 codes (0..63) of group g of a Q6_K super-block. */
QINLINE Codes group_q6(const uint8_t *b, int g) {
    const int h = g / 4, t = g % 4;
    const __m256i v = load32(b + 64 * h + 32 * (t & 1));
    const __m256i low = _mm256_set1_epi8(0xF);
    const __m256i nib =
        (t >> 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low) : _mm256_and_si256(v, low);
    /* The high bits 2t, 2t + 1 of each byte moved to bits 4, 5: one mask and one shift. */
    const __m256i bits = load32(b + 128 + 32 * h), mask = _mm256_set1_epi8((char)(3 << (2 * t)));
    const __m256i hb = t == 2   ? _mm256_and_si256(bits, mask)
                       : t < 2 ? _mm256_slli_epi16(_mm256_and_si256(bits, mask), 4 - 2 * t)
                               : _mm256_srli_epi16(_mm256_and_si256(bits, mask), 2);
    return _mm256_or_si256(nib, hb);
}

/* The 32 codes of a Q5_0 / Q5_1 block (unsigned 0..31). */
QINLINE Codes block_q5(const uint8_t *qs, uint32_t qh) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    const __m256i q = _mm256_and_si256(both, _mm256_set1_epi8(0xF));
    return _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
}

/* Q5_0's codes made signed (q - 16), and their magnitudes, for dot_signed. */
QINLINE void signed_q5(Codes q, Codes *sq, Codes *absq) {
    *sq = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    *absq = _mm256_abs_epi8(*sq);
}

/* Q8_0's signed codes and their magnitudes. */
QINLINE void signed_q8(const uint8_t *qs, Codes *sq, Codes *absq) {
    *sq = load32(qs);
    *absq = _mm256_abs_epi8(*sq);
}

#else
/* The generic build: the same lanes in plain C. */
typedef struct {
    uint8_t b[32];
} Codes;
typedef struct {
    int32_t l[QLANES];
} IntLanes;
typedef struct {
    float l[QLANES];
} Lanes;
typedef struct {
    int16_t s[16];
} Scale16;
typedef struct {
    int16_t s[16];
} Scales;

/* Lane l: pairs (4l, 4l + 1) and (4l + 2, 4l + 3), each pair's sum times that int16 lane's
 * scale, as vpmaddubsw (q unsigned times p signed) then vpmaddwd do. */
QINLINE IntLanes dot_scaled(Codes q, const int8_t *p, Scale16 s) {
    IntLanes out;
    for (int l = 0; l < QLANES; l++) {
        int32_t acc = 0;
        for (int h = 0; h < 2; h++) {
            const int i = 4 * l + 2 * h;
            acc += (int32_t)(q.b[i] * p[i] + q.b[i + 1] * p[i + 1]) * s.s[2 * l + h];
        }
        out.l[l] = acc;
    }
    return out;
}

QINLINE IntLanes dot_signed(Codes absq, Codes q, const int8_t *p) {
    IntLanes out;
    for (int l = 0; l < QLANES; l++) {
        int32_t acc = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) acc += (int32_t)(int8_t)q.b[i] * p[i];
        out.l[l] = acc;
    }
    (void)absq;
    return out;
}

QINLINE IntLanes zero_lanes(void) { return (IntLanes){{0}}; }
QINLINE IntLanes add_lanes(IntLanes a, IntLanes b) {
    for (int l = 0; l < QLANES; l++) a.l[l] += b.l[l];
    return a;
}
QINLINE IntLanes sub_lanes(IntLanes a, IntLanes b) {
    for (int l = 0; l < QLANES; l++) a.l[l] -= b.l[l];
    return a;
}
QINLINE IntLanes times32(IntLanes a) {
    for (int l = 0; l < QLANES; l++) a.l[l] *= 32;
    return a;
}
QINLINE Lanes fold(Lanes f, float de, IntLanes acc) {
    for (int l = 0; l < QLANES; l++) f.l[l] = fmaf(de, (float)acc.l[l], f.l[l]);
    return f;
}
QINLINE Lanes zero_f(void) { return (Lanes){{0}}; }
QINLINE int32_t sum_lanes(IntLanes a) {
    int32_t t = 0;
    for (int l = 0; l < QLANES; l++) t += a.l[l];
    return t;
}

typedef struct {
    float f, c;
} Chains;
QINLINE Chains zero_chains(void) { return (Chains){0.0f, 0.0f}; }
QINLINE Chains fold_chains(Chains fc, const uint8_t *dd, float e, IntLanes a, IntLanes b) {
    return (Chains){fmaf(f16_to_f32(dd) * e, (float)sum_lanes(a), fc.f),
                    fmaf(f16_to_f32(dd + 2) * e, (float)sum_lanes(b), fc.c)};
}
QINLINE float chains_result(Chains fc) { return fc.f - fc.c; }
QINLINE float tree_lanes(Lanes f) { return tree8(f.l); }

QINLINE IntLanes pair_sums(Scales a, const int16_t *b) {
    IntLanes out;
    for (int l = 0; l < QLANES; l++) out.l[l] = a.s[2 * l] * b[2 * l] + a.s[2 * l + 1] * b[2 * l + 1];
    return out;
}

QINLINE Scales scales_of8(const uint32_t v[4]) {
    uint8_t b[16];
    memcpy(b, v, 16);
    Scales s;
    for (int i = 0; i < 16; i++) s.s[i] = i < 8 ? b[i] : 0;
    return s;
}

QINLINE Scales scales_of16(const int8_t *sc) {
    Scales s;
    for (int i = 0; i < 16; i++) s.s[i] = sc[i];
    return s;
}

QINLINE Scale16 scale_k4(Scales s, int g) {
    Scale16 r;
    for (int i = 0; i < 16; i++) r.s[i] = s.s[g];
    return r;
}

QINLINE Scale16 scale_q6(Scales s, int g) {
    Scale16 r;
    for (int i = 0; i < 16; i++) r.s[i] = s.s[2 * g + (i >= 8)];
    return r;
}

QINLINE Scale16 scale_ones(void) {
    Scale16 r;
    for (int i = 0; i < 16; i++) r.s[i] = 1;
    return r;
}

QINLINE Scales minima_pairs(const uint32_t v[4]) {
    uint8_t b[16];
    memcpy(b, v, 16);
    Scales s;
    for (int i = 0; i < 16; i++) s.s[i] = b[8 + i / 2];
    return s;
}

QINLINE Codes group_k(const uint8_t *qs, const uint8_t *qh, int g) {
    Codes c;
    for (int i = 0; i < 32; i++) {
        const uint8_t v = qs[32 * (g / 2) + i];
        c.b[i] = (g & 1) ? v >> 4 : v & 0xF;
        if (qh != NULL) c.b[i] |= ((qh[i] >> g) & 1) << 4;
    }
    return c;
}

QINLINE Codes group_q6(const uint8_t *b, int g) {
    const int h = g / 4, t = g % 4;
    Codes c;
    for (int i = 0; i < 32; i++) {
        const uint8_t v = b[64 * h + 32 * (t & 1) + i];
        const uint8_t nib = (t >> 1) ? v >> 4 : v & 0xF;
        c.b[i] = nib | (((b[128 + 32 * h + i] >> (2 * t)) & 3) << 4);
    }
    return c;
}

QINLINE Codes block_q5(const uint8_t *qs, uint32_t qh) {
    Codes c;
    for (int i = 0; i < 16; i++) {
        c.b[i] = (qs[i] & 0xF) | ((qh >> i) & 1) << 4;
        c.b[i + 16] = (qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
    }
    return c;
}

QINLINE void signed_q5(Codes q, Codes *sq, Codes *absq) {
    for (int i = 0; i < 32; i++) sq->b[i] = (uint8_t)(int8_t)(q.b[i] - 16);
    *absq = *sq; /* the generic dot_signed reads the signed codes alone */
}

QINLINE void signed_q8(const uint8_t *qs, Codes *sq, Codes *absq) {
    memcpy(sq->b, qs, 32);
    *absq = *sq;
}
#endif

/* ---- One weight row against a tile of nr activation rows ---- */

/* The lines of [b, b + bytes) PREFETCH_BYTES ahead; never faults, past the end included. */
QINLINE void prefetch_ahead(const uint8_t *b, int bytes) {
    for (int o = 0; o < bytes; o += LINE) __builtin_prefetch(b + PREFETCH_BYTES + o);
}

/* Q4_K / Q5_K (with_high: Q5_K's fifth bits, 32 bytes before the codes), one weight row against
 * nr activation rows. Group-major: each group's codes and scale are made once and used by
 * every row. */
QINLINE void tile_k45(const uint8_t *w, int64_t blocks, int with_high, const XRow *x, int nr,
                      float *y) {
    const int bytes = with_high ? Q5K_BYTES : Q4K_BYTES;
    Chains fc[TILE_ROWS];
    for (int r = 0; r < nr; r++) fc[r] = zero_chains();
    for (int64_t sb = 0; sb < blocks; sb++) {
        const uint8_t *b = w + sb * bytes;
        prefetch_ahead(b, bytes);
        uint32_t scm[4];
        scales_k4(b + 4, scm);
        const Scales s = scales_of8(scm);
        const uint8_t *qh = with_high ? b + 16 : NULL, *qs = b + 16 + (with_high ? 32 : 0);
        IntLanes acc[TILE_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = zero_lanes();
        UNROLL for (int g = 0; g < 8; g++) {
            const Codes q = group_k(qs, qh, g);
            const Scale16 sg = scale_k4(s, g);
            UNROLL for (int r = 0; r < nr; r++) {
                acc[r] = add_lanes(acc[r], dot_scaled(q, x[r].p + sb * SUPER + 32 * g, sg));
                KEEP(acc[r]);
            }
        }
        const __typeof__(minima_pairs(scm)) m = minima_pairs(scm);
        for (int r = 0; r < nr; r++)
            fc[r] = fold_chains(fc[r], b, x[r].e[sb], acc[r], pair_sums(m, x[r].sum16 + sb * SUB));
    }
    for (int r = 0; r < nr; r++) y[r] = chains_result(fc[r]);
}

QINLINE void tile_q6k(const uint8_t *w, int64_t blocks, const XRow *x, int nr, float *y) {
    float f[TILE_ROWS];
    for (int r = 0; r < nr; r++) f[r] = 0.0f;
    for (int64_t sb = 0; sb < blocks; sb++) {
        const uint8_t *b = w + sb * Q6K_BYTES;
        prefetch_ahead(b, Q6K_BYTES);
        const float d = f16_to_f32(b + 208);
        const Scales s = scales_of16((const int8_t *)(b + 192));
        IntLanes acc[TILE_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = zero_lanes();
        UNROLL for (int g = 0; g < 8; g++) {
            const Codes q = group_q6(b, g);
            const Scale16 sg = scale_q6(s, g);
            UNROLL for (int r = 0; r < nr; r++) {
                acc[r] = add_lanes(acc[r], dot_scaled(q, x[r].p + sb * SUPER + 32 * g, sg));
                KEEP(acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) {
            const IntLanes offset = times32(pair_sums(
#ifdef QUANT_AVX2
                _mm256_permute2x128_si256(s.lo, s.hi, 0x20),
#else
                s,
#endif
                x[r].sum16 + sb * SUB));
            f[r] = fmaf(d * x[r].e[sb], (float)sum_lanes(sub_lanes(acc[r], offset)), f[r]);
        }
    }
    for (int r = 0; r < nr; r++) y[r] = f[r];
}

#ifdef QUANT_AVX2
/* ---- Four weight rows against a tile of nr activation rows (AVX2) ----
 *
 * A row's vpmaddubsw + vpmaddwd per 32 weights spends two multiplies where one would nearly do:
 * the second only applies the group's scale. Here a register holds 8 codes of each of four
 * weight rows (a 4 x 4 transpose of their 64-bit words), so one vpmaddubsw against 8 activation
 * codes broadcast serves four rows; a group's four such products (its 32 weights) add up in
 * int16 before one vpmaddwd applies the four rows' scales: 5 multiplies per four rows' group
 * instead of 8. The int16 sums cannot overflow: |sum| <= 8 * 31 * 127 = 31,496 (Q5_K's 5-bit
 * codes; Q4_K's 15,240). A super-block's integer sum is the same number either way, and the
 * float steps are the row path's, so the bits are too. */

/* 8 bytes at p in every 64-bit word. */
QINLINE __m256i bcast8(const void *p) {
    return _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p));
}

/* Words c of rows a, b, c, d (32 bytes each) -> out[c] = [a.c, b.c | c.c, d.c]. */
QINLINE void transpose_words(__m256i a, __m256i b, __m256i c, __m256i d, __m256i out[4]) {
    const __m256i ab0 = _mm256_unpacklo_epi64(a, b), ab1 = _mm256_unpackhi_epi64(a, b);
    const __m256i cd0 = _mm256_unpacklo_epi64(c, d), cd1 = _mm256_unpackhi_epi64(c, d);
    out[0] = _mm256_permute2x128_si256(ab0, cd0, 0x20);
    out[1] = _mm256_permute2x128_si256(ab1, cd1, 0x20);
    out[2] = _mm256_permute2x128_si256(ab0, cd0, 0x31);
    out[3] = _mm256_permute2x128_si256(ab1, cd1, 0x31);
}

/* The four rows' codes of groups 2i, 2i + 1 (low and high nibbles), transposed. */
QINLINE void pair_k4(const uint8_t *const qs[4], int i, __m256i t[4]) {
    transpose_words(load32(qs[0] + 32 * i), load32(qs[1] + 32 * i), load32(qs[2] + 32 * i),
                    load32(qs[3] + 32 * i), t);
}

/* Group g's codes from its pair's transposed bytes t; qh: the rows' transposed fifth bits. */
QINLINE void group_k4(const __m256i t[4], const __m256i *qh, int g, __m256i q[4]) {
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int c = 0; c < 4; c++) {
        q[c] = (g & 1) ? _mm256_and_si256(_mm256_srli_epi16(t[c], 4), low)
                       : _mm256_and_si256(t[c], low);
        if (qh != NULL) {
            const __m256i h = _mm256_and_si256(_mm256_srli_epi16(qh[c], g), _mm256_set1_epi8(1));
            q[c] = _mm256_or_si256(q[c], _mm256_slli_epi16(h, 4));
        }
    }
}

/* int16 lanes of vpmaddubsw's pairs of four weight rows' codes q with one activation row's
 * block of 32 (codes p), the four words' added up: |sum| <= 8 * 31 * 127 = 31,496. */
QINLINE __m256i word_pairs4(const __m256i q[4], const int8_t *p) {
    __m256i a = _mm256_maddubs_epi16(q[0], bcast8(p));
    for (int c = 1; c < 4; c++)
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(q[c], bcast8(p + 8 * c)));
    return a;
}

/* Lanes [w0 w0 w1 w1 | w2 w2 w3 w3] of one activation row's block of 32 (codes p) against four
 * weight rows' codes q (unsigned, at most 31): each lane sums 16 products, bytes 4l .. 4l + 3
 * of every word. VNNI's vpdpbusd adds four products into an int32 lane at once; otherwise
 * vpmaddubsw's pairs add up in int16 (|sum| <= 8 * 31 * 127 = 31,496), then vpmaddwd. The same
 * integers either way. */
QINLINE __m256i block_dot4(const __m256i q[4], const int8_t *p) {
#ifdef QUANT_VNNI
    __m256i a = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) a = DPBUSD(a, q[c], bcast8(p + 8 * c));
    return a;
#else
    return _mm256_madd_epi16(word_pairs4(q, p), _mm256_set1_epi16(1));
#endif
}

/* Scale g of four rows (sc: bytes [row 0's eight, row 1's | row 2's, row 3's]) as int16
 * lanes [row 0 x4, row 1 x4 | row 2 x4, row 3 x4]; with only_low, as int16 pairs [s, 0] (for
 * VNNI's vpdpwssd on int32 lanes that fit in their low half). */
QINLINE __m256i scales4(__m256i sc, int g, int only_low) {
    const char h = only_low ? -1 : (char)g, h8 = only_low ? -1 : (char)(8 + g);
    const __m128i pick = _mm_setr_epi8(g, -1, h, -1, g, -1, h, -1, 8 + g, -1, h8, -1, 8 + g, -1,
                                       h8, -1);
    return _mm256_shuffle_epi8(sc, _mm256_setr_m128i(pick, pick));
}

/* A super-block's head for four rows at once: d and dmin as floats [d of rows 0-3 | dmin of
 * rows 0-3]; the scales as bytes [row 0's eight, row 1's | row 2's, row 3's]; the minima as
 * int16 [row 0's m0-3, row 1's | row 2's, row 3's] (m03) and m4-7 alike (m47). scales_k4's
 * unpacking, four rows a lane. */
typedef struct {
    __m256 dd;
    __m256i sc, m03, m47;
} K4Head;

QINLINE K4Head head_k4(const uint8_t *const b[4]) {
    enum { LOW6 = 0x3f3f3f3f, LOW4 = 0x0f0f0f0f, LOW2 = 0x03030303 };
    /* Words: 0 the float16 d and dmin, 1-3 the 12 bytes of scales and minima (u0, u1, u2). */
    const __m128i r0 = _mm_loadu_si128((const __m128i *)b[0]);
    const __m128i r1 = _mm_loadu_si128((const __m128i *)b[1]);
    const __m128i r2 = _mm_loadu_si128((const __m128i *)b[2]);
    const __m128i r3 = _mm_loadu_si128((const __m128i *)b[3]);
    const __m128i a0 = _mm_unpacklo_epi32(r0, r1), a1 = _mm_unpackhi_epi32(r0, r1);
    const __m128i a2 = _mm_unpacklo_epi32(r2, r3), a3 = _mm_unpackhi_epi32(r2, r3);
    const __m128i dm = _mm_unpacklo_epi64(a0, a2), u0 = _mm_unpackhi_epi64(a0, a2);
    const __m128i u1 = _mm_unpacklo_epi64(a1, a3), u2 = _mm_unpackhi_epi64(a1, a3);
    const __m128i low6 = _mm_set1_epi32(LOW6), low4 = _mm_set1_epi32(LOW4);
    const __m128i low2 = _mm_set1_epi32(LOW2);
    const __m128i s03 = _mm_and_si128(u0, low6), m03 = _mm_and_si128(u1, low6);
    const __m128i s47 = _mm_or_si128(_mm_and_si128(u2, low4),
                                     _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u0, 6), low2), 4));
    const __m128i m47 = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(u2, 4), low4),
                                     _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u1, 6), low2), 4));
    const __m128i dfirst = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    return (K4Head){
        _mm256_cvtph_ps(_mm_shuffle_epi8(dm, dfirst)),
        _mm256_setr_m128i(_mm_unpacklo_epi32(s03, s47), _mm_unpackhi_epi32(s03, s47)),
        _mm256_cvtepu8_epi16(m03),
        _mm256_cvtepu8_epi16(m47),
    };
}

/* One group's products of four weight rows (codes q, the rows' scales as bytes sc) with each
 * activation row, added to that row's super-block sums as lanes [w0 w0 w1 w1 | w2 w2 w3 w3].
 * Four-bit codes (not wide) under VNNI: a lane's 16 products are at most 16 * 15 * 127 =
 * 30,480, an int16, so vpdpwssd against [s, 0] scales the int32 lane and adds it at once (5
 * multiplies per four rows' group). Otherwise vpmaddubsw's pairs add up in int16 before one
 * vpmaddwd applies the scales (|sum| <= 8 * 31 * 127 = 31,496 for Q5_K's codes). */
QINLINE void group_rows4(const __m256i q[4], __m256i sc, int g, int wide, const XRow *x, int nr,
                         int64_t at, __m256i *acc) {
#ifdef QUANT_VNNI
    if (!wide) {
        const __m256i s = scales4(sc, g, 1);
        UNROLL for (int r = 0; r < nr; r++) {
            acc[r] = DPWSSD(acc[r], block_dot4(q, x[r].p + at), s);
            KEEP(acc[r]);
        }
        return;
    }
#endif
    (void)wide;
    const __m256i s = scales4(sc, g, 0);
    UNROLL for (int r = 0; r < nr; r++) {
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(word_pairs4(q, x[r].p + at), s));
        KEEP(acc[r]);
    }
}

/* A super-block's sums of four rows (head h) folded into each activation row's chains. */
QINLINE void fold_rows4(const K4Head *h, const __m256i *acc, const XRow *x, int nr, int64_t sb,
                        __m256 *fc) {
    for (int r = 0; r < nr; r++) {
        const int16_t *p32 = x[r].sum32 + sb * 8;
        const __m256i mins = _mm256_add_epi32(_mm256_madd_epi16(h->m03, bcast8(p32)),
                                              _mm256_madd_epi16(h->m47, bcast8(p32 + 4)));
        /* [I0 I1 M0 M1 | I2 I3 M2 M3] -> [I0 I1 I2 I3 | M0 M1 M2 M3] */
        const __m256i im = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r], mins), 0xD8);
        const __m256 de = _mm256_mul_ps(h->dd, _mm256_set1_ps(x[r].e[sb]));
        fc[r] = _mm256_fmadd_ps(de, _mm256_cvtepi32_ps(im), fc[r]);
    }
}

/* y[4 r + j] = f - c of each row's chains [f of rows 0-3 | c of rows 0-3]. */
QINLINE void store_rows4(const __m256 *fc, int nr, float *y) {
    for (int r = 0; r < nr; r++) {
        const __m128 f = _mm256_castps256_ps128(fc[r]), c = _mm256_extractf128_ps(fc[r], 1);
        _mm_storeu_ps(y + 4 * r, _mm_sub_ps(f, c));
    }
}

/* y[4 r + j] for weight rows j of w (row_bytes apart) and activation rows r < nr. */
QINLINE void tile4_k45(const uint8_t *w, int64_t row_bytes, int64_t blocks, int with_high,
                       const XRow *x, int nr, float *y) {
    const int bytes = with_high ? Q5K_BYTES : Q4K_BYTES;
    __m256 fc[TILE_ROWS]; /* [f of rows 0-3 | c of rows 0-3] */
    for (int r = 0; r < nr; r++) fc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < blocks; sb++) {
        const uint8_t *b[4], *qs[4];
        for (int j = 0; j < 4; j++) {
            b[j] = w + j * row_bytes + sb * bytes;
            qs[j] = b[j] + 16 + (with_high ? 32 : 0);
        }
        /* The next four rows (contiguous), swept at the pace this tile reads its own. */
        const uint8_t *next = w + 4 * row_bytes + 4 * sb * bytes;
        for (int o = 0; o < 4 * bytes; o += LINE) __builtin_prefetch(next + o);
        const K4Head h = head_k4(b);
        __m256i qh[4];
        if (with_high)
            transpose_words(load32(b[0] + 16), load32(b[1] + 16), load32(b[2] + 16),
                            load32(b[3] + 16), qh);
        __m256i acc[TILE_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_si256();
        __m256i t[4];
        UNROLL for (int g = 0; g < 8; g++) {
            __m256i q[4];
            if (g % 2 == 0) pair_k4(qs, g / 2, t);
            group_k4(t, with_high ? qh : NULL, g, q);
            group_rows4(q, h.sc, g, with_high, x, nr, sb * SUPER + 32 * g, acc);
        }
        fold_rows4(&h, acc, x, nr, sb, fc);
    }
    store_rows4(fc, nr, y);
}

/* y[4 r + j] for the four rows of an interleaved Q4_K strip w (FMT_Q4K_X4) and activation rows
 * r < nr: tile4_k45's sums and steps, its transposes done when the weight was loaded. */
QINLINE void tile4_q4k_x4(const uint8_t *w, int64_t blocks, const XRow *x, int nr, float *y) {
    __m256 fc[TILE_ROWS];
    for (int r = 0; r < nr; r++) fc[r] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int64_t sb = 0; sb < blocks; sb++) {
        const uint8_t *b = w + sb * X4_BYTES, *codes = b + X4_HEADS;
        prefetch_ahead(b, X4_BYTES);
        const uint8_t *heads[4] = {b, b + K_HEAD, b + 2 * K_HEAD, b + 3 * K_HEAD};
        const K4Head h = head_k4(heads);
        __m256i acc[TILE_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++) {
            __m256i q[4];
            for (int c = 0; c < 4; c++) {
                const __m256i v = load32(codes + X4_PAIR * (g / 2) + PAIR_BYTES * c);
                q[c] = _mm256_and_si256(g & 1 ? _mm256_srli_epi16(v, 4) : v, low);
            }
            group_rows4(q, h.sc, g, 0, x, nr, sb * SUPER + 32 * g, acc);
        }
        fold_rows4(&h, acc, x, nr, sb, fc);
    }
    store_rows4(fc, nr, y);
}

/* Q6_K interleaved (FMT_Q6K_X4): for four rows at once, per super-block I = sum_j s_j (sum q p)
 * - 32 sum_j s_j P_j, tile_q6k's integer, and its step f = fma(d e, (float) I, f). A group's
 * 32 codes are two sub-blocks of 16 (scales s_A, s_B): words 0-1 and 2-3 of the transposed
 * codes, whose int16 product sums add up without overflow (4 * 63 * 127 = 32,004), then one
 * vpmaddwd each applies the four rows' scales. */

/* Group g's codes (0..63) of the strip's four rows, transposed: low nibbles from words
 * 8h + 4(t & 1) + c of the low block, bits 2t, 2t + 1 of high word 4h + c (h = g / 4,
 * t = g % 4). */
QINLINE void group_q6_x4(const uint8_t *b, int g, __m256i q[4]) {
    const int h = g / 4, t = g % 4;
    const __m256i low = _mm256_set1_epi8(0xF), mask = _mm256_set1_epi8((char)(3 << (2 * t)));
    for (int c = 0; c < 4; c++) {
        const __m256i v = load32(b + X4_PAIR * (2 * h + (t & 1)) + PAIR_BYTES * c);
        const __m256i nib = _mm256_and_si256(t >> 1 ? _mm256_srli_epi16(v, 4) : v, low);
        const uint8_t *high = b + Q6X4_HIGH + X4_PAIR * h + PAIR_BYTES * c;
        const __m256i bits = _mm256_and_si256(load32(high), mask);
        const __m256i hb = t == 2  ? bits
                           : t < 2 ? _mm256_slli_epi16(bits, 4 - 2 * t)
                                   : _mm256_srli_epi16(bits, 2);
        q[c] = _mm256_or_si256(nib, hb);
    }
}

/* Scale j (of eight; sc: scales [row 0's eight, row 1's | row 2's, row 3's]) of four rows as
 * int16 lanes [row 0 x4, row 1 x4 | row 2 x4, row 3 x4]: the signed byte shuffled to the high
 * half of each lane, then shifted down. */
QINLINE __m256i scales4_signed(__m256i sc, int j) {
    const __m128i pick = _mm_setr_epi8(-1, j, -1, j, -1, j, -1, j, -1, 8 + j, -1, 8 + j, -1, 8 + j,
                                       -1, 8 + j);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(sc, _mm256_setr_m128i(pick, pick)), 8);
}

/* [sum_j s_j P_j of rows 0-3] for one activation row's P (its 16 sums of 16 codes). */
QINLINE __m128i offsets4(const __m256i srow[4], const int16_t *sum16) {
    const __m256i p = load32(sum16);
    __m256i m[4];
    for (int j = 0; j < 4; j++) m[j] = _mm256_madd_epi16(srow[j], p);
    const __m256i m01 = _mm256_hadd_epi32(m[0], m[1]), m23 = _mm256_hadd_epi32(m[2], m[3]);
    const __m256i u = _mm256_hadd_epi32(m01, m23);
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

QINLINE void tile4_q6k_x4(const uint8_t *w, int64_t blocks, const XRow *x, int nr, float *y) {
    __m128 f[TILE_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm_setzero_ps();
    for (int64_t sb = 0; sb < blocks; sb++) {
        const uint8_t *b = w + sb * Q6X4_BYTES;
        prefetch_ahead(b, Q6X4_BYTES);
        const __m256i sc[2] = {load32(b + Q6X4_SCALES), load32(b + Q6X4_SCALES + PAIR_BYTES)};
        __m256i acc[TILE_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_si256();
        UNROLL for (int g = 0; g < 8; g++) {
            __m256i q[4];
            group_q6_x4(b, g, q);
            const __m256i sa = scales4_signed(sc[g / 4], 2 * (g % 4));
            const __m256i sb2 = scales4_signed(sc[g / 4], 2 * (g % 4) + 1);
            UNROLL for (int r = 0; r < nr; r++) {
                const int8_t *p = x[r].p + sb * SUPER + 32 * g;
                const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], bcast8(p)),
                                                   _mm256_maddubs_epi16(q[1], bcast8(p + 8)));
                const __m256i c = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], bcast8(p + 16)),
                                                   _mm256_maddubs_epi16(q[3], bcast8(p + 24)));
#ifdef QUANT_VNNI
                acc[r] = DPWSSD(DPWSSD(acc[r], a, sa), c, sb2);
#else
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(_mm256_madd_epi16(a, sa),
                                                                   _mm256_madd_epi16(c, sb2)));
#endif
                KEEP(acc[r]);
            }
        }
        /* each row's sixteen scales as int16: [j 0-7 | j 8-15] */
        __m256i srow[4];
        for (int j = 0; j < 4; j++) {
            const __m128i a = j < 2 ? _mm256_castsi256_si128(sc[0])
                                    : _mm256_extracti128_si256(sc[0], 1);
            const __m128i c = j < 2 ? _mm256_castsi256_si128(sc[1])
                                    : _mm256_extracti128_si256(sc[1], 1);
            srow[j] = _mm256_cvtepi8_epi16(j % 2 ? _mm_unpackhi_epi64(a, c)
                                                 : _mm_unpacklo_epi64(a, c));
        }
        const __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(b + Q6X4_D)));
        for (int r = 0; r < nr; r++) {
            /* [I0 I0' I1 I1' | I2 I2' I3 I3'] -> [I0 I1 I2 I3], less 32 times the offsets */
            const __m256i sums = _mm256_hadd_epi32(acc[r], acc[r]);
            const __m128i i4 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(sums, 0x08));
            const __m128i offsets = offsets4(srow, x[r].sum16 + sb * SUB);
            const __m128i ints = _mm_sub_epi32(i4, _mm_slli_epi32(offsets, 5));
            const __m128 de = _mm_mul_ps(d, _mm_set1_ps(x[r].e[sb]));
            f[r] = _mm_fmadd_ps(de, _mm_cvtepi32_ps(ints), f[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm_storeu_ps(y + 4 * r, f[r]);
}

/* Q5_0's codes of four rows' block, unsigned 0..31, transposed: q[c] = weights 8c .. 8c + 7 of
 * rows [0, 1 | 2, 3], from the rows' code words 0 (lo) and 1 (hi) in that order. Weight i < 16
 * is the low nibble of code byte i, weight i >= 16 the high nibble of byte i - 16, and its fifth
 * bit is bit i of qh; h holds the rows' qh as int32 lanes [0, 1, .. | 2, 3, ..]. */
QINLINE void codes4_q5(__m256i lo, __m256i hi, __m256i h, __m256i q[4]) {
    const __m256i low = _mm256_set1_epi8(0xF);
    q[0] = _mm256_and_si256(lo, low);
    q[1] = _mm256_and_si256(hi, low);
    q[2] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), low);
    q[3] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), low);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    /* byte c of each row's qh, eight times, tested bit by bit into a mask: the rows' bits 8c ..
     * 8c + 7, whose bytes get 16 added (their code's fifth bit) */
    UNROLL for (int c = 0; c < 4; c++) {
        const char a = (char)c, b = (char)(4 + c);
        const __m256i pick = _mm256_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, a, a,
                                              a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        const __mmask32 set = _mm256_test_epi8_mask(_mm256_shuffle_epi8(h, pick), bit);
        q[c] = _mm256_mask_add_epi8(q[c], set, q[c], _mm256_set1_epi8(0x10));
    }
#else
    /* byte 0 of each row's (shifted) qh, eight times: bits 8c .. 8c + 7 for word c */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0,
                                          0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    UNROLL for (int c = 0; c < 4; c++) {
        const __m256i set =
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(h, pick), bit), bit);
        q[c] = _mm256_or_si256(q[c], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        h = _mm256_srli_epi32(h, 8);
    }
#endif
}

/* Block bi of four Q5_0 rows: of rows w + j * row_bytes as the file has them, or (x4) of the
 * interleaved strip w, whose code words are already in the registers' order. */
QINLINE void block4_q5(const uint8_t *w, int64_t row_bytes, int64_t bi, int x4, __m256i h,
                       __m256i q[4]) {
    if (x4) {
        const uint8_t *codes = w + bi * Q50X4_BYTES + Q50X4_CODES;
        codes4_q5(load32(codes), load32(codes + X4_ROWS * WORD), h, q);
        return;
    }
    const uint8_t *b = w + bi * Q50_BYTES + Q5_D + Q5_QH;
    const __m256i x = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)b),
                                        _mm_loadu_si128((const __m128i *)(b + 2 * row_bytes)));
    const __m256i y = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(b + row_bytes)),
                                        _mm_loadu_si128((const __m128i *)(b + 3 * row_bytes)));
    codes4_q5(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y), h, q);
}

/* The first 8 bytes (d, qh, two codes) of four rows' blocks (b: row 0's; rows rb apart) as
 * 64-bit lanes [0, 1 | 2, 3]. */
QINLINE __m256i heads4_q5(const uint8_t *b, int64_t rb) {
    const __m128i r01 = _mm_insert_epi64(_mm_loadl_epi64((const __m128i *)b),
                                         *(const long long *)(b + rb), 1);
    const __m128i r23 = _mm_insert_epi64(_mm_loadl_epi64((const __m128i *)(b + 2 * rb)),
                                         *(const long long *)(b + 3 * rb), 1);
    return _mm256_setr_m128i(r01, r23);
}

/* Blocks A = bi and B = bi + 1 of four Q5_0 rows as the file has them: qh as int32 lanes
 * [A0 A1 B0 B1 | A2 A3 B2 B3] (bytes 2-5 of each block), d as floats in the same lanes. */
QINLINE void heads_q50(const uint8_t *w, int64_t row_bytes, int64_t bi, int two, __m256i *qh,
                       __m256 *d) {
    const uint8_t *a0 = w + bi * Q50_BYTES;
    const __m256i ha = heads4_q5(a0, row_bytes);
    const __m256i hb = two ? heads4_q5(a0 + Q50_BYTES, row_bytes) : ha;
    *qh = _mm256_or_si256(
        _mm256_shuffle_epi8(ha, _mm256_setr_epi8(2, 3, 4, 5, 10, 11, 12, 13, -1, -1, -1, -1, -1,
                                                 -1, -1, -1, 2, 3, 4, 5, 10, 11, 12, 13, -1, -1,
                                                 -1, -1, -1, -1, -1, -1)),
        _mm256_shuffle_epi8(hb, _mm256_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 4, 5, 10,
                                                 11, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3,
                                                 4, 5, 10, 11, 12, 13)));
    /* d: bytes 0-1, as int16 lanes [A0 A1 B0 B1 | .. | A2 A3 B2 B3 | ..] */
    const __m256i dd = _mm256_or_si256(
        _mm256_shuffle_epi8(ha, _mm256_setr_epi8(0, 1, 8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                 -1, -1, -1, 0, 1, 8, 9, -1, -1, -1, -1, -1, -1,
                                                 -1, -1, -1, -1, -1, -1)),
        _mm256_shuffle_epi8(hb, _mm256_setr_epi8(-1, -1, -1, -1, 0, 1, 8, 9, -1, -1, -1, -1, -1,
                                                 -1, -1, -1, -1, -1, -1, -1, 0, 1, 8, 9, -1, -1,
                                                 -1, -1, -1, -1, -1, -1)));
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(dd, 0x08)));
}

/* The four rows' float16 d of strip blocks a and b (the first 8 bytes of each, Q5_0's and
 * Q8_0's alike) as floats [A0 A1 B0 B1 | A2 A3 B2 B3]. */
QINLINE __m256 strip_d(const uint8_t *a, const uint8_t *b) {
    const __m128i da = _mm_loadl_epi64((const __m128i *)a), db = _mm_loadl_epi64((const __m128i *)b);
    return _mm256_cvtph_ps(_mm_unpacklo_epi32(da, db));
}

/* heads_q50's lanes from an interleaved strip w, whose blocks keep the four rows' d and qh
 * together. */
QINLINE void heads_q50_x4(const uint8_t *w, int64_t bi, int two, __m256i *qh, __m256 *d) {
    const uint8_t *a = w + bi * Q50X4_BYTES, *b = two ? a + Q50X4_BYTES : a;
    const __m128i qa = _mm_loadu_si128((const __m128i *)(a + Q50X4_QH));
    const __m128i qb = _mm_loadu_si128((const __m128i *)(b + Q50X4_QH));
    *qh = _mm256_setr_m128i(_mm_unpacklo_epi64(qa, qb), _mm_unpackhi_epi64(qa, qb));
    *d = strip_d(a, b);
}

/* Blocks A = bi and B = bi + 1 of four rows folded into f: [I_A I_B] of the rows (ints, in
 * the lanes [A0 A1 B0 B1 | A2 A3 B2 B3]) times d e, f = fma(d e, (float) I, f); B's lanes get
 * d e = 0 where two is 0, and fma(0, 0, f) leaves them. */
QINLINE __m256 fold_pair4(__m256 f, __m256 d, __m256i ints, const XRow *x, int64_t bi, int two) {
    const __m256 da = _mm256_mul_ps(d, _mm256_set1_ps(x->e[bi]));
    const __m256 db = two ? _mm256_mul_ps(d, _mm256_set1_ps(x->e[bi + 1])) : _mm256_setzero_ps();
    return _mm256_fmadd_ps(_mm256_blend_ps(da, db, 0xCC), _mm256_cvtepi32_ps(ints), f);
}

/* Four rows' Q5_0 blocks A = bi and B = bi + 1 (B absent where two is 0: its lanes then get
 * d e = 0 and I = 0, and fma(0, 0, f) leaves them) against activation rows r < nr: [I_A I_B]
 * of the four rows from one hadd, less 16 P (q - 16 is the weight), folded into f[r]'s lanes
 * [A0 A1 B0 B1 | A2 A3 B2 B3]. x4: w is an interleaved strip (FMT_Q50_X4). */
QINLINE void pair4_q50(const uint8_t *w, int64_t row_bytes, int64_t bi, int two, int x4,
                       const XRow *x, int nr, __m256 *f) {
    /* int16 pairs [16, 0] where a lane takes block A's P, [0, 16] block B's */
    const __m256i sixteen = _mm256_setr_epi16(16, 0, 16, 0, 0, 16, 0, 16, 16, 0, 16, 0, 0, 16,
                                              0, 16);
    __m256i qh;
    __m256 d;
    if (x4)
        heads_q50_x4(w, bi, two, &qh, &d);
    else
        heads_q50(w, row_bytes, bi, two, &qh, &d);
    __m256i q[4], sa[TILE_ROWS];
    block4_q5(w, row_bytes, bi, x4, qh, q);
    for (int r = 0; r < nr; r++) sa[r] = block_dot4(q, x[r].p + bi * SMALL);
    if (two) block4_q5(w, row_bytes, bi + 1, x4, _mm256_srli_si256(qh, 8), q);
    for (int r = 0; r < nr; r++) {
        const __m256i sb =
            two ? block_dot4(q, x[r].p + (bi + 1) * SMALL) : _mm256_setzero_si256();
        const uint16_t pa = (uint16_t)x[r].sum32[bi], pb = two ? (uint16_t)x[r].sum32[bi + 1] : 0;
        const __m256i offset =
            _mm256_madd_epi16(_mm256_set1_epi32((int)(pa | (uint32_t)pb << 16)), sixteen);
        const __m256i ints = _mm256_sub_epi32(_mm256_hadd_epi32(sa[r], sb), offset);
        f[r] = fold_pair4(f[r], d, ints, &x[r], bi, two);
    }
}

/* Four rows' Q8_0 codes (signed) against one activation row's block of 32 (codes p), in
 * block_dot4's lanes: the signs go onto p (vpsignb), so the magnitudes (at most 128) multiply
 * as unsigned bytes; without VNNI each word's vpmaddubsw pairs (|sum| <= 2 * 128 * 127) widen to
 * int32 before the next word's are added. */
QINLINE __m256i block_dot4_q8(const __m256i q[4], const __m256i absq[4], const int8_t *p) {
    __m256i a = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i sp = _mm256_sign_epi8(bcast8(p + 8 * c), q[c]);
#ifdef QUANT_VNNI
        a = DPBUSD(a, absq[c], sp);
#else
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(absq[c], sp),
                                                  _mm256_set1_epi16(1)));
#endif
    }
    return a;
}

/* Block bi of an interleaved Q8_0 strip w: its four rows' codes by word, and their magnitudes. */
QINLINE void block4_q8(const uint8_t *w, int64_t bi, __m256i q[4], __m256i absq[4]) {
    const uint8_t *codes = w + bi * Q80X4_BYTES + Q80X4_CODES;
    for (int c = 0; c < 4; c++) {
        q[c] = load32(codes + X4_ROWS * WORD * c);
        absq[c] = _mm256_abs_epi8(q[c]);
    }
}

/* pair4_q50's fold for an interleaved Q8_0 strip w: the four rows' I = sum q p of blocks A = bi
 * and B = bi + 1 (none where two is 0) from one hadd, folded into f[r]'s lanes
 * [A0 A1 B0 B1 | A2 A3 B2 B3] with the same float steps. */
QINLINE void pair4_q80(const uint8_t *w, int64_t bi, int two, const XRow *x, int nr,
                       __m256 *f) {
    const uint8_t *a = w + bi * Q80X4_BYTES;
    const __m256 d = strip_d(a, two ? a + Q80X4_BYTES : a);
    __m256i q[4], absq[4], sa[TILE_ROWS];
    block4_q8(w, bi, q, absq);
    for (int r = 0; r < nr; r++) sa[r] = block_dot4_q8(q, absq, x[r].p + bi * SMALL);
    if (two) block4_q8(w, bi + 1, q, absq);
    for (int r = 0; r < nr; r++) {
        const __m256i sb =
            two ? block_dot4_q8(q, absq, x[r].p + (bi + 1) * SMALL) : _mm256_setzero_si256();
        f[r] = fold_pair4(f[r], d, _mm256_hadd_epi32(sa[r], sb), &x[r], bi, two);
    }
}

/* y[4 r + j] for Q5_0 weight rows j of w (row_bytes apart, or an interleaved strip: x4), or
 * (q8) the rows of an interleaved Q8_0 strip, and activation rows r < nr, two blocks at a
 * time; a row's lanes hold its even- and odd-block chains: the row path's. */
QINLINE void tile4_small(const uint8_t *w, int64_t row_bytes, int64_t blocks, int x4, int q8,
                         const XRow *x, int nr, float *y) {
    __m256 f[TILE_ROWS]; /* [e0 e1 o0 o1 | e2 e3 o2 o3]: rows' even- and odd-block chains */
    for (int r = 0; r < nr; r++) f[r] = _mm256_setzero_ps();
    int64_t bi = 0;
    for (; bi + 1 < blocks; bi += 2) {
        if (q8) {
            prefetch_ahead(w + bi * Q80X4_BYTES, 2 * Q80X4_BYTES);
            pair4_q80(w, bi, 1, x, nr, f);
            continue;
        }
        if (x4) {
            prefetch_ahead(w + bi * Q50X4_BYTES, 2 * Q50X4_BYTES);
        } else {
            /* the next four rows (contiguous), swept at the pace this tile reads its own */
            const uint8_t *next = w + 4 * row_bytes + 4 * bi * Q50_BYTES;
            for (int o = 0; o < 8 * Q50_BYTES; o += LINE) __builtin_prefetch(next + o);
        }
        pair4_q50(w, row_bytes, bi, 1, x4, x, nr, f);
    }
    if (bi < blocks) {
        if (q8) pair4_q80(w, bi, 0, x, nr, f);
        else pair4_q50(w, row_bytes, bi, 0, x4, x, nr, f);
    }
    for (int r = 0; r < nr; r++) {
        const __m128 lo = _mm256_castps256_ps128(f[r]), hi = _mm256_extractf128_ps(f[r], 1);
        _mm_storeu_ps(y + 4 * r, _mm_add_ps(_mm_movelh_ps(lo, hi), _mm_movehl_ps(hi, lo)));
    }
}

#endif

/* A block's weights (256 for the super-block formats, 32 for the others) and bytes. */
QINLINE int block_weights(int fmt) {
    return (fmt >= FMT_Q50 && fmt < FMT_Q4K_X4) || fmt >= FMT_Q50_X4 ? SMALL : SUPER;
}
QINLINE int block_bytes(int fmt) {
    switch (fmt) {
    case FMT_Q4K:
    case FMT_Q4K_X4: return Q4K_BYTES; /* a row's share of its strip */
    case FMT_Q5K: return Q5K_BYTES;
    case FMT_Q6K:
    case FMT_Q6K_X4: return Q6K_BYTES;
    case FMT_Q50:
    case FMT_Q50_X4: return Q50_BYTES;
    case FMT_Q51: return Q51_BYTES;
    default: return Q80_BYTES;
    }
}

/* Q5_0 and Q8_0, one weight row: per block the exact integer I = sum (q - 16) p (Q8_0: sum q p),
 * folded into the chain of the block's parity, f_(b mod 2) = fmaf(d e, (float) I, f_(b mod 2));
 * the result f_0 + f_1 (the four-row tiles' lanes). */
QINLINE void tile_parity(const uint8_t *w, int64_t blocks, int fmt, const XRow *x, int nr,
                         float *y) {
    const int bytes = block_bytes(fmt);
    float f[TILE_ROWS][2];
    for (int r = 0; r < nr; r++) f[r][0] = f[r][1] = 0.0f;
    for (int64_t bi = 0; bi < blocks; bi++) {
        const uint8_t *b = w + bi * bytes;
        prefetch_ahead(b, bytes);
        const float d = f16_to_f32(b);
        Codes sq, absq;
        if (fmt == FMT_Q50) {
            uint32_t qh;
            memcpy(&qh, b + Q5_D, Q5_QH);
            signed_q5(block_q5(b + Q5_D + Q5_QH, qh), &sq, &absq);
        } else {
            signed_q8(b + Q5_D, &sq, &absq);
        }
        for (int r = 0; r < nr; r++) {
            const int32_t i = sum_lanes(dot_signed(absq, sq, x[r].p + bi * SMALL));
            f[r][bi & 1] = fmaf(d * x[r].e[bi], (float)i, f[r][bi & 1]);
        }
    }
    for (int r = 0; r < nr; r++) y[r] = f[r][0] + f[r][1];
}

/* Q5_1, one weight row: codes q plus the minimum m e P, the row path's 8 lanes as floats. */
QINLINE void tile_q51(const uint8_t *w, int64_t blocks, const XRow *x, int nr, float *y) {
    Lanes f[TILE_ROWS];
    float c[TILE_ROWS];
    for (int r = 0; r < nr; r++) f[r] = zero_f(), c[r] = 0.0f;
    for (int64_t bi = 0; bi < blocks; bi++) {
        const uint8_t *b = w + bi * Q51_BYTES;
        prefetch_ahead(b, Q51_BYTES);
        const float d = f16_to_f32(b);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const Codes q = block_q5(b + 8, qh);
        for (int r = 0; r < nr; r++) {
            const float e = x[r].e[bi];
            f[r] = fold(f[r], d * e, dot_scaled(q, x[r].p + bi * SMALL, scale_ones()));
            c[r] = fmaf(f16_to_f32(b + 2) * e, (float)x[r].sum32[bi], c[r]);
        }
    }
    for (int r = 0; r < nr; r++) y[r] = tree_lanes(f[r]) + c[r];
}

QINLINE void tile(const uint8_t *w, int64_t k, int fmt, const XRow *x, int nr, float *y) {
    const int64_t blocks = k / block_weights(fmt);
    switch (fmt) {
    case FMT_Q4K: tile_k45(w, blocks, 0, x, nr, y); break;
    case FMT_Q5K: tile_k45(w, blocks, 1, x, nr, y); break;
    case FMT_Q6K: tile_q6k(w, blocks, x, nr, y); break;
    /* Each format by name: a constant fmt inlines its own block loop. */
    case FMT_Q50: tile_parity(w, blocks, FMT_Q50, x, nr, y); break;
    case FMT_Q51: tile_q51(w, blocks, x, nr, y); break;
    default: tile_parity(w, blocks, FMT_Q80, x, nr, y); break;
    }
}

/* Constant tile heights, so each instantiation keeps its rows' accumulators in registers. */
#define TILE_CASE(NR)                                                                        \
    case NR: tile(w, k, fmt, x, NR, y); break;
static void tile_rows(const uint8_t *w, int64_t k, int fmt, const XRow *x, int nr, float *y) {
    switch (nr) {
    TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4)
    TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
    default: break;
    }
}

#ifdef QUANT_AVX2
#define TILE4_CASE(NR)                                                                       \
    case NR:                                                                                 \
        if (fmt == FMT_Q4K_X4) tile4_q4k_x4(w, k / SUPER, x, NR, y);                        \
        else if (fmt == FMT_Q6K_X4) tile4_q6k_x4(w, k / SUPER, x, NR, y);                   \
        else if (fmt == FMT_Q50 || fmt == FMT_Q50_X4)                                       \
            tile4_small(w, row_bytes, k / SMALL, fmt == FMT_Q50_X4, 0, x, NR, y);            \
        else if (fmt == FMT_Q80_X4) tile4_small(w, row_bytes, k / SMALL, 1, 1, x, NR, y);   \
        else tile4_k45(w, row_bytes, k / SUPER, fmt == FMT_Q5K, x, NR, y);                  \
        break;
/* Four weight rows at once where the format has a four-row tile: whether it did. */
static int tile4_rows(const uint8_t *w, int64_t row_bytes, int64_t k, int fmt, const XRow *x,
                      int nr, float *y) {
    if (fmt != FMT_Q4K && fmt != FMT_Q5K && fmt != FMT_Q50 && fmt < FMT_Q4K_X4) return 0;
    switch (nr) {
    TILE4_CASE(1) TILE4_CASE(2) TILE4_CASE(3) TILE4_CASE(4)
    TILE4_CASE(5) TILE4_CASE(6) TILE4_CASE(7) TILE4_CASE(8)
    default: break;
    }
    return 1;
}
#else
/* Words [from, from + count) of row j's super-block o, from where a strip keeps them (word c
 * of rows 0-3 together, from `at`). */
static void strip_words(const uint8_t *at, int from, int count, int j, uint8_t *o) {
    for (int c = 0; c < count; c++)
        memcpy(o + from + WORD * c, at + X4_ROWS * WORD * c + WORD * j, WORD);
}

/* Row j of an interleaved strip w back as the file's blocks (the header's layouts). */
static void strip_row(const uint8_t *w, int64_t blocks, int fmt, int j, uint8_t *row) {
    for (int64_t sb = 0; sb < blocks; sb++) {
        if (fmt == FMT_Q80_X4) {
            const uint8_t *b = w + sb * Q80X4_BYTES;
            uint8_t *o = row + sb * Q80_BYTES;
            memcpy(o, b + Q5_D * j, Q5_D);
            strip_words(b + Q80X4_CODES, Q5_D, (Q80_BYTES - Q5_D) / WORD, j, o);
        } else if (fmt == FMT_Q50_X4) {
            const uint8_t *b = w + sb * Q50X4_BYTES;
            uint8_t *o = row + sb * Q50_BYTES;
            memcpy(o, b + Q5_D * j, Q5_D);
            memcpy(o + Q5_D, b + Q50X4_QH + Q5_QH * j, Q5_QH);
            strip_words(b + Q50X4_CODES, Q5_D + Q5_QH, (Q50_BYTES - Q5_D - Q5_QH) / WORD, j, o);
        } else if (fmt == FMT_Q4K_X4) {
            const uint8_t *b = w + sb * X4_BYTES;
            uint8_t *o = row + sb * Q4K_BYTES;
            memcpy(o, b + K_HEAD * j, K_HEAD);
            strip_words(b + X4_HEADS, K_HEAD, (Q4K_BYTES - K_HEAD) / WORD, j, o);
        } else {
            const uint8_t *b = w + sb * Q6X4_BYTES;
            uint8_t *o = row + sb * Q6K_BYTES;
            enum { HIGH = WORD * Q6K_LOW_WORDS, SCALES = HIGH + WORD * Q6K_HIGH_WORDS };
            enum { HALF_SCALES = Q6K_SCALES / 2, D = SCALES + Q6K_SCALES };
            strip_words(b, 0, Q6K_LOW_WORDS, j, o);
            strip_words(b + Q6X4_HIGH, HIGH, Q6K_HIGH_WORDS, j, o);
            for (int h = 0; h < 2; h++)
                memcpy(o + SCALES + HALF_SCALES * h,
                       b + Q6X4_SCALES + X4_ROWS * HALF_SCALES * h + HALF_SCALES * j, HALF_SCALES);
            memcpy(o + D, b + Q6X4_D + 2 * j, Q6K_BYTES - D);
        }
    }
}

/* The format an interleaved one's rows come from. */
static int file_format(int fmt) {
    return fmt == FMT_Q4K_X4   ? FMT_Q4K
           : fmt == FMT_Q6K_X4 ? FMT_Q6K
           : fmt == FMT_Q80_X4 ? FMT_Q80
                               : FMT_Q50;
}

/* The generic build's four-row tile: an interleaved strip's rows one at a time, as stored. */
static int tile4_rows(const uint8_t *w, int64_t row_bytes, int64_t k, int fmt, const XRow *x,
                      int nr, float *y) {
    if (fmt < FMT_Q4K_X4) return 0;
    uint8_t row[row_bytes];
    float yj[TILE_ROWS];
    for (int j = 0; j < X4_ROWS; j++) {
        strip_row(w, k / block_weights(fmt), fmt, j, row);
        tile_rows(row, k, file_format(fmt), x, nr, yj);
        for (int r = 0; r < nr; r++) y[X4_ROWS * r + j] = yj[r];
    }
    return 1;
}
#endif

/* Weight rows [n0, n1) against activation rows [r0, r0 + nr): four at a time where a four-row
 * tile serves the format, one at a time for the rest. */
static void chunk_rows(const uint8_t *codes, int64_t bytes, int64_t k, int fmt, int64_t n0,
                       int64_t n1, const XRow *x, int nr, int64_t n, float *out) {
    float y[4 * TILE_ROWS];
    int64_t j = n0;
    for (; j + 4 <= n1 && tile4_rows(codes + j * bytes, bytes, k, fmt, x, nr, y); j += 4)
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < 4; i++) out[r * n + j + i] = y[4 * r + i];
    for (; j < n1; j++) {
        tile_rows(codes + j * bytes, k, fmt, x, nr, y);
        for (int r = 0; r < nr; r++) out[r * n + j] = y[r];
    }
}

/* out [m, n] = x [m, k] @ W^T for W [n, k] in one of the formats above. Threads take chunks of
 * COL_CHUNK weight rows; within a chunk, tiles of TILE_ROWS activation rows pass over every
 * weight row of it (the chunk stays in cache between tiles). Returns -1 without memory for the
 * rounded activation. */
int saguaro_quant_linear(const float *x, int64_t m, int64_t k, const uint8_t *codes, int64_t n,
                         int fmt, float *out, int threads) {
    const int64_t block = block_weights(fmt);
    XRow *rows = malloc(sizeof(XRow) * (size_t)m);
    void *buf = rows ? round_rows(x, m, k, block, rows) : NULL;
    if (buf == NULL) {
        free(rows);
        return -1;
    }
    if (m >= AMX_MIN_ROWS && quant_amx_linear(rows, m, k, codes, n, fmt, out, threads)) {
        free(buf);
        free(rows);
        return 0;
    }
    const int64_t bytes = k / block * block_bytes(fmt), chunks = (n + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n0 = c * COL_CHUNK, n1 = n0 + COL_CHUNK < n ? n0 + COL_CHUNK : n;
        for (int64_t r0 = 0; r0 < m; r0 += TILE_ROWS) {
            const int nr = (int)(m - r0 < TILE_ROWS ? m - r0 : TILE_ROWS);
            chunk_rows(codes, bytes, k, fmt, n0, n1, rows + r0, nr, n, out + r0 * n);
        }
    }
    free(buf);
    free(rows);
    return 0;
}
