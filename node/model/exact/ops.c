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
#include <stdlib.h>
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

/* §10's embedding: rows `ids` of a Q4_K (type 2) or Q6_K (type 3) matrix [n, k] dequantized into out
 * [rows, k]: Q4_K fl(fl(fl(d · sc_j) · q_i) − fl(dmin · m_j)), Q6_K fl(fl(d · sc_j) · f32(q_i − 32)), with
 * §2's integers (exact.c's block layouts). 0, or 2 for another type, k or an id outside [0, n). */
static float half_bits(const uint8_t *at) {
    uint16_t h;
    memcpy(&h, at, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | mant << 13);
    if (exp != 0) return bits_to_float(sign | (exp + 112) << 23 | mant << 13);
    float f = (float)mant * bits_to_float(0x33800000u); /* 2^-24: subnormal halves, exact */
    return sign ? -f : f;
}

int ex_embed(int type, const uint8_t *w, int n, int k, const int64_t *ids, int rows, float *out) {
    if ((type != 2 && type != 3) || k % 256) return 2;
    for (int r = 0; r < rows; r++)
        if (ids[r] < 0 || ids[r] >= n) return 2;
    size_t bytes = type == 2 ? 144 : 210, blocks = (size_t)k / 256;
    for (int r = 0; r < rows; r++)
        for (size_t b = 0; b < blocks; b++) {
            const uint8_t *blk = w + ((size_t)ids[r] * blocks + b) * bytes;
            float *o = out + (size_t)r * k + 256 * b;
            if (type == 2) {
                const uint8_t *s = blk + 4, *qs = blk + 16;
                float d = half_bits(blk), dmin = half_bits(blk + 2);
                for (int j = 0; j < 8; j++) {
                    int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
                    int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
                    float scale = d * (float)sc, min = dmin * (float)m;
                    const uint8_t *chunk = qs + 32 * (j / 2);
                    for (int l = 0; l < 32; l++) o[32 * j + l] = scale * (float)((chunk[l] >> 4 * (j % 2)) & 15) - min;
                }
            } else {
                const uint8_t *ql = blk, *qh = blk + 128;
                const int8_t *sc = (const int8_t *)(blk + 192);
                float d = half_bits(blk + 208);
                for (int i = 0; i < 256; i++) {
                    int c = i / 128, p = (i % 128) / 32, l = i % 32;
                    int low = (ql[64 * c + 32 * (p & 1) + l] >> 4 * (p >> 1)) & 15, high = (qh[32 * c + l] >> 2 * p) & 3;
                    int q = low | high << 4;
                    o[i] = (d * (float)sc[i / 16]) * (float)(q - 32);
                }
            }
        }
    return 0;
}

/* The pass's keys and values (each row's kv_heads heads after its q_size query values in qkv, keys then
 * values) into the caches [kv_heads, capacity, head_dim] at positions start, start + 1, ...: copies, in
 * one call rather than a few torch slicing ops per layer. */
void ex_store_kv(const float *qkv, int row_stride, int rows, int q_size, int kv_heads, int head_dim, float *keys,
                 float *values, int capacity, int start) {
    size_t kv_size = (size_t)kv_heads * head_dim, bytes = (size_t)head_dim * sizeof(float);
    for (int h = 0; h < kv_heads; h++)
        for (int m = 0; m < rows; m++) {
            const float *row = qkv + (size_t)m * row_stride + q_size + (size_t)h * head_dim;
            size_t at = ((size_t)h * capacity + start + m) * head_dim;
            memcpy(keys + at, row, bytes);
            memcpy(values + at, row + kv_size, bytes);
        }
}

static inline int key_at(int j, int start, const int *seen) { return seen == NULL || j < start ? j : seen[j - start]; }

/* Attention (§8) runs one KV head's query heads together, a sweep of up to SWEEP_HEADS heads of one
 * query row: every key and value is then loaded from memory once per sweep instead of once per head,
 * while each head's own operations stay those of §8, in its order (which loads are shared and how
 * the loops nest is all that differs from attending head by head). */
#define SWEEP_HEADS 8
#define MAX_HEAD_DIM 256

#if defined(__AVX512F__)
#include <immintrin.h>

/* FOLD16 of q · k_j for 16 keys at once, head_dim a multiple of 16: key r's 16 lanes are one
 * register (acc_l += q_i · k_i for i ≡ l mod 16, in order), then the tree 8, 4, 2, 1 runs on pairs
 * of registers after shuffles, so each addition is one of FOLD16's own: fl(acc_l + acc_{l+w}). */
static inline __m512 fold16_dot16(const float *q, const float *const k[16], int head_dim) {
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

/* the keys at list positions j .. j + 15; past n (a tail) the last key again: its lanes are scored
 * but never kept, each lane's FOLD16 being its own */
static void key_block(const float *keys, int head_dim, int j, int n, int start, const int *seen, const float *k[16]) {
    for (int r = 0; r < 16; r++) k[r] = keys + (size_t)key_at(j + r < n ? j + r : n - 1, start, seen) * head_dim;
}

/* scores_sweep's 16-key blocks, head_dim a multiple of 16: a block is loaded once and scored for every
 * head while it sits in L1. top_t is the maximum over the whole blocks (a register's, then its
 * reduction), then the tail's keys one by one: the order the scalar path takes them in. */
static void scores_sweep16(const float *q, const float *keys, int head_dim, int nh, int n, int start,
                           const int *seen, float scale, float *e, float *top) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 best[SWEEP_HEADS];
    for (int t = 0; t < nh; t++) best[t] = _mm512_set1_ps(-INFINITY);
    const float *k[16];
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        key_block(keys, head_dim, j, n, start, seen, k);
        for (int t = 0; t < nh; t++) {
            __m512 s = _mm512_mul_ps(fold16_dot16(q + (size_t)t * head_dim, k, head_dim), sc);
            _mm512_storeu_ps(e + (size_t)t * n + j, s);
            best[t] = _mm512_max_ps(best[t], s);
        }
    }
    for (int t = 0; t < nh; t++) top[t] = _mm512_reduce_max_ps(best[t]);
    if (j == n) return;
    key_block(keys, head_dim, j, n, start, seen, k);
    __mmask16 keep = (__mmask16)((1u << (n - j)) - 1);
    for (int t = 0; t < nh; t++) {
        float *et = e + (size_t)t * n;
        _mm512_mask_storeu_ps(et + j, keep, _mm512_mul_ps(fold16_dot16(q + (size_t)t * head_dim, k, head_dim), sc));
        for (int i = j; i < n; i++) top[t] = et[i] > top[t] ? et[i] : top[t];
    }
}

/* weigh_values for NH heads (a constant once inlined, so that the 4·NH accumulators live in registers)
 * and the 64 dims c .. c + 63: v_j's 64 floats are loaded once for all NH heads */
static inline __attribute__((always_inline)) void weigh_values64(const float *values, int head_dim, int c,
                                                                 const float *e, int n, int start, const int *seen,
                                                                 const float *z, float *out, const int NH) {
    __m512 a[6][4]; /* 24 accumulators, 4 values and a weight: 29 of the 32 registers */
    for (int t = 0; t < NH; t++)
        for (int u = 0; u < 4; u++) a[t][u] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const float *v = values + (size_t)key_at(j, start, seen) * head_dim + c;
        __m512 vu[4];
        for (int u = 0; u < 4; u++) vu[u] = _mm512_loadu_ps(v + 16 * u);
        for (int t = 0; t < NH; t++) {
            __m512 ej = _mm512_set1_ps(e[(size_t)t * n + j]);
            for (int u = 0; u < 4; u++) a[t][u] = _mm512_add_ps(a[t][u], _mm512_mul_ps(ej, vu[u]));
        }
    }
    for (int t = 0; t < NH; t++)
        for (int u = 0; u < 4; u++)
            _mm512_storeu_ps(out + (size_t)t * head_dim + c + 16 * u, _mm512_div_ps(a[t][u], _mm512_set1_ps(z[t])));
}

/* weigh_values with head_dim a multiple of 64: heads 6 at a time, dims 64 at a time */
static void weigh_values_avx512(const float *values, int head_dim, const float *e, int nh, int n, int start,
                                const int *seen, const float *z, float *out) {
    for (int t = 0; t < nh; t += 6) {
        const float *et = e + (size_t)t * n;
        float *ot = out + (size_t)t * head_dim;
        for (int c = 0; c < head_dim; c += 64) switch (nh - t < 6 ? nh - t : 6) {
            case 1: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 1); break;
            case 2: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 2); break;
            case 3: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 3); break;
            case 4: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 4); break;
            case 5: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 5); break;
            default: weigh_values64(values, head_dim, c, et, n, start, seen, z + t, ot, 6); break;
            }
    }
}
#endif

/* s_{t,j} = fl(FOLD16(q_t · k_j) · scale) for nh heads (q_t = q + t · head_dim) and the n keys their
 * row sees, into e_t = e + t · n; top_t = max_j s_{t,j} (a maximum is exact in any order) */
static void scores_sweep(const float *q, const float *keys, int head_dim, int nh, int n, int start, const int *seen,
                         float scale, float *e, float *top) {
#if defined(__AVX512F__)
    if (head_dim % 16 == 0) {
        scores_sweep16(q, keys, head_dim, nh, n, start, seen, scale, e, top);
        return;
    }
#endif
    for (int t = 0; t < nh; t++) top[t] = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *k = keys + (size_t)key_at(j, start, seen) * head_dim;
        for (int t = 0; t < nh; t++) {
            float s = fold16_dot(q + (size_t)t * head_dim, k, head_dim) * scale;
            e[(size_t)t * n + j] = s;
            top[t] = s > top[t] ? s : top[t];
        }
    }
}

/* e_j = exp(fl(s_j − m)) in place; returns Z = FOLD16(e_j) */
static float softmax_weights(float *e, int n, float m) {
    for (int j = 0; j < n; j++) e[j] = exact_exp(e[j] - m);
    return fold16_sum(e, n);
}

/* o_{t,i} = fl(a_{t,i} / Z_t), a_{t,i} = fl(a_{t,i} + fl(e_{t,j} · v_{j,i})) in key order, for nh heads */
static void weigh_values(const float *values, int head_dim, const float *e, int nh, int n, int start,
                         const int *seen, const float *z, float *out) {
#if defined(__AVX512F__)
    if (head_dim % 64 == 0) {
        weigh_values_avx512(values, head_dim, e, nh, n, start, seen, z, out);
        return;
    }
#endif
    for (int t = 0; t < nh; t++) {
        float acc[MAX_HEAD_DIM] = {0}; /* +0 */
        const float *et = e + (size_t)t * n;
        for (int j = 0; j < n; j++) {
            const float *v = values + (size_t)key_at(j, start, seen) * head_dim;
            for (int i = 0; i < head_dim; i++) acc[i] = acc[i] + et[j] * v[i];
        }
        for (int i = 0; i < head_dim; i++) out[(size_t)t * head_dim + i] = acc[i] / z[t];
    }
}

/* §8 for nh query heads of one row that share a KV head, against the n keys the row sees (the cache
 * positions key_at(j), j in order); e holds nh · n floats */
static void attend_sweep(const float *q, const float *keys, const float *values, int head_dim, int nh, int n,
                         int start, const int *seen, float scale, float *e, float *out) {
    float top[SWEEP_HEADS], z[SWEEP_HEADS];
    scores_sweep(q, keys, head_dim, nh, n, start, seen, scale, e, top);
    for (int t = 0; t < nh; t++) z[t] = softmax_weights(e + (size_t)t * n, n, top[t]);
    weigh_values(values, head_dim, e, nh, n, start, seen, z, out);
}

/* §8, GQA: query row m (q rows `q_stride` apart, `heads` heads) sees the cache's positions 0 .. start
 * - 1, then (a chain, visible NULL) start .. start + m, or (a tree) the cache positions
 * visible[offsets[m]] .. visible[offsets[m + 1] - 1]: its ancestors root first, then itself. A node
 * therefore goes through exactly the operations of its path scored as a chain. keys and values are
 * [kv_heads, capacity, head_dim]; out [rows, heads · head_dim]; scratch holds start + rows floats
 * (one head's weights: the sweeps of several heads take their own buffer, and fall back to one head
 * at a time in scratch where it cannot be had). KV heads go outermost, so that one KV head's keys
 * and values stay in cache across the rows of the pass. */
void ex_attention(const float *q, int q_stride, const float *keys, const float *values, int capacity, float *out,
                  int rows, int start, int heads, int kv_heads, int head_dim, float scale, float *scratch,
                  const int *offsets, const int *visible) {
    int group = heads / kv_heads;
    int sweep = group < SWEEP_HEADS ? group : SWEEP_HEADS;
    float *e = sweep > 1 ? malloc(sizeof(float) * (size_t)sweep * (size_t)(start + rows)) : NULL;
    if (e == NULL) sweep = 1;
    for (int g = 0; g < kv_heads; g++) {
        size_t kv = (size_t)g * capacity * head_dim;
        for (int m = 0; m < rows; m++) {
            const int *seen = visible == NULL ? NULL : visible + offsets[m];
            int n = start + (visible == NULL ? m + 1 : offsets[m + 1] - offsets[m]);
            for (int h = g * group; h < (g + 1) * group; h += sweep) {
                int nh = (g + 1) * group - h < sweep ? (g + 1) * group - h : sweep;
                attend_sweep(q + (size_t)m * q_stride + (size_t)h * head_dim, keys + kv, values + kv, head_dim, nh,
                             n, start, seen, scale, e != NULL ? e : scratch,
                             out + (size_t)m * heads * head_dim + (size_t)h * head_dim);
            }
        }
    }
    free(e);
}
