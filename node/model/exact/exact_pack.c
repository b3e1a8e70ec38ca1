/* The K-quant matrices repacked once at load (docs/exact-arithmetic.md §2-4: the same blocks, the same
 * bits): exact_vnni.c's packed layout, where a tile of 16 output columns is one contiguous stream of
 * 64-byte registers whose lane c is column c (see there). The model (model.py) packs each Q4_K and Q6_K
 * matrix into memory of its own and then reads only the copy, so the GGUF map's pages of those matrices
 * are never touched: the weights are not held twice.
 *
 * The products on a packed matrix take their rows as exact.c's products do (§3 into scratch), or, with
 * x NULL, the rows a previous call prepared in the same scratch, so that matrices that share their input
 * (q, k, v; gate, up) quantize it once; and they write rows `ldo` apart, so that those matrices' outputs
 * land side by side in one tensor. VNNI at every width; AMX (exact_amx.c) for wide passes where built.
 *
 * Measured (Zen 4, one thread, the 1.5B target's whole pass against the raw-layout lanes path): one row
 * 92 -> 52 ms, 7 rows 162 -> 97 ms, 28 rows 422 -> 326 ms. Packing the 985 MB takes about 0.3 s of
 * transposes, plus the first touch of the new memory.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define QK_K 256
enum { EX_Q4_K = 2, EX_Q6_K = 3 };        /* exact.c's type codes */
enum { EX_OK = 0, EX_BAD_SHAPE = 2 };     /* and return codes */
enum { TILE = 16 };

/* exact.c */
int ex_prepare_k(const float *x, int m, int k, void *scratch, int8_t **q, float **dx, int16_t **bs32,
                 int16_t **bs16);
/* exact_vnni.c */
size_t ex_tile_block_bytes(int type);
void ex_pack_tile_block(int type, const uint8_t *blk0, size_t row_bytes, int cols, uint8_t *out);
void ex_vnni_lanes_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                           const int16_t *sums, int m, float *out, int ldo);

static int packable(int type, int n, int k) {
    return (type == EX_Q4_K || type == EX_Q6_K) && n > 0 && k > 0 && k % QK_K == 0;
}

/* The packed size of a Q4_K or Q6_K matrix [n, k] (n rounded up to a tile of 16); 0 for other formats */
size_t ex_packed_bytes(int type, int n, int k) {
    if (!packable(type, n, k)) return 0;
    return (size_t)((n + TILE - 1) / TILE) * (size_t)(k / QK_K) * ex_tile_block_bytes(type);
}

/* Walk w [n, k] in the GGUF's blocks tile after tile, block after block, packing each tile-block: into
 * `out` (ex_pack), or into a buffer on the stack compared with `check` (ex_pack_check; 1 at the first
 * difference). */
static int pack_walk(int type, const uint8_t *w, int n, int k, uint8_t *out, const uint8_t *check) {
    if (!packable(type, n, k)) return EX_BAD_SHAPE;
    enum { MAX_TILE_BLOCK = TILE * 256 }; /* above either format's tile-block */
    uint8_t buf[MAX_TILE_BLOCK] __attribute__((aligned(64)));
    int blocks = k / QK_K;
    size_t bytes = type == EX_Q4_K ? 144 : 210, row_bytes = (size_t)blocks * bytes, tb = ex_tile_block_bytes(type);
    if (tb > sizeof buf) return EX_BAD_SHAPE;
    for (int j0 = 0; j0 < n; j0 += TILE) {
        int cols = n - j0 < TILE ? n - j0 : TILE;
        const uint8_t *tile = w + (size_t)j0 * row_bytes;
        for (int b = 0; b < blocks; b++) {
            uint8_t *to = check ? buf : out + ((size_t)(j0 / TILE) * blocks + b) * tb;
            ex_pack_tile_block(type, tile + b * bytes, row_bytes, cols, to);
            if (check && memcmp(buf, check + ((size_t)(j0 / TILE) * blocks + b) * tb, tb)) return 1;
        }
    }
    return EX_OK;
}

/* w [n, k] in the GGUF's blocks -> out (ex_packed_bytes of it) */
int ex_pack(int type, const uint8_t *w, int n, int k, uint8_t *out) { return pack_walk(type, w, n, k, out, NULL); }

/* Whether `packed` is exactly ex_pack's output for w (0: it is; 1: it differs; EX_BAD_SHAPE): a packed
 * copy kept on disk and shared by the processes of a machine (packed_store.py) is checked against the
 * GGUF's own blocks at every load before any product reads it: a stale, truncated or corrupted file is
 * never computed with. */
int ex_pack_check(int type, const uint8_t *w, int n, int k, const uint8_t *packed) {
    return pack_walk(type, w, n, k, NULL, packed);
}

/* out [m, n] (rows ldo apart) = x [m, k] times the packed matrix w [n, k], on VNNI; x NULL: the rows that
 * the previous call prepared in scratch (ex_scratch_bytes(m, k)). */
int ex_matmul_packed_vnni(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, int ldo,
                          void *scratch) {
    int8_t *q;
    float *dx;
    int16_t *bs32, *bs16;
    if (!packable(type, n, k) || ldo < n) return EX_BAD_SHAPE;
    int rc = ex_prepare_k(x, m, k, scratch, &q, &dx, &bs32, &bs16);
    if (rc) return rc;
    ex_vnni_lanes_product(type, w, 1, n, k, q, dx, type == EX_Q4_K ? bs32 : bs16, m, out, ldo);
    return EX_OK;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
size_t ex_scratch_bytes(int m, int k);     /* exact.c */
size_t ex_amx_scratch_bytes(int m, int k); /* exact_amx.c */
void ex_amx_product(int type, const uint8_t *w, int packed, int n, int k, const int8_t *q, const float *dx,
                    const int16_t *sums, int m, float *out, int ldo, void *scratch);

/* The same on AMX (after ex_amx_enable() succeeded; kernel.py sees to it) */
int ex_matmul_packed_amx(int type, const uint8_t *w, int n, int k, const float *x, int m, float *out, int ldo,
                         void *scratch) {
    int8_t *q;
    float *dx;
    int16_t *bs32, *bs16;
    if (!packable(type, n, k) || ldo < n) return EX_BAD_SHAPE;
    int rc = ex_prepare_k(x, m, k, scratch, &q, &dx, &bs32, &bs16);
    if (rc) return rc;
    /* the AMX layout follows the prepared rows in scratch (exact.c's ex_scratch_bytes) */
    void *layout = (char *)scratch + (ex_scratch_bytes(m, k) - ex_amx_scratch_bytes(m, k));
    ex_amx_product(type, w, 1, n, k, q, dx, type == EX_Q4_K ? bs32 : bs16, m, out, ldo, layout);
    return EX_OK;
}
#endif
#endif
