/* ckpt_layout.c — which part of a global tensor a flat range of the local
 * parameter table covers.  Pure arithmetic over the parameter table; the
 * HDF5 selection is built from it in one place (ckpt_select). */
#include "checkpoint/ckpt_internal.h"

#include "core/error.h"

const char *const ckpt_kind_names[CKPT_KINDS] = {"params", "master", "adam_m", "adam_v"};

int64_t ckpt_real_rows(const ParamSpec *p, const ModelConfig *m)
{
    /* The vocabulary tensors are the outer ones split by rows (embedding and
     * untied head); their padding rows depend on tp and are not stored. */
    if (p->role != ROLE_BLOCK && p->split_dim == 0 && p->shape[0] >= m->vocab)
        return m->vocab;
    return p->shape[0];
}

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

    int64_t ra = (int64_t)a / lc, ca = (int64_t)a % lc;
    const int64_t rb = (int64_t)b / lc, cb = (int64_t)b % lc;   /* b exclusive */
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

void ckpt_chunk_dims(int ndim, const int64_t shape[2], hsize_t chunk[2])
{
    /* Whole rows keep a row's checksum in one chunk and make the chunk
     * grid independent of tp and dp; 1 Mi elements (4 MiB) amortise the
     * per-chunk work of the filter and of collective I/O. */
    const int64_t target = 1 << 20;
    if (ndim == 1) {
        chunk[0] = (hsize_t)(shape[0] < target ? shape[0] : target);
        chunk[1] = 1;
        return;
    }
    int64_t cols = shape[1] < target ? shape[1] : target;
    int64_t rows = target / cols;
    rows = rows < 1 ? 1 : rows > shape[0] ? shape[0] : rows;
    chunk[0] = (hsize_t)(rows > 0 ? rows : 1);
    chunk[1] = (hsize_t)(cols > 0 ? cols : 1);
}

void ckpt_select(hid_t space, const CkptSlab *s)
{
    TRD_ASSERT(H5Sselect_none(space) >= 0);
    for (int i = 0; i < s->n; i++) {
        hsize_t start[2] = {(hsize_t)s->b[i].r, (hsize_t)s->b[i].c};
        hsize_t count[2] = {(hsize_t)s->b[i].nr, (hsize_t)s->b[i].nc};
        /* A 1-D tensor is a column: its blocks all have c == 0, nc == 1. */
        TRD_ASSERT(H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start,
                                       NULL, count, NULL) >= 0);
    }
}

hid_t ckpt_space(int ndim, const int64_t shape[2])
{
    hsize_t dims[2] = {(hsize_t)shape[0], (hsize_t)shape[1]};
    hid_t s = H5Screate_simple(ndim, dims, NULL);
    TRD_ASSERT(s >= 0);
    return s;
}
