/* The exact arithmetic's Q4_K and Q6_K products on AMX (Intel's tile multiply, int8), for wide passes:
 * the same bits as exact.c's scalar reference (docs/exact-arithmetic.md §4; tests/test_exact_kernel.py).
 *
 * The tile product tdpbusd C += A·B sums u8 × s8 products exactly into int32, in any order: an exact
 * integer, as §4 allows. Each tile product here covers ONE sub-block (K = 32 for Q4_K, 16 for Q6_K), so
 * C holds each sub-block's own dot product Σ q·x, and the sub-block scales, the mins (Q4_K) or the −32
 * offset (Q6_K) and then §4's binary32 operations in their order follow in AVX-512, exactly as in the
 * reference: A = Σ_j sc_j·dot_j (int32 multiplies, no bound is near), c_b from A (and B), s = fl(s + c_b).
 *
 * Layout. A = the weights: 16 output columns (tile rows) × the sub-block's K levels (u8), unpacked from
 * a tile of 16 columns' blocks once per block step, for every row group of the pass. B = the
 * activations in the tile multiply's layout, made once per pass: row k4 of group g holds the 4 levels
 * x[4·k4 .. 4·k4 + 3] of each of the group's 16 pass rows (zero past the last row). So C[c][r] is column
 * c's dot product with pass row r: a C row is one column, its 16 lanes 16 pass rows, and each lane keeps
 * its own sequential fold of §4 (s = fl(s + c_b), blocks in order): a row's bits do not depend on the
 * pass width or its group.
 *
 * Built with -mamx-tile -mamx-int8 (kernel.py, where the CPU has them); a process may use the tiles only
 * after Linux granted it the tile data state (ex_amx_enable), which kernel.py asks for after a probe in a
 * child process (ex_amx_probe), so that a refusal can never kill the serving process.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) &&             \
    defined(__AVX512VNNI__)
#include <immintrin.h>

#define QK_K 256
#define GROUP 16     /* pass rows a tile's B and C hold */
#define TILE_COLS 16 /* output columns a step unpacks (C's 16 rows) */
#define CHUNK_GROUPS 16 /* groups whose accumulators stay on the stack while a column tile is swept */
#define PREFETCH_ROW_BYTES 4096
#define PACKED_AHEAD 8192 /* bytes: exact_vnni.c's PREFETCH_AHEAD */

/* exact.c's block layouts (docs/exact-arithmetic.md §2) */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } amx_block_q4_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } amx_block_q6_K;
_Static_assert(sizeof(amx_block_q4_K) == 144, "Q4_K block");
_Static_assert(sizeof(amx_block_q6_K) == 210, "Q6_K block");

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* Linux's permission to use the tile data state, for the whole process (idempotent): 0 when granted */
int ex_amx_enable(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : 1; }

typedef struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-3: C (16 columns × 16 int32); 4, 5: A (16 columns × K levels); 6, 7: B (K / 4 × 16 rows × 4). */
static void configure(int k_sub) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++) cfg.rows[t] = TILE_COLS, cfg.colsb[t] = 4 * GROUP;
    for (int t = 4; t < 6; t++) cfg.rows[t] = TILE_COLS, cfg.colsb[t] = (uint16_t)k_sub;
    for (int t = 6; t < 8; t++) cfg.rows[t] = (uint8_t)(k_sub / 4), cfg.colsb[t] = 4 * GROUP;
    /* GCC does not see ldtilecfg read the whole struct and drops the stores above (seen with GCC 12:
     * palette 1, no rows, then #UD at the first tile op): the barrier makes them happen first */
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* A tile product a child process can run (kernel.py's probe): 1 × 4 levels, known answer */
int ex_amx_probe(void) {
    if (ex_amx_enable()) return 1;
    uint8_t a[TILE_COLS * 32] __attribute__((aligned(64)));
    int8_t b[8 * 64] __attribute__((aligned(64)));
    int32_t c[TILE_COLS * GROUP] __attribute__((aligned(64)));
    for (int i = 0; i < (int)sizeof a; i++) a[i] = (uint8_t)(i % 7);
    for (int i = 0; i < (int)sizeof b; i++) b[i] = (int8_t)(i % 5 - 2);
    configure(32);
    _tile_zero(0);
    _tile_loadd(4, a, 32);
    _tile_loadd(6, b, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_stored(0, c, 64);
    _tile_release();
    for (int col = 0; col < TILE_COLS; col++)
        for (int r = 0; r < GROUP; r++) {
            int32_t want = 0;
            for (int kk = 0; kk < 32; kk++) want += a[32 * col + kk] * b[64 * (kk / 4) + 4 * r + kk % 4];
            if (c[GROUP * col + r] != want) return 2;
        }
    return 0;
}

/* The pass's activations in the tile layout, per group of 16 rows: B levels [k / 4][16][4], dx
 * [blocks][16] and the rows' pairs of sub-block sums [blocks][pairs][16] (int16 pairs, for vpmaddwd
 * against a column's pair of mins or scales). Rows past m are zero (dx = 0: their lanes are never stored). */
typedef struct {
    int8_t *b;
    float *dx;
    int32_t *pairs;
    size_t b_stride, dx_stride, pairs_stride; /* per group */
    int npairs;                               /* pairs of sums a block: 4 (Q4_K, sums of 32), 8 (Q6_K, 16) */
} amx_rows;

size_t ex_amx_scratch_bytes(int m, int k) {
    size_t groups = (size_t)(m + GROUP - 1) / GROUP, blocks = (size_t)k / QK_K;
    return 3 * 64 + groups * ((size_t)k * GROUP + blocks * GROUP * 4 + blocks * 8 * GROUP * 4);
}

static void lay_out_rows(const int8_t *q, const float *dx, const int16_t *sums, int sums_per_block, int m, int k,
                         void *scratch, amx_rows *t) {
    size_t groups = (size_t)(m + GROUP - 1) / GROUP, blocks = (size_t)k / QK_K;
    char *at = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    t->npairs = sums_per_block / 2;
    t->b_stride = (size_t)k * GROUP, t->dx_stride = blocks * GROUP, t->pairs_stride = blocks * t->npairs * GROUP;
    t->b = (int8_t *)at;
    t->dx = (float *)(at += (groups * t->b_stride + 63) & ~(size_t)63);
    t->pairs = (int32_t *)(at + ((groups * t->dx_stride * 4 + 63) & ~(size_t)63));
    memset(t->b, 0, groups * t->b_stride);
    memset(t->dx, 0, groups * t->dx_stride * 4);
    memset(t->pairs, 0, groups * t->pairs_stride * 4);
    for (int r = 0; r < m; r++) {
        size_t g = (size_t)r / GROUP, lane = (size_t)r % GROUP;
        const int8_t *qr = q + (size_t)r * k;
        int32_t *bg = (int32_t *)(t->b + g * t->b_stride);
        for (int k4 = 0; k4 < k / 4; k4++) memcpy(bg + (size_t)k4 * GROUP + lane, qr + 4 * k4, 4);
        for (size_t b = 0; b < blocks; b++) {
            t->dx[g * t->dx_stride + b * GROUP + lane] = dx[(size_t)r * blocks + b];
            const int16_t *s = sums + ((size_t)r * blocks + b) * sums_per_block;
            for (int p = 0; p < t->npairs; p++)
                memcpy(t->pairs + g * t->pairs_stride + (b * t->npairs + p) * GROUP + lane, s + 2 * p, 4);
        }
    }
}

/* One column tile's weights of one block, ready for every row group: the levels of column c at
 * w[c][0..255] (A tiles read sub-block j at a stride of 256), and each column's scales and the rest. */
typedef struct {
    uint8_t w[TILE_COLS][QK_K] __attribute__((aligned(64)));
    int32_t sc[TILE_COLS][16]; /* sc_j as int32 (Q4_K: j < 8) */
    int32_t pair[TILE_COLS][8]; /* Q4_K: (m_2p, m_2p+1); Q6_K: (sc_2p, sc_2p+1), as int16 pairs */
    float d[TILE_COLS], dmin[TILE_COLS];
} amx_tile;

/* 16 binary16 values -> binary32 (vcvtph2ps: exact) */
static void halves16(const uint16_t *h, float *out) {
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
}

/* Q4_K: column c's 128 bytes of nibbles as 256 levels: chunk c' = qs[32c' .. 32c' + 31] holds sub-block 2c'
 * (low nibbles) and 2c' + 1 (high); stored as [lo(chunks 0, 1)] [hi(0, 1)] [lo(2, 3)] [hi(2, 3)], so
 * sub-block j sits at Q4_K_AT[j]. */
static const int Q4_K_AT[8] = {0, 64, 32, 96, 128, 192, 160, 224};

/* Q4_K's 12 scale bytes -> sc_0..7 and m_0..7, a byte each (§2's formula on four bytes at once) */
void ex_q4_K_scales(const uint8_t *s, uint64_t *sc, uint64_t *mn); /* exact.c */

static void unpack_q4_K(const uint8_t *blk0, size_t row_bytes, int cols, amx_tile *t) {
    const __m512i low = _mm512_set1_epi8(15);
    uint16_t d[TILE_COLS], dmin[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) {
        const amx_block_q4_K *blk = (const amx_block_q4_K *)(blk0 + (size_t)(c < cols ? c : cols - 1) * row_bytes);
        for (int h = 0; h < 2; h++) {
            __m512i raw = _mm512_loadu_si512(blk->qs + 64 * h);
            _mm512_store_si512(t->w[c] + 128 * h, _mm512_and_si512(raw, low));
            _mm512_store_si512(t->w[c] + 128 * h + 64, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
        }
        uint64_t sc, mn;
        ex_q4_K_scales(blk->scales, &sc, &mn);
        _mm256_storeu_si256((__m256i *)t->sc[c], _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        _mm_storeu_si128((__m128i *)t->pair[c], _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn)));
        d[c] = blk->d, dmin[c] = blk->dmin;
    }
    halves16(d, t->d), halves16(dmin, t->dmin);
}

/* Q6_K: column c's levels q in 0..63 in their natural order (sub-block j at 16j), §2's formula on 64
 * weights a register: weights 128h + 32s + l take ql[64h + 32(s & 1) + l] >> 4(s >> 1) and qh[32h + l] >> 2s. */
static void unpack_q6_K(const uint8_t *blk0, size_t row_bytes, int cols, amx_tile *t) {
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    uint16_t d[TILE_COLS];
    for (int c = 0; c < TILE_COLS; c++) {
        const amx_block_q6_K *blk = (const amx_block_q6_K *)(blk0 + (size_t)(c < cols ? c : cols - 1) * row_bytes);
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(blk->ql + 64 * h);
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
            /* g: qh for s = 0 (weights 0-31 of the half) in the low 256 bits, qh >> 2 for s = 1 in the high */
            __m512i g = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_and_si512(_mm512_slli_epi16(g, 4), top));
            __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), _mm512_and_si512(g, top));
            _mm512_store_si512(t->w[c] + 128 * h, lo), _mm512_store_si512(t->w[c] + 128 * h + 64, hi);
        }
        __m128i sc8 = _mm_loadu_si128((const __m128i *)blk->scales);
        _mm512_storeu_si512(t->sc[c], _mm512_cvtepi8_epi32(sc8));
        _mm256_storeu_si256((__m256i *)t->pair[c], _mm256_cvtepi8_epi16(sc8)); /* int16 pairs (sc_2p, sc_2p+1) */
        d[c] = blk->d;
    }
    halves16(d, t->d);
}

/* C for 4 sub-blocks (j0 .. j0 + 3) of one row group into c_out[j]: A from the unpacked weights, B from
 * the group's activation layout (row k4 = 64·b + (K/4)·j). The tile numbers must be immediates. */
#define SUB_PRODUCT(T, J, A, B)                                                                             \
    do {                                                                                                    \
        _tile_zero(T);                                                                                      \
        _tile_loadd(A, t->w[0] + at[J], QK_K);                                                              \
        _tile_loadd(B, xb + (size_t)(J) * (k_sub / 4) * 4 * GROUP, 4 * GROUP);                              \
        _tile_dpbusd(T, A, B);                                                                              \
    } while (0)

static void sub_products(const amx_tile *t, const int *at, const int8_t *xb, int k_sub, int subs,
                         int32_t (*c_out)[TILE_COLS * GROUP]) {
    for (int j0 = 0; j0 < subs; j0 += 4) {
        SUB_PRODUCT(0, j0, 4, 6);
        SUB_PRODUCT(1, j0 + 1, 5, 7);
        SUB_PRODUCT(2, j0 + 2, 4, 6);
        SUB_PRODUCT(3, j0 + 3, 5, 7);
        _tile_stored(0, c_out[j0], 4 * GROUP);
        _tile_stored(1, c_out[j0 + 1], 4 * GROUP);
        _tile_stored(2, c_out[j0 + 2], 4 * GROUP);
        _tile_stored(3, c_out[j0 + 3], 4 * GROUP);
    }
}

/* §4 for column c and the group's 16 rows (lanes): A = Σ_j sc_j·dot_j, B = Σ_j m_j·bsum32_j,
 * c_b = fl(fl(fl(dx·d)·f32(A)) − fl(fl(dx·dmin)·f32(B))), s = fl(s + c_b) */
static inline __m512 fold_q4_K(const amx_tile *t, int c, int32_t (*dots)[TILE_COLS * GROUP], const int32_t *pairs,
                               __m512 dx, __m512 acc) {
    __m512i a = _mm512_mullo_epi32(_mm512_load_si512(dots[0] + GROUP * c), _mm512_set1_epi32(t->sc[c][0]));
    for (int j = 1; j < 8; j++)
        a = _mm512_add_epi32(a, _mm512_mullo_epi32(_mm512_load_si512(dots[j] + GROUP * c), _mm512_set1_epi32(t->sc[c][j])));
    __m512i bi = _mm512_madd_epi16(_mm512_loadu_si512(pairs), _mm512_set1_epi32(t->pair[c][0]));
    for (int p = 1; p < 4; p++)
        bi = _mm512_dpwssd_epi32(bi, _mm512_loadu_si512(pairs + p * GROUP), _mm512_set1_epi32(t->pair[c][p]));
    __m512 cb = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(t->d[c])), _mm512_cvtepi32_ps(a)),
                              _mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(t->dmin[c])), _mm512_cvtepi32_ps(bi)));
    return _mm512_add_ps(acc, cb);
}

/* Q6_K: A = Σ_j sc_j·Σ q·x − 32·Σ_j sc_j·bsum16_j (the dots are of q in 0..63; |terms| < 2^28),
 * c_b = fl(fl(dx·d)·f32(A)), s = fl(s + c_b) */
static inline __m512 fold_q6_K(const amx_tile *t, int c, int32_t (*dots)[TILE_COLS * GROUP], const int32_t *pairs,
                               __m512 dx, __m512 acc) {
    __m512i a = _mm512_mullo_epi32(_mm512_load_si512(dots[0] + GROUP * c), _mm512_set1_epi32(t->sc[c][0]));
    for (int j = 1; j < 16; j++)
        a = _mm512_add_epi32(a, _mm512_mullo_epi32(_mm512_load_si512(dots[j] + GROUP * c), _mm512_set1_epi32(t->sc[c][j])));
    __m512i corr = _mm512_madd_epi16(_mm512_loadu_si512(pairs), _mm512_set1_epi32(t->pair[c][0]));
    for (int p = 1; p < 8; p++)
        corr = _mm512_dpwssd_epi32(corr, _mm512_loadu_si512(pairs + p * GROUP), _mm512_set1_epi32(t->pair[c][p]));
    a = _mm512_sub_epi32(a, _mm512_slli_epi32(corr, 5));
    __m512 cb = _mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(t->d[c])), _mm512_cvtepi32_ps(a));
    return _mm512_add_ps(acc, cb);
}

/* out[r][j0 + c] for the group's rows and the tile's columns (rows n apart): acc[c] lane r */
static void store_group(const __m512 *acc, int rows, int cols, float *out, int n) {
    float lanes[TILE_COLS][GROUP] __attribute__((aligned(64)));
    for (int c = 0; c < cols; c++) _mm512_store_ps(lanes[c], acc[c]);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) out[(size_t)r * n + c] = lanes[c][r];
}

/* exact_vnni.c's packed layout: a tile-block's size, and one column's raw block back from it */
size_t ex_tile_block_bytes(int type);
void ex_unpack_column(int type, const uint8_t *tb, int c, uint8_t *blk);

/* A packed tile-block -> the 16 columns' raw blocks, `bytes` apart (unpack_q4_K's and unpack_q6_K's input) */
static void unpack_tile_block(int type, const uint8_t *tb, size_t bytes, uint8_t *blocks) {
    for (int c = 0; c < TILE_COLS; c++) ex_unpack_column(type, tb, c, blocks + (size_t)c * bytes);
}

/* The product for a Q4_K (type 2) or Q6_K (type 3) matrix w [n, k] (raw GGUF blocks, or `packed` in
 * exact_vnni.c's layout) and the pass's prepared levels q [m, k], scales dx [m, k / 256] and sub-block
 * sums (Q4_K: of 32, [m, k / 32]; Q6_K: of 16, [m, k / 16]) -> out [m, n], rows `ldo` apart; scratch of
 * ex_amx_scratch_bytes(m, k). The caller has had ex_amx_enable() succeed. */
void ex_amx_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                    const int16_t *sums, int m, float *out, int ldo, void *scratch) {
    int q4 = type == 2, k_sub = q4 ? 32 : 16, subs = QK_K / k_sub, blocks = k / QK_K;
    size_t block_bytes = q4 ? sizeof(amx_block_q4_K) : sizeof(amx_block_q6_K), row_bytes = blocks * block_bytes;
    size_t tb_bytes = ex_tile_block_bytes(type);
    uint8_t raw[TILE_COLS * sizeof(amx_block_q6_K)]; /* a packed tile-block's raw blocks, block_bytes apart */
    int at[16];
    for (int j = 0; j < subs; j++) at[j] = q4 ? Q4_K_AT[j] : 16 * j;
    amx_rows x;
    lay_out_rows(q, dx, sums, q4 ? 8 : 16, m, k, scratch, &x);
    amx_tile t;                                                         /* 6 KB */
    int32_t dots[16][TILE_COLS * GROUP] __attribute__((aligned(64)));   /* 16 KB: each sub-block's C */
    __m512 acc[CHUNK_GROUPS][TILE_COLS];                                /* 16 KB: the folds */
    int groups = (m + GROUP - 1) / GROUP;
    configure(k_sub);
    for (int g0 = 0; g0 < groups; g0 += CHUNK_GROUPS) {
        int chunk = groups - g0 < CHUNK_GROUPS ? groups - g0 : CHUNK_GROUPS;
        for (int j0 = 0; j0 < n; j0 += TILE_COLS) {
            int cols = n - j0 < TILE_COLS ? n - j0 : TILE_COLS;
            for (int g = 0; g < chunk; g++)
                for (int c = 0; c < TILE_COLS; c++) acc[g][c] = _mm512_setzero_ps();
            /* raw short rows: each step fetches its share of the next column tile into L2 (as exact.c's SWEEP);
             * a packed matrix is one contiguous stream, fetched PACKED_AHEAD ahead (as exact_vnni.c does) */
            const uint8_t *next = w + (size_t)(j0 + TILE_COLS) * row_bytes, *end = w + (size_t)n * row_bytes;
            size_t share = !packed && row_bytes < PREFETCH_ROW_BYTES ? TILE_COLS * block_bytes : 0;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk0 = w + (size_t)j0 * row_bytes + (size_t)b * block_bytes;
                size_t stride = row_bytes;
                for (const uint8_t *line = next + b * share; line < next + (b + 1) * share && line < end; line += 64)
                    _mm_prefetch((const char *)line, _MM_HINT_T1);
                if (packed) { /* columns past n repeat the last in the packed tile, as cols asks */
                    const uint8_t *tb = w + ((size_t)(j0 / TILE_COLS) * blocks + b) * tb_bytes;
                    for (size_t line = 0; line < tb_bytes; line += 64)
                        _mm_prefetch((const char *)tb + PACKED_AHEAD + line, _MM_HINT_T1);
                    unpack_tile_block(type, tb, block_bytes, raw);
                    blk0 = raw, stride = block_bytes;
                }
                if (q4) unpack_q4_K(blk0, stride, cols, &t);
                else unpack_q6_K(blk0, stride, cols, &t);
                for (int g = 0; g < chunk; g++) {
                    size_t gg = (size_t)(g0 + g);
                    const int8_t *xb = x.b + gg * x.b_stride + (size_t)b * QK_K * GROUP;
                    const int32_t *pairs = x.pairs + gg * x.pairs_stride + (size_t)b * x.npairs * GROUP;
                    __m512 vdx = _mm512_loadu_ps(x.dx + gg * x.dx_stride + (size_t)b * GROUP);
                    sub_products(&t, at, xb, k_sub, subs, dots);
                    for (int c = 0; c < cols; c++)
                        acc[g][c] = q4 ? fold_q4_K(&t, c, dots, pairs, vdx, acc[g][c])
                                       : fold_q6_K(&t, c, dots, pairs, vdx, acc[g][c]);
                }
            }
            for (int g = 0; g < chunk; g++) {
                int r0 = (g0 + g) * GROUP, rows = m - r0 < GROUP ? m - r0 : GROUP;
                store_group(acc[g], rows, cols, out + (size_t)r0 * ldo + j0, ldo);
            }
        }
    }
    _tile_release();
}
#endif
