/* The exact arithmetic's operations besides the block products (docs/exact-arithmetic.md §5-10),
 * specmarket-exact/1: FOLD16, exp, SiLU, the square root, RMSNorm, RoPE from stored tables,
 * attention over a binary32 KV cache (a chain or a tree of rows), and the embedding's dequantized
 * rows. Every binary32 operation below is the specification's, in its order: built with
 * -ffp-contract=off and without -ffast-math, so the compiler may vectorize across independent
 * outputs or lanes but never reassociate or fuse. node/model/exact/reference.py is the oracle
 * (tests/test_exact_model.py compares them bit for bit).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FOLD_LANES 16
#define EXP_MIN (-87.0f)
#define EXP_MAX 88.0f
#define EXP_DEGREE 7

static float bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* §5: acc_l = +0; acc_{i mod 16} += a_i in order; then the tree 8, 4, 2, 1. */
static float fold16_finish(float acc[FOLD_LANES]) {
    for (int w = FOLD_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

/* FOLD16 of x_i · y_i over n values (each product rounded, then folded) */
static float fold16_dot(const float *x, const float *y, int n) {
    float acc[FOLD_LANES] = {0};
    int i = 0;
    for (; i + FOLD_LANES <= n; i += FOLD_LANES)
        for (int l = 0; l < FOLD_LANES; l++) acc[l] = acc[l] + x[i + l] * y[i + l];
    for (int l = 0; i + l < n; l++) acc[l] = acc[l] + x[i + l] * y[i + l];
    return fold16_finish(acc);
}

static float fold16_sum(const float *a, int n) {
    float acc[FOLD_LANES] = {0};
    int i = 0;
    for (; i + FOLD_LANES <= n; i += FOLD_LANES)
        for (int l = 0; l < FOLD_LANES; l++) acc[l] = acc[l] + a[i + l];
    for (int l = 0; i + l < n; l++) acc[l] = acc[l] + a[i + l];
    return fold16_finish(acc);
}

/* §6: Cody–Waite reduction with Cephes' constants, Taylor's degree-7 polynomial, 2^n from its bits */
static const float EXP_COEF[EXP_DEGREE + 1] = {
    1.0f, 1.0f, 1.0f / 2, (float)(1.0 / 6), (float)(1.0 / 24), (float)(1.0 / 120), (float)(1.0 / 720),
    (float)(1.0 / 5040),
}; /* 1/k!, each the binary32 nearest (the divisions are in binary64, then rounded once) */

static inline float exact_exp(float x) {
    const float log2e = bits_to_float(0x3FB8AA3Bu), c1 = bits_to_float(0x3F318000u), c2 = bits_to_float(0xB95E8083u);
    x = x < EXP_MIN ? EXP_MIN : x > EXP_MAX ? EXP_MAX : x;
    float n = rintf(x * log2e); /* to nearest, ties to even (the default mode) */
    float r = x - n * c1;
    r = r - n * c2;
    float p = EXP_COEF[EXP_DEGREE];
    for (int k = EXP_DEGREE - 1; k >= 0; k--) p = p * r + EXP_COEF[k];
    return p * bits_to_float((uint32_t)((int32_t)n + 127) << 23);
}

/* §7: the correctly rounded binary32 square root (binary64, rounded once: 53 >= 2·24 + 2 bits) */
static inline float sqrt_rn(float v) { return (float)sqrt((double)v); }

void ex_exp(const float *x, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = exact_exp(x[i]);
}

/* §7: y = fl(fl(x · inv) · w), inv = 1 / sqrt(fl(FOLD16(x²) / n) + ε), row by row */
void ex_rms_norm(const float *x, const float *w, float *out, int rows, int n, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *o = out + (size_t)r * n;
        float v = fold16_dot(xr, xr, n) / (float)n + eps;
        float inv = 1.0f / sqrt_rn(v);
        for (int i = 0; i < n; i++) o[i] = (xr[i] * inv) * w[i];
    }
}

/* §6: out = fl(silu(g) · u), silu(g) = fl(g / fl(1 + exp(-g))); gate and up rows `stride` apart */
void ex_silu_mul(const float *gate, const float *up, float *out, int rows, int width, int stride) {
    for (int r = 0; r < rows; r++) {
        const float *g = gate + (size_t)r * stride, *u = up + (size_t)r * stride;
        float *o = out + (size_t)r * width;
        for (int i = 0; i < width; i++) o[i] = (g[i] / (1.0f + exact_exp(-g[i]))) * u[i];
    }
}

/* §9, in place: row m's heads (head_dim floats each, rows `row_stride` apart) rotated by halves with
 * cos and sin [rows, head_dim / 2] (the stored tables at each row's position). */
void ex_rope(float *x, int row_stride, int rows, int heads, int head_dim, const float *cos, const float *sin) {
    int half = head_dim / 2;
    for (int m = 0; m < rows; m++) {
        const float *c = cos + (size_t)m * half, *s = sin + (size_t)m * half;
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)m * row_stride + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[half + i];
                v[i] = a * c[i] - b * s[i];
                v[half + i] = b * c[i] + a * s[i];
            }
        }
    }
}

static inline int key_at(int j, int start, const int *seen) { return seen == NULL || j < start ? j : seen[j - start]; }

#if defined(__AVX512F__)
#include <immintrin.h>

/* FOLD16 of q · k_j for 16 keys at once, head_dim a multiple of 16: key r's 16 lanes are one
 * register (acc_l += q_i · k_i for i ≡ l mod 16, in order), then the tree 8, 4, 2, 1 runs on pairs
 * of registers after shuffles, so each addition is one of FOLD16's own: fl(acc_l + acc_{l+w}). */
static __m512 fold16_dot16(const float *q, const float *const k[16], int head_dim) {
    __m512 a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
    for (int i = 0; i < head_dim; i += 16) { /* 16 independent chains: throughput, not latency */
        __m512 qi = _mm512_loadu_ps(q + i);
        for (int r = 0; r < 16; r++) a[r] = _mm512_add_ps(a[r], _mm512_mul_ps(qi, _mm512_loadu_ps(k[r] + i)));
    }
    __m512 t[8], u[4], v[2];
    for (int p = 0; p < 8; p++) /* w = 8: lanes 0-7 key 2p, 8-15 key 2p + 1 */
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; p++) /* w = 4: quarter c holds key 4p + c */
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; p++) /* w = 2: quarter c holds keys 8p + c (lanes 0-1) and 8p + 4 + c (2-3) */
        v[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xEE));
    /* w = 1: lane 4c + r holds key c + 4r */
    __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, w); /* lane j: key j */
}
#endif

/* s_j = fl(FOLD16(q · k_j) · scale) for the n keys a row sees, into e; returns max_j s_j */
static float scores(const float *q, const float *keys, int head_dim, int n, int start, const int *seen, float scale,
                    float *e) {
    int j = 0;
    float m = -INFINITY; /* a maximum is exact in any order */
#if defined(__AVX512F__)
    if (head_dim % 16 == 0) {
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (; j + 16 <= n; j += 16) {
            const float *k[16];
            for (int r = 0; r < 16; r++) k[r] = keys + (size_t)key_at(j + r, start, seen) * head_dim;
            __m512 s = _mm512_mul_ps(fold16_dot16(q, k, head_dim), _mm512_set1_ps(scale));
            _mm512_storeu_ps(e + j, s);
            top = _mm512_max_ps(top, s);
        }
        m = _mm512_reduce_max_ps(top);
    }
#endif
    for (; j < n; j++) {
        e[j] = fold16_dot(q, keys + (size_t)key_at(j, start, seen) * head_dim, head_dim) * scale;
        m = e[j] > m ? e[j] : m;
    }
    return m;
}

#define MAX_HEAD_DIM 256

#if defined(__AVX512F__)
/* o_i = fl(a_i / Z), a_i = fl(a_i + fl(e_j · v_{j,i})) in key order, for a head of 128: the eight
 * accumulators stay in registers across the keys */
static void weigh_values_128(const float *values, const float *e, int n, int start, const int *seen, float z,
                             float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < n; j++) {
        const float *v = values + (size_t)key_at(j, start, seen) * 128;
        __m512 ej = _mm512_set1_ps(e[j]);
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(ej, _mm512_loadu_ps(v)));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 16)));
        a2 = _mm512_add_ps(a2, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 32)));
        a3 = _mm512_add_ps(a3, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 48)));
        a4 = _mm512_add_ps(a4, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 64)));
        a5 = _mm512_add_ps(a5, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 80)));
        a6 = _mm512_add_ps(a6, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 96)));
        a7 = _mm512_add_ps(a7, _mm512_mul_ps(ej, _mm512_loadu_ps(v + 112)));
    }
    __m512 zv = _mm512_set1_ps(z);
    __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int c = 0; c < 8; c++) _mm512_storeu_ps(out + 16 * c, _mm512_div_ps(acc[c], zv));
}
#endif

/* §8 for one query head against n keys (the cache positions key_at(j), j in order) */
static void attend_head(const float *q, const float *keys, const float *values, int head_dim, int n, int start,
                        const int *seen, float scale, float *e, float *out) {
    float m = scores(q, keys, head_dim, n, start, seen, scale, e);
    for (int j = 0; j < n; j++) e[j] = exact_exp(e[j] - m);
    float z = fold16_sum(e, n);
#if defined(__AVX512F__)
    if (head_dim == 128) {
        weigh_values_128(values, e, n, start, seen, z, out);
        return;
    }
#endif
    float acc[MAX_HEAD_DIM] = {0}; /* +0: a_i = fl(a_i + fl(e_j · v_{j,i})) in key order */
    for (int j = 0; j < n; j++) {
        const float *v = values + (size_t)key_at(j, start, seen) * head_dim;
        float ej = e[j];
        for (int i = 0; i < head_dim; i++) acc[i] = acc[i] + ej * v[i];
    }
    for (int i = 0; i < head_dim; i++) out[i] = acc[i] / z;
}

/* §8, GQA: query row m (q rows `q_stride` apart, `heads` heads) sees the cache's positions 0 .. start
 * - 1, then (a chain, visible NULL) start .. start + m, or (a tree) the cache positions
 * visible[offsets[m]] .. visible[offsets[m + 1] - 1]: its ancestors root first, then itself. A node
 * therefore goes through exactly the operations of its path scored as a chain. keys and values are
 * [kv_heads, capacity, head_dim]; out [rows, heads · head_dim]; scratch holds start + rows floats. */
void ex_attention(const float *q, int q_stride, const float *keys, const float *values, int capacity, float *out,
                  int rows, int start, int heads, int kv_heads, int head_dim, float scale, float *scratch,
                  const int *offsets, const int *visible) {
    int group = heads / kv_heads;
    for (int m = 0; m < rows; m++) {
        const int *seen = visible == NULL ? NULL : visible + offsets[m];
        int n = start + (visible == NULL ? m + 1 : offsets[m + 1] - offsets[m]);
        for (int h = 0; h < heads; h++) {
            size_t kv = (size_t)(h / group) * capacity * head_dim;
            attend_head(q + (size_t)m * q_stride + (size_t)h * head_dim, keys + kv, values + kv, head_dim, n, start,
                        seen, scale, scratch, out + (size_t)m * heads * head_dim + (size_t)h * head_dim);
        }
    }
}
