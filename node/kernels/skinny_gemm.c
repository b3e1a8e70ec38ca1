/* A matrix product for the few rows of a speculative verification pass (specmarket).
 *
 * out[M, N] = x[M, K] @ W[N, K]^T for small M (one decode position, or the γ+1 positions of a
 * verification pass), fp32 throughout, on AVX2 + FMA.
 *
 * Why: with a KV cache a pass reads every weight once and does little arithmetic per weight, so it
 * is bounded by memory bandwidth (the roofline model: Williams, Waterman & Patterson, CACM 2009).
 * A GEMM library tuned for large M reads the weights once per few rows of x, or falls back to a
 * kernel several times slower, when M is 2-9 (measured: docs/target-performance.md). Here the
 * weights are packed once into blocks that stream front to back, and each block is read from
 * memory once per pass whatever M is.
 *
 * Shape invariance: every output element is the same sequence of operations whatever M is and
 * whichever tile computes it: one 8-lane accumulator over k in order, then a fixed horizontal sum.
 * So row m of a pass over M rows is bit-identical to a pass over row m alone. Built without
 * -ffast-math, so that the compiler keeps this order.
 *
 * Packed layout: rows in blocks of ROWS_PER_BLOCK; inside a block, for each group of 8 k's, the
 * rows' 8 values follow each other: block b, group g, row r, lane l is at
 * ((b * G + g) * ROWS_PER_BLOCK + r) * 8 + l, with G = K / 8; rows past N are zero.
 */
#include <immintrin.h>
#include <stddef.h>

#define LANES 8
#define ROWS_PER_BLOCK 4 /* W rows per block: the tile height, so a block streams in order */
#define X_ROWS_PER_TILE 3 /* x rows per tile: 4 x 3 accumulators + 3 x vectors fit 16 registers */

int skinny_rows_per_block(void) { return ROWS_PER_BLOCK; }

void skinny_pack(const float *w, float *packed, int n_rows, int k) {
    int groups = k / LANES, blocks = (n_rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    for (int b = 0; b < blocks; b++)
        for (int g = 0; g < groups; g++)
            for (int r = 0; r < ROWS_PER_BLOCK; r++) {
                int n = b * ROWS_PER_BLOCK + r;
                float *dst = packed + (((size_t)b * groups + g) * ROWS_PER_BLOCK + r) * LANES;
                for (int l = 0; l < LANES; l++) dst[l] = n < n_rows ? w[(size_t)n * k + g * LANES + l] : 0.0f;
            }
}

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One block of W against x rows m0 .. m0 + X_ROWS; X_ROWS is a constant at every call site, so the
 * accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const float *block, const float *x, float *out, int groups,
                                                       int k, int n_rows, int n0, int m0, const int X_ROWS) {
    __m256 acc[ROWS_PER_BLOCK][X_ROWS_PER_TILE];
    for (int r = 0; r < ROWS_PER_BLOCK; r++)
        for (int j = 0; j < X_ROWS; j++) acc[r][j] = _mm256_setzero_ps();
    const float *xm = x + (size_t)m0 * k;
    for (int g = 0; g < groups; g++) {
        const float *wg = block + (size_t)g * ROWS_PER_BLOCK * LANES;
        for (int j = 0; j < X_ROWS; j++) {
            __m256 xv = _mm256_loadu_ps(xm + (size_t)j * k + g * LANES);
            for (int r = 0; r < ROWS_PER_BLOCK; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(wg + r * LANES), xv, acc[r][j]);
        }
    }
    for (int r = 0; r < ROWS_PER_BLOCK && n0 + r < n_rows; r++)
        for (int j = 0; j < X_ROWS; j++) out[(size_t)(m0 + j) * n_rows + n0 + r] = horizontal_sum(acc[r][j]);
}

static void tile_1(const float *b, const float *x, float *o, int g, int k, int n, int n0, int m0) {
    tile(b, x, o, g, k, n, n0, m0, 1);
}
static void tile_2(const float *b, const float *x, float *o, int g, int k, int n, int n0, int m0) {
    tile(b, x, o, g, k, n, n0, m0, 2);
}
static void tile_3(const float *b, const float *x, float *o, int g, int k, int n, int n0, int m0) {
    tile(b, x, o, g, k, n, n0, m0, 3);
}
typedef void (*tile_fn)(const float *, const float *, float *, int, int, int, int, int);
static const tile_fn TILES[X_ROWS_PER_TILE + 1] = {0, tile_1, tile_2, tile_3};

/* out[m_rows, n_rows] = x[m_rows, k] @ W^T, W packed by skinny_pack; k a multiple of LANES;
 * x and out contiguous. */
void skinny_gemm(const float *x, const float *packed, float *out, int m_rows, int n_rows, int k) {
    int groups = k / LANES, blocks = (n_rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    for (int b = 0; b < blocks; b++) {
        const float *block = packed + (size_t)b * groups * ROWS_PER_BLOCK * LANES;
        for (int m0 = 0; m0 < m_rows; m0 += X_ROWS_PER_TILE) { /* the block is read from memory once */
            int rows = m_rows - m0 < X_ROWS_PER_TILE ? m_rows - m0 : X_ROWS_PER_TILE;
            TILES[rows](block, x, out, groups, k, n_rows, b * ROWS_PER_BLOCK, m0);
        }
    }
}
