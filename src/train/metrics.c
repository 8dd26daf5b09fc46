#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

/* A record that did not reach the file is lost silently unless the run
 * stops: a full disk or a lost mount ends it (exit 1) naming the file.
 * errno is 0 when a write failed earlier without leaving its reason. */
static void write_failed(const Metrics *m)
{
    trd_fatal(TRD_EXIT_RUNTIME, "free space under run.dir (or check the mount), then resume",
              "cannot write %s: %s", m->path, strerror(errno ? errno : EIO));
}

void metrics_open(Metrics *m, const char *dir, int steps, int log_every, int append)
{
    char *path = m->path;
    snprintf(path, sizeof m->path, "%s/metrics.jsonl", dir);
    m->jsonl = fopen(path, append ? "a+" : "w");
    if (m->jsonl && append && fseek(m->jsonl, -1, SEEK_END) == 0 && fgetc(m->jsonl) != '\n') {
        /* A run killed mid-line left a torn record: end it, so every
         * record after it stands on a line of its own. */
        fseek(m->jsonl, 0, SEEK_END);
        fputc('\n', m->jsonl);
    }
    if (!m->jsonl)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "cannot open %s: %s", path,
                  strerror(errno));
    m->steps = steps;
    m->log_every = log_every;
}

/* Seconds as m:ss, or h:mm:ss from an hour. */
static const char *clock_text(double seconds, char buf[32])
{
    long t = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, 32, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, 32, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* A JSON number, or null for NaN and Inf (a step skipped by
 * training.nonfinite: skip), which JSON cannot spell. */
static const char *json_number(double v, const char *fmt, char buf[32])
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, 32, fmt, v);
    return buf;
}

void metrics_record(Metrics *m, const StepMetrics *s)
{
    char loss[32], norm[32];
    errno = 0;
    fprintf(m->jsonl,
            "{\"step\": %d, \"loss\": %s, \"lr\": %.6g, \"grad_norm\": %s, \"tokens\": %lld, "
            "\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"mfu\": %.4f, \"comm_ms\": %.3f, "
            "\"comm_bytes\": %llu, \"data_ms\": %.3f",
            s->step, json_number(s->loss, "%.7g", loss), s->lr,
            json_number(s->grad_norm, "%.6g", norm), s->tokens, s->step_ms, s->tokens_per_s, s->mfu,
            s->comm_ms, s->comm_bytes, s->data_ms);
    if (s->val_loss >= 0)
        fprintf(m->jsonl, ", \"val_loss\": %.7g", s->val_loss);
    if (s->pp_idle >= 0)
        fprintf(m->jsonl, ", \"pp_idle\": %.4f", s->pp_idle);
    if (s->cp_ms >= 0)
        fprintf(m->jsonl, ", \"cp_ms\": %.3f, \"cp_bytes\": %llu", s->cp_ms, s->cp_bytes);
    if (s->extra)
        fprintf(m->jsonl, ", %s", s->extra);
    fputs("}\n", m->jsonl);
    /* fprintf's errors stick in ferror; fflush hands the line to the kernel. */
    if (fflush(m->jsonl) != 0 || ferror(m->jsonl))
        write_failed(m);

    if (s->step % m->log_every == 0 || s->step == 1 || s->step == m->steps || s->val_loss >= 0) {
        printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | mfu %.1f%%",
               s->step, m->steps, s->loss, s->lr, s->grad_norm, s->step_ms, s->tokens_per_s,
               100.0 * s->mfu);
        if (s->val_loss >= 0)
            printf(" | val %.4f", s->val_loss);
        char el[32], eta[32];
        printf(" | %s elapsed, eta %s\n", clock_text(s->elapsed_s, el), clock_text(s->eta_s, eta));
        fflush(stdout);
    }
}

void metrics_close(Metrics *m)
{
    if (!m->jsonl)
        return;
    /* fsync: the records are on disk, not only in the page cache, when the
     * run reports success (a node crash right after would lose them). */
    errno = 0;
    FILE *f = m->jsonl;
    m->jsonl = NULL;
    const int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    if (fclose(f) != 0 || bad)
        write_failed(m);
}
