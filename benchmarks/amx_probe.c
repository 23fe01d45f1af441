/* Probe: what Intel AMX (tile registers, `tdpbf16ps`) costs on this host, for the routed-expert dot.

    gcc -O2 -mamx-tile -mamx-bf16 benchmarks/amx_probe.c -o /tmp/amx_probe && /tmp/amx_probe

Linux hands a process the 8 KB of tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
XFEATURE_XTILEDATA); the probe asks, and says so if refused. Each figure is the best of 60 trials of 20,000
iterations, in ns per operation, for three tile shapes of the product C [M, 16] += A [M, 32 bf16] B [32, 16]:
M = 1 (one token row against 16 weight rows), 4 and 16, and for the other orientation, 16 weight rows of
one 32-weight block against one token column (B 16 x 1 pair, C 16 x 1):
- dp indep: four independent products into four C tiles (throughput); dp chain: two into one C (latency);
- loadB + dp: a fresh B tile (1 KB) loaded before each product, as a kernel decoding weights into memory
  would; zero + load + dp + store: the per-block form, a C tile per 32-weight block, stored for its scale.
Run it several times: on a shared VM the tile unit's figures moved 2-4x between runs (2026-12-01, nine runs: the
independent product 4-19 ns, the per-block chain 11-31 ns, against 21 ns for 512 weights through
`vdpbf16ps` at 5.2 ns per 128, docs/history/cpu-fast-path.md, "The sixth session"). */

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static uint16_t A[4 * 512] __attribute__((aligned(64)));
static uint16_t B[4 * 512] __attribute__((aligned(64)));
static float C[256] __attribute__((aligned(64)));
static tile_config config;  /* static: the compiler may drop stores to a stack copy that only ldtilecfg reads */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define BEST(label, per, body)                                              \
    do {                                                                    \
        double best = 1e9;                                                  \
        for (int trial = 0; trial < 60; trial++) {                          \
            double t0 = now();                                              \
            for (long i = 0; i < 20000; i++) { body; }                      \
            double ns = (now() - t0) / 20000 / (per) * 1e9;                 \
            if (ns < best) best = ns;                                       \
        }                                                                   \
        printf("  %-32s %6.2f ns\n", label, best);                          \
    } while (0)

/* tiles 0-3: C [c_rows, n_bytes]; 4-5: A [a_rows, 64 B]; 6-7: B [16, n_bytes] */
static void configure(int c_rows, int a_rows, int n_bytes) {
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 4; t++) { config.rows[t] = c_rows; config.colsb[t] = n_bytes; }
    for (int t = 4; t < 6; t++) { config.rows[t] = a_rows; config.colsb[t] = 64; }
    for (int t = 6; t < 8; t++) { config.rows[t] = 16; config.colsb[t] = n_bytes; }
    _tile_loadconfig(&config);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, A, 64); _tile_loadd(5, A, 64); _tile_loadd(6, B, n_bytes); _tile_loadd(7, B, n_bytes);
}

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        fprintf(stderr, "The kernel did not grant the AMX tile state (arch_prctl); nothing measured.\n");
        return 2;
    }
    for (int i = 0; i < 4 * 512; i++) A[i] = B[i] = 0x3f80;  /* bfloat16 1.0: no subnormal assists */
    int rows[3] = {1, 4, 16};
    for (int r = 0; r < 3; r++) {
        int m = rows[r];
        printf("A %d x 32 bf16, B 16 x 16 pairs, C %d x 16 fp32\n", m, m);
        configure(m, m, 64);
        BEST("dp indep (4 C tiles)", 4, {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 7); _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 5, 6); });
        BEST("dp chain (1 C tile)", 2, { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(0, 5, 7); });
        BEST("loadB + dp", 2, {
            _tile_loadd(6, B, 64); _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, B + 512, 64); _tile_dpbf16ps(1, 4, 7); });
        BEST("zero + loadB + dp + storeC", 1, {
            _tile_zero(0); _tile_loadd(6, B, 64); _tile_dpbf16ps(0, 4, 6); _tile_stored(0, C, 64); });
        BEST("loadA", 1, { _tile_loadd(4, A, 64); });
        BEST("storeC", 1, { _tile_stored(0, C, 64); });
    }
    printf("A 16 x 32 bf16 (16 weight rows, one block), B 16 x 1 pair (one token), C 16 x 1\n");
    configure(16, 16, 4);
    BEST("dp indep (4 C tiles)", 4, {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 7); _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 5, 6); });
    BEST("loadA + dp", 2, {
        _tile_loadd(4, A, 64); _tile_dpbf16ps(0, 4, 6); _tile_loadd(5, A + 512, 64); _tile_dpbf16ps(1, 5, 6); });
    BEST("zero + loadA + dp + storeC", 1, {
        _tile_zero(0); _tile_loadd(4, A, 64); _tile_dpbf16ps(0, 4, 6); _tile_stored(0, C, 4); });
    _tile_release();
    return 0;
}
