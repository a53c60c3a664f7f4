/* What quant_kernels.c and amx_kernels.c share: GGUF's block formats and their interleaved
 * layouts (quant_kernels.c's header describes them), the rounded activation rows, and the
 * entry of amx_kernels.c that quant_kernels.c calls. */
#ifndef SAGUARO_QUANT_KERNELS_H
#define SAGUARO_QUANT_KERNELS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define QINLINE static inline __attribute__((always_inline))

enum { FMT_Q4K = 4, FMT_Q5K = 5, FMT_Q6K = 6, FMT_Q50 = 7, FMT_Q51 = 8, FMT_Q80 = 9 };
enum { FMT_Q4K_X4 = 10, FMT_Q6K_X4 = 11, FMT_Q50_X4 = 12, FMT_Q80_X4 = 13 }; /* (below) */
enum { SUPER = 256, SMALL = 32, SUB = 16, QLANES = 8, TILE_ROWS = 8, COL_CHUNK = 16 };
enum { Q4K_BYTES = 144, Q5K_BYTES = 176, Q6K_BYTES = 210, Q50_BYTES = 22, Q51_BYTES = 24 };
enum { Q80_BYTES = 34 };
/* Q4_K interleaved: a strip of four rows' super-block sb is X4_BYTES, its headers first. */
enum { X4_ROWS = 4, K_HEAD = 16, X4_HEADS = X4_ROWS * K_HEAD, X4_BYTES = X4_ROWS * Q4K_BYTES };
enum { WORD = 8, PAIR_BYTES = 32, X4_PAIR = X4_ROWS * PAIR_BYTES };
/* Q6_K interleaved: the low nibbles' 16 words, the high bits' 8, the scales, the d's. */
enum { Q6K_LOW_WORDS = 16, Q6K_HIGH_WORDS = 8, Q6K_SCALES = 16 };
enum {
    Q6X4_BYTES = X4_ROWS * Q6K_BYTES,
    Q6X4_HIGH = X4_ROWS * WORD * Q6K_LOW_WORDS,
    Q6X4_SCALES = Q6X4_HIGH + X4_ROWS * WORD * Q6K_HIGH_WORDS,
    Q6X4_D = Q6X4_SCALES + X4_ROWS * Q6K_SCALES,
};
/* Q5_0 interleaved: a strip's block is the four d's, the four qh's, then the codes' two words. */
enum { Q5_D = 2, Q5_QH = 4, Q50X4_BYTES = X4_ROWS * Q50_BYTES };
enum { Q50X4_QH = X4_ROWS * Q5_D, Q50X4_CODES = Q50X4_QH + X4_ROWS * Q5_QH };
/* Q8_0 interleaved: a strip's block is the four d's (float16, as Q5_0's), then the codes' four
 * words, each of rows 0-3. */
enum { Q80X4_BYTES = X4_ROWS * Q80_BYTES, Q80X4_CODES = X4_ROWS * Q5_D };
/* A row's int8 codes [k], one scale per block [k / block], and the sums the formats'
 * corrections need: of each 16 codes (int16 [k / 16]) and of each 32 (int16 [k / 32]; |sum| <=
 * 32 * 127). */
typedef struct {
    const int8_t *p;
    const float *e;
    const int16_t *sum16;
    const int16_t *sum32;
} XRow;

/* out [m, n] = x @ W^T on AMX tiles where this build and the CPU have them and the format and
 * shape suit (amx_kernels.c): whether it did. The rows are rounded as for the other paths. */
int quant_amx_linear(const XRow *rows, int64_t m, int64_t k, const uint8_t *codes, int64_t n,
                     int fmt, float *out, int threads);

#endif
