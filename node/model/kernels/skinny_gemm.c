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
 * Half-width weights: where every weight of a matrix is exactly a float16 value (a draft shipped in
 * float16), the packed copy may hold float16, widened in registers by F16C. The widening is exact,
 * so the products are bit-identical to the fp32 kernel's on the same values, for half the bytes read.
 *
 * Packed layout: rows in blocks of ROWS_PER_BLOCK; inside a block, for each group of 8 k's, the
 * rows' 8 values follow each other: block b, group g, row r, lane l is at
 * ((b * G + g) * ROWS_PER_BLOCK + r) * 8 + l, with G = K / 8; rows past N are zero.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8
#define ROWS_PER_BLOCK 4 /* W rows per block: the tile height, so a block streams in order */
#define X_ROWS_PER_TILE 3 /* x rows per tile: 4 x 3 accumulators + 3 x vectors fit 16 registers */
/* How far ahead of the group being multiplied the weights are prefetched (software prefetch, one
 * instruction per group). Without it a pass over more rows than one stalls on memory: the core
 * computes on a block while too few reads are in flight, so memory time and arithmetic add up
 * instead of overlapping. Measured on the 1.5B target's real passes, one thread, Xeon with AVX-512,
 * ms in the products per pass of 1 / 7 rows: 1.5 KiB ahead 228 / 275, 3 KiB 206 / 263, 6 KiB
 * 204 / 264, 12 KiB 245 / 328; whole passes without a prefetch 238 / 366 (docs/target-performance.md).
 * A prefetch changes no result. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 3072
#endif

static inline void prefetch_ahead(const void *block, size_t element, size_t weight_bytes) {
    __builtin_prefetch((const char *)block + element * weight_bytes + PREFETCH_BYTES, 0, 3); /* prefetcht0 */
}

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

static inline __m256 load_f32(const void *w, size_t i) { return _mm256_loadu_ps((const float *)w + i); }
static inline __m256 load_f16(const void *w, size_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
}
/* int8 weights (a draft's weight-only quantization, node/model/packed.py): widened exactly to fp32;
 * the caller multiplies each output column by its row's scale. */
static inline __m256 load_i8(const void *w, size_t i) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)w + i))));
}
typedef __m256 (*load_fn)(const void *, size_t);

/* One block of W against x rows m0 .. m0 + X_ROWS; X_ROWS and LOAD are constants at every call site,
 * so the accumulators live in registers and the load is inlined. */
static inline __attribute__((always_inline)) void tile(const void *block, const float *x, float *out, int groups,
                                                       int k, int n_rows, int n0, int m0, const int X_ROWS,
                                                       const load_fn LOAD, const size_t WEIGHT_BYTES) {
    __m256 acc[ROWS_PER_BLOCK][X_ROWS_PER_TILE];
    for (int r = 0; r < ROWS_PER_BLOCK; r++)
        for (int j = 0; j < X_ROWS; j++) acc[r][j] = _mm256_setzero_ps();
    const float *xm = x + (size_t)m0 * k;
    for (int g = 0; g < groups; g++) {
        size_t wg = (size_t)g * ROWS_PER_BLOCK * LANES;
        prefetch_ahead(block, wg, WEIGHT_BYTES);
        for (int j = 0; j < X_ROWS; j++) {
            __m256 xv = _mm256_loadu_ps(xm + (size_t)j * k + g * LANES);
            for (int r = 0; r < ROWS_PER_BLOCK; r++)
                acc[r][j] = _mm256_fmadd_ps(LOAD(block, wg + r * LANES), xv, acc[r][j]);
        }
    }
    for (int r = 0; r < ROWS_PER_BLOCK && n0 + r < n_rows; r++)
        for (int j = 0; j < X_ROWS; j++) out[(size_t)(m0 + j) * n_rows + n0 + r] = horizontal_sum(acc[r][j]);
}

#define TILE(NAME, X_ROWS, LOAD, T)                                                          \
    static void NAME(const void *b, const float *x, float *o, int g, int k, int n, int n0, int m0) { \
        tile(b, x, o, g, k, n, n0, m0, X_ROWS, LOAD, sizeof(T));                             \
    }
TILE(tile_1, 1, load_f32, float)
TILE(tile_2, 2, load_f32, float)
TILE(tile_3, 3, load_f32, float)
TILE(tile_1_f16, 1, load_f16, uint16_t)
TILE(tile_2_f16, 2, load_f16, uint16_t)
TILE(tile_3_f16, 3, load_f16, uint16_t)
TILE(tile_1_i8, 1, load_i8, int8_t)
TILE(tile_2_i8, 2, load_i8, int8_t)
TILE(tile_3_i8, 3, load_i8, int8_t)
typedef void (*tile_fn)(const void *, const float *, float *, int, int, int, int, int);
static const tile_fn TILES[X_ROWS_PER_TILE + 1] = {0, tile_1, tile_2, tile_3};
static const tile_fn TILES_F16[X_ROWS_PER_TILE + 1] = {0, tile_1_f16, tile_2_f16, tile_3_f16};
static const tile_fn TILES_I8[X_ROWS_PER_TILE + 1] = {0, tile_1_i8, tile_2_i8, tile_3_i8};

static void gemm(const void *packed, size_t weight_bytes, const tile_fn *tiles, const float *x, float *out,
                 int m_rows, int n_rows, int k) {
    int groups = k / LANES, blocks = (n_rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    for (int b = 0; b < blocks; b++) {
        const char *block = (const char *)packed + (size_t)b * groups * ROWS_PER_BLOCK * LANES * weight_bytes;
        for (int m0 = 0; m0 < m_rows; m0 += X_ROWS_PER_TILE) { /* the block is read from memory once */
            int rows = m_rows - m0 < X_ROWS_PER_TILE ? m_rows - m0 : X_ROWS_PER_TILE;
            tiles[rows](block, x, out, groups, k, n_rows, b * ROWS_PER_BLOCK, m0);
        }
    }
}

/* out[m_rows, n_rows] = x[m_rows, k] @ W^T, W packed by skinny_pack; k a multiple of LANES;
 * x and out contiguous. */
void skinny_gemm(const float *x, const float *packed, float *out, int m_rows, int n_rows, int k) {
    gemm(packed, sizeof(float), TILES, x, out, m_rows, n_rows, k);
}

/* The same with the packed weights as float16 (skinny_pack's layout, each value narrowed exactly). */
void skinny_gemm_f16(const float *x, const uint16_t *packed, float *out, int m_rows, int n_rows, int k) {
    gemm(packed, sizeof(uint16_t), TILES_F16, x, out, m_rows, n_rows, k);
}

/* The same with int8 weights (skinny_pack's layout), without their scales: out = x @ Q^T, and the
 * caller scales column n by row n's scale. For a draft only: its precision never touches exactness. */
void skinny_gemm_i8(const float *x, const int8_t *packed, float *out, int m_rows, int n_rows, int k) {
    gemm(packed, sizeof(int8_t), TILES_I8, x, out, m_rows, n_rows, k);
}

/* The float16 product on AVX-512, for machines that have it (chosen at run time: skinny_has_wide,
 * then the loader's CPU-flag check). Same packed layout and bit-identical results: each 512-bit
 * register holds two W rows' 8-lane accumulators side by side (rows r and r+1 of a block are
 * adjacent in the packed layout), each x vector is broadcast to both halves, and every half is the
 * AVX2 kernel's accumulator, the same FMAs over k in the same order, then the same horizontal sum.
 * What changes is the count of instructions per weight (half the FMAs, one conversion for 16
 * weights) and the registers (32), so a tile covers up to WIDE_X_ROWS x rows: every weight is
 * loaded and widened once per pass for the verification widths. */
#define WIDE_X_ROWS 12 /* 2 x 12 accumulators + 2 weight vectors + 1 x vector fit 32 registers */
#define WIDE __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl")))

/* 16 weights (two rows' 8 lanes) from element i of a block, widened exactly to fp32 */
static inline WIDE __m512 wide_load_f16(const void *w, size_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
}
static inline WIDE __m512 wide_load_i8(const void *w, size_t i) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)w + i))));
}
typedef __m512 (*wide_load_fn)(const void *, size_t);

static inline WIDE __attribute__((always_inline)) void wide_tile(const void *block, const float *x, float *out,
                                                                 int groups, int k, int n_rows, int n0, int m0,
                                                                 const int X_ROWS, const wide_load_fn LOAD,
                                                                 const size_t WEIGHT_BYTES) {
    __m512 acc[2][WIDE_X_ROWS];
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < X_ROWS; j++) acc[p][j] = _mm512_setzero_ps();
    const float *xm = x + (size_t)m0 * k;
    for (int g = 0; g < groups; g++) {
        size_t wg = (size_t)g * ROWS_PER_BLOCK * LANES;
        prefetch_ahead(block, wg, WEIGHT_BYTES);
        __m512 w01 = LOAD(block, wg);      /* rows 0 and 1 */
        __m512 w23 = LOAD(block, wg + 16); /* rows 2 and 3 */
        for (int j = 0; j < X_ROWS; j++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xm + (size_t)j * k + g * LANES));
            acc[0][j] = _mm512_fmadd_ps(w01, xv, acc[0][j]);
            acc[1][j] = _mm512_fmadd_ps(w23, xv, acc[1][j]);
        }
    }
    for (int p = 0; p < 2; p++)
        for (int h = 0; h < 2; h++) {
            int r = 2 * p + h;
            if (n0 + r >= n_rows) break;
            for (int j = 0; j < X_ROWS; j++) {
                __m256 half = h ? _mm512_extractf32x8_ps(acc[p][j], 1) : _mm512_castps512_ps256(acc[p][j]);
                out[(size_t)(m0 + j) * n_rows + n0 + r] = horizontal_sum(half);
            }
        }
}

typedef void (*wide_fn)(const void *, const float *, float *, int, int, int, int, int);
#define WIDE_TILE(T, X)                                                                                   \
    static WIDE void wide_tile_##T##_##X(const void *b, const float *x, float *o, int g, int k, int n, int n0, \
                                         int m0) {                                                        \
        wide_tile(b, x, o, g, k, n, n0, m0, X, wide_load_##T, sizeof(T##_t));                             \
    }
typedef uint16_t f16_t;
typedef int8_t i8_t;
#define WIDE_TILES_OF(T)                                                                                  \
    WIDE_TILE(T, 1) WIDE_TILE(T, 2) WIDE_TILE(T, 3) WIDE_TILE(T, 4) WIDE_TILE(T, 5) WIDE_TILE(T, 6)      \
    WIDE_TILE(T, 7) WIDE_TILE(T, 8) WIDE_TILE(T, 9) WIDE_TILE(T, 10) WIDE_TILE(T, 11) WIDE_TILE(T, 12)   \
    static const wide_fn WIDE_TILES_##T[WIDE_X_ROWS + 1] = {                                              \
        0, wide_tile_##T##_1, wide_tile_##T##_2, wide_tile_##T##_3, wide_tile_##T##_4, wide_tile_##T##_5, \
        wide_tile_##T##_6, wide_tile_##T##_7, wide_tile_##T##_8, wide_tile_##T##_9, wide_tile_##T##_10,   \
        wide_tile_##T##_11, wide_tile_##T##_12};
WIDE_TILES_OF(f16)
WIDE_TILES_OF(i8)

/* Whether this build has the AVX-512 path (the caller still checks the CPU's flags). */
int skinny_has_wide(void) { return 1; }

static WIDE void wide_gemm(const void *packed, size_t weight_bytes, const wide_fn *tiles, const float *x, float *out,
                           int m_rows, int n_rows, int k) {
    int groups = k / LANES, blocks = (n_rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    for (int b = 0; b < blocks; b++) {
        const char *block = (const char *)packed + (size_t)b * groups * ROWS_PER_BLOCK * LANES * weight_bytes;
        for (int m0 = 0; m0 < m_rows; m0 += WIDE_X_ROWS) {
            int rows = m_rows - m0 < WIDE_X_ROWS ? m_rows - m0 : WIDE_X_ROWS;
            tiles[rows](block, x, out, groups, k, n_rows, b * ROWS_PER_BLOCK, m0);
        }
    }
}

/* skinny_gemm_f16 on AVX-512: the same result, bit for bit. */
WIDE void skinny_gemm_f16_wide(const float *x, const uint16_t *packed, float *out, int m_rows, int n_rows, int k) {
    wide_gemm(packed, sizeof(uint16_t), WIDE_TILES_f16, x, out, m_rows, n_rows, k);
}

/* skinny_gemm_i8 on AVX-512: the same result, bit for bit (int8 widens exactly, then the same FMAs). */
WIDE void skinny_gemm_i8_wide(const float *x, const int8_t *packed, float *out, int m_rows, int n_rows, int k) {
    wide_gemm(packed, sizeof(int8_t), WIDE_TILES_i8, x, out, m_rows, n_rows, k);
}

/* ---- 4- and 5-bit weights, int8 activations: a draft only (its precision never touches exactness) ----
 *
 * A draft's decode step reads every weight once, so its bytes per weight set its speed. Group
 * layouts (node/model/packed.py writes them): blocks of ROWS_PER_BLOCK rows; per block and group of
 * QG_GROUP k's: 64 bytes of nibbles, byte 16 r + j holding the low 4 bits of row r's weight at
 * k = 32 g + j in its low nibble and at k = 32 g + 16 + j in its high one; for 5 bits, two 64-bit
 * masks of the fifth bits (bit 16 r + j of the first for k = 32 g + j, of the second for
 * k = 32 g + 16 + j); then the block's 4 row scales as float16. w = (q - 2^(bits-1)) * scale. These
 * are llama.cpp's Q4_0 and Q5_0 blocks (ggml, Gerganov et al.) laid out for 4 rows at a time; a
 * GGUF's Q5_0 tensor is carried over exactly.
 *
 * x is quantized per row and group to int8 with an absmax scale (llama.cpp's Q8_0), so a group's
 * product is an integer dot product: AVX512-VNNI's vpdpbusd (64 u8 x s8 products an instruction),
 * or AVX2's vpmaddubsw + vpmaddwd, which give the same int32s (no pair sum nears int16's limit:
 * 2 x 31 x 127 = 7874). The zero point enters as -2^(bits-1) x the group's sum of x in one int32
 * lane per row; the int32 sum is converted and scaled by (w scale x x scale) into fp32 lanes, group
 * after group; a row's 4 lanes are summed in a fixed order at the end. Both paths do the same float
 * operations per lane, so they agree bit for bit, and each row's result is the same in a pass of
 * any width (x rows are quantized alone). */
#define QG_GROUP 32
#define QG_NIBBLE_BYTES (ROWS_PER_BLOCK * QG_GROUP / 2)
#define QG_GROUP_BYTES(BITS) (QG_NIBBLE_BYTES + ((BITS) == 5 ? ROWS_PER_BLOCK * QG_GROUP / 8 : 0) + ROWS_PER_BLOCK * 2)
#define QG_ZERO(BITS) (1 << ((BITS) - 1))
#define X_LEVELS 127.0f
#define QG_X_ROWS 8      /* x rows per tile on AVX-512 (8 accumulators + the group's vectors) */
#define QG_X_ROWS_AVX2 4 /* on AVX2: two 256-bit accumulators per x row, 16 registers */

int skinny_group_bytes(int bits) { return bits == 4 || bits == 5 ? QG_GROUP_BYTES(bits) : -1; }

/* x [m_rows, k] -> q [m_rows, k] int8, scale and sum(q) [m_rows, groups] */
static void quantize_x(const float *x, int m_rows, int k, int8_t *q, float *scale, int32_t *sum) {
    int groups = k / QG_GROUP;
    for (int m = 0; m < m_rows; m++)
        for (int g = 0; g < groups; g++) {
            const float *xg = x + (size_t)m * k + (size_t)g * QG_GROUP;
            int8_t *qg = q + (size_t)m * k + (size_t)g * QG_GROUP;
            float top = 0.0f;
            for (int i = 0; i < QG_GROUP; i++) top = fabsf(xg[i]) > top ? fabsf(xg[i]) : top;
            float inv = top > 0.0f ? X_LEVELS / top : 0.0f;
            int32_t total = 0;
            for (int i = 0; i < QG_GROUP; i++) {
                float v = nearbyintf(xg[i] * inv);
                qg[i] = (int8_t)(v > X_LEVELS ? X_LEVELS : v < -X_LEVELS ? -X_LEVELS : v);
                total += qg[i];
            }
            scale[(size_t)m * groups + g] = top / X_LEVELS;
            sum[(size_t)m * groups + g] = total;
        }
}

/* a row's result from its 4 fp32 lanes, in one order for both paths */
static inline void qg_store(const float lanes[16], float *out, int m, int n_rows, int n0) {
    for (int r = 0; r < ROWS_PER_BLOCK && n0 + r < n_rows; r++)
        out[(size_t)m * n_rows + n0 + r] = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
}

typedef struct {
    const int8_t *q;
    const float *scale;
    const int32_t *sum;
} q8_rows;

/* 16 where bit i of `bits` is set, for the 32 bytes i of one AVX2 half (the fifth bits) */
static inline __m256i fifth_bits(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, /* bytes of bits */
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), select);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, select), _mm256_set1_epi8(16));
}

static inline __attribute__((always_inline)) void qg_tile_avx2(const uint8_t *block, q8_rows x, float *out, int groups,
                                                               int k, int n_rows, int n0, int m0, const int X_ROWS,
                                                               const int BITS) {
    __m256 acc[QG_X_ROWS_AVX2][2];
    for (int j = 0; j < X_ROWS; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i first = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), second = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    for (int g = 0; g < groups; g++) {
        const uint8_t *p = block + (size_t)g * QG_GROUP_BYTES(BITS);
        prefetch_ahead(p, 0, 1);
        const uint8_t *sp = p + QG_GROUP_BYTES(BITS) - ROWS_PER_BLOCK * 2;
        __m256 s4 = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sp)));
        __m256 sw[2] = {_mm256_permutevar8x32_ps(s4, first), _mm256_permutevar8x32_ps(s4, second)};
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 * h)); /* rows 2h and 2h + 1 */
            lo[h] = _mm256_and_si256(v, nib);
            hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            if (BITS == 5) {
                uint32_t bits_lo, bits_hi;
                memcpy(&bits_lo, p + QG_NIBBLE_BYTES + 4 * h, 4);
                memcpy(&bits_hi, p + QG_NIBBLE_BYTES + 8 + 4 * h, 4);
                lo[h] = _mm256_add_epi8(lo[h], fifth_bits(bits_lo));
                hi[h] = _mm256_add_epi8(hi[h], fifth_bits(bits_hi));
            }
        }
        for (int j = 0; j < X_ROWS; j++) {
            size_t row = (size_t)(m0 + j), at = row * groups + g;
            const int8_t *xr = x.q + row * k + (size_t)g * QG_GROUP;
            __m256i xa = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xr));
            __m256i xb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xr + 16)));
            __m256i zero = _mm256_blend_epi32(_mm256_setzero_si256(), _mm256_set1_epi32(-QG_ZERO(BITS) * x.sum[at]), 0x11);
            __m256 xs = _mm256_set1_ps(x.scale[at]);
            for (int h = 0; h < 2; h++) {
                __m256i d = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo[h], xa), ones),
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(hi[h], xb), ones));
                d = _mm256_add_epi32(zero, d);
                acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sw[h], xs), acc[j][h]);
            }
        }
    }
    for (int j = 0; j < X_ROWS; j++) {
        float lanes[16];
        _mm256_storeu_ps(lanes, acc[j][0]);
        _mm256_storeu_ps(lanes + 8, acc[j][1]);
        qg_store(lanes, out, m0 + j, n_rows, n0);
    }
}

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

static inline VNNI __attribute__((always_inline)) void qg_tile_vnni(const uint8_t *block, q8_rows x, float *out,
                                                                    int groups, int k, int n_rows, int n0, int m0,
                                                                    const int X_ROWS, const int BITS) {
    __m512 acc[QG_X_ROWS];
    for (int j = 0; j < X_ROWS; j++) acc[j] = _mm512_setzero_ps();
    const __m512i nib = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const __m512i expand = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int g = 0; g < groups; g++) {
        const uint8_t *p = block + (size_t)g * QG_GROUP_BYTES(BITS);
        prefetch_ahead(p, 0, 1);
        __m512i v = _mm512_loadu_si512((const void *)p);
        __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if (BITS == 5) {
            uint64_t bits_lo, bits_hi;
            memcpy(&bits_lo, p + QG_NIBBLE_BYTES, 8);
            memcpy(&bits_hi, p + QG_NIBBLE_BYTES + 8, 8);
            lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(bits_lo), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(bits_hi), hi, sixteen);
        }
        const uint8_t *sp = p + QG_GROUP_BYTES(BITS) - ROWS_PER_BLOCK * 2;
        __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sp));
        __m512 sw = _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(s4));
        for (int j = 0; j < X_ROWS; j++) {
            size_t row = (size_t)(m0 + j), at = row * groups + g;
            const int8_t *xr = x.q + row * k + (size_t)g * QG_GROUP;
            __m512i xa = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xr));
            __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xr + 16)));
            __m512i d = _mm512_maskz_set1_epi32(0x1111, -QG_ZERO(BITS) * x.sum[at]); /* lane 0 of each row */
            d = _mm512_dpbusd_epi32(d, lo, xa);
            d = _mm512_dpbusd_epi32(d, hi, xb);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, _mm512_set1_ps(x.scale[at])), acc[j]);
        }
    }
    for (int j = 0; j < X_ROWS; j++) {
        float lanes[16];
        _mm512_storeu_ps(lanes, acc[j]);
        qg_store(lanes, out, m0 + j, n_rows, n0);
    }
}

typedef void (*qg_tile_fn)(const uint8_t *, q8_rows, float *, int, int, int, int, int);
#define QG_TILE(PATH, BITS, X, ATTR)                                                                        \
    static ATTR void qg_##PATH##_##BITS##_##X(const uint8_t *b, q8_rows x, float *o, int g, int k, int n, int n0, \
                                              int m0) {                                                    \
        qg_tile_##PATH(b, x, o, g, k, n, n0, m0, X, BITS);                                                 \
    }
#define NO_ATTR
#define QG_TILES(BITS)                                                                                      \
    QG_TILE(avx2, BITS, 1, NO_ATTR) QG_TILE(avx2, BITS, 2, NO_ATTR) QG_TILE(avx2, BITS, 3, NO_ATTR)          \
    QG_TILE(avx2, BITS, 4, NO_ATTR) QG_TILE(vnni, BITS, 1, VNNI) QG_TILE(vnni, BITS, 2, VNNI)                 \
    QG_TILE(vnni, BITS, 3, VNNI) QG_TILE(vnni, BITS, 4, VNNI) QG_TILE(vnni, BITS, 5, VNNI)                    \
    QG_TILE(vnni, BITS, 6, VNNI) QG_TILE(vnni, BITS, 7, VNNI) QG_TILE(vnni, BITS, 8, VNNI)                    \
    static const qg_tile_fn QG_AVX2_##BITS[QG_X_ROWS_AVX2 + 1] = {0, qg_avx2_##BITS##_1, qg_avx2_##BITS##_2, \
                                                                  qg_avx2_##BITS##_3, qg_avx2_##BITS##_4};   \
    static const qg_tile_fn QG_VNNI_##BITS[QG_X_ROWS + 1] = {                                                \
        0, qg_vnni_##BITS##_1, qg_vnni_##BITS##_2, qg_vnni_##BITS##_3, qg_vnni_##BITS##_4,                   \
        qg_vnni_##BITS##_5, qg_vnni_##BITS##_6, qg_vnni_##BITS##_7, qg_vnni_##BITS##_8};
QG_TILES(4)
QG_TILES(5)

/* out[m_rows, n_rows] = x @ W^T for group-packed W of `bits` 4 or 5; k a multiple of QG_GROUP.
 * Returns 0; -1 when the scratch for the quantized x cannot be allocated, -2 for other bits. */
static int qg_gemm(const float *x, const uint8_t *packed, float *out, int m_rows, int n_rows, int k, int bits,
                   int vnni) {
    const qg_tile_fn *tiles = bits == 4 ? (vnni ? QG_VNNI_4 : QG_AVX2_4) : bits == 5 ? (vnni ? QG_VNNI_5 : QG_AVX2_5) : 0;
    if (!tiles) return -2;
    int per_tile = vnni ? QG_X_ROWS : QG_X_ROWS_AVX2;
    int groups = k / QG_GROUP, blocks = (n_rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    int8_t *q = malloc((size_t)m_rows * k);
    float *scale = malloc((size_t)m_rows * groups * sizeof(float));
    int32_t *sum = malloc((size_t)m_rows * groups * sizeof(int32_t));
    int status = q && scale && sum ? 0 : -1;
    if (status == 0) {
        quantize_x(x, m_rows, k, q, scale, sum);
        q8_rows rows = {q, scale, sum};
        for (int b = 0; b < blocks; b++) {
            const uint8_t *block = packed + (size_t)b * groups * QG_GROUP_BYTES(bits);
            for (int m0 = 0; m0 < m_rows; m0 += per_tile) { /* the block is read from memory once */
                int n = m_rows - m0 < per_tile ? m_rows - m0 : per_tile;
                tiles[n](block, rows, out, groups, k, n_rows, b * ROWS_PER_BLOCK, m0);
            }
        }
    }
    free(q);
    free(scale);
    free(sum);
    return status;
}

int skinny_gemm_qg(const float *x, const uint8_t *packed, float *out, int m_rows, int n_rows, int k, int bits) {
    return qg_gemm(x, packed, out, m_rows, n_rows, k, bits, 0);
}

/* skinny_gemm_qg with AVX512-VNNI: the same result, bit for bit */
int skinny_gemm_qg_vnni(const float *x, const uint8_t *packed, float *out, int m_rows, int n_rows, int k, int bits) {
    return qg_gemm(x, packed, out, m_rows, n_rows, k, bits, 1);
}

/* The small per-row ops of a Llama layer, row by row, so that a row's result does not depend on the
 * pass width either; each is one call instead of the handful of torch ops (and their dispatch) that
 * dominate a one-row pass once the products are near the memory limit. */

/* out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) + eps)) (HF's LlamaRMSNorm, in its order of the final
 * products); d a multiple of LANES. */
void skinny_rms_norm(const float *x, const float *w, float *out, int rows, int d, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *outr = out + (size_t)r * d;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < d; i += LANES) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float mean = horizontal_sum(acc) / (float)d;
        __m256 inv = _mm256_set1_ps(_mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_sqrt_ss(_mm_set_ss(mean + eps)))));
        for (int i = 0; i < d; i += LANES)
            _mm256_storeu_ps(outr + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv)));
    }
}

/* Rotary embedding in place (Su et al. 2021, RoFormer; HF's rotate_half convention): for each row m
 * and head h of x (row m starts at x + m * row_stride, heads of head_dim floats follow each other),
 * x1, x2 = halves; x1' = x1 cos1 - x2 sin1, x2' = x2 cos2 + x1 sin2, with cos and sin [rows,
 * head_dim]. Separate multiplies and adds (no FMA contraction under -std=c11), so the result is
 * bit-identical to torch's x * cos + rotate_half(x) * sin. head_dim / 2 a multiple of LANES. */
void skinny_rope(float *x, int row_stride, int rows, int heads, int head_dim, const float *cos, const float *sin) {
    int half = head_dim / 2;
    for (int m = 0; m < rows; m++) {
        const float *c = cos + (size_t)m * head_dim, *s = sin + (size_t)m * head_dim;
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)m * row_stride + (size_t)h * head_dim;
            for (int i = 0; i < half; i += LANES) {
                __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
                __m256 ra = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)), _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
                __m256 rb = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                          _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i)));
                _mm256_storeu_ps(v + i, ra);
                _mm256_storeu_ps(v + half + i, rb);
            }
        }
    }
}

/* Causal attention with grouped KV heads (GQA: Ainslie et al. 2023), row by row: query row m, at
 * position start + m, attends to cached keys 0 .. start + m. q rows start at q + m * q_stride with
 * `heads` heads of head_dim floats; keys and values are [kv_heads, capacity, head_dim]; out is
 * [rows, heads * head_dim]; scratch holds start + rows floats. Softmax as exp(s - max) / sum, summed
 * over the visible keys in order, so a row's result is the same in a pass of any width.
 *
 * Tree attention (SpecInfer: Miao et al. 2024, "topology-aware causal mask"): where `visible` is
 * given, row m sees the cached keys 0 .. start - 1 and then the keys at the cache positions
 * visible[offsets[m]] .. visible[offsets[m + 1] - 1]: its ancestors in the tree, root first, then
 * itself. A chain is the tree whose row m sees start .. start + m, so a node scored in a tree goes
 * through exactly the operations of the same path scored as a chain (the same keys and values in
 * the same order): its result is bit-identical (tests/test_tree_forward.py). */
static inline int key_position(int j, int start, const int *visible) {
    return visible == NULL || j < start ? j : visible[j - start];
}

static void attention(const float *q, int q_stride, const float *keys, const float *values, int capacity,
                      float *out, int rows, int start, int heads, int kv_heads, int head_dim, float scale,
                      float *weights, const int *offsets, const int *visible) {
    int group = heads / kv_heads, vectors = head_dim / LANES;
    for (int m = 0; m < rows; m++) {
        const int *seen = visible == NULL ? NULL : visible + offsets[m]; /* this row's tree keys */
        int n = start + (visible == NULL ? m + 1 : offsets[m + 1] - offsets[m]);
        for (int h = 0; h < heads; h++) {
            const float *qh = q + (size_t)m * q_stride + (size_t)h * head_dim;
            const float *k = keys + (size_t)(h / group) * capacity * head_dim;
            const float *v = values + (size_t)(h / group) * capacity * head_dim;
            float top = -INFINITY, total = 0.0f;
            for (int j = 0; j < n; j++) {
                const float *kj = k + (size_t)key_position(j, start, seen) * head_dim;
                __m256 acc = _mm256_setzero_ps();
                for (int i = 0; i < vectors; i++)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i * LANES), _mm256_loadu_ps(kj + i * LANES), acc);
                weights[j] = horizontal_sum(acc) * scale;
                top = weights[j] > top ? weights[j] : top;
            }
            for (int j = 0; j < n; j++) {
                weights[j] = expf(weights[j] - top);
                total += weights[j];
            }
            float *o = out + (size_t)m * heads * head_dim + (size_t)h * head_dim;
            for (int i = 0; i < vectors; i++) {
                __m256 acc = _mm256_setzero_ps();
                for (int j = 0; j < n; j++) {
                    const float *vj = v + (size_t)key_position(j, start, seen) * head_dim;
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), _mm256_loadu_ps(vj + i * LANES), acc);
                }
                _mm256_storeu_ps(o + i * LANES, _mm256_div_ps(acc, _mm256_set1_ps(total)));
            }
        }
    }
}

void skinny_attention(const float *q, int q_stride, const float *keys, const float *values, int capacity, float *out,
                      int rows, int start, int heads, int kv_heads, int head_dim, float scale, float *weights) {
    attention(q, q_stride, keys, values, capacity, out, rows, start, heads, kv_heads, head_dim, scale, weights, NULL,
              NULL);
}

/* The same over a tree of rows: row m sees the cache up to `start`, then visible[offsets[m] ..
 * offsets[m + 1]) (cache positions, its ancestors root first, then its own). */
void skinny_tree_attention(const float *q, int q_stride, const float *keys, const float *values, int capacity,
                           float *out, int rows, int start, int heads, int kv_heads, int head_dim, float scale,
                           float *weights, const int *offsets, const int *visible) {
    attention(q, q_stride, keys, values, capacity, out, rows, start, heads, kv_heads, head_dim, scale, weights,
              offsets, visible);
}

/* out[r] = silu(gate[r]) * up[r] (the Llama MLP's gating, silu(g) = g / (1 + e^-g)), where row r of
 * gate_up holds gate then up, each `width` floats. */
void skinny_silu_mul(const float *gate_up, float *out, int rows, int width) {
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + (size_t)r * 2 * width, *u = g + width;
        float *o = out + (size_t)r * width;
        for (int i = 0; i < width; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
