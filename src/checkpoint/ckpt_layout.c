/* ckpt_layout.c — which part of a global tensor a flat range of the local
 * parameter table covers.  Pure arithmetic over the parameter table; the
 * HDF5 selection is built from it in one place (ckpt_select). */
#include "checkpoint/ckpt_internal.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

const char *const ckpt_kind_names[CKPT_KINDS] = {"params", "master", "adam_m", "adam_v"};

static void add_block(CkptSlab *s, int64_t r, int64_t c, int64_t nr, int64_t nc)
{
    if (nr > 0 && nc > 0)
        s->b[s->n++] = (CkptBlock){.r = r, .c = c, .nr = nr, .nc = nc};
}

CkptSlab ckpt_slab(const ParamSpec *p, int64_t real_rows, size_t lo, size_t hi)
{
    CkptSlab s = {.n = 0};
    const size_t beg = p->offset, end = p->offset + p->numel;
    size_t a = lo > beg ? lo : beg, b = hi < end ? hi : end;
    if (a >= b)
        return s;
    a -= beg;
    b -= beg;
    const int64_t lc = p->local_shape[1], r0 = p->local_start[0], c0 = p->local_start[1];
    /* Padding rows are the last global rows, hence the last local rows. */
    int64_t keep_rows = real_rows - r0;
    keep_rows = keep_rows < 0 ? 0 : keep_rows > p->local_shape[0] ? p->local_shape[0] : keep_rows;
    const size_t keep = (size_t)(keep_rows * lc);
    if (b > keep)
        b = keep;
    if (a >= b)
        return s;
    s.first = beg + a;
    s.count = b - a;
    /* Whole rows held (no column split): the slab is one run of the stored
     * tensor, starting at global element gfirst. */
    s.contiguous = lc == p->shape[1];
    s.gfirst = (r0 + (int64_t)a / lc) * p->shape[1] + c0 + (int64_t)a % lc;

    int64_t ra = (int64_t)a / lc, ca = (int64_t)a % lc;
    const int64_t rb = (int64_t)b / lc, cb = (int64_t)b % lc; /* b exclusive */
    if (ra == rb) {
        add_block(&s, r0 + ra, c0 + ca, 1, cb - ca);
        return s;
    }
    if (ca > 0) {
        add_block(&s, r0 + ra, c0 + ca, 1, lc - ca);
        ra++;
    }
    add_block(&s, r0 + ra, c0, rb - ra, lc);
    add_block(&s, r0 + rb, c0, 1, cb);
    return s;
}

int ckpt_slabs(const ParamSpec *p, int64_t real_rows, size_t lo, size_t hi,
               CkptSlab out[CKPT_MAX_RUNS], int64_t first_row[CKPT_MAX_RUNS])
{
    /* Runs of local rows that are consecutive global rows: all of them, or
     * (replicated kv heads, params.h) the query rows then the k, v rows, or
     * (experts split over TP) each expert's rows. */
    const int64_t lc = p->local_shape[1];
    int64_t run_lo[CKPT_MAX_RUNS], run_hi[CKPT_MAX_RUNS];
    int runs = 0;
    if (p->row_blocks > 1) {
        TRD_ASSERT(p->row_blocks <= CKPT_MAX_RUNS);
        const int64_t mine = p->local_shape[0] / p->row_blocks;
        for (; runs < p->row_blocks; runs++) {
            run_lo[runs] = runs * mine;
            run_hi[runs] = (runs + 1) * mine;
        }
    } else {
        const int64_t split =
            p->kv_row > 0 && p->kv_row < p->local_shape[0] ? p->kv_row : p->local_shape[0];
        run_lo[0] = 0;
        run_hi[0] = run_lo[1] = split;
        run_hi[1] = p->local_shape[0];
        runs = 2;
    }
    int n = 0;
    for (int i = 0; i < runs; i++) {
        if (run_lo[i] >= run_hi[i])
            continue;
        ParamSpec q = *p;
        q.local_start[0] = params_global_row(p, run_lo[i]);
        q.local_shape[0] = run_hi[i] - run_lo[i];
        q.offset = p->offset + (size_t)(run_lo[i] * lc);
        q.numel = (size_t)(q.local_shape[0] * lc);
        CkptSlab s = ckpt_slab(&q, real_rows, lo, hi);
        if (s.count) {
            first_row[n] = run_lo[i] + (int64_t)(s.first - q.offset) / lc;
            out[n++] = s;
        }
    }
    return n;
}

int64_t ckpt_block_rows(int ndim, const int64_t shape[2])
{
    /* About 1 Mi elements (4 MiB) per block: big enough that verifying a
     * block costs one sequential read, small enough that a reader of a
     * partial tensor reads little beyond what it needs. */
    const int64_t target = 1 << 20;
    const int64_t cols = ndim == 1 ? 1 : shape[1];
    int64_t rows = cols > 0 ? target / cols : 1;
    return rows < 1 ? 1 : rows;
}

int64_t ckpt_n_blocks(int ndim, const int64_t shape[2])
{
    const int64_t r = ckpt_block_rows(ndim, shape);
    return (shape[0] + r - 1) / r;
}

static inline uint64_t elem_hash(uint64_t gidx, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    /* For a fixed index this is a bijection of the value's bits, so any
     * change of one element changes the block's sum; the index key makes
     * moved or swapped elements count too. */
    uint64_t h = (gidx * 0x9E3779B97F4A7C15ull) ^ bits;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

int64_t ckpt_checksum_slab(const CkptSlab *s, int64_t cols, int64_t block_rows, const float *src,
                           uint64_t *sums)
{
    /* The save touches every element here anyway: NaN and Inf (exponent
     * all ones) are found on the way, as the largest magnitude bit pattern
     * of the row (a max vectorises; +0.15 ns an element against 0.75 for
     * the hash), and counted only in a row that has one. */
    int64_t nonfinite = 0;
    for (int i = 0; i < s->n; i++) {
        const CkptBlock *b = &s->b[i];
        for (int64_t r = b->r; r < b->r + b->nr; r++) {
            const float *row = src + (r - b->r) * b->nc;
            const uint64_t row0 = (uint64_t)r * (uint64_t)cols + (uint64_t)b->c;
            uint64_t acc = 0;
            uint32_t top = 0;
            for (int64_t c = 0; c < b->nc; c++) {
                uint32_t bits;
                memcpy(&bits, &row[c], sizeof bits);
                bits &= 0x7fffffffu;
                top = bits > top ? bits : top;
                acc += elem_hash(row0 + (uint64_t)c, row[c]);
            }
            sums[r / block_rows] += acc;
            for (int64_t c = 0; top >= 0x7f800000u && c < b->nc; c++)
                nonfinite += !isfinite(row[c]);
        }
        src += b->nr * b->nc;
    }
    return nonfinite;
}

uint64_t ckpt_checksum_rows(const float *buf, int64_t row0, int64_t nrows, int64_t cols)
{
    /* One thread: the hash runs at several GB/s (vectorised), faster than
     * the disk, and OpenMP workers spinning beside the I/O would slow it. */
    uint64_t acc = 0;
    const uint64_t first = (uint64_t)row0 * (uint64_t)cols, n = (uint64_t)(nrows * cols);
    for (uint64_t i = 0; i < n; i++)
        acc += elem_hash(first + i, buf[i]);
    return acc;
}

void ckpt_select(hid_t space, const CkptSlab *s)
{
    TRD_ASSERT(H5Sselect_none(space) >= 0);
    for (int i = 0; i < s->n; i++) {
        hsize_t start[2] = {(hsize_t)s->b[i].r, (hsize_t)s->b[i].c};
        hsize_t count[2] = {(hsize_t)s->b[i].nr, (hsize_t)s->b[i].nc};
        /* A 1-D tensor is a column: its blocks all have c == 0, nc == 1. */
        TRD_ASSERT(H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, NULL,
                                       count, NULL) >= 0);
    }
}

hid_t ckpt_space(int ndim, const int64_t shape[2])
{
    hsize_t dims[2] = {(hsize_t)shape[0], (hsize_t)shape[1]};
    hid_t s = H5Screate_simple(ndim, dims, NULL);
    TRD_ASSERT(s >= 0);
    return s;
}

/* Eight rows of 8 floats, src[k][j0 .. j0 + 8), transposed in registers
 * into dst[k][i0 .. i0 + 8): three rounds of interleaving pairs, of
 * singles, then of pairs, then of halves (GCC's vector extensions: AVX
 * shuffles with -march=native, SSE pairs without). */
typedef float V8 __attribute__((vector_size(32)));

static inline void transpose8(const float *const *src, int64_t j0, float *const *dst, int64_t i0)
{
    V8 a[8], b[8];
    for (int k = 0; k < 8; k++)
        memcpy(&a[k], src[k] + j0, sizeof a[k]);
    for (int k = 0; k < 8; k += 2) {
        b[k] = __builtin_shufflevector(a[k], a[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        b[k + 1] = __builtin_shufflevector(a[k], a[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int k = 0; k < 8; k += 4)
        for (int h = 0; h < 2; h++) {
            a[k + 2 * h] =
                __builtin_shufflevector(b[k + h], b[k + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            a[k + 2 * h + 1] =
                __builtin_shufflevector(b[k + h], b[k + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int k = 0; k < 4; k++) {
        b[k] = __builtin_shufflevector(a[k], a[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        b[k + 4] = __builtin_shufflevector(a[k], a[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (int k = 0; k < 8; k++)
        memcpy(dst[k] + i0, &b[k], sizeof b[k]);
}

void ckpt_transpose(const float *in, int64_t r, int64_t c, const int64_t *imap, const int64_t *omap,
                    float *out)
{
    /* Panels of 64 x 64, in 8 x 8 blocks transposed in registers: 3x the
     * speed of going through a tile in memory (2.6 against 8 GB/s of a
     * 16 MiB matrix that is not in the cache), which an import spends on
     * its main thread for every Conv1D weight. */
    enum { P = 64 };
    const float *src[P];
    float *dst[P];
    for (int64_t i0 = 0; i0 < r; i0 += P) {
        const int64_t ni = r - i0 < P ? r - i0 : P, ni8 = ni / 8 * 8;
        for (int64_t i = 0; i < ni; i++)
            src[i] = in + (imap ? imap[i0 + i] : i0 + i) * c;
        for (int64_t j0 = 0; j0 < c; j0 += P) {
            const int64_t nj = c - j0 < P ? c - j0 : P, nj8 = nj / 8 * 8;
            for (int64_t j = 0; j < nj; j++)
                dst[j] = out + (omap ? omap[j0 + j] : j0 + j) * r + i0;
            for (int64_t j = 0; j < nj8; j += 8)
                for (int64_t i = 0; i < ni8; i += 8)
                    transpose8(src + i, j0 + j, dst + j, i);
            for (int64_t j = 0; j < nj; j++) /* the edges, one float at a time */
                for (int64_t i = j < nj8 ? ni8 : 0; i < ni; i++)
                    dst[j][i] = src[i][j0 + j];
        }
    }
}
