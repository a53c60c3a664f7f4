/* saguaro's CPU kernels: weight-only quantized and dense linear layers, RMSNorm, SwiGLU and
 * paged attention, each computing a row's result in an order fixed by the row alone; and, at
 * the end, sampling's counter-based noise (integer hashing, the same bits as torch's).
 *
 * Batch invariance. Every output element is one chain of float operations whose order depends
 * on the shapes of the model (K, D, the keys a query sees), never on how many rows share the
 * call, where a row sits in its tile, or how many threads run: a dot product over K keeps 16
 * partial sums (lane l sums the products k = l mod 16, in increasing k), and adds them by one
 * fixed pairwise tree at the end. Tiling (several rows and columns per step) only chooses
 * which chains run side by side. Threads split the output columns (or the query tokens), so a
 * chain is never split. So a token's logits are the same bits alone, in a K + 1-position
 * verification, among SSD's branches or in a batch of 64.
 *
 * A chain's 16 lanes are one GCC vector of 16 floats, or two halves of 8 (AVX2 registers):
 * their lane-wise meaning is the same either way, the lane sums take the same tree, and
 * multiply-adds are contracted to FMA everywhere (-ffp-contract=fast, -mfma), so the bits do not
 * depend on the register width or the x86 vendor either.
 *
 * Quantized weights (weight-only, groupwise). A row of W holds K codes q in groups of G
 * (a multiple of 32); group g has a scale d_g and minimum m_g (float16 values, held as float32 so
 * that a loop broadcasts them from memory without converting them), and the weight is
 * w = d_g * q + m_g, computed as one FMA. d * q is exact in float32 (an 11-bit significand
 * times a code of at most 8 bits), so the FMA rounds once, exactly as GGUF's d * q + m does:
 * the kernel multiplies by the very weights the dequantized checkpoint holds. Formats:
 *   Q4: codes packed in 16 bytes per 32 weights; byte j holds weight j (low nibble) and
 *       weight j + 16 (high nibble), GGUF's Q4_0/Q4_1 block layout.
 *   Q8: one signed byte per weight, symmetric (m_g = 0): its minima are never read, which
 *       spares a memory-bound product (the LM head) 4 of its 40 bytes a block.
 * Each 32-weight block is turned into floats once per tile of rows and used by all of them;
 * with more rows than a tile, once per call (linear_columns).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint8_t v16b __attribute__((vector_size(16)));
typedef uint16_t v16h __attribute__((vector_size(32)));

enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_Q8 = 2, FMT_Q4 = 3 };
#define QUANTIZED(fmt) ((fmt) == FMT_Q8 || (fmt) == FMT_Q4)
enum { PREFETCH_ROWS = 8, CACHE_LINE = 64 };
enum { BLOCK = 32, LANES = 16, MAX_HEAD_DIM = 256, MAX_TILE_ROWS = 8, CHUNK = 32 };

/* Without AVX-512 the linear layers take the AVX2 path below (same chains, same bits);
 * SAGUARO_GENERIC forces the generic vector code, which the tests build to compare the two. */
#if defined(__AVX2__) && !defined(__AVX512F__) && !defined(SAGUARO_GENERIC)
#define SAGUARO_AVX2 1
#endif

#define INLINE static inline __attribute__((always_inline))

/* Lane sums by one fixed tree: (0+8, 1+9, ...), then halves again, down to one. */
INLINE float tree_sum(float t[LANES]) {
    for (int s = LANES / 2; s >= 1; s /= 2)
        for (int i = 0; i < s; i++) t[i] = t[i] + t[i + s];
    return t[0];
}

/* A 16-lane chain held as two 8-lane halves lo (lanes 0-7) and hi (lanes 8-15), element i of a
 * row going to half (i / 8) % 2: the lanes, and so the bits, are a v16 chain's, but each
 * half is one AVX2 register (GCC lowers a 64-byte vector on AVX2 through the stack). */
typedef float v8 __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
enum { HALF = 8 };

INLINE v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* The chain's lanes summed by tree_sum's tree, whose first level is lo + hi. Each half is a
 * variable of its own in the loops that fill them: halves in an array indexed at run time live
 * in memory, every update a store and a load. */
INLINE float halves_sum(v8 lo, v8 hi) {
    const __m256 s8 = _mm256_add_ps((__m256)lo, (__m256)hi);                    /* t[i] + t[i + 8] */
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* + 4 */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                            /* + 2 */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                          /* + 1 */
}

/* e^x in each lane, to a few units in the last place: x = n ln 2 + r with n = rint(x / ln 2)
 * and |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact to float rounding), e^r by its Taylor
 * polynomial to r^6 / 720 (the next term is below 2^-23 of it), times 2^n made in the exponent
 * bits. x is clamped where e^x leaves the normal floats: e^x of a clamped x is then the
 * smallest normal (below) or about 2.5e38 (above), which a softmax or SiLU rounds away as it
 * would 0 or infinity; a NaN stays NaN. Every step is one IEEE operation, fused multiply-adds
 * written out, so the bits are the same in every build. */
enum { EXP_BIAS = 127, MANTISSA_BITS = 23 };
static const float EXP_LO = -87.33654f, EXP_HI = 88.37626f; /* ln 2^-126, ln 2^127.5 */
static const float LOG2E = 1.44269504f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
static const float EXP_TAYLOR[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
INLINE v8 exp8(v8 x) {
    __m256 v = _mm256_max_ps(_mm256_set1_ps(EXP_LO), (__m256)x); /* NaN: the second operand */
    v = _mm256_min_ps(_mm256_set1_ps(EXP_HI), v);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), v);
    v = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), v);
    __m256 p = _mm256_set1_ps(EXP_TAYLOR[0]);
    for (size_t i = 1; i < sizeof EXP_TAYLOR / sizeof *EXP_TAYLOR; i++)
        p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(EXP_TAYLOR[i]));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(EXP_BIAS)), MANTISSA_BITS);
    return (v8)_mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* exp8 of the n <= 8 floats at x, in place. */
INLINE void exp_tail(float *x, int64_t n) {
    float t[HALF] = {0};
    memcpy(t, x, n * sizeof(float));
    store8(t, exp8(load8(t)));
    memcpy(x, t, n * sizeof(float));
}

typedef struct {
    const void *codes;      /* float32, bfloat16, int8 or packed-int4 rows of K */
    const float *scales;    /* [N, K / G] (quantized formats) */
    const float *mins;      /* [N, K / G] (quantized formats) */
    int64_t k, group;
    int fmt;
} Weight;

#ifdef SAGUARO_AVX2
/* AVX2 holds each 16-lane chain in two 8-lane registers (lanes 0-7 and 8-15 of the generic
 * code's v16) and updates them with the same FMAs in the same order, so every output has the
 * generic code's bits. It is written with intrinsics because GCC lowers 64-byte vectors on
 * AVX2 through the stack and scalar byte extracts (about 5x slower for quantized weights).
 * The tile is one column of up to six rows: 12 accumulators and a block's 4 weight vectors fill
 * AVX2's 16 registers (AVX-512 has 32), and a K + 1 = 5-row verification converts each weight
 * once. */
enum { ROWS = 6, COLS = 1, SMALL_ROWS = ROWS };

/* Block `b` of row `n` as q[i] = weights 8i .. 8i + 7, with its group's scale d and min m. */
INLINE void weight_block8(const Weight *w, const int fmt, int64_t n, int64_t b, __m256 d,
                          __m256 m, __m256 q[4]) {
    const int64_t k = w->k;
    if (fmt == FMT_F32) {
        const float *p = (const float *)w->codes + n * k + b * BLOCK;
        for (int i = 0; i < 4; i++) q[i] = _mm256_loadu_ps(p + 8 * i);
        return;
    }
    if (fmt == FMT_BF16) {
        const uint16_t *p = (const uint16_t *)w->codes + n * k + b * BLOCK;
        for (int i = 0; i < 4; i++) {
            const __m128i h = _mm_loadu_si128((const __m128i *)(p + 8 * i));
            q[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        return;
    }
    if (fmt == FMT_Q8) {
        const int8_t *p = (const int8_t *)w->codes + n * k + b * BLOCK;
        for (int i = 0; i < 4; i++) {
            const __m128i v = _mm_loadl_epi64((const __m128i *)(p + 8 * i));
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        }
    } else {
        /* Each 8 bytes widened once to 32-bit lanes, their low nibbles taken by a mask and the
         * high ones by a shift: two widenings a block where splitting the nibbles first takes
         * four, and the widening is what bounds a one-row product. */
        const uint8_t *p = (const uint8_t *)w->codes + n * (k / 2) + b * (BLOCK / 2);
        const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
        const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
        const __m256i nibble = _mm256_set1_epi32(15);
        q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(b0, nibble));
        q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b1, nibble));
        q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));
        q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
    }
    for (int i = 0; i < 4; i++) q[i] = _mm256_fmadd_ps(q[i], d, m);
}

INLINE void group_scale(const Weight *w, const int fmt, int64_t g, __m256 *d, __m256 *m) {
    *d = QUANTIZED(fmt) ? _mm256_broadcast_ss(w->scales + g) : _mm256_set1_ps(1.0f);
    *m = fmt == FMT_Q4 ? _mm256_broadcast_ss(w->mins + g) : _mm256_setzero_ps();
}

/* Block `b` of row `n` as 32 floats at dst. */
INLINE void block_floats(const Weight *w, const int fmt, int64_t n, int64_t b, float *dst) {
    __m256 d, m, q[4];
    group_scale(w, fmt, n * (w->k / w->group) + b * BLOCK / w->group, &d, &m);
    weight_block8(w, fmt, n, b, d, m, q);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + 8 * i, q[i]);
}

/* A group's scale or minimum as the tile reads it, and the tile's accumulators (tile_blocks). */
typedef __m256 Scale;
typedef __m256 TileAcc[COLS][ROWS][2];

/* Block b of the tile's nc columns (their scales and minima d, m) into the rows' chains. */
INLINE void tile_block(const float *x, const Weight *w, const int fmt, int64_t r0, int nr,
                       int64_t wn0, int nc, int64_t b, const Scale d[COLS], const Scale m[COLS],
                       TileAcc acc) {
    for (int c = 0; c < nc; c++) {
        __m256 q[4];
        weight_block8(w, fmt, wn0 + c, b, d[c], m[c], q);
        for (int r = 0; r < nr; r++) {
            const float *xr = x + (r0 + r) * w->k + b * BLOCK;
            for (int i = 0; i < 4; i++)
                acc[c][r][i % 2] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * i), q[i],
                                                   acc[c][r][i % 2]);
        }
    }
}

#else
/* Tiles of four rows by four columns: 16 accumulators and a block's 8 weight vectors in
 * AVX-512's 32 registers. A call of ROWS + 1 .. SMALL_ROWS rows (a K + 1 verification of K = 4
 * to 7) runs as one taller tile instead, so each block is still converted once per call
 * without the float32 buffer of linear_columns: at so few rows that buffer's second pass over
 * 8x the weight bytes costs more than the conversions it saves (5 rows cost 2.5x 4 rows that
 * way, 1.2x this way), even where the taller tile's accumulators leave registers. */
enum { ROWS = 4, COLS = 4, SMALL_ROWS = 8 };

INLINE v16 load_f32(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store_f32(float *p, v16 v) { memcpy(p, &v, sizeof v); }

INLINE v16 load_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u bits = __builtin_convertvector(h, v16u) << 16;  /* bfloat16 -> float32 is exact */
    v16 v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

INLINE float lane_sum(v16 a) {
    float t[LANES];
    memcpy(t, &a, sizeof t);
    return tree_sum(t);
}

/* A group's scale or minimum as the tile reads it.
 * AVX-512 keeps it broadcast, loaded by one broadcast from memory (a scalar load and a
 * register broadcast would take a shuffle unit the table's permutations need). */
#ifdef __AVX512F__
typedef __m512 Scale;
#define SCALE(v) _mm512_set1_ps(v)
#else
typedef float Scale;
#define SCALE(v) (v)
#endif

/* Block `b` (weights 32b .. 32b + 31) of row `n` as floats: lo = weights 0..15, hi = 16..31;
 * d and m are its group's scale and minimum (unused for float32 and bfloat16). */
INLINE void weight_block(const Weight *w, const int fmt, int64_t n, int64_t b, Scale d, Scale m,
                         v16 *lo, v16 *hi) {
    const int64_t k = w->k;
    if (fmt == FMT_F32) {
        const float *p = (const float *)w->codes + n * k + b * BLOCK;
        *lo = load_f32(p);
        *hi = load_f32(p + LANES);
        return;
    }
    if (fmt == FMT_BF16) {
        const uint16_t *p = (const uint16_t *)w->codes + n * k + b * BLOCK;
        *lo = load_bf16(p);
        *hi = load_bf16(p + LANES);
        return;
    }
    v16 qlo, qhi;
    if (fmt == FMT_Q8) {
        const uint8_t *p = (const uint8_t *)w->codes + n * k + b * BLOCK;
#ifdef __AVX512F__
        /* One sign extension and one conversion per 16 codes. */
        const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)p)));
        const __m512 c =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(p + LANES))));
        memcpy(&qlo, &a, sizeof qlo);
        memcpy(&qhi, &c, sizeof qhi);
#else
        /* Signed bytes widen through unsigned ones (q + 128, then - 128, both exact): GCC
         * vectorizes the unsigned conversion but not the signed one. */
        v16b a, c;
        memcpy(&a, p, sizeof a);
        memcpy(&c, p + LANES, sizeof c);
        qlo = __builtin_convertvector(__builtin_convertvector(a ^ 0x80, v16i), v16) - 128.0f;
        qhi = __builtin_convertvector(__builtin_convertvector(c ^ 0x80, v16i), v16) - 128.0f;
#endif
    } else {
        const uint8_t *p = (const uint8_t *)w->codes + n * (k / 2) + b * (BLOCK / 2);
#ifdef __AVX512F__
        /* A 4-bit code has 16 values: the block's 16 weights d j + m (j = 0..15, the same FMA
         * as below, so the same floats) fill one register, and each code picks its weight by
         * a permutation, which reads only an index's low 4 bits. The mask, the high nibbles'
         * byte shift and both conversions to float drop out of the innermost loop. */
        const v16 levels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const __m512 table = levels * d + m;
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)p));
        const __m512 a = _mm512_permutexvar_ps(bytes, table);
        const __m512 c = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
        memcpy(lo, &a, sizeof *lo);
        memcpy(hi, &c, sizeof *hi);
        return;
#else
        v16b bytes;
        memcpy(&bytes, p, sizeof bytes);
        qlo = __builtin_convertvector(__builtin_convertvector(bytes & 15, v16i), v16);
        qhi = __builtin_convertvector(__builtin_convertvector(bytes >> 4, v16i), v16);
#endif
    }
    *lo = qlo * d + m;
    *hi = qhi * d + m;
}

/* Group g's scale and minimum (1 and 0 for float formats, which have none). */
INLINE void group_scale(const Weight *w, const int fmt, int64_t g, Scale *d, Scale *m) {
    *d = SCALE(QUANTIZED(fmt) ? w->scales[g] : 1.0f);
    *m = SCALE(fmt == FMT_Q4 ? w->mins[g] : 0.0f);
}

/* The tile's accumulators (tile_blocks). */
typedef v16 TileAcc[COLS][SMALL_ROWS];

/* Block b of the tile's nc columns (their scales and minima d, m) into the rows' chains. */
INLINE void tile_block(const float *x, const Weight *w, const int fmt, int64_t r0, int nr,
                       int64_t wn0, int nc, int64_t b, const Scale d[COLS], const Scale m[COLS],
                       TileAcc acc) {
    v16 lo[COLS], hi[COLS];
    for (int c = 0; c < nc; c++) weight_block(w, fmt, wn0 + c, b, d[c], m[c], &lo[c], &hi[c]);
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (r0 + r) * w->k + b * BLOCK;
        const v16 xlo = load_f32(xr), xhi = load_f32(xr + LANES);
        for (int c = 0; c < nc; c++) {
            acc[c][r] = xlo * lo[c] + acc[c][r];
            acc[c][r] = xhi * hi[c] + acc[c][r];
        }
    }
}

/* Block `b` of row `n` as 32 floats at dst. */
INLINE void block_floats(const Weight *w, const int fmt, int64_t n, int64_t b, float *dst) {
    Scale d, m;
    group_scale(w, fmt, n * (w->k / w->group) + b * BLOCK / w->group, &d, &m);
    v16 lo, hi;
    weight_block(w, fmt, n, b, d, m, &lo, &hi);
    store_f32(dst, lo);
    store_f32(dst + LANES, hi);
}
#endif

/* Ask for weight rows n .. n + nc - 1 (codes, scales and minima) ahead of their use: on a
 * product too large for the cache (the LM head; every layer in a forward) the hardware's
 * prefetcher alone streams the tile's interleaved rows far below a plain read's bandwidth
 * (docs/bench/kernels). A prefetch never faults, so rows past the end are harmless. */
INLINE void prefetch_rows(const Weight *w, const int fmt, int64_t n, int nc) {
    const int64_t bytes = fmt == FMT_F32    ? 4 * w->k
                          : fmt == FMT_BF16 ? 2 * w->k
                          : fmt == FMT_Q8   ? w->k
                                            : w->k / 2,
                  groups = w->k / w->group;
    for (int c = 0; c < nc; c++) {
        const char *codes = (const char *)w->codes + (n + c) * bytes;
        for (int64_t o = 0; o < bytes; o += CACHE_LINE) __builtin_prefetch(codes + o);
        __builtin_prefetch(codes + bytes - 1);
        if (!QUANTIZED(fmt)) continue;
        for (int64_t g = 0; g < groups; g += CACHE_LINE / (int64_t)sizeof(float)) {
            __builtin_prefetch(w->scales + (n + c) * groups + g);
            if (fmt == FMT_Q4) __builtin_prefetch(w->mins + (n + c) * groups + g);
        }
    }
}

/* Every block of the tile's columns into its rows' chains, in increasing block order, each
 * block with its group's scales, read by index (no division per block): GGUF's one scale per
 * block beside its block (a group loop of one block a pass spends much of a one-row product on
 * loop overhead), a longer group's once for all its blocks. */
INLINE void tile_blocks(const float *x, const Weight *w, const int fmt, int64_t r0, int nr,
                        int64_t wn0, int nc, TileAcc acc) {
    const int64_t groups = w->k / w->group, per_group = w->group / BLOCK;
    Scale d[COLS], m[COLS];
    if (r0 == 0) prefetch_rows(w, fmt, wn0 + PREFETCH_ROWS, nc);  /* later row tiles hit cache */
    if (per_group == 1)
        for (int64_t b = 0; b < groups; b++) {
            for (int c = 0; c < nc; c++) group_scale(w, fmt, (wn0 + c) * groups + b, &d[c], &m[c]);
            tile_block(x, w, fmt, r0, nr, wn0, nc, b, d, m, acc);
        }
    else
        for (int64_t gi = 0; gi < groups; gi++) {
            for (int c = 0; c < nc; c++) group_scale(w, fmt, (wn0 + c) * groups + gi, &d[c], &m[c]);
            for (int64_t b = gi * per_group; b < (gi + 1) * per_group; b++)
                tile_block(x, w, fmt, r0, nr, wn0, nc, b, d, m, acc);
        }
}

#ifdef SAGUARO_AVX2
/* As the generic linear_tile below: the chain of lane l takes x[k] * w[k] for k = l mod 16 in
 * increasing k, so lanes 0-7 take q[0] then q[2] of each block, lanes 8-15 q[1] then q[3]. */
INLINE void linear_tile(const float *x, const Weight *w, const int fmt, float *out, int64_t n_out,
                        int64_t r0, int nr, int64_t n0, int64_t wn0, int nc) {
    TileAcc acc;
    for (int c = 0; c < COLS; c++)
        for (int r = 0; r < ROWS; r++) acc[c][r][0] = acc[c][r][1] = _mm256_setzero_ps();
    tile_blocks(x, w, fmt, r0, nr, wn0, nc, acc);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++)
            out[(r0 + r) * n_out + n0 + c] = halves_sum(acc[c][r][0], acc[c][r][1]);
}
#else
/* out[r, n] for rows r0 .. r0 + nr - 1 and columns n0 .. n0 + nc - 1 (nr <= ROWS, nc <= COLS),
 * from weight rows wn0 .. wn0 + nc - 1: each (r, n) is the same chain whatever nr and nc are. */
INLINE void linear_tile(const float *x, const Weight *w, const int fmt, float *out, int64_t n_out,
                        int64_t r0, int nr, int64_t n0, int64_t wn0, int nc) {
    TileAcc acc;
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) acc[c][r] = (v16){0};
    tile_blocks(x, w, fmt, r0, nr, wn0, nc, acc);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) out[(r0 + r) * n_out + n0 + c] = lane_sum(acc[c][r]);
}
#endif
_Static_assert((int)ROWS <= (int)MAX_TILE_ROWS, "linear_rows' REST cases cover remainders of 1..7 rows");
_Static_assert((int)SMALL_ROWS <= (int)MAX_TILE_ROWS, "linear_small's cases cover 5..8 rows");

/* Constant tile shapes and formats, so that each call is unrolled with its accumulators in
 * registers and no branch on the format is left in the loop. */
#define TILE(NR, NC) linear_tile(x, w, fmt, out, n_out, r0, NR, n0 + c, wn0 + c, NC)
/* Rows r0 .. r0 + NR - 1 for every column: tiles of COLS, then single ones. */
#define ROW_TILE(NR)                                                                          \
    do {                                                                                      \
        int c = 0;                                                                            \
        for (; c + COLS <= nc; c += COLS) TILE(NR, COLS);                                     \
        for (; c < nc; c++) TILE(NR, 1);                                                      \
    } while (0)
/* A remainder of NR rows (always fewer than ROWS: cases from ROWS up never run, and are
 * instantiated one row high to stay within the tile's accumulators). */
#define REST(NR)                                                                              \
    case NR:                                                                                  \
        ROW_TILE(NR < ROWS ? NR : 1);                                                         \
        break;
/* All NR rows of a small call (ROWS < NR <= SMALL_ROWS) in one tile height; the same
 * instantiation guard as REST's. */
#define SMALL(NR)                                                                             \
    case NR:                                                                                  \
        ROW_TILE(NR <= SMALL_ROWS ? NR : 1);                                                  \
        break;

/* Columns n0 .. n0 + nc - 1 (weight rows wn0 ..) for all m rows, a tile of rows at a time
 * across all nc columns: the rows' activations stay in cache while the columns pass. */
INLINE void linear_rows(const float *x, int64_t m, const Weight *w, const int fmt, float *out,
                        int64_t n_out, int64_t n0, int64_t wn0, int nc) {
    int64_t r0 = 0;
    for (; r0 + ROWS <= m; r0 += ROWS) ROW_TILE(ROWS);
    /* The last rows in one tile of their own height. */
    switch ((int)(m - r0)) {
    REST(1) REST(2) REST(3) REST(4) REST(5) REST(6) REST(7)
    default: break;
    }
}

/* Columns n0 .. n0 + nc - 1 for ROWS < m <= SMALL_ROWS rows, in one tile height. */
INLINE void linear_small(const float *x, int64_t m, const Weight *w, const int fmt, float *out,
                         int64_t n_out, int64_t n0, int nc) {
    const int64_t r0 = 0, wn0 = n0;
    switch ((int)m) {
    SMALL(5) SMALL(6) SMALL(7) SMALL(8)
    default: break;
    }
}

/* Columns n0 .. n0 + nc - 1 for all m rows. With more rows than one tile, a converted format's
 * columns are turned into floats once, into a buffer the tiles then read as float32: the same
 * floats the tiles would compute themselves, so the same bits, at one conversion per weight
 * instead of one per tile of rows. */
INLINE void linear_columns(const float *x, int64_t m, const Weight w, const int fmt, float *out,
                           int64_t n_out, int64_t n0, int nc) {
    if (m > ROWS && m <= SMALL_ROWS) {
        linear_small(x, m, &w, fmt, out, n_out, n0, nc);
        return;
    }
    if (fmt == FMT_F32 || m <= ROWS) {
        linear_rows(x, m, &w, fmt, out, n_out, n0, n0, nc);
        return;
    }
    float *buf = malloc(sizeof(float) * (size_t)(nc * w.k));
    if (buf == NULL) {
        linear_rows(x, m, &w, fmt, out, n_out, n0, n0, nc);
        return;
    }
    for (int c = 0; c < nc; c++)
        for (int64_t b = 0; b < w.k / BLOCK; b++)
            block_floats(&w, fmt, n0 + c, b, buf + c * w.k + b * BLOCK);
    const Weight dense = {buf, NULL, NULL, w.k, w.group, FMT_F32};
    linear_rows(x, m, &dense, FMT_F32, out, n_out, n0, 0, nc);
    free(buf);
}

/* Threads take chunks of CHUNK columns (a multiple of COLS), the last chunk what is left. */
#define LINEAR(FMT)                                                                           \
    static void linear_##FMT(const float *x, int64_t m, const Weight w, float *out, int64_t n,  \
                             int threads) {                                                   \
        const int64_t chunks = (n + CHUNK - 1) / CHUNK;                                       \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t j = 0; j < chunks; j++) {                                                \
            const int64_t n0 = j * CHUNK;                                                     \
            linear_columns(x, m, w, FMT, out, n, n0, (int)(n - n0 < CHUNK ? n - n0 : CHUNK)); \
        }                                                                                     \
    }
LINEAR(FMT_F32)
LINEAR(FMT_BF16)
LINEAR(FMT_Q8)
LINEAR(FMT_Q4)

/* out [m, n] = x [m, k] @ W^T, W [n, k] in format `fmt` (k a multiple of 32 and of group). */
void saguaro_linear(const float *x, int64_t m, int64_t k, const void *codes,
                    const float *scales, const float *mins, int64_t n, int64_t group,
                    int fmt, float *out, int threads) {
    const Weight w = {codes, scales, mins, k, group, fmt};
    switch (fmt) {
    case FMT_F32: linear_FMT_F32(x, m, w, out, n, threads); break;
    case FMT_BF16: linear_FMT_BF16(x, m, w, out, n, threads); break;
    case FMT_Q8: linear_FMT_Q8(x, m, w, out, n, threads); break;
    default: linear_FMT_Q4(x, m, w, out, n, threads); break;
    }
}

/* out [m, k] = x * (1 / sqrt(mean(x^2) + eps)), per row (k a multiple of 16), then times
 * weight [k] where one is given (two roundings, as the norm and the scaling done apart). The sum
 * of squares is one 16-lane chain, held as two halves (see `halves_sum`). */
void saguaro_rms_norm(const float *x, int64_t m, int64_t k, float eps, const float *weight,
                      float *out) {
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * k;
        v8 lo = {0}, hi = {0};
        for (int64_t i = 0; i < k; i += LANES) {
            const v8 a = load8(xr + i), b = load8(xr + i + HALF);
            lo = a * a + lo;
            hi = b * b + hi;
        }
        const float inv = 1.0f / sqrtf(halves_sum(lo, hi) / (float)k + eps);
        for (int64_t i = 0; i < k; i += HALF) {
            const v8 normed = load8(xr + i) * inv;
            store8(out + r * k + i, weight ? normed * load8(weight + i) : normed);
        }
    }
}

/* out [m, i] = silu(gate) * up = gate / (1 + e^-gate) * up, gate_up [m, 2i] = [gate | up]
 * (elementwise, exp8). */
void saguaro_silu_mul(const float *gate_up, int64_t m, int64_t inter, float *out) {
    for (int64_t r = 0; r < m; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + HALF <= inter; i += HALF) {
            const v8 gv = load8(g + i);
            store8(o + i, gv / (1.0f + exp8(-gv)) * load8(u + i));
        }
        for (int64_t j = i; j < inter; j++) o[j] = -g[j];
        exp_tail(o + i, inter - i);
        for (int64_t j = i; j < inter; j++) o[j] = g[j] / (1.0f + o[j]) * u[j];
    }
}

/* Rotary embedding (rotate-half) of one head's d floats, in place: element i < d/2 becomes
 * x[i] cos[i] - x[i + d/2] sin[i], element i >= d/2 becomes x[i] cos[i] + x[i - d/2] sin[i]. */
INLINE void rotate(float *x, const float *cos, const float *sin, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* One layer's step between its QKV product and attention, per token t of qkv [T, (H + 2 Hkv) D]:
 * q_out [T, H, D] gets the rotated queries; the rotated keys and the values are written to
 * slot slots[t] of the caches [num_slots, Hkv, D] (float32). cos and sin are [T, D]. Each
 * element depends on its own token only. Returns -1, writing nothing, if a slot is outside the
 * caches. */
int saguaro_rope_cache(const float *qkv, int64_t t_count, int64_t heads, int64_t kv_heads,
                       int64_t d, const float *cos, const float *sin, const int64_t *slots,
                       int64_t num_slots, float *k_cache, float *v_cache, float *q_out) {
    const int64_t width = (heads + 2 * kv_heads) * d;
    for (int64_t t = 0; t < t_count; t++)
        if (slots[t] < 0 || slots[t] >= num_slots) return -1;
    for (int64_t t = 0; t < t_count; t++) {
        const float *row = qkv + t * width, *c = cos + t * d, *s = sin + t * d;
        float *q = q_out + t * heads * d;
        memcpy(q, row, heads * d * sizeof(float));
        for (int64_t h = 0; h < heads; h++) rotate(q + h * d, c, s, d);
        float *k = k_cache + slots[t] * kv_heads * d, *v = v_cache + slots[t] * kv_heads * d;
        memcpy(k, row + heads * d, kv_heads * d * sizeof(float));
        for (int64_t h = 0; h < kv_heads; h++) rotate(k + h * d, c, s, d);
        memcpy(v, row + (heads + kv_heads) * d, kv_heads * d * sizeof(float));
    }
    return 0;
}

INLINE v8 cache_row(const void *cache, int bf16, int64_t offset) {
    if (!bf16) return load8((const float *)cache + offset);
    v8h h;
    memcpy(&h, (const uint16_t *)cache + offset, sizeof h);
    v8u bits = __builtin_convertvector(h, v8u) << 16; /* bfloat16 -> float32 is exact */
    v8 v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The paged caches one attention call reads (see saguaro_attention). */
typedef struct {
    const void *k_cache, *v_cache;
    int64_t kv_heads, l;
} Keys;

/* Ask for head kv's row at `slot` of a cache KEYS_AHEAD keys before it is read: a long
 * context's keys and values come from memory, at slots the hardware cannot predict. */
enum { KEYS_AHEAD = 8 };
INLINE void prefetch_row(const Keys *keys, const void *cache, int64_t slot, int64_t kv,
                         const int64_t d, const int bf16) {
    const int64_t size = bf16 ? 2 : 4;
    const char *p = (const char *)cache + (slot * keys->kv_heads + kv) * d * size;
    for (int64_t o = 0; o < d * size; o += CACHE_LINE) __builtin_prefetch(p + o);
}

/* The scores of query heads [0, nh) of one key-value group (vectors q, q + d, ...; nh <=
 * PASS_HEADS) against the keys its mask row `visible` shows, at the slots `slots`: head h's
 * score of key j into score[h * l + j], its largest into top[h]. Each score is one 16-lane
 * chain over D (two halves), so the heads sharing a key row run side by side: independent
 * chains, the key row read once, and each head's bits those of its chain alone. */
enum { PASS_HEADS = 4 };
INLINE void group_scores(const float *q, int nh, const Keys *keys, const int64_t *slots,
                         const uint8_t *visible, int64_t kv, float scale, float *score,
                         float *top, const int64_t d, const int bf16) {
    const int64_t l = keys->l, kv_heads = keys->kv_heads;
    for (int h = 0; h < nh; h++) top[h] = -INFINITY;
    for (int64_t j = 0; j < l; j++) {
        if (!visible[j]) {
            for (int h = 0; h < nh; h++) score[h * l + j] = -INFINITY; /* read, never used */
            continue;
        }
        const int64_t row = (slots[j] * kv_heads + kv) * d;
        if (j + KEYS_AHEAD < l)
            prefetch_row(keys, keys->k_cache, slots[j + KEYS_AHEAD], kv, d, bf16);
        v8 lo[PASS_HEADS], hi[PASS_HEADS];
        for (int h = 0; h < nh; h++) lo[h] = hi[h] = (v8){0};
        for (int64_t i = 0; i < d; i += LANES) {
            const v8 klo = cache_row(keys->k_cache, bf16, row + i);
            const v8 khi = cache_row(keys->k_cache, bf16, row + i + HALF);
            for (int h = 0; h < nh; h++) {
                lo[h] = load8(q + h * d + i) * klo + lo[h];
                hi[h] = load8(q + h * d + i + HALF) * khi + hi[h];
            }
        }
        for (int h = 0; h < nh; h++) {
            score[h * l + j] = halves_sum(lo[h], hi[h]) * scale;
            top[h] = score[h * l + j] > top[h] ? score[h * l + j] : top[h];
        }
    }
}

/* One head's output from its scores (group_scores's row and largest): the softmax's
 * exponentials, their sum in key order, and the weighted sum of the values. With d and bf16
 * constants (the dispatch below) the value accumulators stay in registers and no branch on the
 * cache's type is left in the loops. */
INLINE void attend(const Keys *keys, const int64_t *slots, const uint8_t *visible, int64_t kv,
                   float top, float *score, float *o, const int64_t d, const int bf16) {
    const int64_t l = keys->l, kv_heads = keys->kv_heads;
    v8 acc[MAX_HEAD_DIM / HALF];
    for (int64_t i = 0; i < d / HALF; i++) acc[i] = (v8){0};
    float total = 0.0f;
    int64_t j0 = 0;
    for (; j0 + HALF <= l; j0 += HALF) store8(score + j0, exp8(load8(score + j0) - top));
    for (int64_t j = j0; j < l; j++) score[j] -= top;
    exp_tail(score + j0, l - j0);
    for (int64_t j = 0; j < l; j++)
        if (visible[j]) total += score[j];
    for (int64_t j = 0; j < l; j++) {
        if (!visible[j]) continue;
        const int64_t row = (slots[j] * kv_heads + kv) * d;
        if (j + KEYS_AHEAD < l)
            prefetch_row(keys, keys->v_cache, slots[j + KEYS_AHEAD], kv, d, bf16);
        for (int64_t i = 0; i < d / HALF; i++)
            acc[i] = cache_row(keys->v_cache, bf16, row + i * HALF) * score[j] + acc[i];
    }
    for (int64_t i = 0; i < d / HALF; i++) store8(o + i * HALF, acc[i] / total);
}

/* Query heads [h0, h0 + nh) of token t, one key-value group's (nh <= PASS_HEADS). */
INLINE void attend_heads(const float *q, int64_t h0, int nh, const Keys *keys,
                         const int64_t *slots, const uint8_t *visible, int64_t kv, float scale,
                         float *score, float *o, const int64_t d, const int bf16) {
    float top[PASS_HEADS];
#define SCORES(NH)                                                                          \
    group_scores(q + h0 * d, NH, keys, slots, visible, kv, scale, score, top, d, bf16)
    switch (nh) { /* a constant count: each head's chains in registers */
    case 1: SCORES(1); break;
    case 2: SCORES(2); break;
    case 3: SCORES(3); break;
    default: SCORES(4);
    }
#undef SCORES
    for (int h = 0; h < nh; h++)
        attend(keys, slots, visible, kv, top[h], score + h * keys->l, o + (h0 + h) * d, d, bf16);
}

/* Paged attention, one (query token, key-value head) pair per task: its group of query heads,
 * PASS_HEADS at a time. Token t is row rows[t] of the padded [b, Q] layout: it sees key j of its
 * sequence where mask[b, rows[t] % Q, j], the key and value living at slot key_slots[b, j] of
 * the caches [slots, Hkv, D] (float32 or bfloat16). The visible keys are taken in their order
 * in key_slots (position order), and the softmax's max, sum and weighted sum of values run over
 * them in that order. A score q.k is one 16-lane chain over D (two halves, as in the norm).
 * q [T, H, D] (rotated), out [T, H, D]; scratch holds `threads` x PASS_HEADS rows of L floats. */
void saguaro_attention(const float *q, int64_t t_count, int64_t heads, int64_t d,
                       const void *k_cache, const void *v_cache, int bf16, int64_t kv_heads,
                       const int64_t *key_slots, int64_t l, const uint8_t *mask, int64_t q_pad,
                       const int64_t *rows, float scale, float *out, float *scratch, int threads) {
    const int64_t group = heads / kv_heads;
    const Keys keys = {k_cache, v_cache, kv_heads, l};
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < t_count * kv_heads; task++) {
        const int64_t t = task / kv_heads, kv = task % kv_heads, b = rows[t] / q_pad;
        const uint8_t *visible = mask + rows[t] * l;
        const int64_t *slots = key_slots + b * l;
        float *score = scratch + (int64_t)omp_get_thread_num() * PASS_HEADS * l;
        const float *qv = q + t * heads * d;
        float *o = out + t * heads * d;
        for (int64_t h0 = kv * group; h0 < (kv + 1) * group; h0 += PASS_HEADS) {
            const int64_t left = (kv + 1) * group - h0;
            const int nh = (int)(left < PASS_HEADS ? left : PASS_HEADS);
#define ATTEND(D, BF16)                                                                     \
    attend_heads(qv, h0, nh, &keys, slots, visible, kv, scale, score, o, D, BF16)
            if (d == 64)
                bf16 ? ATTEND(64, 1) : ATTEND(64, 0);
            else if (d == 128)
                bf16 ? ATTEND(128, 1) : ATTEND(128, 0);
            else
                bf16 ? ATTEND(d, 1) : ATTEND(d, 0);
#undef ATTEND
        }
    }
}

/* A linear layer's weight as saguaro_linear takes it. */
typedef struct {
    const void *codes;
    const float *scales, *mins;
    int64_t n, k, group, fmt;
} LinearArg;

/* One decoder layer: its four products (the QKV product in up to three parts of different
 * formats, in q, k, v order, and its bias or NULL), its two norms' weights and its KV caches
 * (float32). */
enum { MAX_QKV_PARTS = 3 };
typedef struct {
    LinearArg qkv[MAX_QKV_PARTS];
    int64_t qkv_parts;
    const float *qkv_bias;
    LinearArg o, gate_up, down;
    const float *input_norm, *post_norm;
    float *k_cache, *v_cache;
} LayerArg;

/* What every layer of one forward shares: shapes, RoPE's angles and the attention metadata. */
typedef struct {
    int64_t t, hidden, heads, kv_heads, head_dim, inter, num_slots, keys, q_pad, threads;
    float eps, scale;
    const float *cos, *sin;
    const int64_t *slots, *key_slots, *rows;
    const uint8_t *mask;
} StepArg;

INLINE void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* GGUF's blocks as stored (quant_kernels.c); -1 without memory for the rounded activation. */
int saguaro_quant_linear(const float *x, int64_t m, int64_t k, const uint8_t *codes, int64_t n,
                         int fmt, float *out, int threads);
enum { FIRST_RAW_FMT = 4 };

/* Returns -1 without scratch memory (a raw format's rounded activation), else 0. */
INLINE int linear_arg(const float *x, int64_t m, const LinearArg *w, float *out, int threads) {
    if (w->fmt >= FIRST_RAW_FMT)
        return saguaro_quant_linear(x, m, w->k, w->codes, w->n, (int)w->fmt, out, threads);
    saguaro_linear(x, m, w->k, w->codes, w->scales, w->mins, w->n, w->group, (int)w->fmt, out,
                   threads);
    return 0;
}

/* out [t, width] = x @ [q | k | v]^T (+ bias): each part into scratch, then into its columns, as
 * the parts' modules and their concatenation compute it; the bias added after, in one rounding
 * per element. Returns -1 without scratch memory. */
INLINE int qkv_product(const float *x, int64_t t, const LayerArg *a, int64_t width, float *out,
                       float *scratch, int threads) {
    if (a->qkv_parts == 1) {
        if (linear_arg(x, t, &a->qkv[0], out, threads)) return -1;
    } else
        for (int64_t p = 0, col = 0; p < a->qkv_parts; col += a->qkv[p].n, p++) {
            const int64_t n = a->qkv[p].n;
            if (linear_arg(x, t, &a->qkv[p], scratch, threads)) return -1;
            for (int64_t r = 0; r < t; r++)
                memcpy(out + r * width + col, scratch + r * n, n * sizeof(float));
        }
    if (a->qkv_bias != NULL)
        for (int64_t r = 0; r < t; r++) add_into(out + r * width, a->qkv_bias, width);
    return 0;
}

/* The decoder layers of a Llama or Qwen2 model over the hidden states x [T, hidden], in place:
 * per layer (qkv with its bias, if any)
 *     x = x + o(attention(rope_cache(qkv(norm(x)))));  x = x + down(silu_mul(gate_up(norm(x))))
 * by the very kernels, in the very order, a forward calling them one by one takes, so the same
 * bits, without an interpreter between them. Returns -1, having changed nothing, if a slot is
 * outside the caches; -2 if scratch memory cannot be had. */
int saguaro_layers(const LayerArg *layers, int64_t n_layers, const StepArg *s, float *x) {
    const int64_t t = s->t, hd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    const int threads = (int)s->threads;
    for (int64_t i = 0; i < t; i++)
        if (s->slots[i] < 0 || s->slots[i] >= s->num_slots) return -1;
    const int64_t sizes[] = {t * s->hidden, t * (hd + 2 * kvd), t * hd, t * hd,
                             t * 2 * s->inter, t * s->inter,
                             threads * PASS_HEADS * (s->keys > 0 ? s->keys : 1)};
    enum { NORMED, QKV, Q, ATTN, GATE_UP, ACT, SCORES, BUFFERS };
    float *buf[BUFFERS];
    int failed = 0;
    for (int i = 0; i < BUFFERS; i++) failed |= (buf[i] = malloc(sizes[i] * sizeof(float))) == NULL;
    for (int64_t l = 0; l < n_layers && !failed; l++) {
        const LayerArg *a = &layers[l];
        saguaro_rms_norm(x, t, s->hidden, s->eps, a->input_norm, buf[NORMED]);
        /* The query buffer is free until RoPE writes it: the parts' scratch (q is the
         * widest part). */
        failed |= qkv_product(buf[NORMED], t, a, hd + 2 * kvd, buf[QKV], buf[Q], threads);
        if (failed) break;
        saguaro_rope_cache(buf[QKV], t, s->heads, s->kv_heads, s->head_dim, s->cos, s->sin,
                           s->slots, s->num_slots, a->k_cache, a->v_cache, buf[Q]);
        saguaro_attention(buf[Q], t, s->heads, s->head_dim, a->k_cache, a->v_cache, 0,
                          s->kv_heads, s->key_slots, s->keys, s->mask, s->q_pad, s->rows,
                          s->scale, buf[ATTN], buf[SCORES], threads);
        failed |= linear_arg(buf[ATTN], t, &a->o, buf[NORMED], threads);
        if (failed) break;
        add_into(x, buf[NORMED], t * s->hidden);
        saguaro_rms_norm(x, t, s->hidden, s->eps, a->post_norm, buf[NORMED]);
        failed |= linear_arg(buf[NORMED], t, &a->gate_up, buf[GATE_UP], threads);
        if (failed) break;
        saguaro_silu_mul(buf[GATE_UP], t, s->inter, buf[ACT]);
        failed |= linear_arg(buf[ACT], t, &a->down, buf[NORMED], threads);
        if (failed) break;
        add_into(x, buf[NORMED], t * s->hidden);
    }
    for (int i = 0; i < BUFFERS; i++) free(buf[i]);
    return failed ? -2 : 0;
}

/* Coupled sampling's perturbed argmax (saguaro.sampling.coupled), one row at a time:
 *     out[r] = the first v with z_v >= thr[r] maximising  (double)z_v + g_v,
 *     g_v = -log(-log u_v),  u_v = ((w_v >> 11) + 0.5) 2^-53,  w_v = mix(key[r] + v G),
 * the noise of saguaro.sampling.noise: key[r] = mix(mix(mix(s + G) + i G) + purpose G) for the
 * row's seed s and position i, mix SplitMix64's finaliser, in unsigned arithmetic that wraps as
 * torch's int64 does. A row's result depends on that row alone.
 *
 * Most tokens are ruled out without a logarithm. With r = 2^53 - (w_v >> 11) >= 1, so that
 * 1 - u = (r - 1/2) 2^-53 >= r 2^-54, and -log u >= 1 - u:
 *     g_v <= -log(1 - u) <= 54 ln 2 - ln r <= ln 2 (clz(r) - 9),
 * since floor(log2 r) = 63 - clz(r). A token whose z_v plus that bound stays below the best
 * value found so far (less a slack far above the rounding of either side) cannot win; before
 * hashing, the same holds with GUMBEL_MAX, the largest g any 53-bit u gives. The row's
 * largest z is scored first, so the best value starts near its final one. */
static const uint64_t NOISE_GOLDEN = 0x9E3779B97F4A7C15ull, NOISE_MIX1 = 0xBF58476D1CE4E5B9ull,
                      NOISE_MIX2 = 0x94D049BB133111EBull;
static const double NOISE_GUMBEL_MAX = 37.42994775023705, NOISE_SLACK = 0x1p-30,
                    NOISE_LN2 = 0.6931471805599453;

INLINE uint64_t noise_mix(uint64_t x) {
    x = (x ^ (x >> 30)) * NOISE_MIX1;
    x = (x ^ (x >> 27)) * NOISE_MIX2;
    return x ^ (x >> 31);
}

INLINE uint64_t noise_key(int64_t seed, int64_t position, int64_t purpose) {
    const uint64_t key = noise_mix((uint64_t)seed + NOISE_GOLDEN);
    return noise_mix(noise_mix(key + (uint64_t)position * NOISE_GOLDEN) +
                     (uint64_t)purpose * NOISE_GOLDEN);
}

/* out[i] = key(seed[i], position[i], purpose), then mix(out[i] + column[i] G) where columns are
 * given: saguaro.sampling.noise.hash_words, elementwise over n broadcast elements. */
void saguaro_hash_words(const int64_t *seed, const int64_t *position, const int64_t *column,
                        int64_t n, int64_t purpose, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const uint64_t key = noise_key(seed[i], position[i], purpose);
        out[i] = (int64_t)(column ? noise_mix(key + (uint64_t)column[i] * NOISE_GOLDEN) : key);
    }
}

INLINE double noise_value(float z, uint64_t bits53) {
    const double u = ((double)bits53 + 0.5) * 0x1p-53;
    return (double)z + -log(-log(u));
}

static int64_t gumbel_argmax_row(const float *z, int64_t vocab, float thr, uint64_t key) {
    int64_t best_v = -1;
    for (int64_t v = 0; v < vocab; v++)  /* the largest kept z, first among ties */
        if (z[v] >= thr && (best_v < 0 || z[v] > z[best_v])) best_v = v;
    if (best_v < 0) return 0;
    double best = noise_value(z[best_v], noise_mix(key + (uint64_t)best_v * NOISE_GOLDEN) >> 11);
    double bar = best - NOISE_SLACK * (1.0 + fabs(best));
    uint64_t column = key;  /* key + v G */
    for (int64_t v = 0; v < vocab; v++, column += NOISE_GOLDEN) {
        const float zv = z[v];
        if (!(zv >= thr) || (double)zv + NOISE_GUMBEL_MAX < bar) continue;
        const uint64_t bits = noise_mix(column) >> 11;
        const int lead = __builtin_clzll((1ull << 53) - bits);
        if ((double)zv + NOISE_LN2 * (lead - 9) < bar) continue;
        const double value = noise_value(zv, bits);
        if (value > best || (value == best && v < best_v)) {
            best = value;
            best_v = v;
            bar = best - NOISE_SLACK * (1.0 + fabs(best));
        }
    }
    return best_v;
}

/* z [rows, vocab] float32 (scaled logits), thr, seed and position [rows]; out [rows] int64. */
void saguaro_gumbel_argmax(const float *z, int64_t rows, int64_t vocab, const float *thr,
                           const int64_t *seed, const int64_t *position, int64_t purpose,
                           int64_t *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        out[r] = gumbel_argmax_row(z + r * vocab, vocab, thr[r], noise_key(seed[r], position[r],
                                                                            purpose));
}

/* Inverse-CDF draws from processed rows (saguaro.sampling.verify's final draw), one row at a
 * time: with w_v = expf(z_v) where z_v >= thr[r] (else 0) and C_v = w_0 + ... + w_v summed in
 * double, out[r] = the first v with C_v > x, x = min(u[r] C_V, the double below C_V); mass[r]
 * = C_V. The second pass adds the same terms in the same order as the first, so it reaches C_V
 * and stops within the row; a zero-weight token never stops it (its C equals the one before).
 * z is at most 0 (scaled logits less their maximum), so no weight overflows. */
static int64_t sample_row(const float *z, int64_t vocab, float thr, double u, double *mass) {
    double total = 0.0;
    for (int64_t v = 0; v < vocab; v++)
        if (z[v] >= thr) total += (double)expf(z[v]);
    *mass = total;
    double x = u * total;
    const double below = nextafter(total, 0.0);
    if (x > below) x = below;
    double c = 0.0;
    for (int64_t v = 0; v < vocab; v++)
        if (z[v] >= thr) {
            c += (double)expf(z[v]);
            if (c > x) return v;
        }
    return vocab - 1;
}

/* z [rows, vocab] float32, thr [rows] float32, u [rows] float64 in (0, 1); out [rows] int64,
 * mass [rows] float64. */
void saguaro_sample_rows(const float *z, int64_t rows, int64_t vocab, const float *thr,
                         const double *u, int64_t *out, double *mass, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        out[r] = sample_row(z + r * vocab, vocab, thr[r], u[r], mass + r);
}
