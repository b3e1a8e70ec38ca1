/* The exact arithmetic's Q4_K and Q6_K products on AVX-512 VNNI (docs/exact-arithmetic.md §2-4): the
 * same bits as exact.c's scalar reference (tests/test_exact_kernel.py), for passes of any width.
 *
 * exact.c's tile paths give each output column its own register of partial sums and, per row, a tree
 * of shuffles and adds turns 16 such registers into one register of 16 exact integers. Here a 32-bit lane
 * is an output column from the start: the tile's weights are transposed while they are unpacked, so
 * that register i holds dword i (4 levels) of each of the 16 columns' sub-block, and vpdpbusd against
 * the row's matching 4 activations (one dword broadcast to all lanes) adds 4 products to each column's
 * own exact integer. No horizontal sum per row and no packing: a row costs its products, one vpdpwssd a
 * pair of scales and §4's binary32 operations lane by lane, in the reference's order. The transposed
 * weights live in registers only and are used at once by every row of the pass (up to ROW_CHUNK rows),
 * so a block step's unpacking is paid once for all of them.
 *
 * Called by exact.c's ex_matmul_vnni (and ex_matmul_amx below AMX's width) with the pass's prepared
 * rows (§3): levels q [m, k] in their natural order, scales dx [m, k / 256], and each sub-block's sum of
 * levels (32 values for Q4_K, 16 for Q6_K). Built with -ffp-contract=off and without -ffast-math.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#define QK_K 256
enum { EX_Q4_K = 2, EX_Q6_K = 3 }; /* exact.c's type codes */

/* exact.c's block layouts (docs/exact-arithmetic.md §2) */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
_Static_assert(sizeof(block_q4_K) == 144, "Q4_K block");
_Static_assert(sizeof(block_q6_K) == 210, "Q6_K block");

enum { ROW_CHUNK = 64 }; /* rows whose int32 and binary32 accumulators a tile sweep keeps (on the stack) */

/* Short rows: a tile's 16 columns are 16 strided streams the hardware prefetchers hardly follow, so each
 * step fetches its share of the NEXT tile (contiguous bytes) into L2, as exact.c's tile paths do.
 * Prefetches do not fault; the range stays inside w. */
enum { PREFETCH_ROW_BYTES = 4096 };
static inline void prefetch_next(const uint8_t *next, size_t len, const uint8_t *end) {
    for (const uint8_t *line = next; line < next + len && line < end; line += 64)
        _mm_prefetch((const char *)line, _MM_HINT_T1);
}

/* 16 binary16 values at byte `at` of each column's block (the high half of the dword there) -> binary32
 * (vcvtph2ps: exact); the 32-bit gather keeps every read inside the block. */
static inline __m512 gather_half_high(const uint8_t *base, __m512i off, int at) {
    __m512i v = _mm512_srli_epi32(_mm512_i32gather_epi32(off, base + at, 1), 16);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

static inline void store16(float *out, int cols, __m512 v) {
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << cols) - 1), v);
}

/* Long rows (no next-tile prefetch, see PREFETCH_ROW_BYTES): each column's next block into L1 a step
 * ahead, every line of it (measured: short rows gain nothing from it, long ones about 5%) */
static inline void prefetch_blocks(const uint8_t *blk0, const int32_t *offs, int bytes) {
    for (int c = 0; c < 16; c++)
        for (int at = 0; at < bytes + 63; at += 64) {
            int o = at < bytes ? at : bytes - 1;
            _mm_prefetch((const char *)blk0 + offs[c] + o, _MM_HINT_T0);
        }
}

/* 8 registers, Z_p's low half column lo(p), high half column lo(p) + 4 (lo(p) = p, p + 4 for p < 4,
 * >= 4), each half 8 dwords of its column -> g[i] lane c = column c's dword i (an 8x8 transpose in the
 * two 256-bit halves whose last step interleaves the 128-bit quarters into the column order). */
static inline void transpose_8x16(const __m512i z[8], __m512i g[8]) {
    __m512i u[8], v[8];
    for (int p = 0; p < 8; p += 2) {
        u[p] = _mm512_unpacklo_epi32(z[p], z[p + 1]), u[p + 1] = _mm512_unpackhi_epi32(z[p], z[p + 1]);
    }
    for (int h = 0; h < 8; h += 4) { /* quarter q of v[h + i]: dword i of each quarter's 4 columns */
        v[h] = _mm512_unpacklo_epi64(u[h], u[h + 2]), v[h + 1] = _mm512_unpackhi_epi64(u[h], u[h + 2]);
        v[h + 2] = _mm512_unpacklo_epi64(u[h + 1], u[h + 3]), v[h + 3] = _mm512_unpackhi_epi64(u[h + 1], u[h + 3]);
    }
    for (int i = 0; i < 4; i++) { /* v[i]'s quarters: cols 0-3 dword i, 0-3 dword i + 4, 4-7 i, 4-7 i + 4 */
        g[i] = _mm512_shuffle_i64x2(v[i], v[4 + i], 0x88);
        g[4 + i] = _mm512_shuffle_i64x2(v[i], v[4 + i], 0xdd);
    }
}

/* 32 bytes at byte `at` of each of the 16 columns' block -> 8 registers, lane c = column c's dword i */
static inline void load_transposed(const uint8_t *blk0, const int32_t *offs, int at, __m512i g[8]) {
    __m512i z[8];
    for (int p = 0; p < 8; p++) {
        int lo = p < 4 ? p : p + 4;
        __m256i a = _mm256_loadu_si256((const __m256i *)(blk0 + offs[lo] + at));
        __m256i b = _mm256_loadu_si256((const __m256i *)(blk0 + offs[lo + 4] + at));
        z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    }
    transpose_8x16(z, g);
}

/* Two int32 sums of at most 2^15 in magnitude -> one lane of two int16, the first in the low half, for
 * vpmaddwd (a masked byte shuffle: the high sum's low two bytes into bytes 2, 3 of each lane) */
static inline __m512i pair16(__m512i low, __m512i high) {
    const __m512i up = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13));
    return _mm512_mask_shuffle_epi8(low, (__mmask64)0xccccccccccccccccull, high, up);
}

/* 4 weight registers against the 16 activations at x: Σ over each lane's 16 products (dword i of x
 * broadcast against register i) */
static inline __m512i dot16(const __m512i w[4], const int8_t *x) {
    __m512i s = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) {
        int32_t xi;
        memcpy(&xi, x + 4 * i, 4);
        s = _mm512_dpbusd_epi32(s, w[i], _mm512_set1_epi32(xi));
    }
    return s;
}

/* -- Q4_K: chunk c's 32 qs bytes of each column transposed; the low nibbles of g[0..7] are sub-block
 * 2c's levels 4i .. 4i + 3, the high nibbles sub-block 2c + 1's. A half sub-block's sum (16 products,
 * |.| <= 16·15·127 = 30480) is an int16, so the two halves pair into one lane and one vpdpwssd against
 * (sc_j, sc_j) adds sc_j times the sub-block's dot product to A (|A| < 2^25, §4). */
/* The first 16 bytes of each of the 16 columns' block -> 4 registers, lane c = column c's dword i
 * (quarter t of r[q] is column 4t + q's 16 bytes; a 4x4 transpose inside the quarters) */
static inline void heads_transposed(const uint8_t *blk0, const int32_t *offs, __m512i h[4]) {
    __m512i r[4];
    for (int q = 0; q < 4; q++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk0 + offs[q])));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk0 + offs[4 + q])), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk0 + offs[8 + q])), 2);
        r[q] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(blk0 + offs[12 + q])), 3);
    }
    __m512i u0 = _mm512_unpacklo_epi32(r[0], r[1]), u1 = _mm512_unpackhi_epi32(r[0], r[1]);
    __m512i u2 = _mm512_unpacklo_epi32(r[2], r[3]), u3 = _mm512_unpackhi_epi32(r[2], r[3]);
    h[0] = _mm512_unpacklo_epi64(u0, u2), h[1] = _mm512_unpackhi_epi64(u0, u2);
    h[2] = _mm512_unpacklo_epi64(u1, u3), h[3] = _mm512_unpackhi_epi64(u1, u3);
}

typedef struct {
    __m512i sc2[8];  /* lane c: (sc_j, sc_j) of column c as int16 */
    __m512i mins[4]; /* lane c: (m_2p, m_2p+1) as int16 */
    __m512 d, dmin;
} heads_q4_K_lanes;

static inline void heads_q4_K_lane(const uint8_t *blk0, const int32_t *offs, heads_q4_K_lanes *h) {
    const __m512i six = _mm512_set1_epi32(0x3f3f3f3f), four = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i two = _mm512_set1_epi32(0x03030303);
    __m512i hd[4];
    heads_transposed(blk0, offs, hd);
    __m512i dd = hd[0], u0 = hd[1], u1 = hd[2], u2 = hd[3];
    h->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    h->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
    __m512i sc_lo = _mm512_and_si512(u0, six), m_lo = _mm512_and_si512(u1, six);
    __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(u2, four),
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), two), 4));
    __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), four),
                                   _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), two), 4));
    const __m512i lo2 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13, -1));
    const __m512i hi2 = _mm512_add_epi8(lo2, _mm512_set1_epi32(0x00020002));
    h->mins[0] = _mm512_shuffle_epi8(m_lo, lo2), h->mins[1] = _mm512_shuffle_epi8(m_lo, hi2);
    h->mins[2] = _mm512_shuffle_epi8(m_hi, lo2), h->mins[3] = _mm512_shuffle_epi8(m_hi, hi2);
    const __m512i same = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 0, -1, 4, -1, 4, -1, 8, -1, 8, -1, 12, -1, 12, -1));
    for (int j = 0; j < 4; j++) { /* byte j of each lane twice, widened */
        __m512i pick = _mm512_add_epi8(same, _mm512_set1_epi16((short)j));
        h->sc2[j] = _mm512_shuffle_epi8(sc_lo, pick), h->sc2[4 + j] = _mm512_shuffle_epi8(sc_hi, pick);
    }
}

static void matmul_q4_K_lanes(const uint8_t *w, int n, int k, const int8_t *q, const float *dx, const int16_t *sums, int m, float *out) {
    const __m512i low = _mm512_set1_epi8(15);
    int blocks = k / QK_K;
    size_t row_bytes = (size_t)blocks * sizeof(block_q4_K);
    for (int r0 = 0; r0 < m; r0 += ROW_CHUNK) {
        int rows = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;
        for (int j0 = 0; j0 < n; j0 += 16) {
            int cols = n - j0 < 16 ? n - j0 : 16;
            int32_t offs[16];
            for (int c = 0; c < 16; c++) offs[c] = (int32_t)((c < cols ? c : cols - 1) * row_bytes);
            const uint8_t *base = w + (size_t)j0 * row_bytes;
            __m512 acc[ROW_CHUNK];
            for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
            const uint8_t *next = base + 16 * row_bytes, *end = w + (size_t)n * row_bytes;
            size_t share = row_bytes < PREFETCH_ROW_BYTES ? 16 * sizeof(block_q4_K) : 0;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk0 = base + (size_t)b * sizeof(block_q4_K);
                prefetch_next(next + (size_t)b * share, share, end);
                if (!share && b + 1 < blocks) prefetch_blocks(blk0 + sizeof(block_q4_K), offs, sizeof(block_q4_K));
                heads_q4_K_lanes h;
                heads_q4_K_lane(blk0, offs, &h);
                __m512i a[ROW_CHUNK];
                for (int r = 0; r < rows; r++) a[r] = _mm512_setzero_si512();
                for (int c = 0; c < 4; c++) {
                    __m512i g[8], lo[8], hi[8];
                    load_transposed(blk0, offs, 16 + 32 * c, g);
                    for (int i = 0; i < 8; i++)
                        lo[i] = _mm512_and_si512(g[i], low), hi[i] = _mm512_and_si512(_mm512_srli_epi16(g[i], 4), low);
                    for (int r = 0; r < rows; r++) {
                        const int8_t *x = q + (size_t)(r0 + r) * k + (size_t)b * QK_K + 64 * c;
                        __m512i s = pair16(dot16(lo, x), dot16(lo + 4, x + 16));
                        __m512i t = pair16(dot16(hi, x + 32), dot16(hi + 4, x + 48));
                        a[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(a[r], s, h.sc2[2 * c]), t, h.sc2[2 * c + 1]);
                    }
                }
                for (int r = 0; r < rows; r++) {
                    const int16_t *bs32 = sums + ((size_t)(r0 + r) * k + (size_t)b * QK_K) / 32;
                    int32_t pair[4];
                    memcpy(pair, bs32, 16);
                    __m512i bi = _mm512_madd_epi16(h.mins[0], _mm512_set1_epi32(pair[0]));
                    for (int q = 1; q < 4; q++) bi = _mm512_dpwssd_epi32(bi, h.mins[q], _mm512_set1_epi32(pair[q]));
                    __m512 vdx = _mm512_set1_ps(dx[(size_t)(r0 + r) * blocks + b]);
                    __m512 cb = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(vdx, h.d), _mm512_cvtepi32_ps(a[r])),
                                              _mm512_mul_ps(_mm512_mul_ps(vdx, h.dmin), _mm512_cvtepi32_ps(bi)));
                    acc[r] = _mm512_add_ps(acc[r], cb);
                }
            }
            for (int r = 0; r < rows; r++) store16(out + (size_t)(r0 + r) * n + j0, cols, acc[r]);
        }
    }
}

/* -- Q6_K: per half h, ql[64h .. 64h + 31] (t0), ql[64h + 32 .. 64h + 63] (t1) and qh[32h .. 32h + 31]
 * transposed; register i of part s then holds weights 128h + 32s + 4i .. + 3 (q in 0..63, §2), i.e.
 * levels 4(i mod 4) .. of sub-block 8h + 2s + i / 4. One vpdpbusd lane sums 4 products, |.| <= 4·63·127
 * = 32004: an int16, so two of them pair into one lane and vpdpwssd against (sc_j, sc_j) adds them
 * scaled. The −32 of (q − 32) is taken out once a block, as in the tile path: A = Σ_j sc_j Σ q·x − 32·C,
 * C = Σ_j sc_j·bsum16_j (|C| <= 16·128·2032 < 2^22). */
typedef struct {
    __m512i sc2[16];  /* lane c: (sc_j, sc_j) of column c as int16 */
    __m512i pairs[8]; /* lane c: (sc_2p, sc_2p+1) as int16 */
    __m512 d;
} heads_q6_K_lanes;

static inline void heads_q6_K_lane(const uint8_t *blk0, const int32_t *offs, heads_q6_K_lanes *h) {
    __m512i sc[4];
    heads_transposed(blk0 + 192, offs, sc);
    h->d = gather_half_high(blk0, _mm512_loadu_si512(offs), 206);
    /* a byte to the high byte of an int16, then >> 8: sign-extended */
    const __m512i even = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, 0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13));
    const __m512i odd = _mm512_add_epi8(even, _mm512_set1_epi32(0x02000200));
    const __m512i same = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, 0, -1, 0, -1, 4, -1, 4, -1, 8, -1, 8, -1, 12, -1, 12));
    for (int q = 0; q < 4; q++) {
        h->pairs[2 * q] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc[q], even), 8);
        h->pairs[2 * q + 1] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc[q], odd), 8);
        for (int j = 0; j < 4; j++) {
            __m512i pick = _mm512_add_epi8(same, _mm512_set1_epi16((short)(j << 8)));
            h->sc2[4 * q + j] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc[q], pick), 8);
        }
    }
}

/* Σ sc_j times two sub-blocks' dot products (8 registers of levels against x's 32 values) added to a */
static inline __m512i two_sub_blocks_q6_K(const __m512i w[8], const int8_t *x, __m512i s0, __m512i s1, __m512i a) {
    __m512i d[8];
    for (int i = 0; i < 8; i++) {
        int32_t xi;
        memcpy(&xi, x + 4 * i, 4);
        d[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[i], _mm512_set1_epi32(xi));
    }
    a = _mm512_dpwssd_epi32(a, pair16(d[0], d[1]), s0), a = _mm512_dpwssd_epi32(a, pair16(d[2], d[3]), s0);
    a = _mm512_dpwssd_epi32(a, pair16(d[4], d[5]), s1);
    return _mm512_dpwssd_epi32(a, pair16(d[6], d[7]), s1);
}

static void matmul_q6_K_lanes(const uint8_t *w, int n, int k, const int8_t *q, const float *dx, const int16_t *sums, int m, float *out) {
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    int blocks = k / QK_K;
    size_t row_bytes = (size_t)blocks * sizeof(block_q6_K);
    for (int r0 = 0; r0 < m; r0 += ROW_CHUNK) {
        int rows = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;
        for (int j0 = 0; j0 < n; j0 += 16) {
            int cols = n - j0 < 16 ? n - j0 : 16;
            int32_t offs[16];
            for (int c = 0; c < 16; c++) offs[c] = (int32_t)((c < cols ? c : cols - 1) * row_bytes);
            const uint8_t *base = w + (size_t)j0 * row_bytes;
            __m512 acc[ROW_CHUNK];
            for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
            const uint8_t *next = base + 16 * row_bytes, *end = w + (size_t)n * row_bytes;
            size_t share = row_bytes < PREFETCH_ROW_BYTES ? 16 * sizeof(block_q6_K) : 0;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk0 = base + (size_t)b * sizeof(block_q6_K);
                prefetch_next(next + (size_t)b * share, share, end);
                if (!share && b + 1 < blocks) prefetch_blocks(blk0 + sizeof(block_q6_K), offs, sizeof(block_q6_K));
                heads_q6_K_lanes h;
                heads_q6_K_lane(blk0, offs, &h);
                __m512i a[ROW_CHUNK];
                for (int r = 0; r < rows; r++) a[r] = _mm512_setzero_si512();
                for (int half = 0; half < 2; half++) {
                    __m512i qh[8];
                    load_transposed(blk0, offs, 128 + 32 * half, qh);
                    for (int odd = 0; odd < 2; odd++) { /* parts s = odd and odd + 2 share ql's bytes */
                        __m512i ql[8];
                        load_transposed(blk0, offs, 64 * half + 32 * odd, ql);
                        for (int s = odd; s < 4; s += 2) {
                            __m512i wq[8];
                            for (int i = 0; i < 8; i++) {
                                __m512i lo = s < 2 ? ql[i] : _mm512_srli_epi16(ql[i], 4);
                                __m512i hi = s == 0 ? _mm512_slli_epi16(qh[i], 4)
                                             : s == 1 ? _mm512_slli_epi16(qh[i], 2)
                                             : s == 2 ? qh[i]
                                                      : _mm512_srli_epi16(qh[i], 2);
                                /* (lo & 15) | (hi & 0x30) */
                                wq[i] = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, low), hi, top, 0xf8);
                            }
                            int j = 8 * half + 2 * s;
                            for (int r = 0; r < rows; r++) {
                                const int8_t *x = q + (size_t)(r0 + r) * k + (size_t)b * QK_K + 16 * j;
                                a[r] = two_sub_blocks_q6_K(wq, x, h.sc2[j], h.sc2[j + 1], a[r]);
                            }
                        }
                    }
                }
                for (int r = 0; r < rows; r++) {
                    const int16_t *bs16 = sums + ((size_t)(r0 + r) * k + (size_t)b * QK_K) / 16;
                    int32_t bs[8];
                    memcpy(bs, bs16, 32);
                    __m512i corr = _mm512_madd_epi16(h.pairs[0], _mm512_set1_epi32(bs[0]));
                    for (int q = 1; q < 8; q++) corr = _mm512_dpwssd_epi32(corr, h.pairs[q], _mm512_set1_epi32(bs[q]));
                    __m512i ai = _mm512_sub_epi32(a[r], _mm512_slli_epi32(corr, 5));
                    __m512 vdx = _mm512_set1_ps(dx[(size_t)(r0 + r) * blocks + b]);
                    __m512 cb = _mm512_mul_ps(_mm512_mul_ps(vdx, h.d), _mm512_cvtepi32_ps(ai));
                    acc[r] = _mm512_add_ps(acc[r], cb);
                }
            }
            for (int r = 0; r < rows; r++) store16(out + (size_t)(r0 + r) * n + j0, cols, acc[r]);
        }
    }
}

/* out [m, n] = the pass's rows (prepared by exact.c) times the Q4_K or Q6_K matrix w [n, k] */
void ex_vnni_lanes_product(int type, const uint8_t *w, int n, int k, const int8_t *q, const float *dx,
                           const int16_t *sums, int m, float *out) {
    if (type == EX_Q4_K) matmul_q4_K_lanes(w, n, k, q, dx, sums, m, out);
    else matmul_q6_K_lanes(w, n, k, q, dx, sums, m, out);
}
#endif
