/* The exact arithmetic's products (docs/exact-arithmetic.md §2-4), specmarket-exact/1.
 *
 * out[m, n] = Σ_b c_b(x_m, W_n): x quantized per block to int8 (§3), each block's product an exact
 * integer (§4), its binary32 scaling, then one sequential binary32 fold over the blocks in order.
 * Weights are the GGUF's blocks as published, row n's blocks after each other.
 *
 * One block format a struct, one product a function per ISA, and the scalar reference that every
 * path must match bit for bit (after llama.cpp's ggml-quants.c). Built with -ffp-contract=off and
 * without -ffast-math: the binary32 operations below are the specification's, in its order.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QK_K 256
#define QK_0 32
#define ACT_LEVELS 127

enum { EX_Q8_0 = 0, EX_Q5_0 = 1, EX_Q4_K = 2, EX_Q6_K = 3 };
enum { EX_OK = 0, EX_NON_FINITE = 1, EX_BAD_SHAPE = 2 };

typedef struct { uint16_t d; int8_t qs[QK_0]; } block_q8_0;                       /* 34 bytes */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK_0 / 2]; } block_q5_0;    /* 22 bytes */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;  /* 144 */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K; /* 210 */

_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(block_q4_K) == 144, "Q4_K block");
_Static_assert(sizeof(block_q6_K) == 210, "Q6_K block");

/* binary16 -> binary32, exact (IEEE: normals, subnormals, infinities, NaN) */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else { /* subnormal: normalize */
        int e = -1;
        do { mant <<= 1; e++; } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int act_block(int type) { return type == EX_Q4_K || type == EX_Q6_K ? QK_K : QK_0; }
static size_t block_bytes(int type) {
    return type == EX_Q8_0 ? 34 : type == EX_Q5_0 ? 22 : type == EX_Q4_K ? 144 : 210;
}

/* §3: one row's blocks of `block` values -> int8 levels and one scale each. */
static int quantize_row(const float *x, int k, int block, int8_t *q, float *dx) {
    for (int b = 0; b < k / block; b++) {
        const float *xb = x + (size_t)b * block;
        float amax = 0.0f;
        for (int i = 0; i < block; i++) {
            if (!isfinite(xb[i])) return EX_NON_FINITE;
            float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        float d = amax / (float)ACT_LEVELS;
        dx[b] = d;
        for (int i = 0; i < block; i++) {
            float v = d == 0.0f ? 0.0f : rintf(xb[i] / d); /* rintf: the current mode, to nearest even */
            q[(size_t)b * block + i] = (int8_t)(v > ACT_LEVELS ? ACT_LEVELS : v < -ACT_LEVELS ? -ACT_LEVELS : v);
        }
    }
    return EX_OK;
}

#if defined(__AVX512F__)
#include <float.h>
#include <immintrin.h>

/* §3 as quantize_row, 16 values at a time: the maximum is exact in any order, x / dx a true division,
 * rounding to nearest even (vrndscaleps), the same clamp: the same bits. Non-finite: |x| <= FLT_MAX fails. */
static int quantize_row_avx512(const float *x, int k, int block, int8_t *q, float *dx) {
    const __m512 huge = _mm512_set1_ps(FLT_MAX), top = _mm512_set1_ps((float)ACT_LEVELS);
    for (int b = 0; b < k / block; b++) {
        const float *xb = x + (size_t)b * block;
        int8_t *qb = q + (size_t)b * block;
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int i = 0; i < block; i += 16) {
            __m512 a = _mm512_abs_ps(_mm512_loadu_ps(xb + i));
            bad |= _mm512_cmp_ps_mask(a, huge, _CMP_NLE_UQ);
            amax = _mm512_max_ps(amax, a);
        }
        if (bad) return EX_NON_FINITE;
        float d = _mm512_reduce_max_ps(amax) / (float)ACT_LEVELS;
        dx[b] = d;
        __m512 vd = _mm512_set1_ps(d);
        for (int i = 0; i < block; i += 16) {
            __m512 v = _mm512_div_ps(_mm512_loadu_ps(xb + i), vd);
            v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), top)), top);
            __m128i l = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v));
            _mm_storeu_si128((__m128i *)(qb + i), d == 0.0f ? _mm_setzero_si128() : l);
        }
    }
    return EX_OK;
}
#endif

static void q4_k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else { *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4; *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4; }
}

/* c_b of §4 for one weight block against one activation block (scalar reference) */
static float block_q4_K_ref(const block_q4_K *w, const int8_t *x, float dx) {
    int32_t a = 0, bsum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m, dot = 0, sum = 0, c = j / 2, shift = 4 * (j % 2);
        q4_k_scale_min(w->scales, j, &sc, &m);
        for (int l = 0; l < 32; l++) {
            int q = (w->qs[32 * c + l] >> shift) & 15, xi = x[32 * j + l];
            dot += q * xi;
            sum += xi;
        }
        a += sc * dot;
        bsum += m * sum;
    }
    float d = half_to_float(w->d), dmin = half_to_float(w->dmin);
    return (dx * d) * (float)a - (dx * dmin) * (float)bsum;
}

static float block_q6_K_ref(const block_q6_K *w, const int8_t *x, float dx) {
    int32_t a = 0;
    for (int j = 0; j < 16; j++) {
        int dot = 0;
        for (int t = 0; t < 16; t++) {
            int i = 16 * j + t, c = i / 128, s = (i % 128) / 32, l = i % 32;
            int low = (w->ql[64 * c + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
            int high = (w->qh[32 * c + l] >> (2 * s)) & 3;
            dot += ((low | high << 4) - 32) * x[i];
        }
        a += w->scales[j] * dot;
    }
    return (dx * half_to_float(w->d)) * (float)a;
}

static float block_q8_0_ref(const block_q8_0 *w, const int8_t *x, float dx) {
    int32_t a = 0;
    for (int i = 0; i < QK_0; i++) a += w->qs[i] * x[i];
    return (dx * half_to_float(w->d)) * (float)a;
}

static float block_q5_0_ref(const block_q5_0 *w, const int8_t *x, float dx) {
    uint32_t qh;
    memcpy(&qh, w->qh, 4);
    int32_t a = 0;
    for (int i = 0; i < QK_0; i++) {
        int low = i < 16 ? w->qs[i] & 15 : w->qs[i - 16] >> 4;
        a += ((low | ((qh >> i) & 1) << 4) - 16) * x[i];
    }
    return (dx * half_to_float(w->d)) * (float)a;
}

static float block_ref(int type, const uint8_t *w, const int8_t *x, float dx) {
    switch (type) {
    case EX_Q8_0: return block_q8_0_ref((const block_q8_0 *)w, x, dx);
    case EX_Q5_0: return block_q5_0_ref((const block_q5_0 *)w, x, dx);
    case EX_Q4_K: return block_q4_K_ref((const block_q4_K *)w, x, dx);
    default: return block_q6_K_ref((const block_q6_K *)w, x, dx);
    }
}

/* Scratch: levels q [m, k], scales dx [m, k / block], and each sub-block's sum of levels, of 32 values
 * [m, k / 32] and of 16 values [m, k / 16] (|sum| <= 32 * 127 = 4064: int16), each 64-byte aligned. */
static size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }

static size_t prepared_bytes(int m, int k) {
    size_t rows = (size_t)m, blocks = (size_t)(k / QK_0);
    return 64 + align64(rows * k) + align64(rows * blocks * 4) + align64(rows * blocks * 2) +
           align64(rows * blocks * 4);
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) &&             \
    defined(__AVX512VNNI__)
#define EX_AMX 1
size_t ex_amx_scratch_bytes(int m, int k); /* exact_amx.c */
void ex_amx_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                    const int16_t *sums, int m, float *out, int ldo, void *scratch);
#endif

/* The scratch every path's product needs: the prepared rows, and after them the AMX path's layout */
size_t ex_scratch_bytes(int m, int k) {
#ifdef EX_AMX
    return prepared_bytes(m, k) + ex_amx_scratch_bytes(m, k);
#else
    return prepared_bytes(m, k);
#endif
}

typedef struct { int8_t *q; float *dx; int16_t *bsums, *bsums16; } prepared;

/* §3 for every row of the pass into scratch (one preparation for every product path; `simd`: the
 * AVX-512 quantization where built, the same bits as the scalar one that the reference keeps) */
static void place_rows(int m, int k, void *scratch, prepared *p) {
    size_t rows = (size_t)m, blocks = (size_t)(k / QK_0);
    char *at = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    p->q = (int8_t *)at;
    p->dx = (float *)(at += align64(rows * k));
    p->bsums = (int16_t *)(at += align64(rows * blocks * 4));
    p->bsums16 = (int16_t *)(at + align64(rows * blocks * 2));
}

static int prepare_rows(const float *x, int m, int k, int block, void *scratch, prepared *p, int simd) {
    size_t rows = (size_t)m;
    place_rows(m, k, scratch, p);
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        int8_t *qr = p->q + (size_t)r * k;
        float *dxr = p->dx + (size_t)r * (k / block);
#if defined(__AVX512F__)
        int rc = simd ? quantize_row_avx512(xr, k, block, qr, dxr) : quantize_row(xr, k, block, qr, dxr);
#else
        int rc = quantize_row(xr, k, block, qr, dxr);
#endif
        if (rc) return rc;
    }
    for (size_t i = 0; i < rows * k / 16; i++) {
        int total = 0;
        for (int l = 0; l < 16; l++) total += p->q[16 * i + l];
        p->bsums16[i] = (int16_t)total;
    }
    for (size_t i = 0; i < rows * k / 32; i++) p->bsums[i] = (int16_t)(p->bsums16[2 * i] + p->bsums16[2 * i + 1]);
    return EX_OK;
}

/* The K-quants' preparation for exact_pack.c's products: the rows of x quantized into scratch (blocks
 * of 256), or, where x is NULL, the rows a previous call prepared there (same m and k): q, k and v, or
 * gate and up, quantize their common input once. */
int ex_prepare_k(const float *x, int m, int k, void *scratch, int8_t **q, float **dx, int16_t **bs32,
                 int16_t **bs16) {
    if (k % QK_K || m < 0) return EX_BAD_SHAPE;
    prepared p;
    int rc = EX_OK;
    if (x != NULL) rc = prepare_rows(x, m, k, QK_K, scratch, &p, 1);
    else place_rows(m, k, scratch, &p);
    *q = p.q, *dx = p.dx, *bs32 = p.bsums, *bs16 = p.bsums16;
    return rc;
}

/* The scalar reference product: out [m, n] row-major; scratch of ex_scratch_bytes(m, k). */
int ex_matmul_ref(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    int block = act_block(type), blocks = k / block;
    if (k % block) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, block, scratch, &p, 0);
    if (rc) return rc;
    int8_t *q = p.q;
    float *dx = p.dx;
    size_t row_bytes = (size_t)blocks * block_bytes(type);
    for (int j = 0; j < n; j++)
        for (int r = 0; r < m; r++) {
            float s = 0.0f;
            for (int b = 0; b < blocks; b++)
                s = s + block_ref(type, w + j * row_bytes + b * block_bytes(type), q + (size_t)r * k + (size_t)b * block,
                                  dx[(size_t)r * blocks + b]);
            out[(size_t)r * n + j] = s;
        }
    return EX_OK;
}

/* ==== The SIMD paths ====
 *
 * Both vectorize ACROSS output columns: a tile of COLS consecutive columns (16 for AVX-512, 8 for AVX2)
 * keeps, for each row of the pass, one binary32 register whose lane c is output column c's own
 * sequential fold of §4 (s = fl(s + c_b) in block order). Per block step, the tile's weight blocks are
 * unpacked once into a small buffer (integers ready for the products, scales as vectors, d and dmin
 * widened) and then used by every row of the pass; per row, each column's exact integer products are
 * summed in SIMD lanes, a transposing tree of adds turns COLS such registers into one register of COLS
 * exact integers A (lane = column), and the binary32 scaling and the fold run lane by lane, the very
 * operations of the reference in its order. Integer sums may be reordered freely (they are exact); the
 * binary32 ones never are. A row's bits therefore do not depend on the pass width or the tile.
 * (The tile-and-unpack idea is the usual one for quantized GEMV kernels such as llama.cpp's; the code
 * here is written from docs/exact-arithmetic.md.) */
#if defined(__AVX2__)
#include <immintrin.h>

enum { ROW_CHUNK = 64 }; /* rows whose accumulators stay on the stack while a tile is swept */

/* Q4_K's 12 packed scale bytes -> sc_0..7 (one byte each) and m_0..7, by §2's formula on 4 bytes at
 * once: bytes 0-3 hold sc_0..3 (low 6 bits) and the top bits of sc_4..7, 4-7 m_0..3 and the top bits of
 * m_4..7, 8-11 the low 4 bits of sc_4..7 (low nibble) and of m_4..7 (high nibble). */
void ex_q4_K_scales(const uint8_t *s, uint64_t *sc, uint64_t *mn) { /* also exact_amx.c's */
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4), memcpy(&u1, s + 4, 4), memcpy(&u2, s + 8, 4);
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
    *sc = sc_lo | (uint64_t)sc_hi << 32, *mn = m_lo | (uint64_t)m_hi << 32;
}

/* Software prefetch for short rows: a tile's 16 columns are read a block at a time, 16 strided streams
 * that, when each is shorter than a page, the hardware prefetchers hardly follow. Then each step fetches
 * its share of the NEXT tile (contiguous bytes) into L2. Long rows are left to the hardware (measured:
 * prefetching them costs more than it gains). Prefetches do not fault; the range stays inside w. */
enum { PREFETCH_ROW_BYTES = 4096 };
static inline void prefetch_next(const uint8_t *next, size_t len, const uint8_t *end) {
    for (const uint8_t *line = next; line < next + len && line < end; line += 64)
        _mm_prefetch((const char *)line, _MM_HINT_T1);
}

/* The tile sweep, one function a format (the loops are the same; the compiler inlines the format's
 * unpack and row product). Columns past n repeat column n − 1 and are not stored. */
#define SWEEP(COLS, VEC, ZERO, STORE, UNPACK, ROW)                                                             \
    for (int r0 = 0; r0 < m; r0 += ROW_CHUNK) {                                                               \
        int rows = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;                                                   \
        for (int j0 = 0; j0 < n; j0 += COLS) {                                                                \
            int cols = n - j0 < COLS ? n - j0 : COLS;                                                         \
            int32_t offs[COLS];                                                                               \
            for (int c = 0; c < COLS; c++) offs[c] = (int32_t)((c < cols ? c : cols - 1) * row_bytes);        \
            const uint8_t *base = w + (size_t)j0 * row_bytes;                                                 \
            VEC acc[ROW_CHUNK];                                                                               \
            for (int r = 0; r < rows; r++) acc[r] = ZERO;                                                     \
            const uint8_t *next = base + (size_t)COLS * row_bytes, *end = w + (size_t)n * row_bytes;          \
            size_t share = row_bytes < PREFETCH_ROW_BYTES ? (size_t)COLS * STEP * (row_bytes / blocks) : 0;    \
            for (int b = 0; b < blocks; b += STEP) {                                                          \
                prefetch_next(next + (size_t)(b / STEP) * share, share, end);                                 \
                UNPACK;                                                                                       \
                for (int r = 0; r < rows; r++) acc[r] = ROW;                                                  \
            }                                                                                                 \
            for (int r = 0; r < rows; r++) STORE(out + (size_t)(r0 + r) * n + j0, cols, acc[r]);               \
        }                                                                                                     \
    }
#endif

/* ---- AVX-512 (F, BW, VL) with VNNI: 16 columns a tile. Q8_0 and Q5_0 here; Q4_K and Q6_K in
 * exact_vnni.c, whose lanes are the columns from the start (no tree per row: faster for every width). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
void ex_vnni_lanes_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                           const int16_t *sums, int m, float *out, int ldo); /* exact_vnni.c */

/* The transposing tree: 16 registers of 16 int32 partial sums (one register a column) -> one register
 * whose lane c is the sum of register c's lanes. Levels 1-3 only add lanes of the same 256-bit half, so
 * `tree16_halves` can also give the two halves' sums apart (two blocks in one register, Q8_0/Q5_0). */
static inline __m512i tree_pairs(__m512i a, __m512i b) { /* lanes (2q, 2q+1) of each 128 bits: a, b */
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
static inline __m512i tree_quads(__m512i a, __m512i b) { /* each 128 bits: columns a0, a1, b0, b1 */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
static inline __m512i tree_quarters(__m512i a, __m512i b) { /* 128-bit quarters (0+1, 2+3) of a, of b */
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xdd));
}
static inline void tree16_halves(const __m512i v[16], __m512i *y0, __m512i *y1) {
    __m512i u[4];
    for (int g = 0; g < 4; g++)
        u[g] = tree_quads(tree_pairs(v[4 * g], v[4 * g + 1]), tree_pairs(v[4 * g + 2], v[4 * g + 3]));
    *y0 = tree_quarters(u[0], u[1]); /* columns 0-3 (half 0), 0-3 (half 1), 4-7 (half 0), 4-7 (half 1) */
    *y1 = tree_quarters(u[2], u[3]); /* the same for columns 8-15 */
}
/* 16 binary16 values at byte offset `at` of each column's block -> binary32 (vcvtph2ps: exact). `off`
 * holds each column's byte offset from `base`; a 32-bit gather whose low half (or high half) is the
 * value keeps every read inside the block. */
static inline __m512 gather_half(const uint8_t *base, __m512i off, int at, int high) {
    __m512i v = _mm512_i32gather_epi32(off, base + at, 1);
    if (high) v = _mm512_srli_epi32(v, 16);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* -- Q8_0 and Q5_0: 32 weights a block, so one register holds two consecutive blocks of a column (lanes
 * 0-7 block b, 8-15 block b + 1) and the tree gives both blocks' A. The weights are made unsigned for
 * vpdpbusd and the offset is taken out after the tree: Q8_0 q + 128 (xor 0x80, in 0..255),
 * A = Σ (q + 128)·x − 128·bsum32; Q5_0 q in 0..31, A = Σ q·x − 16·bsum32. A lane sums 4 products,
 * |lane| <= 4·255·127: exact int32. */
typedef struct {
    __m512i w[16]; /* per column: blocks b, b + 1 (the second zero when absent) as u8 */
    __m512 d[2];
} tile_q0_vnni;

static inline __m256i q8_0_u8(const block_q8_0 *blk) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk->qs), _mm256_set1_epi8((char)0x80));
}

static inline __m256i q5_0_u8(const block_q5_0 *blk) {
    __m128i qs = _mm_loadu_si128((const __m128i *)blk->qs), low = _mm_set1_epi8(15);
    __m256i nib = _mm256_setr_m128i(_mm_and_si128(qs, low), _mm_and_si128(_mm_srli_epi16(qs, 4), low));
    uint32_t qh;
    memcpy(&qh, blk->qh, 4);
    return _mm256_or_si256(nib, _mm256_maskz_set1_epi8((__mmask32)qh, 16)); /* bit i of qh -> 16 in byte i */
}

static inline void unpack_q0_vnni(int type, const uint8_t *base, const int32_t *offs, int b, int both,
                                  tile_q0_vnni *t) {
    size_t bytes = type == EX_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q5_0);
    const uint8_t *blk0 = base + (size_t)b * bytes;
    for (int c = 0; c < 16; c++) {
        const uint8_t *blk = blk0 + offs[c];
        __m256i w0, w1 = _mm256_setzero_si256();
        if (type == EX_Q8_0) {
            w0 = q8_0_u8((const block_q8_0 *)blk);
            if (both) w1 = q8_0_u8((const block_q8_0 *)(blk + bytes));
        } else {
            w0 = q5_0_u8((const block_q5_0 *)blk);
            if (both) w1 = q5_0_u8((const block_q5_0 *)(blk + bytes));
        }
        t->w[c] = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
    }
    __m512i off = _mm512_loadu_si512(offs);
    t->d[0] = gather_half(blk0, off, 0, 0);
    t->d[1] = both ? gather_half(blk0 + bytes, off, 0, 0) : _mm512_setzero_ps();
}

static inline __m512 row_q0_vnni(int type, const tile_q0_vnni *t, const int8_t *x, const int16_t *bs32,
                                 const float *dx, int both, __m512 acc) {
    __m512i xv = both ? _mm512_loadu_si512(x) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)x));
    __m512i v[16];
    for (int j = 0; j < 16; j++) v[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), t->w[j], xv);
    __m512i y0, y1;
    tree16_halves(v, &y0, &y1);
    int shift = type == EX_Q8_0 ? 7 : 4; /* the offset 128 or 16 */
    for (int h = 0; h < 1 + both; h++) {
        __m512i ai = _mm512_shuffle_i64x2(y0, y1, h ? 0xdd : 0x88);
        ai = _mm512_sub_epi32(ai, _mm512_set1_epi32((int32_t)bs32[h] << shift));
        __m512 cb = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dx[h]), t->d[h]), _mm512_cvtepi32_ps(ai));
        acc = _mm512_add_ps(acc, cb);
    }
    return acc;
}

static inline void store16(float *out, int cols, __m512 v) {
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << cols) - 1), v);
}
#define SWEEP_VNNI(UNPACK, ROW) SWEEP(16, __m512, _mm512_setzero_ps(), store16, UNPACK, ROW)

static void matmul_q0_vnni(int type, const uint8_t *w, int n, int k, const prepared *p, int m, float *out) {
    enum { STEP = 2 };
    int blocks = k / QK_0;
    size_t row_bytes = (size_t)blocks * (type == EX_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q5_0));
    tile_q0_vnni t;
    SWEEP_VNNI(int both = b + 1 < blocks; unpack_q0_vnni(type, base, offs, b, both, &t),
               row_q0_vnni(type, &t, p->q + (size_t)(r0 + r) * k + (size_t)b * QK_0,
                           p->bsums + (size_t)(r0 + r) * blocks + b, p->dx + (size_t)(r0 + r) * blocks + b, both,
                           acc[r]))
}

int ex_matmul_vnni(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    int block = act_block(type);
    if (k % block || n < 0 || m < 0) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, block, scratch, &p, 1);
    if (rc) return rc;
    switch (type) {
    case EX_Q4_K: ex_vnni_lanes_product(type, w, 0, n, k, p.q, p.dx, p.bsums, m, out, n); break;
    case EX_Q6_K: ex_vnni_lanes_product(type, w, 0, n, k, p.q, p.dx, p.bsums16, m, out, n); break;
    default: matmul_q0_vnni(type, w, n, k, &p, m, out); break;
    }
    return EX_OK;
}

#ifdef EX_AMX
/* The AMX path (exact_amx.c) for Q4_K and Q6_K; Q8_0 and Q5_0 take the VNNI one. Only after
 * ex_amx_enable() succeeded in this process (kernel.py sees to it). */
int ex_matmul_amx(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    int block = act_block(type);
    if (k % block || n < 0 || m < 0) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, block, scratch, &p, 1);
    if (rc) return rc;
    void *layout = (char *)scratch + prepared_bytes(m, k);
    switch (type) {
    case EX_Q4_K: ex_amx_product(type, w, 0, n, k, p.q, p.dx, p.bsums, m, out, n, layout); break;
    case EX_Q6_K: ex_amx_product(type, w, 0, n, k, p.q, p.dx, p.bsums16, m, out, n, layout); break;
    default: matmul_q0_vnni(type, w, n, k, &p, m, out); break;
    }
    return EX_OK;
}
#endif
#endif

/* ---- AVX2: 8 columns a tile, vpmaddubsw (u8 weights × s8 activations, pairs of products summed to
 * int16) then vpmaddwd (int16 pairs to int32, against a scale or against ones) ---- */
#if defined(__AVX2__)

/* 8 registers of 8 int32 partial sums -> one register whose lane c is the sum of register c's lanes */
static inline __m256i tree8(const __m256i v[8]) {
    __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

static inline void halves8(const uint8_t *blk0, const int32_t *offs, int at, float *d) {
    for (int c = 0; c < 8; c++) {
        uint16_t h;
        memcpy(&h, blk0 + offs[c] + at, 2);
        d[c] = half_to_float(h);
    }
}

/* -- Q4_K: each 32-byte register of nibbles is one sub-block (chunk c's low nibbles 2c, high 2c + 1);
 * vpmaddubsw pairs: |q·x + q'·x'| <= 2·15·127 = 3810, no saturation; vpmaddwd against the 6-bit scale. */
typedef struct {
    __m256i w[8][8];      /* per column: sub-blocks 0..7 (u8, 0..15) */
    int16_t sc[8][8];     /* per column: sc_0..7 */
    __m256i mins[4];      /* lane c: column c's (m_2p, m_2p+1) as int16 */
    float d[8], dmin[8];
} tile_q4_K_avx2;

static inline void unpack_q4_K_avx2(const uint8_t *base, const int32_t *offs, int b, tile_q4_K_avx2 *t) {
    const __m256i low = _mm256_set1_epi8(15);
    const uint8_t *blk0 = base + (size_t)b * sizeof(block_q4_K);
    int32_t mins[4][8];
    for (int c = 0; c < 8; c++) {
        const block_q4_K *blk = (const block_q4_K *)(blk0 + offs[c]);
        for (int h = 0; h < 4; h++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * h));
            t->w[c][2 * h] = _mm256_and_si256(raw, low);
            t->w[c][2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        }
        uint64_t sc, mn;
        ex_q4_K_scales(blk->scales, &sc, &mn);
        for (int j = 0; j < 8; j++) t->sc[c][j] = (int16_t)((sc >> 8 * j) & 0xff);
        for (int p = 0; p < 4; p++) mins[p][c] = (int32_t)(((mn >> 16 * p) & 0xff) | ((mn >> (16 * p + 8)) & 0xff) << 16);
    }
    for (int p = 0; p < 4; p++) t->mins[p] = _mm256_loadu_si256((const __m256i *)mins[p]);
    halves8(blk0, offs, 0, t->d), halves8(blk0, offs, 2, t->dmin);
}

static inline __m256 row_q4_K_avx2(const tile_q4_K_avx2 *t, const int8_t *x, const int16_t *bs32, float dx,
                                   __m256 acc) {
    __m256i xs[8], v[8];
    for (int j = 0; j < 8; j++) xs[j] = _mm256_loadu_si256((const __m256i *)(x + 32 * j));
    for (int c = 0; c < 8; c++) {
        __m256i s = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++)
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(t->w[c][j], xs[j]),
                                                      _mm256_set1_epi16(t->sc[c][j])));
        v[c] = s;
    }
    int32_t pair[4];
    memcpy(pair, bs32, 16);
    __m256i bi = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) bi = _mm256_add_epi32(bi, _mm256_madd_epi16(t->mins[p], _mm256_set1_epi32(pair[p])));
    __m256 vdx = _mm256_set1_ps(dx);
    __m256 dd = _mm256_mul_ps(vdx, _mm256_loadu_ps(t->d)), dm = _mm256_mul_ps(vdx, _mm256_loadu_ps(t->dmin));
    __m256 cb = _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(tree8(v))), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(bi)));
    return _mm256_add_ps(acc, cb);
}

/* -- Q6_K: register i holds weights 32i .. 32i + 31 as q in 0..63 (its 128-bit halves sub-blocks 2i and
 * 2i + 1); vpmaddubsw pairs: |q·x + q'·x'| <= 2·63·127 = 16002, no saturation; vpmaddwd against the
 * halves' signed scales. The −32: A = Σ sc·Σ q·x − 32·Σ_j sc_j bsum16_j, the last sum by one vpmaddwd
 * (|sc_j·bsum16_j + ...| <= 2·128·2032 < 2^20, so ·32 stays in int32). */
typedef struct {
    __m256i w[8][8];  /* per column: q of weights 32i .. 32i + 31 */
    __m256i s[8][8];  /* per column: int16, the low half sc_2i, the high half sc_2i+1 */
    __m256i sc16[8];  /* per column: sc_0..15 as int16 */
    float d[8];
} tile_q6_K_avx2;

static inline void unpack_q6_K_avx2(const uint8_t *base, const int32_t *offs, int b, tile_q6_K_avx2 *t) {
    const __m256i low = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, /* word 0 of a pair */
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3); /* word 1 */
    const uint8_t *blk0 = base + (size_t)b * sizeof(block_q6_K);
    for (int c = 0; c < 8; c++) {
        const block_q6_K *blk = (const block_q6_K *)(blk0 + offs[c]);
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
            /* s = 0..3: weights 128h + 32s + l; low bits from l0/l1's nibbles, high bits qh >> 2s */
            t->w[c][4 * h] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top));
            t->w[c][4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top));
            t->w[c][4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(qh, top));
            t->w[c][4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), top));
        }
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
        t->sc16[c] = sc;
        for (int i = 0; i < 8; i++) /* dword i of sc is (sc_2i, sc_2i+1): spread it over the two halves */
            t->s[c][i] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(i)), halves);
    }
    halves8(blk0, offs, 208, t->d);
}

static inline __m256 row_q6_K_avx2(const tile_q6_K_avx2 *t, const int8_t *x, const int16_t *bs16, float dx,
                                   __m256 acc) {
    __m256i xs[8], v[8], bs = _mm256_loadu_si256((const __m256i *)bs16);
    for (int i = 0; i < 8; i++) xs[i] = _mm256_loadu_si256((const __m256i *)(x + 32 * i));
    for (int c = 0; c < 8; c++) {
        __m256i s = _mm256_slli_epi32(_mm256_madd_epi16(t->sc16[c], bs), 5);
        s = _mm256_sub_epi32(_mm256_setzero_si256(), s);
        for (int i = 0; i < 8; i++)
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(t->w[c][i], xs[i]), t->s[c][i]));
        v[c] = s;
    }
    __m256 cb = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dx), _mm256_loadu_ps(t->d)), _mm256_cvtepi32_ps(tree8(v)));
    return _mm256_add_ps(acc, cb);
}

/* -- Q8_0: vpmaddubsw needs an unsigned operand: |q| (0..128) against x with q's sign (vpsignb; |x| <=
 * 127, so the negation is exact): pairs |..| <= 2·128·127 = 32512, no saturation. Q5_0: q in 0..31,
 * pairs <= 2·31·127, and A = Σ q·x − 16·bsum32. One block a step. */
typedef struct {
    __m256i w[8], sign[8]; /* per column: the unsigned operand; Q8_0's q for vpsignb */
    float d[8];
} tile_q0_avx2;

static inline __m256i q5_0_u8_avx2(const block_q5_0 *blk) {
    __m128i qs = _mm_loadu_si128((const __m128i *)blk->qs), low = _mm_set1_epi8(15);
    __m256i nib = _mm256_setr_m128i(_mm_and_si128(qs, low), _mm_and_si128(_mm_srli_epi16(qs, 4), low));
    uint32_t qh;
    memcpy(&qh, blk->qh, 4);
    /* byte i <- bit i of qh: byte i/8 of qh into byte i, tested against 1 << (i % 8) */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                            3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

static inline void unpack_q0_avx2(int type, const uint8_t *base, const int32_t *offs, int b, tile_q0_avx2 *t) {
    size_t bytes = type == EX_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q5_0);
    const uint8_t *blk0 = base + (size_t)b * bytes;
    for (int c = 0; c < 8; c++) {
        const uint8_t *blk = blk0 + offs[c];
        if (type == EX_Q8_0) {
            __m256i q = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs);
            t->w[c] = _mm256_abs_epi8(q), t->sign[c] = q;
        } else {
            t->w[c] = q5_0_u8_avx2((const block_q5_0 *)blk);
        }
    }
    halves8(blk0, offs, 0, t->d);
}

static inline __m256 row_q0_avx2(int type, const tile_q0_avx2 *t, const int8_t *x, const int16_t *bs32, float dx,
                                 __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xv = _mm256_loadu_si256((const __m256i *)x), v[8];
    for (int c = 0; c < 8; c++) {
        __m256i xs = type == EX_Q8_0 ? _mm256_sign_epi8(xv, t->sign[c]) : xv;
        v[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(t->w[c], xs), ones);
    }
    __m256i ai = tree8(v);
    if (type == EX_Q5_0) ai = _mm256_sub_epi32(ai, _mm256_set1_epi32((int32_t)bs32[0] << 4));
    __m256 cb = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dx), _mm256_loadu_ps(t->d)), _mm256_cvtepi32_ps(ai));
    return _mm256_add_ps(acc, cb);
}

static inline void store8(float *out, int cols, __m256 v) {
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(out, _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lanes), v);
}
#define SWEEP_AVX2(UNPACK, ROW) SWEEP(8, __m256, _mm256_setzero_ps(), store8, UNPACK, ROW)

static void matmul_q4_K_avx2(const uint8_t *w, int n, int k, const prepared *p, int m, float *out) {
    enum { STEP = 1 };
    int blocks = k / QK_K;
    size_t row_bytes = (size_t)blocks * sizeof(block_q4_K);
    tile_q4_K_avx2 t;
    SWEEP_AVX2(unpack_q4_K_avx2(base, offs, b, &t),
               row_q4_K_avx2(&t, p->q + (size_t)(r0 + r) * k + (size_t)b * QK_K,
                             p->bsums + ((size_t)(r0 + r) * k + (size_t)b * QK_K) / 32,
                             p->dx[(size_t)(r0 + r) * blocks + b], acc[r]))
}

static void matmul_q6_K_avx2(const uint8_t *w, int n, int k, const prepared *p, int m, float *out) {
    enum { STEP = 1 };
    int blocks = k / QK_K;
    size_t row_bytes = (size_t)blocks * sizeof(block_q6_K);
    tile_q6_K_avx2 t;
    SWEEP_AVX2(unpack_q6_K_avx2(base, offs, b, &t),
               row_q6_K_avx2(&t, p->q + (size_t)(r0 + r) * k + (size_t)b * QK_K,
                             p->bsums16 + ((size_t)(r0 + r) * k + (size_t)b * QK_K) / 16,
                             p->dx[(size_t)(r0 + r) * blocks + b], acc[r]))
}

static void matmul_q0_avx2(int type, const uint8_t *w, int n, int k, const prepared *p, int m, float *out) {
    enum { STEP = 1 };
    int blocks = k / QK_0;
    size_t row_bytes = (size_t)blocks * (type == EX_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q5_0));
    tile_q0_avx2 t;
    SWEEP_AVX2(unpack_q0_avx2(type, base, offs, b, &t),
               row_q0_avx2(type, &t, p->q + (size_t)(r0 + r) * k + (size_t)b * QK_0,
                           p->bsums + (size_t)(r0 + r) * blocks + b, p->dx[(size_t)(r0 + r) * blocks + b], acc[r]))
}

int ex_matmul_avx2(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    int block = act_block(type);
    if (k % block || n < 0 || m < 0) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, block, scratch, &p, 0);
    if (rc) return rc;
    switch (type) {
    case EX_Q4_K: matmul_q4_K_avx2(w, n, k, &p, m, out); break;
    case EX_Q6_K: matmul_q6_K_avx2(w, n, k, &p, m, out); break;
    default: matmul_q0_avx2(type, w, n, k, &p, m, out); break;
    }
    return EX_OK;
}
#endif
