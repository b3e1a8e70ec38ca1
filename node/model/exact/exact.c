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

/* levels [m, k], then the scales [m, k / 32] (at most), then the sub-block sums [m, k / 32] */
size_t ex_scratch_bytes(int m, int k) { return (size_t)m * k + (size_t)m * (k / QK_0) * 6 + 64; }

/* §3 for every row of the pass into scratch: levels q [m, k], scales dx [m, k / block], and, where
 * `bsums` is asked for, each sub-block of 32's sum of levels [m, k / 32] (Q4_K's mins). */
typedef struct { int8_t *q; float *dx; int16_t *bsums; } prepared;

static int prepare_rows(const float *x, int m, int k, int block, void *scratch, prepared *p) {
    int blocks = k / block;
    p->q = scratch;
    p->dx = (float *)((char *)scratch + (((size_t)m * k + 63) & ~(size_t)63));
    p->bsums = (int16_t *)(p->dx + (size_t)m * blocks);
    for (int r = 0; r < m; r++) {
        int rc = quantize_row(x + (size_t)r * k, k, block, p->q + (size_t)r * k, p->dx + (size_t)r * blocks);
        if (rc) return rc;
    }
    for (size_t i = 0; i < (size_t)m * k / 32; i++) {
        int total = 0;
        for (int l = 0; l < 32; l++) total += p->q[32 * i + l];
        p->bsums[i] = (int16_t)total;
    }
    return EX_OK;
}

/* The scalar reference product: out [m, n] row-major; scratch of ex_scratch_bytes(m, k). */
int ex_matmul_ref(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    int block = act_block(type), blocks = k / block;
    if (k % block) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, block, scratch, &p);
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

/* ---- AVX2: the same integers by vpmaddubsw (u8 × s8 pairs, |sum| ≤ 2·15·127: no saturation), then
 * vpmaddwd against the sub-block's scale (exact int32) ---- */
#if defined(__AVX2__)
#include <immintrin.h>

static int32_t hsum_epi32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static float block_q4_K_avx2(const block_q4_K *w, const int8_t *x, const int16_t *bsums, float dx) {
    const __m256i low_mask = _mm256_set1_epi8(15);
    __m256i a = _mm256_setzero_si256();
    int32_t bi = 0;
    for (int c = 0; c < 4; c++) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * c));
        __m256i lo = _mm256_and_si256(raw, low_mask), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
        int s0, m0, s1, m1;
        q4_k_scale_min(w->scales, 2 * c, &s0, &m0);
        q4_k_scale_min(w->scales, 2 * c + 1, &s1, &m1);
        __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * c)));
        __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * c + 32)));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(p0, _mm256_set1_epi16((short)s0)));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)s1)));
        bi += m0 * bsums[2 * c] + m1 * bsums[2 * c + 1];
    }
    float d = half_to_float(w->d), dmin = half_to_float(w->dmin);
    return (dx * d) * (float)hsum_epi32_256(a) - (dx * dmin) * (float)bi;
}
#endif

/* ---- AVX-512 VNNI: the same integers by vpdpbusd (u8 weights × s8 activations, exact int32) ---- */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

/* Q4_K: chunk c's 64 weights are one register (low nibbles: sub-block 2c; high: 2c + 1), lanes 0-7 of
 * the products belong to sub-block 2c and lanes 8-15 to 2c + 1; each lane is scaled by its
 * sub-block's 6-bit scale (and, for B, its min) before the integer sums. */
static float block_q4_K_vnni(const __m512i wq[4], const __m512i sc[4], const int mins[8], float d, float dmin,
                             const int8_t *x, const int16_t *bsums, float dx) {
    __m512i a = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[c], _mm512_loadu_si512(x + 64 * c));
        a = _mm512_add_epi32(a, _mm512_mullo_epi32(dot, sc[c]));
    }
    int32_t ai = _mm512_reduce_add_epi32(a), bi = 0; /* integers: any order */
    for (int j = 0; j < 8; j++) bi += mins[j] * bsums[j];
    return (dx * d) * (float)ai - (dx * dmin) * (float)bi;
}

static void unpack_q4_K(const block_q4_K *w, __m512i wq[4], __m512i sc[4], int mins[8]) {
    const __m256i low_mask = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * c));
        __m256i lo = _mm256_and_si256(raw, low_mask), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
        wq[c] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        int s0, m0, s1, m1;
        q4_k_scale_min(w->scales, 2 * c, &s0, &m0);
        q4_k_scale_min(w->scales, 2 * c + 1, &s1, &m1);
        sc[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(s0)), _mm256_set1_epi32(s1), 1);
        mins[2 * c] = m0, mins[2 * c + 1] = m1;
    }
}

int ex_matmul_vnni(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    if (type != EX_Q4_K) return ex_matmul_ref(type, w, n, k, x, m, out, scratch);
    int blocks = k / QK_K;
    if (k % QK_K) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, QK_K, scratch, &p);
    if (rc) return rc;
    int8_t *q = p.q;
    float *dx = p.dx;
    int16_t *bsums = p.bsums;
    enum { MAX_ROWS = 64 };
    float acc[MAX_ROWS];
    for (int r0 = 0; r0 < m; r0 += MAX_ROWS) {
        int rows = m - r0 < MAX_ROWS ? m - r0 : MAX_ROWS;
        for (int j = 0; j < n; j++) {
            const block_q4_K *row = (const block_q4_K *)(w + (size_t)j * blocks * sizeof(block_q4_K));
            for (int r = 0; r < rows; r++) acc[r] = 0.0f;
            for (int b = 0; b < blocks; b++) { /* each block unpacked once for every row of the pass */
                __m512i wq[4], sc[4];
                int mins[8];
                unpack_q4_K(row + b, wq, sc, mins);
                float d = half_to_float(row[b].d), dmin = half_to_float(row[b].dmin);
                for (int r = 0; r < rows; r++) {
                    size_t at = (size_t)(r0 + r) * k + (size_t)b * QK_K;
                    acc[r] = acc[r] + block_q4_K_vnni(wq, sc, mins, d, dmin, q + at, bsums + at / 32,
                                                      dx[(size_t)(r0 + r) * blocks + b]);
                }
            }
            for (int r = 0; r < rows; r++) out[(size_t)(r0 + r) * n + j] = acc[r];
        }
    }
    return EX_OK;
}
#endif

#if defined(__AVX2__)
int ex_matmul_avx2(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, void *scratch) {
    if (type != EX_Q4_K) return ex_matmul_ref(type, w, n, k, x, m, out, scratch);
    int blocks = k / QK_K;
    if (k % QK_K) return EX_BAD_SHAPE;
    prepared p;
    int rc = prepare_rows(x, m, k, QK_K, scratch, &p);
    if (rc) return rc;
    int8_t *q = p.q;
    float *dx = p.dx;
    int16_t *bsums = p.bsums;
    for (int j = 0; j < n; j++) {
        const block_q4_K *row = (const block_q4_K *)(w + (size_t)j * blocks * sizeof(block_q4_K));
        for (int r = 0; r < m; r++) {
            float s = 0.0f;
            for (int b = 0; b < blocks; b++) {
                size_t at = (size_t)r * k + (size_t)b * QK_K;
                s = s + block_q4_K_avx2(row + b, q + at, bsums + at / 32, dx[(size_t)r * blocks + b]);
            }
            out[(size_t)r * n + j] = s;
        }
    }
    return EX_OK;
}
#endif
