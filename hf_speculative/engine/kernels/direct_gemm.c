/* Small-row matrix products on the weight as the model holds it: y[M, N] = x[M, K] W[N, K]^T (+ bias).
 *
 * Decoding is memory-bound: a forward over a few dozen tokens should cost what reading the weights once costs.
 * The weight is read in place (nn.Linear's row-major [out, in] layout, float32 or bfloat16): no packed copy, so
 * the kernels add no memory. What makes that fast is the order of the reads:
 *
 *  - up to SMALL_M rows of x: one weight row at a time, every row of x against it (a row of x per accumulator
 *    set), so the whole weight is one sequential stream through memory, prefetched PF_AHEAD elements ahead;
 *    up to PASSES_M rows, passes of SMALL_M rows each;
 *  - more rows: blocks of BLOCK_N weight rows, K in chunks of KC (the chunk of the block stays in L1 while every
 *    group of up to 6 rows of x passes over it), the next block prefetched while this one is computed.
 *
 * Every product accumulates in float32 (bfloat16 weights are widened exactly); x arrives in float32. Threads
 * (OpenMP, the runtime torch itself loads) split the weight rows. Portable C with GCC/Clang vector extensions,
 * compiled with -march=native on the machine that runs it.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
#define SMALL_M 12  /* up to this many rows of x per pass of the sequential one-weight-row-at-a-time path */
#define PASSES_M 24 /* up to this many rows: passes of SMALL_M rows; more: the blocked path */
#define BLOCK_N 12  /* weight rows per block on the blocked path */
#define KC 256      /* K per chunk on the blocked path */
#define MAX_M 48    /* rows of x per pass on the blocked path */
#define ABI_VERSION 1
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
                if (U * VW * sizeof(WT) > 64) __builtin_prefetch(w + k + PF_AHEAD + 64 / sizeof(WT));     \
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

/* acc_io[i * NR + j] += x[i, k0:k1] * W[j, k0:k1] lane by lane, i < R, j < NR (rows past nr repeat row 0). */
#define DEFINE_TILE(NAME, WT, R, NR)                                                                      \
    static void NAME##_tile##R(const float *x, int64_t K, const WT *W, int64_t nr, int64_t k0, int64_t k1,   \
                               vf *acc_io) {                                                              \
        vf acc[R][NR];                                                                                    \
        const WT *w[NR];                                                                                  \
        for (int j = 0; j < NR; j++) w[j] = W + (j < nr ? j : 0) * K;                                     \
        for (int i = 0; i < R; i++)                                                                       \
            for (int j = 0; j < NR; j++) acc[i][j] = acc_io[i * NR + j];                                  \
        for (int64_t k = k0; k < k1; k += VW) {                                                           \
            vf wv[NR];                                                                                    \
            for (int j = 0; j < NR; j++) wv[j] = load_##NAME(w[j] + k);                                   \
            for (int i = 0; i < R; i++) {                                                                 \
                vf xv = load_f32(x + i * K + k);                                                          \
                for (int j = 0; j < NR; j++) acc[i][j] += xv * wv[j];                                     \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            for (int j = 0; j < NR; j++) acc_io[i * NR + j] = acc[i][j];                                  \
    }

/* weight rows per tile for r rows of x (r * width accumulators stay in registers) */
static const int TILE_WIDTH[7] = {0, 4, 4, 4, 3, 2, 2};

#define DEFINE_KERNELS(NAME, WT)                                                                          \
    DEFINE_STREAM(NAME, WT, 1, 4) DEFINE_STREAM(NAME, WT, 2, 4) DEFINE_STREAM(NAME, WT, 3, 4)              \
    DEFINE_STREAM(NAME, WT, 4, 3) DEFINE_STREAM(NAME, WT, 5, 2) DEFINE_STREAM(NAME, WT, 6, 2)              \
    DEFINE_STREAM(NAME, WT, 7, 1) DEFINE_STREAM(NAME, WT, 8, 1) DEFINE_STREAM(NAME, WT, 9, 1)              \
    DEFINE_STREAM(NAME, WT, 10, 1) DEFINE_STREAM(NAME, WT, 11, 1) DEFINE_STREAM(NAME, WT, 12, 1)           \
    DEFINE_TILE(NAME, WT, 1, 4) DEFINE_TILE(NAME, WT, 2, 4) DEFINE_TILE(NAME, WT, 3, 4)                    \
    DEFINE_TILE(NAME, WT, 4, 3) DEFINE_TILE(NAME, WT, 5, 2) DEFINE_TILE(NAME, WT, 6, 2)                    \
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
    static void NAME##_tile(int r, const float *x, int64_t K, const WT *W, int64_t n, int64_t k0, int64_t k1, \
                            vf *acc) {                                                                    \
        switch (r) {                                                                                      \
        case 1: NAME##_tile1(x, K, W, n, k0, k1, acc); break;                                             \
        case 2: NAME##_tile2(x, K, W, n, k0, k1, acc); break;                                             \
        case 3: NAME##_tile3(x, K, W, n, k0, k1, acc); break;                                             \
        case 4: NAME##_tile4(x, K, W, n, k0, k1, acc); break;                                             \
        case 5: NAME##_tile5(x, K, W, n, k0, k1, acc); break;                                             \
        default: NAME##_tile6(x, K, W, n, k0, k1, acc); break;                                            \
        }                                                                                                 \
    }                                                                                                     \
                                                                                                          \
    /* M <= MAX_M rows of x against one block of nr <= BLOCK_N weight rows */                             \
    static void NAME##_block(int64_t M, const float *x, int64_t K, const WT *W, int64_t nr, const WT *next, \
                             float *out, int64_t ldo) {                                                   \
        vf acc[MAX_M * BLOCK_N];                                                                          \
        int64_t kv = K / VW * VW;                                                                         \
        memset(acc, 0, sizeof(vf) * M * BLOCK_N);                                                         \
        for (int64_t k0 = 0; k0 < kv; k0 += KC) {                                                         \
            int64_t k1 = k0 + KC < kv ? k0 + KC : kv;                                                     \
            if (next)                                                                                     \
                for (int64_t j = 0; j < BLOCK_N; j++)                                                     \
                    for (int64_t k = k0; k < k1; k += 64 / sizeof(WT)) __builtin_prefetch(next + j * K + k); \
            for (int64_t m = 0; m < M; m += 6) {                                                          \
                int r = (int)(M - m < 6 ? M - m : 6), wd = TILE_WIDTH[r];                                 \
                for (int64_t j = 0; j < nr; j += wd)                                                      \
                    NAME##_tile(r, x + m * K, K, W + j * K, nr - j < wd ? nr - j : wd, k0, k1,            \
                                acc + m * BLOCK_N + j * r);                                               \
            }                                                                                             \
        }                                                                                                 \
        for (int64_t m = 0; m < M; m += 6) {                                                              \
            int r = (int)(M - m < 6 ? M - m : 6), wd = TILE_WIDTH[r];                                     \
            for (int64_t j = 0; j < nr; j += wd)                                                          \
                for (int i = 0; i < r; i++)                                                               \
                    for (int64_t q = 0; q < wd && j + q < nr; q++) {                                      \
                        const float *xr = x + (m + i) * K;                                                \
                        const WT *wr = W + (j + q) * K;                                                   \
                        float s = hsum(acc[m * BLOCK_N + j * r + i * wd + q]);                            \
                        for (int64_t t = kv; t < K; t++) s += xr[t] * one_##NAME(wr[t]);                  \
                        out[(m + i) * ldo + j + q] = s;                                                   \
                    }                                                                                     \
        }                                                                                                 \
    }                                                                                                     \
                                                                                                          \
    void hfs_direct_##NAME(const float *x, int64_t M, int64_t K, const WT *W, int64_t N, const float *bias,   \
                           float *y, int threads) {                                                       \
        if (M > SMALL_M && M <= PASSES_M) {                                                               \
            for (int64_t m = 0; m < M; m += SMALL_M)                                                      \
                hfs_direct_##NAME(x + m * K, M - m < SMALL_M ? M - m : SMALL_M, K, W, N, bias, y + m * N, threads); \
            return;                                                                                       \
        }                                                                                                 \
        int64_t nb = M <= SMALL_M ? 16 : BLOCK_N, blocks = (N + nb - 1) / nb;                             \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                                \
        for (int64_t b = 0; b < blocks; b++) {                                                            \
            int64_t n0 = b * nb, nr = N - n0 < nb ? N - n0 : nb;                                          \
            if (M <= SMALL_M)                                                                             \
                NAME##_stream(M, x, K, W + n0 * K, nr, y + n0, N);                                        \
            else                                                                                          \
                for (int64_t m = 0; m < M; m += MAX_M) {                                                  \
                    const WT *next = m == 0 && N - n0 - nb >= nb ? W + (n0 + nb) * K : 0;                 \
                    NAME##_block(M - m < MAX_M ? M - m : MAX_M, x + m * K, K, W + n0 * K, nr, next,       \
                                 y + m * N + n0, N);                                                      \
                }                                                                                         \
            if (bias)                                                                                     \
                for (int64_t m = 0; m < M; m++)                                                           \
                    for (int64_t j = 0; j < nr; j++) y[m * N + n0 + j] += bias[n0 + j];                   \
        }                                                                                                 \
    }

DEFINE_KERNELS(f32, float)
DEFINE_KERNELS(bf16, uint16_t)
