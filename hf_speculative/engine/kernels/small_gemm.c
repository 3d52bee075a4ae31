/* Small-row matrix products for the verification forward: y[M, N] = x[M, K] W[N, K]^T (+ bias), float32.
 *
 * A forward over a few dozen tokens reads every weight once; the product should cost what reading the weights
 * costs (decoding is memory-bound). General BLAS kernels re-pack W on every call and run compute-starved at
 * M = 2..32 rows. Here W is packed once into panels of NB columns (K x NB floats each, contiguous, the last
 * padded with zeros); every panel is streamed once per call and multiplied with up to MR rows of x held in
 * registers (an outer-product micro-kernel). Threads (OpenMP, the runtime torch itself loads) split the panels.
 *
 * Portable C: GCC/Clang vector extensions, compiled with -march=native on the machine that runs it.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VW 16
#define NV 4
#else
#define VW 8
#define NV 2
#endif
#define NB (VW * NV)
#define MR 6          /* rows of x per micro-kernel call: MR x NV accumulators stay in registers */
#define KC 64         /* rows of a panel per chunk (KC x NB floats: 16 KiB with AVX-512) */
#define MAX_ROWS 48   /* rows of x per pass over a panel */
#define PREFETCH 8    /* panel rows prefetched ahead: keeps memory busy while the FMAs run */

typedef float vf __attribute__((vector_size(VW * 4)));

int hfs_panel_width(void) { return NB; }

/* P: ceil(N / NB) panels of K x NB floats. */
void hfs_pack(const float *W, float *P, int64_t N, int64_t K) {
    int64_t panels = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = P + p * K * NB;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < NB; j++) {
                int64_t n = p * NB + j;
                dst[k * NB + j] = n < N ? W[n * K + k] : 0.0f;
            }
    }
}

#define DEFINE_KERNEL(R)                                                                          \
    static void kernel_##R(const float *x, int64_t ldx, const float *panel, int64_t k0, int64_t k1,  \
                           float *acc_io) {                                                       \
        vf acc[R][NV];                                                                            \
        for (int i = 0; i < R; i++)                                                               \
            for (int v = 0; v < NV; v++) memcpy(&acc[i][v], acc_io + i * NB + v * VW, sizeof(vf)); \
        for (int64_t k = k0; k < k1; k++) {                                                       \
            const vf *w = (const vf *)(panel + k * NB);                                           \
            for (int q = 0; q < NB; q += 16) __builtin_prefetch(panel + (k + PREFETCH) * NB + q); \
            vf wv[NV];                                                                            \
            for (int v = 0; v < NV; v++) wv[v] = w[v];                                            \
            for (int i = 0; i < R; i++) {                                                         \
                vf xb = x[i * ldx + k] - (vf){0}; /* a broadcast load (x - 0 is exact: no add) */  \
                for (int v = 0; v < NV; v++) acc[i][v] += xb * wv[v];                             \
            }                                                                                     \
        }                                                                                         \
        for (int i = 0; i < R; i++)                                                               \
            for (int v = 0; v < NV; v++) memcpy(acc_io + i * NB + v * VW, &acc[i][v], sizeof(vf)); \
    }

DEFINE_KERNEL(1)
DEFINE_KERNEL(2)
DEFINE_KERNEL(3)
DEFINE_KERNEL(4)
DEFINE_KERNEL(5)
DEFINE_KERNEL(6)

static void kernel_rows(int r, const float *x, int64_t ldx, const float *panel, int64_t k0, int64_t k1, float *acc) {
    switch (r) {
    case 1: kernel_1(x, ldx, panel, k0, k1, acc); break;
    case 2: kernel_2(x, ldx, panel, k0, k1, acc); break;
    case 3: kernel_3(x, ldx, panel, k0, k1, acc); break;
    case 4: kernel_4(x, ldx, panel, k0, k1, acc); break;
    case 5: kernel_5(x, ldx, panel, k0, k1, acc); break;
    default: kernel_6(x, ldx, panel, k0, k1, acc); break;
    }
}

/* One panel times up to MAX_ROWS rows of x: the panel is read from memory once, in chunks of KC rows that stay
 * in L1 while every block of MR rows of x passes over them. */
static void panel_product(const float *x, int64_t M, int64_t K, const float *panel, float *acc) {
    memset(acc, 0, M * NB * sizeof(float));
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t k1 = k0 + KC < K ? k0 + KC : K;
        for (int64_t m = 0; m < M; m += MR) {
            int r = (int)(M - m < MR ? M - m : MR);
            kernel_rows(r, x + m * K, K, panel, k0, k1, acc + m * NB);
        }
    }
}

/* y[M, N] = x[M, K] W^T + bias (bias may be NULL); x and y contiguous; P from hfs_pack. */
void hfs_gemm(const float *x, int64_t M, int64_t K, const float *P, int64_t N, const float *bias, float *y, int threads) {
    int64_t panels = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        float acc[MAX_ROWS * NB] __attribute__((aligned(64)));
        int64_t n0 = p * NB, width = N - n0 < NB ? N - n0 : NB;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
            int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
            panel_product(x + m0 * K, rows, K, P + p * K * NB, acc);
            for (int64_t i = 0; i < rows; i++) {
                float *row = y + (m0 + i) * N + n0;
                if (bias)
                    for (int64_t j = 0; j < width; j++) row[j] = acc[i * NB + j] + bias[n0 + j];
                else
                    memcpy(row, acc + i * NB, width * sizeof(float));
            }
        }
    }
}
