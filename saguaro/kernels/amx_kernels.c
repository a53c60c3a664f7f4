/* Q4_K and Q6_K products on AMX tiles (Intel's tile registers and their int8 multiplier), for
 * calls with many activation rows: a prompt's prefill, a large batch's verification.
 *
 * The same integers and float steps as quant_kernels.c, so the same bits. For a weight row
 * and an activation row, per super-block of 256 weights (quant_kernels.c's header):
 *   Q4_K  I = sum_j s_j C_j and M = sum_j m_j P_j (j: the eight groups of 32),
 *         f = fmaf(d e, (float) I, f), c = fmaf(dmin e, (float) M, c), the result f - c;
 *   Q6_K  I = sum_j s_j C_j (j: the sixteen groups of 16), f = fmaf(d e, (float) I, f),
 * with C_j = sum_{i in j} q_i p_i the group's integer dot product (Q6_K's codes taken as
 * q - 32, so that its offset is inside C_j: the same I as sum_j s_j (sum q p - 32 P_j)).
 *
 * One tile instruction (tdpbssd) adds, for 16 activation rows (positions: the A tile, rows of
 * int8 codes) times 16 weight rows (the B tile: their bytes in dwords of 4, "VNNI" order), 64
 * products into each of 16 x 16 int32 sums. The scales differ per weight row and group, so a
 * weight tile is unpacked once per call with its scales folded in: each code times its group's
 * scale, split into two bytes (split_store), so that two tile products give a super-block's I
 * with one readout, not one per group. The readout, the minima (vpdpwssd) and the float steps
 * run on AVX-512, a position's 16 weight rows a register, lane by lane in super-block order,
 * while the tiles compute the next super-block (weight_tile). The activation's codes are packed
 * once per call in the order the tiles read them, 1 KB a tile, on cache lines.
 *
 * Linux hands out the tile registers to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM);
 * where it refuses, or the format or shape does not suit, quant_amx_linear returns 0 and the
 * other paths take the call.
 */
#include "quant_kernels.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__) &&                 \
    !defined(SAGUARO_GENERIC)
#include <omp.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* positions and weight rows a tile product takes, bytes of a tile row */
enum { TILE_M = 16, TILE_N = 16, TILE_BYTES = 64, DWORD = 4, PAIRS = 4, LINE = 64 };
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
/* The intrinsics take tile numbers as literals. */
#define TILE_A 4
#define TILE_B 6
#define TILE_B2 7
enum { Q4K_SPLIT = 5, Q6K_SPLIT = 6 };

/* ldtilecfg's 64 bytes (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* A weight tile (16 rows, all super-blocks) unpacked: the scaled codes' low and high bytes
 * (codes, high) [blocks][K / 64][16][16][4] (a super-block's four B tiles of 64 weights, each
 * dword 4 weights of one row), Q4_K's minima as int16 pairs (m_2l, m_2l+1) [blocks][4][16],
 * and d, dmin [blocks][16]. */
typedef struct {
    uint8_t *codes, *high;
    int32_t *minima;
    float *d, *dmin;
} Unpacked;

static int amx_permitted(void) {
    static int state; /* 0 unknown, 1 granted, -1 refused; first asked outside any thread team */
    if (state == 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
                                ? 1
                                : -1;
    return state == 1;
}

/* Tiles 0-3: two steps' A and B sums C [16 x 16 int32]; then 16 positions' codes of a K = 64
 * chunk, and the chunk's two weight parts. Once per thread and call: loading a configuration
 * costs about as much as a super-block's products. */
static void configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.colsb[t] = TILE_BYTES, c.rows[t] = TILE_M;
    c.colsb[TILE_A] = TILE_BYTES, c.rows[TILE_A] = TILE_M;
    c.colsb[TILE_B] = c.colsb[TILE_B2] = TILE_BYTES;
    c.rows[TILE_B] = c.rows[TILE_B2] = TILE_BYTES / DWORD;
    _tile_loadconfig(&c);
}

/* 32 bytes at off in each of the tile's four strips (strip_bytes apart), whose row j keeps its
 * 8 bytes at 8 j: dwords 0 of rows 0-15 in even, dwords 1 in odd. */
QINLINE void rows_dwords(const uint8_t *w, int64_t strip_bytes, int64_t off, __m512i *even,
                         __m512i *odd) {
    const uint8_t *a = w + off;
#define STRIP(s) _mm256_loadu_si256((const __m256i *)(a + (s) * strip_bytes))
    const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(STRIP(0)), STRIP(1), 1);
    const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(STRIP(2)), STRIP(3), 1);
#undef STRIP
    const __m512i pick = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    *even = _mm512_permutex2var_epi32(lo, pick, hi);
    *odd = _mm512_permutex2var_epi32(lo, _mm512_add_epi32(pick, _mm512_set1_epi32(1)), hi);
}

/* Bits [shift, shift + width) of every byte, moved to bit at. */
QINLINE __m512i byte_bits(__m512i v, int shift, int width, int at) {
    const __m512i mask = _mm512_set1_epi8((char)((1 << width) - 1));
    return _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(v, shift), mask), at);
}

/* The scales into the codes, split so that each part fits a byte: v = s_j q (Q4_K: 0..945;
 * Q6_K: s_j (q - 32), -4096..4064) as v = a + 2^SPLIT b with a = v mod 2^SPLIT and b = v >> SPLIT
 * (Q4_K: a <= 31, b <= 29; Q6_K: a <= 63, -64 <= b <= 63), in 16-bit lanes (even and odd bytes
 * apart). Then I = sum_i p_i v_i = A + 2^SPLIT B, A and B the tiles' sums of p a and p b over
 * the super-block: one readout per super-block instead of one per group. v: a B tile row's
 * codes (16 weight rows' dwords), sc: their rows' scales as int16 pairs (s, s). */
QINLINE void split_store(const Unpacked *u, int64_t at, __m512i v, __m512i sc, int q4) {
    const int split = q4 ? Q4K_SPLIT : Q6K_SPLIT;
    const __m512i low = _mm512_set1_epi16((1 << split) - 1), byte = _mm512_set1_epi16(0xFF);
    const __m512i even =
        q4 ? _mm512_and_si512(v, byte) : _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8);
    const __m512i odd = q4 ? _mm512_srli_epi16(v, 8) : _mm512_srai_epi16(v, 8);
    const __m512i pe = _mm512_mullo_epi16(even, sc), po = _mm512_mullo_epi16(odd, sc);
    const __m512i ae = _mm512_and_si512(pe, low), ao = _mm512_and_si512(po, low);
    const __m512i be = _mm512_and_si512(_mm512_srai_epi16(pe, split), byte);
    const __m512i bo = _mm512_srai_epi16(po, split);
    _mm512_storeu_si512(u->codes + at, _mm512_or_si512(ae, _mm512_slli_epi16(ao, 8)));
    _mm512_storeu_si512(u->high + at, _mm512_or_si512(be, _mm512_slli_epi16(bo, 8)));
}

/* int32 lanes (one a row) as int16 pairs (s, s), for split_store. */
QINLINE __m512i scale_pairs(__m512i s) {
    const __m512i low = _mm512_and_si512(s, _mm512_set1_epi32(0xFFFF));
    return _mm512_or_si512(low, _mm512_slli_epi32(s, 16));
}

/* Offsets of the tile's 16 rows' header bytes: strip r / 4, row r % 4 of it (row bytes apart). */
QINLINE __m512i row_offsets(int64_t strip_bytes, int row_bytes) {
    const __m512i r = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i strip = _mm512_srli_epi32(r, 2), row = _mm512_and_si512(r, _mm512_set1_epi32(3));
    return _mm512_add_epi32(_mm512_mullo_epi32(strip, _mm512_set1_epi32((int)strip_bytes)),
                            _mm512_mullo_epi32(row, _mm512_set1_epi32(row_bytes)));
}

/* Q4_K's headers of the tile's 16 rows at b (16 bytes a row: d, dmin, the 12 bytes of eight
 * 6-bit scales and minima; a strip's four rows together): the scales as pairs into sc, the
 * minima (m_2l, m_2l+1) and d, dmin into u. quant_kernels.c's scales_k4, four rows a register. */
static void heads_q4k(const uint8_t *b, int64_t strip_bytes, int64_t sb, const Unpacked *u,
                      __m512i sc[SUPER / SMALL]) {
    /* scales 0-7, minima 0-7 a row; a spare row for the last gathers' dwords */
    uint8_t sm[TILE_N + 1][K_HEAD] __attribute__((aligned(LINE)));
    const __m512i low6 = _mm512_set1_epi32(0x3f3f3f3f), low4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i low2 = _mm512_set1_epi32(0x03030303);
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
    __m512i head[X4_ROWS];
    for (int s = 0; s < X4_ROWS; s++) {
        head[s] = _mm512_loadu_si512(b + s * strip_bytes); /* dwords: dd, u0, u1, u2 a row */
        const __m512i x = _mm512_shuffle_epi32(head[s], (_MM_PERM_ENUM)0xED); /* u0 u2 u1 u2 */
        const __m512i y = _mm512_shuffle_epi32(head[s], (_MM_PERM_ENUM)0xA5); /* u0 u0 u1 u1 */
        const __m512i high = _mm512_or_si512(
            _mm512_and_si512(_mm512_srlv_epi32(x, shift), low4),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(y, 6), low2), 4));
        const __m512i odd_high = _mm512_mask_blend_epi32(0xAAAA, _mm512_and_si512(x, low6), high);
        _mm512_store_si512(sm[X4_ROWS * s], odd_high);
    }
    const __m512i at = row_offsets(X4_ROWS * K_HEAD, K_HEAD), byte = _mm512_set1_epi32(0xFF);
    for (int g = 0; g < SUPER / SMALL; g++)
        sc[g] = scale_pairs(
            _mm512_and_si512(_mm512_i32gather_epi32(at, (const void *)(&sm[0][g]), 1), byte));
    for (int l = 0; l < PAIRS; l++) {
        const __m512i m = _mm512_i32gather_epi32(at, (const void *)(&sm[0][8 + 2 * l]), 1);
        const __m512i second = _mm512_slli_epi32(_mm512_and_si512(m, _mm512_set1_epi32(0xFF00)), 8);
        _mm512_storeu_si512(u->minima + (sb * PAIRS + l) * TILE_N,
                            _mm512_or_si512(_mm512_and_si512(m, byte), second));
    }
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i dd = _mm512_inserti64x4(
        _mm512_permutex2var_epi32(head[0], first, head[1]),
        _mm512_castsi512_si256(_mm512_permutex2var_epi32(head[2], first, head[3])), 1);
    _mm512_storeu_ps(u->d + sb * TILE_N, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_storeu_ps(u->dmin + sb * TILE_N,
                     _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
}

/* Super-block sb of an interleaved Q4_K tile (four strips from w): the codes of group 2i are
 * the low nibbles of pair i's bytes, 2i + 1's the high ones; word c of a pair holds dwords 2c
 * and 2c + 1 of each of its groups. */
static void unpack_q4k(const uint8_t *w, int64_t strip_bytes, int64_t sb, Unpacked *u) {
    const uint8_t *b = w + sb * X4_BYTES;
    const int kks = SMALL / DWORD;
    __m512i sc[SUPER / SMALL];
    heads_q4k(b, strip_bytes, sb, u, sc);
    for (int i = 0; i < SUPER / (2 * SMALL); i++)
        for (int c = 0; c < PAIR_BYTES / WORD; c++) {
            __m512i v[2];
            rows_dwords(b, strip_bytes, X4_HEADS + X4_PAIR * i + PAIR_BYTES * c, &v[0], &v[1]);
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) {
                    const int g = 2 * i + half;
                    split_store(u, ((sb * (SUPER / SMALL) + g) * kks + 2 * c + h) * TILE_BYTES,
                                byte_bits(v[h], 4 * half, 4, 0), sc[g], 1);
                }
        }
}

/* Q6_K's int8 scales (sixteen a row: 0-7 of a strip's four rows, then 8-15) of the tile's 16
 * rows as pairs into sc, and their d into u. */
static void heads_q6k(const uint8_t *b, int64_t strip_bytes, int64_t sb, const Unpacked *u,
                      __m512i sc[SUPER / SUB]) {
    const int half = Q6K_SCALES / 2;
    const __m512i rows = row_offsets(strip_bytes, half);
    for (int g = 0; g < Q6K_SCALES; g++) {
        const uint8_t *at = b + Q6X4_SCALES + X4_ROWS * half * (g / half) + g % half;
        const __m512i v = _mm512_i32gather_epi32(rows, (const void *)at, 1);
        sc[g] = scale_pairs(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
    }
    /* each row's d in its dword's high half: the dwords end inside the strip's block */
    const __m512i d =
        _mm512_i32gather_epi32(row_offsets(strip_bytes, 2), (const void *)(b + Q6X4_D - 2), 1);
    _mm512_storeu_ps(u->d + sb * TILE_N,
                     _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16))));
}

/* Super-block sb of an interleaved Q6_K tile: weights 128 h + 32 t + l have their low nibble in
 * byte 64 h + 32 (t & 1) + l of the low part (the high one where t >= 2) and their top bits at
 * 2 t of byte 32 h + l of the high part; a code goes in as q - 32. */
static void unpack_q6k(const uint8_t *w, int64_t strip_bytes, int64_t sb, Unpacked *u) {
    const uint8_t *b = w + sb * Q6X4_BYTES;
    const int kks = SUB / DWORD, words = PAIR_BYTES / WORD;
    __m512i sc[SUPER / SUB];
    heads_q6k(b, strip_bytes, sb, u, sc);
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int c = 0; c < words; c++) {
                __m512i low[2], high[2];
                const int lw = 8 * h + words * (t & 1) + c, hw = words * h + c;
                rows_dwords(b, strip_bytes, X4_PAIR / words * lw, &low[0], &low[1]);
                rows_dwords(b, strip_bytes, Q6X4_HIGH + X4_PAIR / words * hw, &high[0], &high[1]);
                for (int o = 0; o < 2; o++) {
                    const __m512i q = _mm512_or_si512(byte_bits(low[o], 4 * (t >> 1), 4, 0),
                                                      byte_bits(high[o], 2 * t, 2, 4));
                    const int dw = 2 * c + o; /* dword of the 32 weights 128 h + 32 t + ... */
                    const int g = 2 * (4 * h + t) + dw / kks;
                    split_store(u, ((sb * (SUPER / SUB) + g) * kks + dw % kks) * TILE_BYTES,
                                _mm512_sub_epi8(q, _mm512_set1_epi8(32)), sc[g], 0);
                }
            }
}

/* Super-block sb's products for 16 positions p (their packed codes: four K = 64 chunks of
 * 16 rows) into the tiles CA and CB, then stored to c. The tile numbers are literals. */
#define SUPER_BLOCK_TILES(CA, CB)                                                              \
    do {                                                                                       \
        _tile_zero(CA);                                                                        \
        _tile_zero(CB);                                                                        \
        for (int ch = 0; ch < SUPER / TILE_BYTES; ch++) {                                      \
            _tile_loadd(TILE_A, p + ch * TILE_BYTES * TILE_M, TILE_BYTES);                     \
            _tile_loadd(TILE_B, a + ch * TILE_BYTES * TILE_N, TILE_BYTES);                     \
            _tile_loadd(TILE_B2, b + ch * TILE_BYTES * TILE_N, TILE_BYTES);                    \
            _tile_dpbssd(CA, TILE_A, TILE_B);                                                  \
            _tile_dpbssd(CB, TILE_A, TILE_B2);                                                 \
        }                                                                                      \
        _tile_stored(CA, c[0], TILE_BYTES);                                                    \
        _tile_stored(CB, c[1], TILE_BYTES);                                                    \
    } while (0)

/* Super-block sb's A and B sums into c, on tiles 0-1 or 2-3 by the step's parity: the tile
 * unit works on one step while the vector units fold the one before. */
static void super_block_tiles(const int8_t *p, int64_t sb, int odd, const Unpacked *u,
                              int32_t c[2][TILE_M][TILE_N]) {
    const uint8_t *a = u->codes + sb * SUPER * TILE_N, *b = u->high + sb * SUPER * TILE_N;
    if (odd) SUPER_BLOCK_TILES(2, 3);
    else SUPER_BLOCK_TILES(0, 1);
}

/* Super-block sb's sums c folded into positions' chains f (and Q4_K's c_min), in lanes: the
 * tile's 16 weight rows. */
static void fold_super_block(const XRow *x, int64_t sb, int m, int q4, const Unpacked *u,
                             int32_t c[2][TILE_M][TILE_N], __m512 *f, __m512 *c_min) {
    const int split = q4 ? Q4K_SPLIT : Q6K_SPLIT;
    const __m512 d = _mm512_loadu_ps(u->d + sb * TILE_N);
    for (int r = 0; r < m; r++) {
        const __m512i acc = _mm512_add_epi32(
            _mm512_loadu_si512(c[0][r]), _mm512_slli_epi32(_mm512_loadu_si512(c[1][r]), split));
        const __m512 e = _mm512_set1_ps(x[r].e[sb]);
        f[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, e), _mm512_cvtepi32_ps(acc), f[r]);
    }
    if (!q4) return;
    const __m512 dmin = _mm512_loadu_ps(u->dmin + sb * TILE_N);
    __m512i minima[PAIRS];
    for (int l = 0; l < PAIRS; l++)
        minima[l] = _mm512_loadu_si512(u->minima + (sb * PAIRS + l) * TILE_N);
    for (int r = 0; r < m; r++) {
        __m512i mins = _mm512_setzero_si512();
        for (int l = 0; l < PAIRS; l++) {
            int32_t pair;
            memcpy(&pair, x[r].sum32 + sb * (SUPER / SMALL) + 2 * l, sizeof pair);
            mins = _mm512_dpwssd_epi32(mins, minima[l], _mm512_set1_epi32(pair));
        }
        const __m512 e = _mm512_set1_ps(x[r].e[sb]);
        c_min[r] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, e), _mm512_cvtepi32_ps(mins), c_min[r]);
    }
}

/* A position's 16 results. Past the caches where out's lines allow it: each goes to a row of
 * its own, so a cached store would first read a line that the whole output (megabytes at a
 * prompt's length) has long pushed out of the caches. */
QINLINE void store_row(float *to, __m512 v) {
    if (((uintptr_t)to & (LINE - 1)) == 0) _mm512_stream_ps(to, v);
    else _mm512_storeu_ps(to, v);
}

/* out [m, n] for the tile's 16 columns: for each 16 positions, the super-blocks' sums folded
 * in order. The steps (16 positions, one super-block) run as a pipeline: a step's products go
 * to the tiles before the step before it is folded. */
static void weight_tile(const XRow *x, const int8_t *packed, int64_t m, int64_t blocks, int fmt,
                        const Unpacked *u, float *out, int64_t n) {
    const int q4 = fmt == FMT_Q4K;
    const int64_t steps = (m + TILE_M - 1) / TILE_M * blocks;
    __m512 f[TILE_M], c_min[TILE_M];
    int32_t c[2][2][TILE_M][TILE_N] __attribute__((aligned(LINE)));
    super_block_tiles(packed, 0, 0, u, c[0]);
    for (int64_t step = 0; step < steps; step++) {
        const int64_t r0 = step / blocks * TILE_M, sb = step % blocks, next = step + 1;
        const int mt = (int)(m - r0 < TILE_M ? m - r0 : TILE_M);
        if (next < steps)
            super_block_tiles(packed + next * SUPER * TILE_M, next % blocks, (int)(next % 2), u,
                              c[next % 2]);
        if (sb == 0)
            for (int r = 0; r < mt; r++) f[r] = c_min[r] = _mm512_setzero_ps();
        fold_super_block(x + r0, sb, mt, q4, u, c[step % 2], f, c_min);
        if (sb == blocks - 1)
            for (int r = 0; r < mt; r++)
                store_row(out + (r0 + r) * n, _mm512_sub_ps(f[r], c_min[r]));
    }
}

/* Memory whose tile rows start on cache lines: a 64-byte row across two lines costs two. */
static void *lines(size_t bytes) { return aligned_alloc(LINE, (bytes + LINE - 1) / LINE * LINE); }

/* One thread's unpacked weight tile, in one allocation (NULL without memory). */
static uint8_t *tile_buffer(int64_t blocks, Unpacked *u) {
    const size_t codes = (size_t)blocks * SUPER * TILE_N, lanes = (size_t)blocks * TILE_N;
    uint8_t *buf = lines(2 * codes + sizeof(int32_t) * lanes * (PAIRS + 2));
    if (buf == NULL) return NULL;
    u->codes = buf;
    u->high = buf + codes;
    u->minima = (int32_t *)(buf + 2 * codes);
    u->d = (float *)(u->minima + lanes * PAIRS);
    u->dmin = u->d + lanes;
    return buf;
}

/* The rows' codes as the A tiles read them, each tile's 1 KB in one piece, in the order the
 * steps take them: [m / 16][k / 64][16 rows][64] (rows past m zero). NULL without memory. */
static int8_t *pack_rows(const XRow *rows, int64_t m, int64_t k) {
    const int64_t tiles = (m + TILE_M - 1) / TILE_M, chunks = k / TILE_BYTES;
    int8_t *packed = lines((size_t)(tiles * TILE_M * k));
    if (packed == NULL) return NULL;
    for (int64_t t = 0; t < tiles; t++)
        for (int r = 0; r < TILE_M; r++)
            for (int64_t ch = 0; ch < chunks; ch++) {
                int8_t *to = packed + ((t * chunks + ch) * TILE_M + r) * TILE_BYTES;
                const int64_t row = t * TILE_M + r;
                if (row < m) memcpy(to, rows[row].p + ch * TILE_BYTES, TILE_BYTES);
                else memset(to, 0, TILE_BYTES);
            }
    return packed;
}

int quant_amx_linear(const XRow *rows, int64_t m, int64_t k, const uint8_t *codes, int64_t n,
                     int fmt, float *out, int threads) {
    if ((fmt != FMT_Q4K_X4 && fmt != FMT_Q6K_X4) || n % TILE_N || k % SUPER || m < 1 ||
        !amx_permitted())
        return 0;
    const int kind = fmt == FMT_Q4K_X4 ? FMT_Q4K : FMT_Q6K; /* the file's format */
    const int64_t blocks = k / SUPER;
    const int64_t strip_bytes = blocks * (kind == FMT_Q4K ? X4_BYTES : Q6X4_BYTES);
    uint8_t *bufs[threads];
    Unpacked us[threads];
    int8_t *packed = pack_rows(rows, m, k);
    int ok = packed != NULL;
    for (int t = 0; t < threads; t++) ok &= (bufs[t] = tile_buffer(blocks, &us[t])) != NULL;
    if (!ok) {
        for (int t = 0; t < threads; t++) free(bufs[t]);
        free(packed);
        return 0;
    }
#pragma omp parallel num_threads(threads)
    {
        Unpacked *u = &us[omp_get_thread_num()];
        configure();
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < n; n0 += TILE_N) {
            const uint8_t *w = codes + n0 / X4_ROWS * strip_bytes;
            for (int64_t sb = 0; sb < blocks; sb++)
                (kind == FMT_Q4K ? unpack_q4k : unpack_q6k)(w, strip_bytes, sb, u);
            weight_tile(rows, packed, m, blocks, kind, u, out + n0, n);
        }
        _tile_release();
    }
    _mm_sfence(); /* the streamed results, before anyone reads them */
    for (int t = 0; t < threads; t++) free(bufs[t]);
    free(packed);
    return 1;
}

#else
int quant_amx_linear(const XRow *rows, int64_t m, int64_t k, const uint8_t *codes, int64_t n,
                     int fmt, float *out, int threads) {
    (void)rows, (void)m, (void)k, (void)codes, (void)n, (void)fmt, (void)out, (void)threads;
    return 0;
}
#endif
