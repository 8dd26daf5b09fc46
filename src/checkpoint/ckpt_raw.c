/* ckpt_raw.c — the tensors' bytes, written beside HDF5 (ckpt_internal.h).
 *
 * The datasets are contiguous and allocated when created, never filled
 * (ckpt_save.c's create_dataset, the import's write_tensor): HDF5 writes no raw data of its own, and a dataset's
 * bytes are its row-major float32 values at H5Dget_offset in the file.  Each
 * rank writes its pieces there itself, beside HDF5 (which writes only the
 * metadata): whole 4 KiB blocks with O_DIRECT through an aligned staging
 * buffer, the unaligned ends of a piece through the page cache.  Buffered
 * writes of the same bytes cost about 8x the kernel time of direct ones
 * (1.0 s against 0.13 s of system time for 840 MB on the development VM),
 * CPU an asynchronous save takes from training.  A file system that refuses
 * O_DIRECT (tmpfs) gets every byte through the page cache.  No block is
 * written both ways: direct writes cover whole blocks inside one piece,
 * buffered ones the blocks a piece shares with its neighbours. */
#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int ckpt_raw_open(CkptRaw *w, const char *path)
{
    w->fd = open(path, O_WRONLY | O_CLOEXEC);
    w->fd_direct = w->fd >= 0 ? open(path, O_WRONLY | O_CLOEXEC | O_DIRECT) : -1;
    w->stage = NULL;
    if (w->fd_direct >= 0 &&
        posix_memalign((void **)&w->stage, CKPT_RAW_ALIGN, CKPT_RAW_STAGE) != 0) {
        close(w->fd_direct);
        w->fd_direct = -1;
        w->stage = NULL;
    }
    return w->fd >= 0 ? 0 : -1;
}

/* pwrite all n bytes (errno set on failure; a short write of a full disk
 * is ENOSPC). */
static int pwrite_all(int fd, const char *src, size_t n, off_t at)
{
    while (n > 0) {
        const ssize_t k = pwrite(fd, src, n, at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = ENOSPC;
            return -1;
        }
        src += k;
        at += k;
        n -= (size_t)k;
    }
    return 0;
}

int ckpt_raw_write(CkptRaw *w, const char *src, size_t n, off_t at)
{
    if (w->fd_direct < 0)
        return pwrite_all(w->fd, src, n, at);
    size_t head = (size_t)((CKPT_RAW_ALIGN - at % CKPT_RAW_ALIGN) % CKPT_RAW_ALIGN);
    head = head < n ? head : n;
    if (head && pwrite_all(w->fd, src, head, at) != 0)
        return -1;
    src += head, at += (off_t)head, n -= head;
    for (size_t mid = n / CKPT_RAW_ALIGN * CKPT_RAW_ALIGN; mid > 0;) {
        /* Memory aligned like the file goes out as it is, in one call (the
         * disk gets all of its requests at once); other memory through the
         * staging buffer. */
        const int staged = (uintptr_t)src % CKPT_RAW_ALIGN != 0;
        const size_t m = !staged || mid < CKPT_RAW_STAGE ? mid : CKPT_RAW_STAGE;
        const char *p = src;
        if (staged) {
            memcpy(w->stage, src, m);
            p = w->stage;
        }
        if (pwrite_all(w->fd_direct, p, m, at) != 0)
            return -1;
        src += m, at += (off_t)m, n -= m, mid -= m;
    }
    return n ? pwrite_all(w->fd, src, n, at) : 0;
}

/* Sync what went through the page cache (direct writes are on the device
 * when pwrite returns; fsync also flushes its cache) and close. */
int ckpt_raw_close(CkptRaw *w, int sync)
{
    int rc = 0;
    if (w->fd >= 0 && sync && fsync(w->fd) != 0)
        rc = -1;
    const int saved = errno;
    if (w->fd_direct >= 0)
        close(w->fd_direct);
    if (w->fd >= 0)
        close(w->fd);
    free(w->stage);
    errno = saved;
    return rc;
}

void *ckpt_io_alloc(size_t n, const char *what)
{
    enum { HUGE_PAGE = 2 << 20 };
    void *p = NULL;
    if (posix_memalign(&p, n >= HUGE_PAGE ? HUGE_PAGE : CKPT_RAW_ALIGN, n ? n : 1) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory: %s (%zu bytes)", what, n);
#ifdef MADV_HUGEPAGE
    if (n >= HUGE_PAGE)
        (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

void *ckpt_io_grow(void *buf, size_t *cap, size_t n, const char *what)
{
    if (n <= *cap)
        return buf;
    free(buf);
    *cap = n;
    return ckpt_io_alloc(n, what);
}

size_t ckpt_raw_span(off_t at, size_t n)
{
    if (n == 0)
        return 0;
    const off_t a0 = at / CKPT_RAW_ALIGN * CKPT_RAW_ALIGN;
    const off_t a1 = (at + (off_t)n + CKPT_RAW_ALIGN - 1) / CKPT_RAW_ALIGN * CKPT_RAW_ALIGN;
    return (size_t)(a1 - a0);
}

int ckpt_raw_read(int fd, int fd_direct, off_t at, size_t n, char *dst, off_t *fail)
{
    const off_t a0 = at / CKPT_RAW_ALIGN * CKPT_RAW_ALIGN, end = at + (off_t)n;
    int direct = fd_direct >= 0 && n > 0;
    off_t pos = direct ? a0 : at;
    while (pos < end) {
        const off_t want_end = direct ? a0 + (off_t)ckpt_raw_span(at, n) : end;
        const size_t want = (size_t)(want_end - pos) < CKPT_RAW_READ_CHUNK
                                ? (size_t)(want_end - pos)
                                : CKPT_RAW_READ_CHUNK;
        const ssize_t got = pread(direct ? fd_direct : fd, dst + (pos - a0), want, pos);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == EINVAL && direct) { /* no O_DIRECT here after all */
            direct = 0;
            pos = pos > at ? pos : at;
            continue;
        }
        if (got < 0) {
            *fail = pos;
            return errno;
        }
        pos += got;
        /* O_DIRECT reads whole blocks except at the end of the file. */
        if (pos < end && (got == 0 || (direct && got % CKPT_RAW_ALIGN))) {
            *fail = pos;
            return -1;
        }
    }
    return 0;
}

/* ---- CkptSink: the writes behind the caller ----------------------------- */

static void *sink_writer(void *arg)
{
    CkptSink *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->done == s->queued && !s->closing)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->done == s->queued)
            break;
        const CkptSinkJob j = s->job[s->done % CKPT_SINK_JOBS];
        const int failed = s->err_no != 0;
        pthread_mutex_unlock(&s->mu);
        const int rc = failed ? 0 : ckpt_raw_write(&s->raw, j.src, j.n, j.at);
        const int err_no = rc != 0 ? (errno ? errno : EIO) : 0;
        pthread_mutex_lock(&s->mu);
        if (err_no && !s->err_no)
            s->err_no = err_no;
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int ckpt_sink_open(CkptSink *s, const char *path)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    if (ckpt_raw_open(&s->raw, path) != 0)
        return -1;
    for (int i = 0; i < CKPT_SINK_BUFS; i++)
        if (posix_memalign((void **)&s->bufs[i], CKPT_RAW_ALIGN, CKPT_SINK_CAP) != 0) {
            for (int k = 0; k < i; k++)
                free(s->bufs[k]);
            ckpt_raw_close(&s->raw, 0);
            errno = ENOMEM;
            return -1;
        }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    TRD_ASSERT(pthread_create(&s->thread, NULL, sink_writer, s) == 0);
    return 0;
}

/* errno = the first write's failure: -1, else 0. */
static int sink_status(int err_no)
{
    if (!err_no)
        return 0;
    errno = err_no;
    return -1;
}

/* Hand job j to the writer (waiting while the ring is full): its ticket. */
static int64_t sink_queue(CkptSink *s, CkptSinkJob j, int *err_no)
{
    pthread_mutex_lock(&s->mu);
    while (s->queued - s->done == CKPT_SINK_JOBS)
        pthread_cond_wait(&s->cv, &s->mu);
    s->job[s->queued % CKPT_SINK_JOBS] = j;
    const int64_t ticket = ++s->queued;
    pthread_cond_broadcast(&s->cv);
    *err_no = s->err_no;
    pthread_mutex_unlock(&s->mu);
    return ticket;
}

void ckpt_sink_wait(CkptSink *s, int64_t t)
{
    pthread_mutex_lock(&s->mu);
    while (s->done < t)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Hand the buffer being filled to the writer. */
static int sink_flush(CkptSink *s)
{
    int err_no = 0;
    if (s->n) {
        const int b = (int)(s->n_bufs % CKPT_SINK_BUFS);
        s->buf_ticket[b] = sink_queue(s, (CkptSinkJob){s->buf + s->lead, s->n, s->at}, &err_no);
        s->n_bufs++;
        s->at += (off_t)s->n;
        s->n = 0;
        s->lead = (size_t)(s->at % CKPT_RAW_ALIGN);
    } else {
        pthread_mutex_lock(&s->mu);
        err_no = s->err_no;
        pthread_mutex_unlock(&s->mu);
    }
    s->buf = NULL;
    return sink_status(err_no);
}

int ckpt_sink_seek(CkptSink *s, off_t at)
{
    const int rc = sink_flush(s);
    const int err_no = errno;
    s->at = at;
    s->lead = (size_t)(at % CKPT_RAW_ALIGN);
    errno = err_no;
    return rc;
}

int ckpt_sink_put(CkptSink *s, const void *src, size_t bytes)
{
    const char *p = src;
    while (bytes > 0) {
        if (!s->buf) { /* the next buffer, once its last write is done */
            const int b = (int)(s->n_bufs % CKPT_SINK_BUFS);
            ckpt_sink_wait(s, s->buf_ticket[b]);
            s->buf = s->bufs[b];
        }
        const size_t room = CKPT_SINK_CAP - s->lead - s->n, m = bytes < room ? bytes : room;
        memcpy(s->buf + s->lead + s->n, p, m);
        s->n += m, p += m, bytes -= m;
        if (s->lead + s->n == CKPT_SINK_CAP && sink_flush(s) != 0)
            return -1;
    }
    return 0;
}

int64_t ckpt_sink_write_ref(CkptSink *s, const void *src, size_t n, off_t at)
{
    if (sink_flush(s) != 0)
        return -1;
    int err_no;
    const int64_t ticket = sink_queue(s, (CkptSinkJob){src, n, at}, &err_no);
    s->at = at + (off_t)n;
    s->lead = (size_t)(s->at % CKPT_RAW_ALIGN);
    return sink_status(err_no) == 0 ? ticket : -1;
}

int ckpt_sink_error(CkptSink *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->done < s->queued)
        pthread_cond_wait(&s->cv, &s->mu);
    const int err_no = s->err_no;
    pthread_mutex_unlock(&s->mu);
    return err_no;
}

int ckpt_sink_close(CkptSink *s, int sync)
{
    int rc = sync ? sink_flush(s) : 0;
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    if (rc == 0 && sync)
        rc = sink_status(s->err_no);
    int err_no = errno;
    if (ckpt_raw_close(&s->raw, sync && rc == 0) != 0 && rc == 0) {
        rc = -1;
        err_no = errno;
    }
    for (int i = 0; i < CKPT_SINK_BUFS; i++)
        free(s->bufs[i]);
    errno = err_no;
    return rc;
}

/* ---- CkptSource: the reads ahead of the caller -------------------------- */

/* Where read i's span goes, once there is room (the mutex held): a
 * position in the stream of bytes the ring has held, its place in the ring
 * that modulo cap.  A span never wraps (it starts the ring over instead)
 * and the spans held lie between freed and freed + cap.  -1: stopped. */
static int64_t source_place(CkptSource *s, int64_t i, size_t span)
{
    const int64_t cap = (int64_t)s->cap;
    for (;;) {
        if (s->stop)
            return -1;
        int64_t p = s->wpos;
        if (i == s->released) /* nothing held: start at the ring's beginning */
            s->freed = p = (p + cap - 1) / cap * cap;
        if (p % cap + (int64_t)span > cap)
            p = (p / cap + 1) * cap;
        if (p + (int64_t)span <= s->freed + cap)
            return p;
        pthread_cond_wait(&s->cv, &s->mu);
    }
}

/* Each of the source's threads claims the next read, places it in the
 * ring (in the plan's order), reads it, and marks it done: with
 * CKPT_SOURCE_THREADS reads in flight the disk has work queued while a
 * read completes (one at a time, an O_DIRECT read left it idle between
 * reads, where the page cache's readahead keeps it busy). */
static void *source_reader(void *arg)
{
    CkptSource *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop && s->claimed < s->n) {
        const int64_t i = s->claimed++;
        while (!s->stop && s->placed < i)
            pthread_cond_wait(&s->cv, &s->mu);
        const CkptSourceRead *r = &s->plan[i];
        const size_t span = ckpt_raw_span(r->at, r->n);
        const int64_t at = s->stop ? -1 : source_place(s, i, span);
        if (at < 0)
            break;
        s->pos[i] = at;
        s->wpos = at + (int64_t)span;
        s->placed++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        off_t fail = 0;
        const int err =
            ckpt_raw_read(r->fd, r->fd_direct, r->at, r->n, s->ring + at % (int64_t)s->cap, &fail);
        pthread_mutex_lock(&s->mu);
        s->err[i] = err;
        s->err_at[i] = fail;
        s->done[i] = 1;
        while (s->read < s->n && s->done[s->read])
            s->read++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void ckpt_source_open(CkptSource *s, const CkptSourceRead *plan, int n, size_t ring)
{
    memset(s, 0, sizeof *s);
    s->plan = plan;
    s->n = n;
    size_t total = 0, largest = 0;
    for (int i = 0; i < n; i++) {
        const size_t span = ckpt_raw_span(plan[i].at, plan[i].n);
        total += span;
        largest = span > largest ? span : largest;
    }
    ring = ring ? ring / CKPT_RAW_ALIGN * CKPT_RAW_ALIGN : CKPT_SOURCE_RING;
    s->cap = total < ring ? total : ring;
    s->cap = s->cap > largest ? s->cap : largest;
    s->cap = s->cap ? s->cap : CKPT_RAW_ALIGN;
    s->ring = ckpt_io_alloc(s->cap, "read-ahead ring");
    s->pos = trd_calloc((size_t)n + 1, sizeof *s->pos, "read-ahead plan");
    s->err = trd_calloc((size_t)n + 1, sizeof *s->err, "read-ahead plan");
    s->err_at = trd_calloc((size_t)n + 1, sizeof *s->err_at, "read-ahead plan");
    s->done = trd_calloc((size_t)n + 1, 1, "read-ahead plan");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int t = 0; t < CKPT_SOURCE_THREADS; t++)
        TRD_ASSERT(pthread_create(&s->thread[t], NULL, source_reader, s) == 0);
}

int ckpt_source_take(CkptSource *s, const void **bytes, off_t *at)
{
    pthread_mutex_lock(&s->mu);
    TRD_ASSERT(s->taken < s->n);
    while (s->read <= s->taken)
        pthread_cond_wait(&s->cv, &s->mu);
    const int64_t i = s->taken++;
    pthread_mutex_unlock(&s->mu);
    *bytes = s->ring + s->pos[i] % (int64_t)s->cap + s->plan[i].at % CKPT_RAW_ALIGN;
    *at = s->err_at[i];
    return s->err[i];
}

void ckpt_source_release(CkptSource *s)
{
    pthread_mutex_lock(&s->mu);
    TRD_ASSERT(s->released < s->taken);
    s->freed = s->pos[s->released] +
               (int64_t)ckpt_raw_span(s->plan[s->released].at, s->plan[s->released].n);
    s->released++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ckpt_source_close(CkptSource *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int t = 0; t < CKPT_SOURCE_THREADS; t++)
        pthread_join(s->thread[t], NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->ring);
    free(s->done);
    free(s->pos);
    free(s->err);
    free(s->err_at);
}
