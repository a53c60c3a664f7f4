/* The tile unit's rate on this core: nanoseconds per tdpbssd (16 x 16 x 64 int8 products) with
 * every operand already in a tile, then in steps of four accumulators over four K = 64 chunks
 * (two position tiles times two weight tiles), loads and stores in the first-level cache. The
 * tile numbers are literals, as the intrinsics require. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 2000000, CHUNKS = 4, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static int8_t buf[8][1024] __attribute__((aligned(64)));

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 1;
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
    _tile_loadd(6, buf[6], 64);
    _tile_loadd(7, buf[7], 64);
    double start = seconds();
    for (long i = 0; i < ROUNDS; i++) {
        _tile_dpbssd(0, 6, 7);
        _tile_dpbssd(1, 6, 7);
        _tile_dpbssd(2, 6, 7);
        _tile_dpbssd(3, 6, 7);
    }
    _tile_stored(0, buf[0], 64);
    printf("tdpbssd, operands in tiles: %.2f ns\n", (seconds() - start) / (4.0 * ROUNDS) * 1e9);
    start = seconds();
    for (long i = 0; i < ROUNDS / CHUNKS; i++) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int ch = 0; ch < CHUNKS; ch++) {
            _tile_loadd(4, buf[4], 64);
            _tile_loadd(5, buf[5], 64);
            _tile_loadd(6, buf[6], 64);
            _tile_loadd(7, buf[7], 64);
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
        _tile_stored(0, buf[0], 64);
        _tile_stored(1, buf[1], 64);
        _tile_stored(2, buf[2], 64);
        _tile_stored(3, buf[3], 64);
    }
    printf("tdpbssd in steps with loads and stores: %.2f ns\n",
           (seconds() - start) / (4.0 * ROUNDS) * 1e9);
    _tile_release();
    return 0;
}
