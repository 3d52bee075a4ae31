/* Small-row matrix products on the weight as the model holds it: y[M, N] = x[M, K] W[N, K]^T (+ bias).
 *
 * Decoding is memory-bound: a forward over a few dozen tokens should cost what reading the weights once costs.
 * The weight is read in place (nn.Linear's row-major [out, in] layout, float32 or bfloat16): no packed copy, so
 * the kernels add no memory. What makes that fast is the order of the reads:
 *
 *  - up to SMALL_M rows of x: one weight row at a time, every row of x against it (a row of x per accumulator
 *    set), so the whole weight is one sequential stream through memory, every cache line of it prefetched
 *    PF_AHEAD elements ahead; past STREAM_ANY_K rows only while those rows of x fit a core's L1 data cache
 *    (STREAM_X_BYTES): each weight row reads every row of x again, and from L2 that costs more than the
 *    x-transposed path's padded tile;
 *  - 13-24 rows on AVX-512 (32 vector registers): register blocks of 4 rows of x by 6 weight rows, K along the
 *    lanes, in chunks of BLOCK_KC so a group's chunk and x's stay in L1: 10 loads for 24 FMAs;
 *  - more rows: x is transposed once into a small per-thread buffer (tiles of XT_TILE rows, K x XT_TILE floats
 *    each: a copy of x, not of W), and every weight element, read in place, is broadcast against the two vectors
 *    of a tile: 2 x 6 accumulators, the outer-product tile of a packed GEMM without packing W. Groups of XT_GROUP
 *    weight rows go in chunks of XT_KC along K, so a group's chunk stays in cache while every tile passes over
 *    it; up to XT_LEFT_ROWS rows past the last full tile go through the dot-product path on the same group;
 *    bfloat16 groups are widened to float32 (in a per-thread buffer) first.
 *
 * bfloat16 x against bfloat16 weights on a CPU with AMX (and a compiler for it) go through AMX's tiles instead
 * (hfs_direct_bf16_amx): the weight is the tile A in place, x's pairs a small transposed buffer.
 *
 * Every product accumulates in float32 (bfloat16 weights are widened exactly); x arrives in float32 (bfloat16 on
 * the AMX path). Threads (OpenMP, the runtime torch itself loads) split the weight rows. Portable C with GCC/Clang
 * vector extensions (an AVX transpose where the CPU has AVX; AVX-512 and AMX intrinsics where it has them),
 * compiled with -march=native on the machine that runs it.
 */
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
#define SMALL_M 12  /* up to this many rows of x: the sequential one-weight-row-at-a-time path */
#define STREAM_ANY_K 8 /* up to this many rows the sequential path whatever K; from here on only while x fits: */
#define STREAM_X_BYTES (32 * 1024) /* rows x K of float32 the sequential path may hold (a core's L1 data cache) */
#define ABI_VERSION 2
#define PF_AHEAD 1024 /* elements of a weight row prefetched ahead on the sequential path */

typedef float vf __attribute__((vector_size(VW * 4)));
typedef uint16_t vh __attribute__((vector_size(VW * 2)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));

int hfs_direct_abi_version(void) { return ABI_VERSION; }
int hfs_direct_vector_width(void) { return VW; }

static inline vf load_f32(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vf load_bf16(const uint16_t *p) { /* bfloat16 -> float32 is exact: the 16 bits move up */
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    return (vf)u;
}
static inline float one_f32(float v) { return v; }
static inline float one_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float hsum(vf v) {
    float s = 0;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}
/* the sum of v's lanes by a tree of shuffles (independent sums overlap; hsum's chain of scalar adds does not) */
static inline float hsum_tree(vf v) {
#if defined(__AVX512F__) && VW == 16
    __m512 m;
    memcpy(&m, &v, sizeof m);
    return _mm512_reduce_add_ps(m);
#else
    return hsum(v);
#endif
}

/* Rows [0, R) of x (row stride K) against weight rows [0, nr): out[i * ldo + j]. U accumulators per row of x. */
#define DEFINE_STREAM(NAME, WT, R, U)                                                                     \
    static void NAME##_stream##R(const float *x, int64_t K, const WT *W, int64_t nr, float *out, int64_t ldo) { \
        for (int64_t j = 0; j < nr; j++) {                                                                \
            const WT *w = W + j * K;                                                                      \
            vf acc[R][U];                                                                                 \
            for (int i = 0; i < R; i++)                                                                   \
                for (int u = 0; u < U; u++) acc[i][u] = (vf){0};                                          \
            int64_t k = 0;                                                                                \
            for (; k + U * VW <= K; k += U * VW) {                                                        \
                __builtin_prefetch(w + k + PF_AHEAD);                                                     \
                for (int q = 64; q < U * VW * (int)sizeof(WT); q += 64)                                   \
                    __builtin_prefetch(w + k + PF_AHEAD + q / sizeof(WT));                                \
                for (int u = 0; u < U; u++) {                                                             \
                    vf wv = load_##NAME(w + k + u * VW);                                                  \
                    for (int i = 0; i < R; i++) acc[i][u] += load_f32(x + i * K + k + u * VW) * wv;       \
                }                                                                                         \
            }                                                                                             \
            for (; k + VW <= K; k += VW) {                                                                \
                vf wv = load_##NAME(w + k);                                                               \
                for (int i = 0; i < R; i++) acc[i][0] += load_f32(x + i * K + k) * wv;                    \
            }                                                                                             \
            for (int i = 0; i < R; i++) {                                                                 \
                for (int u = 1; u < U; u++) acc[i][0] += acc[i][u];                                       \
                float s = hsum(acc[i][0]);                                                                \
                for (int64_t t = k; t < K; t++) s += x[i * K + t] * one_##NAME(w[t]);                     \
                out[i * ldo + j] = s;                                                                     \
            }                                                                                             \
        }                                                                                                 \
    }


/* ---- the register-blocked path (AVX-512: 32 vector registers) ---- */
#define BLOCK_NR 6 /* weight rows per block: 6 weight vectors, 4 x 6 accumulators and a row of x fit 32 registers */
#define BLOCK_MR 4 /* rows of x per block */
#define BLOCK_KC 256 /* K per chunk: a group's chunk and x's chunk stay in L1 */
#define BLOCK_PF 256 /* elements of a weight row the first block prefetches ahead */
#define BLOCK_MIN_ROWS 13 /* the register-blocked path runs BLOCK_MIN_ROWS..BLOCK_ROWS rows (measured on an AVX-512 */
#define BLOCK_ROWS 24     /* Xeon: past 24 rows the x-transposed tiles are as fast, at 28-32 faster) */

/* rows [0, MR) of x (row stride K) against BLOCK_NR float32 weight rows w[j], over k in [k0, k1) (whole vectors):
 * K along the lanes, every weight vector loaded once for MR rows of x and every row of x once for BLOCK_NR weight
 * rows, so a step of VW k's makes MR x BLOCK_NR FMAs from MR + BLOCK_NR loads; the partial sums acc_io[i][j] carry
 * over from chunk to chunk */
#define DEFINE_BLOCK(MR)                                                                                  \
    static void f32_block##MR(const float *x, int64_t K, const float *const *w, int64_t k0, int64_t k1,   \
                              vf (*acc_io)[BLOCK_NR], int64_t pf) {                                       \
        vf acc[MR][BLOCK_NR];                                                                             \
        for (int i = 0; i < MR; i++)                                                                      \
            for (int j = 0; j < BLOCK_NR; j++) acc[i][j] = acc_io[i][j];                                  \
        for (int64_t k = k0; k < k1; k += VW) {                                                           \
            vf wv[BLOCK_NR];                                                                              \
            for (int j = 0; j < BLOCK_NR; j++) wv[j] = load_f32(w[j] + k);                                \
            if (pf)                                                                                       \
                for (int j = 0; j < BLOCK_NR; j++) __builtin_prefetch(w[j] + k + pf);                     \
            for (int i = 0; i < MR; i++) {                                                                \
                vf xv = load_f32(x + i * K + k);                                                          \
                for (int j = 0; j < BLOCK_NR; j++) acc[i][j] += xv * wv[j];                               \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < MR; i++)                                                                      \
            for (int j = 0; j < BLOCK_NR; j++) acc_io[i][j] = acc[i][j];                                  \
    }
DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)

/* every row of x (M <= BLOCK_ROWS) against gn <= BLOCK_NR float32 weight rows Wg (row stride K): y[m, j]. K goes in
 * chunks of BLOCK_KC, BLOCK_MR rows of x at a time within a chunk, so the group's chunk is read from memory by the
 * first block and from L1 by the others, and the chunk of x stays in L1 too */
static void f32_blocks(const float *x, int64_t M, int64_t K, const float *Wg, int gn, float *y, int64_t ldy) {
    vf acc[BLOCK_ROWS][BLOCK_NR];
    const float *w[BLOCK_NR];
    for (int j = 0; j < BLOCK_NR; j++) w[j] = Wg + (j < gn ? j : 0) * K;
    for (int64_t i = 0; i < M; i++)
        for (int j = 0; j < BLOCK_NR; j++) acc[i][j] = (vf){0};
    int64_t kv = K / VW * VW;
    for (int64_t k0 = 0; k0 < kv; k0 += BLOCK_KC) {
        int64_t k1 = k0 + BLOCK_KC < kv ? k0 + BLOCK_KC : kv;
        for (int64_t m = 0; m < M; m += BLOCK_MR) {
            const float *xm = x + m * K;
            switch (M - m < BLOCK_MR ? M - m : BLOCK_MR) {
            case 1: f32_block1(xm, K, w, k0, k1, acc + m, m ? 0 : BLOCK_PF); break;
            case 2: f32_block2(xm, K, w, k0, k1, acc + m, m ? 0 : BLOCK_PF); break;
            case 3: f32_block3(xm, K, w, k0, k1, acc + m, m ? 0 : BLOCK_PF); break;
            default: f32_block4(xm, K, w, k0, k1, acc + m, m ? 0 : BLOCK_PF); break;
            }
        }
    }
    for (int64_t i = 0; i < M; i++)
        for (int j = 0; j < gn; j++) {
            float s = hsum_tree(acc[i][j]);
            for (int64_t t = kv; t < K; t++) s += x[i * K + t] * w[j][t];
            y[i * ldy + j] = s;
        }
}

static float *scratch(int slot, size_t n);

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
/* ---- AMX: bfloat16 x against bfloat16 weights read in place ----
 * TDPBF16PS multiplies a tile A (16 rows of 32 bfloat16) by a tile B (16 pairs of rows: 16 columns of bfloat16
 * pairs) into a 16 x 16 float32 tile C: C[m][n] += A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1]. A is the weight as
 * the model holds it (16 weight rows, 32 of K, row stride 2K bytes), so nothing is copied; B is x's pairs
 * transposed (x[n][2k], x[n][2k+1] at B[k][n]), a small per-call buffer; C[m][n] is y[n][m]. Up to 32 rows of x:
 * two weight tiles and up to two x tiles per step; 33-64 rows: one weight tile and up to four x tiles (a 32-node
 * tree's 33 rows read the weights once). */
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_XROWS 64 /* rows of x per pass (four B tiles) */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* whether this process may use AMX's tile data (Linux asks each process to request it once) */
static int amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return permitted;
}

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void amx_configure(void) {
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { /* 0-3: C, 4-5: A (weight), 6-7: B (x pairs); see amx_block2 / amx_block1 */
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* rows [0, M) of bfloat16 x (M <= AMX_XROWS, row stride K) into pairs xp[k][n] (uint32: x[n][2k], x[n][2k+1];
 * nb * 16 columns, zero past M) */
static void amx_pack(const uint16_t *x, int64_t M, int64_t K, int nb, uint32_t *xp) {
    for (int64_t k = 0; k < K / 2; k++)
        for (int64_t n = 0; n < nb * 16; n++) {
            uint32_t v = 0;
            if (n < M) memcpy(&v, x + n * K + 2 * k, 4);
            xp[k * nb * 16 + n] = v;
        }
}

/* y[n, n0 + 16 WB + m] for the weight tile WB and x tile XB (x rows n < M): the C tile T through a buffer */
#define AMX_STORE(T, WB, XB)                                                                              \
    do {                                                                                                  \
        _tile_stored(T, cbuf, 64);                                                                        \
        for (int64_t n = (XB) * 16; n < M && n < (XB) * 16 + 16; n++)                                     \
            for (int m = 0; m < 16; m++) y[n * N + n0 + (WB) * 16 + m] = cbuf[m][n - (XB) * 16];           \
    } while (0)

/* the weight rows [n0, n0 + 32) against up to two x tiles (nb <= 2): two weight tiles a step (C: tiles 0-3, A: 4
 * and 5, B: 6 and 7) */
static inline void amx_block2(const uint32_t *xp, int nb, int64_t M, int64_t K, const uint16_t *W, int64_t N,
                              int64_t n0, float *y, float (*cbuf)[16]) {
    const uint16_t *w0 = W + n0 * K, *w1 = w0 + 16 * K;
    for (int64_t k = 0; k < K; k += 32) {
        for (int r = 0; r < 16; r++) {
            __builtin_prefetch(w0 + r * K + k + 256);
            __builtin_prefetch(w1 + r * K + k + 256);
        }
        _tile_loadd(4, w0 + k, 2 * K);
        _tile_loadd(5, w1 + k, 2 * K);
        _tile_loadd(6, xp + (k / 2) * nb * 16, nb * 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (nb == 2) {
            _tile_loadd(7, xp + (k / 2) * nb * 16 + 16, nb * 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    AMX_STORE(0, 0, 0);
    AMX_STORE(2, 1, 0);
    if (nb == 2) {
        AMX_STORE(1, 0, 1);
        AMX_STORE(3, 1, 1);
    }
}

/* the weight rows [n0, n0 + 16) against three or four x tiles: one weight tile a step (C: tiles 0-3, A: 4, B: 6 and
 * 7 in turn) */
static inline void amx_block1(const uint32_t *xp, int nb, int64_t M, int64_t K, const uint16_t *W, int64_t N,
                              int64_t n0, float *y, float (*cbuf)[16]) {
    const uint16_t *w0 = W + n0 * K;
    for (int64_t k = 0; k < K; k += 32) {
        const uint32_t *xk = xp + (k / 2) * nb * 16;
        for (int r = 0; r < 16; r++) __builtin_prefetch(w0 + r * K + k + 256);
        _tile_loadd(4, w0 + k, 2 * K);
        _tile_loadd(6, xk, nb * 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, xk + 16, nb * 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(6, xk + 32, nb * 64);
        _tile_dpbf16ps(2, 4, 6);
        if (nb == 4) {
            _tile_loadd(7, xk + 48, nb * 64);
            _tile_dpbf16ps(3, 4, 7);
        }
    }
    AMX_STORE(0, 0, 0);
    AMX_STORE(1, 0, 1);
    AMX_STORE(2, 0, 2);
    if (nb == 4) AMX_STORE(3, 0, 3);
}

/* y[M, N] = x W^T for bfloat16 x and W (N and K multiples of 32, M <= AMX_XROWS); xp: x's pairs (amx_pack). Up to 32
 * rows of x: blocks of 32 weight rows; more: blocks of 16, so the weights are read once either way */
static void amx_pass(const uint32_t *xp, int64_t M, int64_t K, const uint16_t *W, int64_t N, float *y, int threads) {
    int nb = (int)((M + 15) / 16), width = nb > 2 ? 16 : 32;
    int64_t blocks = N / width;
    _Pragma("omp parallel num_threads(threads)") {
        float cbuf[16][16] __attribute__((aligned(64)));
        amx_configure();
        _Pragma("omp for schedule(static)") for (int64_t b = 0; b < blocks; b++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            if (nb > 2)
                amx_block1(xp, nb, M, K, W, N, b * width, y, cbuf);
            else
                amx_block2(xp, nb, M, K, W, N, b * width, y, cbuf);
        }
        _tile_release();
    }
}

static int amx_product(const uint16_t *x, int64_t M, int64_t K, const uint16_t *W, int64_t N, float *y, int threads) {
    if (N % 32 || K % 32 || M < 1 || !amx_permitted()) return 0;
    int64_t passes = (M + AMX_XROWS - 1) / AMX_XROWS, rows = (M + passes - 1) / passes;
    uint32_t *xp = (uint32_t *)scratch(0, (size_t)K / 2 * AMX_XROWS);
    if (!xp) return 0;
    for (int64_t m = 0; m < M; m += rows) {
        int64_t r = M - m < rows ? M - m : rows;
        amx_pack(x + m * K, r, K, (int)((r + 15) / 16), xp);
        amx_pass(xp, r, K, W, N, y + m * N, threads);
    }
    return 1;
}
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

/* ---- the x-transposed path ---- */
#define XT_TILE (2 * VW) /* rows of x per tile */
#define XT_ROWS 64     /* rows of x per pass at most (bounds the buffer; more rows: even passes) */
#define XT_GROUP 12    /* weight rows per group: 2 tiles of 6 (or 1 of 12) */
#define XT_KC 512      /* K per chunk of the x-transposed path */
#define XT_LEFT_ROWS 4 /* up to this many rows past the last full tile go through the dot-product path */

/* one k of a tile: MV vectors of x rows, each of NR weight elements broadcast against them */
#define XT_STEP(MV, NR, K_)                                                                               \
    do {                                                                                                  \
        vf xv[MV];                                                                                        \
        for (int v = 0; v < MV; v++) xv[v] = load_f32(xt + (K_) * XT_TILE + v * VW);                      \
        for (int j = 0; j < NR; j++) {                                                                    \
            float s = w[j][K_];                                                                           \
            for (int v = 0; v < MV; v++) acc[j][v] += xv[v] * s;                                          \
        }                                                                                                 \
    } while (0)

/* acc_io[(j * 2 + v) * VW + l] += sum_{k0 <= k < k1} xt[k * XT_TILE + v * VW + l] * W[j, k], j < NR (rows past nr
 * repeat row 0) */
#define DEFINE_XT_TILE(MV, NR)                                                                            \
    static void xt_tile_##MV##_##NR(const float *xt, int64_t K, const float *W, int nr, int64_t k0,         \
                                     int64_t k1, float *acc_io) {                                          \
        vf acc[NR][MV];                                                                                   \
        const float *w[NR];                                                                               \
        for (int j = 0; j < NR; j++) w[j] = W + (j < nr ? j : 0) * K;                                     \
        for (int j = 0; j < NR; j++)                                                                      \
            for (int v = 0; v < MV; v++) memcpy(&acc[j][v], acc_io + (j * 2 + v) * VW, sizeof(vf));       \
        int64_t k = k0;                                                                                   \
        for (; k + 16 <= k1; k += 16) {                                                                   \
            for (int kk = 0; kk < 16; kk++) XT_STEP(MV, NR, k + kk);                                      \
        }                                                                                                 \
        for (; k < k1; k++) XT_STEP(MV, NR, k);                                                           \
        for (int j = 0; j < NR; j++)                                                                      \
            for (int v = 0; v < MV; v++) memcpy(acc_io + (j * 2 + v) * VW, &acc[j][v], sizeof(vf));       \
    }
DEFINE_XT_TILE(2, 6)
DEFINE_XT_TILE(1, 12)

/* rows [0, Mt) of x (transposed in xt by tiles, Mt <= XT_ROWS) against gn <= XT_GROUP float32 weight rows
 * Wg (row stride K): y[m, j] for m < Mt, j < gn (y: the group's first output column, row stride ldy). K goes in
 * chunks of XT_KC, so that the group's chunk stays in cache while every tile of rows passes over it. */
static void xt_group(const float *xt, int64_t Mt, int64_t K, const float *Wg, int64_t gn, float *y,
                     int64_t ldy) {
    float acc[(XT_ROWS / VW + 1) * XT_GROUP * VW] __attribute__((aligned(64)));
    int64_t tiles = (Mt + 2 * VW - 1) / (2 * VW);
    memset(acc, 0, sizeof(float) * tiles * 2 * XT_GROUP * VW);
    for (int64_t k0 = 0; k0 < K; k0 += XT_KC) {
        int64_t k1 = k0 + XT_KC < K ? k0 + XT_KC : K;
        for (int64_t t = 0; t < tiles; t++) {
            int mv = (2 * t + 1) * VW < Mt ? 2 : 1, width = mv == 2 ? 6 : 12;
            for (int64_t j = 0; j < gn; j += width) {
                int nr = (int)(gn - j < width ? gn - j : width);
                float *a = acc + (t * XT_GROUP + j) * 2 * VW;
                if (mv == 2)
                    xt_tile_2_6(xt + t * K * XT_TILE, K, Wg + j * K, nr, k0, k1, a);
                else
                    xt_tile_1_12(xt + t * K * XT_TILE, K, Wg + j * K, nr, k0, k1, a);
            }
        }
    }
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t j = 0; j < gn; j++)
            for (int v = 0; v < 2; v++)
                for (int l = 0; l < VW; l++) {
                    int64_t row = (2 * t + v) * VW + l;
                    if (row < Mt) y[row * ldy + j] = acc[((t * XT_GROUP + j) * 2 + v) * VW + l];
                }
}

/* a buffer of at least n floats owned by the calling thread, kept for its next calls (slot 0: x transposed, slot 1:
 * a widened bfloat16 group); NULL when memory runs out */
static float *scratch(int slot, size_t n) {
    static __thread float *buffers[2];
    static __thread size_t sizes[2];
    if (sizes[slot] < n) {
        free(buffers[slot]);
        buffers[slot] = aligned_alloc(64, (sizeof(float) * n + 63) / 64 * 64);
        sizes[slot] = buffers[slot] ? n : 0;
    }
    return buffers[slot];
}

/* columns [k0, k0 + 8) of rows [0, Mt) of x into xt, by tiles of XT_TILE rows (K x XT_TILE floats each): x[l, k]
 * is xt[(l / XT_TILE * K + k) * XT_TILE + l % XT_TILE]; the last tile's lanes past Mt are zero */
static void xt_pack(const float *x, int64_t Mt, int64_t K, int64_t k0, float *xt) {
    int64_t l = 0, kn = K - k0 < 8 ? K - k0 : 8;
#if defined(__AVX__)
    if (kn == 8)
        for (; l + 8 <= Mt; l += 8) { /* an 8 x 8 block through registers */
            const float *src = x + l * K + k0;
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * K);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int c = 0; c < 4; c++) {
                float *dst = xt + (l / XT_TILE * K + k0) * XT_TILE + l % XT_TILE;
                _mm256_storeu_ps(dst + c * XT_TILE, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
                _mm256_storeu_ps(dst + (c + 4) * XT_TILE, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
            }
        }
#endif
    for (int64_t c = 0; c < kn; c++) {
        for (int64_t i = l; i < (Mt + XT_TILE - 1) / XT_TILE * XT_TILE; i++)
            xt[(i / XT_TILE * K + k0 + c) * XT_TILE + i % XT_TILE] = i < Mt ? x[i * K + k0 + c] : 0;
    }
}

/* rows of x that go through tiles (the rest, at most XT_LEFT_ROWS, through the dot-product path) */
static int64_t xt_tiled_rows(int64_t M) {
    int64_t r = M % (2 * VW);
    return r <= XT_LEFT_ROWS ? M - r : M;
}

/* y[m, j] += bias[j] for every row (no bias: nothing) */
static void add_bias(float *y, int64_t M, int64_t N, const float *bias) {
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < N; j++) y[m * N + j] += bias[j];
}

/* whether M rows go through the register-blocked path (AVX-512 only: it needs 32 vector registers) */
static int blocked_rows(int64_t M) {
#if VW == 16
    return M >= BLOCK_MIN_ROWS && M <= BLOCK_ROWS;
#else
    (void)M;
    return 0;
#endif
}

/* the sequential path's accumulators per row of x (U) by row count: 2 and 3 rows with 2 each (with 4, a 2-core AMD
 * EPYC ran them slower than 4 rows) */
#define DEFINE_KERNELS(NAME, WT)                                                                          \
    DEFINE_STREAM(NAME, WT, 1, 4) DEFINE_STREAM(NAME, WT, 2, 2) DEFINE_STREAM(NAME, WT, 3, 2)              \
    DEFINE_STREAM(NAME, WT, 4, 3) DEFINE_STREAM(NAME, WT, 5, 2) DEFINE_STREAM(NAME, WT, 6, 2)              \
    DEFINE_STREAM(NAME, WT, 7, 1) DEFINE_STREAM(NAME, WT, 8, 1) DEFINE_STREAM(NAME, WT, 9, 1)              \
    DEFINE_STREAM(NAME, WT, 10, 1) DEFINE_STREAM(NAME, WT, 11, 1) DEFINE_STREAM(NAME, WT, 12, 1)           \
                                                                                                          \
    static void NAME##_stream(int64_t M, const float *x, int64_t K, const WT *W, int64_t nr, float *out,   \
                              int64_t ldo) {                                                              \
        switch (M) {                                                                                      \
        case 1: NAME##_stream1(x, K, W, nr, out, ldo); break;                                             \
        case 2: NAME##_stream2(x, K, W, nr, out, ldo); break;                                             \
        case 3: NAME##_stream3(x, K, W, nr, out, ldo); break;                                             \
        case 4: NAME##_stream4(x, K, W, nr, out, ldo); break;                                             \
        case 5: NAME##_stream5(x, K, W, nr, out, ldo); break;                                             \
        case 6: NAME##_stream6(x, K, W, nr, out, ldo); break;                                             \
        case 7: NAME##_stream7(x, K, W, nr, out, ldo); break;                                             \
        case 8: NAME##_stream8(x, K, W, nr, out, ldo); break;                                             \
        case 9: NAME##_stream9(x, K, W, nr, out, ldo); break;                                             \
        case 10: NAME##_stream10(x, K, W, nr, out, ldo); break;                                           \
        case 11: NAME##_stream11(x, K, W, nr, out, ldo); break;                                           \
        default: NAME##_stream12(x, K, W, nr, out, ldo); break;                                           \
        }                                                                                                 \
    }                                                                                                     \
                                                                                                          \
    /* any number of rows of x through the dot-product path, SMALL_M at a time (one thread) */              \
    static void NAME##_stream_rows(int64_t M, const float *x, int64_t K, const WT *W, int64_t nr, float *out, \
                                   int64_t ldo) {                                                         \
        for (int64_t m = 0; m < M; m += SMALL_M)                                                          \
            NAME##_stream(M - m < SMALL_M ? M - m : SMALL_M, x + m * K, K, W, nr, out + m * ldo, ldo);    \
    }                                                                                                     \
                                                                                                          \
    /* weight rows [n0, n0 + gn) as float32: W's own, or (bfloat16) widened into wide; NULL without that buffer */ \
    static const float *NAME##_group(const WT *W, int64_t n0, int64_t gn, int64_t K, float *wide) {          \
        if (sizeof(WT) == 4) return (const float *)(W + n0 * K);                                          \
        if (!wide) return 0;                                                                              \
        for (int64_t t = 0; t < gn * K; t++) wide[t] = one_##NAME(W[n0 * K + t]);                         \
        return wide;                                                                                      \
    }                                                                                                     \
                                                                                                          \
    /* the weight rows in groups of `width` over the threads, each group as float32 (bfloat16 widened into a\
     * per-thread buffer): the x-transposed tiles when xt is given (Mt rows of x packed into it first), else the\
     * register blocks; a group with no buffer to widen into goes through the dot-product path */         \
    static void NAME##_grouped(const float *x, int64_t M, int64_t K, const WT *W, int64_t N, float *y, int threads,\
                               int64_t width, float *xt, int64_t Mt) {                                    \
        int64_t groups = (N + width - 1) / width;                                                         \
        _Pragma("omp parallel num_threads(threads)") {                                                    \
            float *wide = sizeof(WT) == 4 ? 0 : scratch(1, width * K);                                    \
            if (xt) {                                                                                     \
                _Pragma("omp for schedule(static)") for (int64_t k = 0; k < K; k += 8) xt_pack(x, Mt, K, k, xt);\
            }                                                                                             \
            _Pragma("omp for schedule(static)") for (int64_t g = 0; g < groups; g++) {                    \
                int64_t n0 = g * width, gn = N - n0 < width ? N - n0 : width;                             \
                const float *Wg = NAME##_group(W, n0, gn, K, wide);                                       \
                if (!Wg) {                                                                                \
                    NAME##_stream_rows(M, x, K, W + n0 * K, gn, y + n0, N);                               \
                } else if (!xt) {                                                                         \
                    f32_blocks(x, M, K, Wg, (int)gn, y + n0, N);                                          \
                } else {                                                                                  \
                    xt_group(xt, Mt, K, Wg, gn, y + n0, N);                                               \
                    if (Mt < M) f32_stream(M - Mt, x + Mt * K, K, Wg, gn, y + Mt * N + n0, N);            \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
                                                                                                          \
    /* the x-transposed path: M rows (up to XT_ROWS) */                                                 \
    static void NAME##_xt(const float *x, int64_t M, int64_t K, const WT *W, int64_t N, float *y, int threads) { \
        int64_t Mt = xt_tiled_rows(M);                                                                    \
        float *xt = scratch(0, (Mt + XT_TILE - 1) / XT_TILE * XT_TILE * K);                               \
        if (!xt) { /* no memory for x transposed: the dot-product path */                                 \
            NAME##_stream_rows(M, x, K, W, N, y, N);                                                      \
            return;                                                                                       \
        }                                                                                                 \
        NAME##_grouped(x, M, K, W, N, y, threads, XT_GROUP, xt, Mt);                                      \
    }                                                                                                     \
                                                                                                          \
    /* the register-blocked path: M rows, BLOCK_NR weight rows per group */                               \
    static void NAME##_blocked(const float *x, int64_t M, int64_t K, const WT *W, int64_t N, float *y, int threads) {\
        NAME##_grouped(x, M, K, W, N, y, threads, BLOCK_NR, 0, M);                                        \
    }                                                                                                     \
                                                                                                          \
    void hfs_direct_##NAME(const float *x, int64_t M, int64_t K, const WT *W, int64_t N, const float *bias,   \
                           float *y, int threads) {                                                       \
        if (blocked_rows(M)) {                                                                            \
            NAME##_blocked(x, M, K, W, N, y, threads);                                                    \
        } else if (M > SMALL_M || (M > STREAM_ANY_K && M * K * (int64_t)sizeof(float) > STREAM_X_BYTES)) { \
            int64_t passes = (M + XT_ROWS - 1) / XT_ROWS, rows = (M + passes - 1) / passes; /* even passes */ \
            for (int64_t m = 0; m < M; m += rows)                                                         \
                NAME##_xt(x + m * K, M - m < rows ? M - m : rows, K, W, N, y + m * N, threads);           \
        } else {                                                                                          \
            int64_t blocks = (N + 15) / 16;                                                               \
            _Pragma("omp parallel for schedule(static) num_threads(threads)")                            \
            for (int64_t b = 0; b < blocks; b++) {                                                        \
                int64_t n0 = b * 16;                                                                      \
                NAME##_stream(M, x, K, W + n0 * K, N - n0 < 16 ? N - n0 : 16, y + n0, N);                 \
            }                                                                                             \
        }                                                                                                 \
        add_bias(y, M, N, bias);                                                                          \
    }

DEFINE_KERNELS(f32, float)
DEFINE_KERNELS(bf16, uint16_t)

/* 1 when this build has the AMX path and this process may use AMX's tiles */
int hfs_direct_amx(void) {
#if HAVE_AMX
    return amx_permitted();
#else
    return 0;
#endif
}

/* y[M, N] = x[M, K] W[N, K]^T (+ bias) with x and W in bfloat16 through AMX: 1 when done, 0 when this build or
 * process has no AMX or N or K is not a multiple of 32 (the caller then widens x and calls hfs_direct_bf16) */
int hfs_direct_bf16_amx(const uint16_t *x, int64_t M, int64_t K, const uint16_t *W, int64_t N, const float *bias,
                        float *y, int threads) {
#if HAVE_AMX
    if (!amx_product(x, M, K, W, N, y, threads)) return 0;
    add_bias(y, M, N, bias);
    return 1;
#else
    (void)x; (void)M; (void)K; (void)W; (void)N; (void)bias; (void)y; (void)threads;
    return 0;
#endif
}
