/* The exact arithmetic's Q4_K and Q6_K products on AVX-512 VNNI (docs/exact-arithmetic.md §2-4): the
 * same bits as exact.c's scalar reference (tests/test_exact_kernel.py), for passes of any width.
 *
 * A 32-bit lane is an output column. The weights of a tile of 16 columns are read in the "packed"
 * layout below, where a block step's register i holds dword i of each of the 16 columns' blocks, so
 * vpdpbusd against the row's matching 4 activations (one dword broadcast to all lanes) adds 4 products
 * to each column's own exact integer. No horizontal sum per row and no packing of results: a row costs
 * its products, the sub-block scales (a vpdpwssd a pair for Q4_K, a vpmulld each for Q6_K) and §4's
 * binary32 operations lane by lane, in the reference's order. A block step's weights are unpacked once,
 * in registers, and used by every row of the pass (up to ROW_CHUNK rows).
 *
 * The packed layout (one "tile-block" per 16 columns and block, 64 bytes a dword of the block):
 *   tile-block(t, b) at byte (t · blocks + b) · words · 64; its dword 16 · i + c is dword i of
 *   column 16t + c's block b (columns past n repeat column n − 1; bytes past a block's end are 0).
 * Q4_K: 36 registers (d|dmin, the 3 dwords of scales, then qs); Q6_K: 53 (ql, qh, scales, then d in
 * the low half of the last). A tile's blocks follow each other and the tiles follow each other, so a
 * whole matrix is one contiguous stream of aligned 64-byte loads: no gathers, no transposes and no 16
 * strided streams per step. The model repacks each matrix once at load (ex_pack, exact_pack.c); a raw
 * GGUF matrix is packed here a tile-block at a time into a buffer (the same products, for callers that
 * hold raw bytes). The GGUF's size: 144 bytes per column and block for Q4_K, 212 (210 + 2 of padding)
 * for Q6_K.
 *
 * Called by exact.c's ex_matmul_vnni and exact_pack.c's ex_matmul_packed_vnni with the pass's prepared
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
enum { TILE = 16, Q4_K_BYTES = 144, Q6_K_BYTES = 210, Q4_K_WORDS = 36, Q6_K_WORDS = 53 };
enum { ROW_CHUNK = 64 }; /* rows whose int32 and binary32 accumulators a tile sweep keeps (on the stack) */

static size_t raw_block_bytes(int type) { return type == EX_Q4_K ? Q4_K_BYTES : Q6_K_BYTES; }
static int block_words(int type) { return type == EX_Q4_K ? Q4_K_WORDS : Q6_K_WORDS; }

/* The bytes of one packed tile-block (a multiple of 64) */
size_t ex_tile_block_bytes(int type) { return (size_t)block_words(type) * 64; }

/* 16 columns' block (rows `row_bytes` apart; `cols` of them, the rest repeat the last) -> one packed
 * tile-block at `out`. */
void ex_pack_tile_block(int type, const uint8_t *blk0, size_t row_bytes, int cols, uint8_t *out) {
    size_t bytes = raw_block_bytes(type);
    int words = block_words(type), whole = (int)(bytes / 4);
    uint32_t *o = (uint32_t *)out;
    for (int c = 0; c < TILE; c++) {
        const uint8_t *blk = blk0 + (size_t)(c < cols ? c : cols - 1) * row_bytes;
        for (int i = 0; i < whole; i++) memcpy(o + TILE * i + c, blk + 4 * i, 4);
        if (whole < words) { /* Q6_K's d: the block's last 2 bytes, zero-extended */
            uint16_t h;
            memcpy(&h, blk + 4 * whole, 2);
            o[TILE * whole + c] = h;
        }
    }
}

/* The inverse for one column: its raw block (`raw_block_bytes`) from a packed tile-block (AMX's input) */
void ex_unpack_column(int type, const uint8_t *tb, int c, uint8_t *blk) {
    int whole = (int)(raw_block_bytes(type) / 4);
    const uint32_t *in = (const uint32_t *)tb + c;
    for (int i = 0; i < whole; i++) memcpy(blk + 4 * i, in + TILE * i, 4);
    if (whole < block_words(type)) memcpy(blk + 4 * whole, in + TILE * whole, 2); /* Q6_K's d */
}

static inline __m512i reg(const uint8_t *tb, int i) { return _mm512_loadu_si512(tb + 64 * i); }

static inline void store16(float *out, int cols, __m512 v) {
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << cols) - 1), v);
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

/* The pass's prepared rows (exact.c) from row r0 on */
typedef struct {
    const int8_t *q;     /* levels [m, k] */
    const float *dx;     /* [m, blocks] */
    const int16_t *sums; /* [m, k / 32] (Q4_K) or [m, k / 16] (Q6_K) */
    int k, blocks, rows;
} pass_rows;

/* -- Q4_K: registers 4 + 8c + i hold dword i of chunk c's 32 qs bytes; their low nibbles are sub-block
 * 2c's levels 4i .. 4i + 3, the high nibbles sub-block 2c + 1's. A half sub-block's sum (16 products,
 * |.| <= 16·15·127 = 30480) is an int16, so the two halves pair into one lane and one vpdpwssd against
 * (sc_j, sc_j) adds sc_j times the sub-block's dot product to A (|A| < 2^25, §4). */
typedef struct {
    __m512i sc2[8];  /* lane c: (sc_j, sc_j) of column c as int16 */
    __m512i mins[4]; /* lane c: (m_2p, m_2p+1) as int16 */
    __m512 d, dmin;
} heads_q4_K;

/* registers 0-3: (d, dmin) and the 12 scale bytes -> §2's sc_j, m_j by its formula on 4 bytes at once */
static inline void heads_q4_K_lanes(const uint8_t *tb, heads_q4_K *h) {
    const __m512i six = _mm512_set1_epi32(0x3f3f3f3f), four = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i two = _mm512_set1_epi32(0x03030303);
    __m512i dd = reg(tb, 0), u0 = reg(tb, 1), u1 = reg(tb, 2), u2 = reg(tb, 3);
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

#define INLINE static inline __attribute__((always_inline))

/* One block step of a Q4_K tile for every row: acc[r] = fl(acc[r] + c_b) lane by lane */
INLINE void step_q4_K(const uint8_t *tb, const pass_rows *p, int rows, int b, __m512 *acc) {
    const __m512i low = _mm512_set1_epi8(15);
    heads_q4_K h;
    heads_q4_K_lanes(tb, &h);
    __m512i a[ROW_CHUNK];
    for (int r = 0; r < rows; r++) a[r] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i lo[8], hi[8];
        for (int i = 0; i < 8; i++) {
            __m512i g = reg(tb, 4 + 8 * c + i);
            lo[i] = _mm512_and_si512(g, low), hi[i] = _mm512_and_si512(_mm512_srli_epi16(g, 4), low);
        }
        for (int r = 0; r < rows; r++) {
            const int8_t *x = p->q + (size_t)r * p->k + (size_t)b * QK_K + 64 * c;
            __m512i s = pair16(dot16(lo, x), dot16(lo + 4, x + 16));
            __m512i t = pair16(dot16(hi, x + 32), dot16(hi + 4, x + 48));
            a[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(a[r], s, h.sc2[2 * c]), t, h.sc2[2 * c + 1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        const int16_t *bs32 = p->sums + ((size_t)r * p->k + (size_t)b * QK_K) / 32;
        int32_t pair[4];
        memcpy(pair, bs32, 16);
        __m512i bi = _mm512_madd_epi16(h.mins[0], _mm512_set1_epi32(pair[0]));
        for (int q = 1; q < 4; q++) bi = _mm512_dpwssd_epi32(bi, h.mins[q], _mm512_set1_epi32(pair[q]));
        __m512 vdx = _mm512_set1_ps(p->dx[(size_t)r * p->blocks + b]);
        __m512 cb = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(vdx, h.d), _mm512_cvtepi32_ps(a[r])),
                                  _mm512_mul_ps(_mm512_mul_ps(vdx, h.dmin), _mm512_cvtepi32_ps(bi)));
        acc[r] = _mm512_add_ps(acc[r], cb);
    }
}

/* -- Q6_K: per half h, ql[64h .. 64h + 31] (registers 16h + i), ql[64h + 32 .. 64h + 63] (16h + 8 + i)
 * and qh[32h .. 32h + 31] (32 + 8h + i); register i of part s then holds weights 128h + 32s + 4i .. + 3
 * (q in 0..63, §2), i.e. levels 4(i mod 4) .. of sub-block 8h + 2s + i / 4. Four vpdpbusd give each lane
 * its column's sub-block dot product (|.| <= 16·63·127 < 2^17), one vpmulld scales it by sc_j (|.| <
 * 2^24) into A; measured faster than pairing int16 halves for vpdpwssd, as Q4_K does, because a Q6_K
 * sub-block is only 16 levels (a pair per 4 vpdpbusd there). The −32 of (q − 32) is taken out once a
 * block: A = Σ_j sc_j Σ q·x − 32·C, C = Σ_j sc_j·bsum16_j (|C| <= 16·128·2032 < 2^22). */
typedef struct {
    __m512i sc32[16]; /* lane c: sc_j of column c as int32 */
    __m512i pairs[8]; /* lane c: (sc_2p, sc_2p+1) as int16 */
    __m512 d;
} heads_q6_K;

static inline void heads_q6_K_lanes(const uint8_t *tb, heads_q6_K *h) {
    h->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(reg(tb, 52)));
    /* a byte to the high byte of an int16, then >> 8: sign-extended */
    const __m512i even = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, 0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13));
    const __m512i odd = _mm512_add_epi8(even, _mm512_set1_epi32(0x02000200));
    for (int q = 0; q < 4; q++) {
        __m512i sc = reg(tb, 48 + q); /* scales 4q .. 4q + 3 */
        h->pairs[2 * q] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc, even), 8);
        h->pairs[2 * q + 1] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc, odd), 8);
        for (int j = 0; j < 4; j++) h->sc32[4 * q + j] = _mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - 8 * j), 24);
    }
}

/* a + sc_j · (sub-block j's dot product) + sc_j+1 · (sub-block j + 1's): 8 registers of levels against
 * x's 32 values */
static inline __m512i two_sub_blocks_q6_K(const __m512i w[8], const int8_t *x, __m512i s0, __m512i s1, __m512i a) {
    __m512i d0 = dot16(w, x), d1 = dot16(w + 4, x + 16);
    return _mm512_add_epi32(_mm512_add_epi32(a, _mm512_mullo_epi32(d0, s0)), _mm512_mullo_epi32(d1, s1));
}

INLINE void step_q6_K(const uint8_t *tb, const pass_rows *p, int rows, int b, __m512 *acc) {
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    heads_q6_K h;
    heads_q6_K_lanes(tb, &h);
    __m512i a[ROW_CHUNK];
    for (int r = 0; r < rows; r++) a[r] = _mm512_setzero_si512();
    for (int half = 0; half < 2; half++) {
        for (int odd = 0; odd < 2; odd++) { /* parts s = odd and odd + 2 share ql's bytes */
            for (int s = odd; s < 4; s += 2) {
                __m512i wq[8];
                for (int i = 0; i < 8; i++) {
                    __m512i ql = reg(tb, 16 * half + 8 * odd + i), qh = reg(tb, 32 + 8 * half + i);
                    __m512i lo = s < 2 ? ql : _mm512_srli_epi16(ql, 4);
                    __m512i hi = s == 0 ? _mm512_slli_epi16(qh, 4)
                                 : s == 1 ? _mm512_slli_epi16(qh, 2)
                                 : s == 2 ? qh
                                          : _mm512_srli_epi16(qh, 2);
                    wq[i] = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, low), hi, top, 0xf8); /* lo | (hi & 0x30) */
                }
                int j = 8 * half + 2 * s;
                for (int r = 0; r < rows; r++) {
                    const int8_t *x = p->q + (size_t)r * p->k + (size_t)b * QK_K + 16 * j;
                    a[r] = two_sub_blocks_q6_K(wq, x, h.sc32[j], h.sc32[j + 1], a[r]);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const int16_t *bs16 = p->sums + ((size_t)r * p->k + (size_t)b * QK_K) / 16;
        int32_t bs[8];
        memcpy(bs, bs16, 32);
        __m512i corr = _mm512_madd_epi16(h.pairs[0], _mm512_set1_epi32(bs[0]));
        for (int q = 1; q < 8; q++) corr = _mm512_dpwssd_epi32(corr, h.pairs[q], _mm512_set1_epi32(bs[q]));
        __m512i ai = _mm512_sub_epi32(a[r], _mm512_slli_epi32(corr, 5));
        __m512 vdx = _mm512_set1_ps(p->dx[(size_t)r * p->blocks + b]);
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(vdx, h.d), _mm512_cvtepi32_ps(ai)));
    }
}

/* Packed weights: each step fetches the lines this far ahead into L2 (measured on Zen 4: 8-16 KB ahead
 * streams 1.3-1.7x faster than the hardware prefetchers alone or 2 KB ahead; into L1 or non-temporal
 * loses, and so did adding an L1 prefetch 2 KB ahead for one-row passes: 52 -> 57 ms a whole decode
 * step). Prefetches do not fault, so running past the matrix's end is harmless. */
enum { PREFETCH_AHEAD = 8192 };

/* One tile's sweep over the blocks for `rows` rows (a constant where inlined for one row: a decode
 * step's accumulators then stay in registers) */
INLINE void sweep_tile(int type, const uint8_t *tile, int packed, size_t row_bytes, int cols, const pass_rows *p,
                       int rows, __m512 *acc) {
    size_t tb_bytes = ex_tile_block_bytes(type);
    uint8_t buf[Q6_K_WORDS * 64] __attribute__((aligned(64)));
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < p->blocks; b++) {
        const uint8_t *tb = tile + (size_t)b * tb_bytes;
        if (packed) {
            for (size_t at = 0; at < tb_bytes; at += 64)
                _mm_prefetch((const char *)tb + PREFETCH_AHEAD + at, _MM_HINT_T1);

        } else {
            ex_pack_tile_block(type, tile + (size_t)b * raw_block_bytes(type), row_bytes, cols, buf);
            tb = buf;
        }
        if (type == EX_Q4_K) step_q4_K(tb, p, rows, b, acc);
        else step_q6_K(tb, p, rows, b, acc);
    }
}

/* out [m, n] (rows `ldo` apart) = the pass's prepared rows times the Q4_K or Q6_K matrix w [n, k]:
 * packed (ex_pack's layout) or raw (the GGUF's blocks, packed here a tile-block at a time) */
void ex_vnni_lanes_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                           const int16_t *sums, int m, float *out, int ldo) {
    int blocks = k / QK_K, per_block = type == EX_Q4_K ? QK_K / 32 : QK_K / 16;
    size_t tb_bytes = ex_tile_block_bytes(type), row_bytes = (size_t)blocks * raw_block_bytes(type);
    for (int r0 = 0; r0 < m; r0 += ROW_CHUNK) {
        pass_rows p = {q + (size_t)r0 * k, dx + (size_t)r0 * blocks, sums + (size_t)r0 * blocks * per_block, k, blocks,
                       m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK};
        for (int j0 = 0; j0 < n; j0 += TILE) {
            int cols = n - j0 < TILE ? n - j0 : TILE;
            const uint8_t *tile = packed ? w + (size_t)(j0 / TILE) * blocks * tb_bytes : w + (size_t)j0 * row_bytes;
            __m512 acc[ROW_CHUNK];
            if (p.rows == 1) sweep_tile(type, tile, packed, row_bytes, cols, &p, 1, acc);
            else sweep_tile(type, tile, packed, row_bytes, cols, &p, p.rows, acc);
            for (int r = 0; r < p.rows; r++) store16(out + (size_t)(r0 + r) * ldo + j0, cols, acc[r]);
        }
    }
}
#endif
