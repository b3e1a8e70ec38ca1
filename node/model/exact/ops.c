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

/* §8 for one query head against n keys (the cache positions pos(j), j in order): scores into e */
static void attend_head(const float *q, const float *keys, const float *values, int head_dim, int n, int start,
                        const int *seen, float scale, float *e, float *out) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++) {
        int at = seen == NULL || j < start ? j : seen[j - start];
        e[j] = fold16_dot(q, keys + (size_t)at * head_dim, head_dim) * scale;
        m = e[j] > m ? e[j] : m;
    }
    for (int j = 0; j < n; j++) e[j] = exact_exp(e[j] - m);
    float z = fold16_sum(e, n);
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        int at = seen == NULL || j < start ? j : seen[j - start];
        const float *v = values + (size_t)at * head_dim;
        for (int i = 0; i < head_dim; i++) out[i] = out[i] + e[j] * v[i];
    }
    for (int i = 0; i < head_dim; i++) out[i] = out[i] / z;
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
