#include "train/tensorboard.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "train/tb_event.pb-c.h"

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven:
 * Debian 12 packages no C library for it (zlib's crc32 is another
 * polynomial), and TFRecord frames need exactly this one. */
static uint32_t crc32c(const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    uint32_t crc = 0xFFFFFFFFu;
    while (n--)
        crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* TFRecord masks its CRCs so that a CRC of data that holds CRCs stays
 * well distributed (tensorflow/core/lib/hash/crc32c.h). */
static uint32_t masked_crc(const uint8_t *p, size_t n)
{
    const uint32_t crc = crc32c(p, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

static _Noreturn void write_failed(const TbWriter *tb, int err)
{
    trd_fatal(TRD_EXIT_RUNTIME,
              "check that run.dir is writable and its disk has space, or set "
              "run.tensorboard: false",
              "cannot write %s: %s", tb->path, strerror(err));
}

/* One TFRecord: uint64 length, masked CRC of the length, the event, masked
 * CRC of the event; flushed, so TensorBoard shows a live run and a full
 * disk is caught at the step it happens. */
static void write_event(TbWriter *tb, const Tensorboard__Event *ev)
{
    const size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *buf = trd_malloc(n + 16, "tensorboard event");
    uint8_t head[12], tail[4];
    put_le(head, n, 8);
    put_le(head + 8, masked_crc(head, 8), 4);
    tensorboard__event__pack(ev, buf);
    put_le(tail, masked_crc(buf, n), 4);
    errno = 0;
    if (fwrite(head, 1, sizeof head, tb->f) != sizeof head || fwrite(buf, 1, n, tb->f) != n ||
        fwrite(tail, 1, sizeof tail, tb->f) != sizeof tail || fflush(tb->f) != 0)
        write_failed(tb, errno ? errno : EIO);
    free(buf);
}

static double wall_time(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

void tb_open(TbWriter *tb, const char *run_dir)
{
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0)
        strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    snprintf(tb->path, sizeof tb->path, "%s/tb", run_dir);
    if (mkdir(tb->path, 0755) != 0 && errno != EEXIST)
        write_failed(tb, errno);
    /* TensorBoard's own naming: it reads every events.out.tfevents.* file
     * of a directory, and the time and pid keep resumed runs apart. */
    snprintf(tb->path, sizeof tb->path, "%s/tb/events.out.tfevents.%lld.%s.%ld.trident", run_dir,
             (long long)time(NULL), host, (long)getpid());
    tb->f = fopen(tb->path, "wbx"); /* x: never overwrite another run's file */
    if (!tb->f)
        write_failed(tb, errno);
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    write_event(tb, &ev);
}

#define TB_MAX_VALUES 16

typedef struct {
    Tensorboard__Summary__Value v[TB_MAX_VALUES];
    Tensorboard__Summary__Value *p[TB_MAX_VALUES];
    char tags[TB_MAX_VALUES][64];
    int n;
} Values;

/* The value as metrics.jsonl prints it (fmt is its printf format), so the
 * two files say the same number for a step: a float32 of the full double
 * would differ from the file's rounded text in the last digits. */
static void add(Values *vs, const char *tag, const char *fmt, double value)
{
    TRD_ASSERT(vs->n < TB_MAX_VALUES);
    char text[64];
    snprintf(text, sizeof text, fmt, value);
    Tensorboard__Summary__Value *v = &vs->v[vs->n];
    tensorboard__summary__value__init(v);
    snprintf(vs->tags[vs->n], sizeof vs->tags[vs->n], "%s", tag);
    v->tag = vs->tags[vs->n];
    v->value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v->simple_value = (float)strtod(text, NULL);
    vs->p[vs->n] = v;
    vs->n++;
}

static void write_values(TbWriter *tb, int step, Values *vs)
{
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)vs->n;
    sum.value = vs->p;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    write_event(tb, &ev);
}

void tb_record(TbWriter *tb, const StepMetrics *s)
{
    if (!tb->f)
        return;
    Values vs = {.n = 0};
    /* The formats of metrics_record (src/train/metrics.c). */
    add(&vs, "loss", "%.7g", s->loss);
    if (s->val_loss >= 0)
        add(&vs, "val_loss", "%.7g", s->val_loss);
    add(&vs, "lr", "%.6g", s->lr);
    add(&vs, "grad_norm", "%.6g", s->grad_norm);
    add(&vs, "tokens_per_s", "%.1f", s->tokens_per_s);
    add(&vs, "mfu", "%.4f", s->mfu);
    add(&vs, "step_ms", "%.3f", s->step_ms);
    write_values(tb, s->step, &vs);
}

void tb_record_values(TbWriter *tb, int step, const char *prefix, const char *const *names,
                      const double *values, const char *const *fmts, int n)
{
    if (!tb->f)
        return;
    Values vs = {.n = 0};
    for (int i = 0; i < n; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "%s/%s", prefix, names[i]);
        add(&vs, tag, fmts ? fmts[i] : "%.0f", values[i]);
    }
    write_values(tb, step, &vs);
}

void tb_close(TbWriter *tb)
{
    if (tb->f && fclose(tb->f) != 0)
        write_failed(tb, errno);
    tb->f = NULL;
}
