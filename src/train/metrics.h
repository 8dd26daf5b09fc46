/* metrics.h — what a run reports: <run.dir>/metrics.jsonl (one JSON object
 * per step, rank 0) and a readable log line every run.log_every steps. */
#ifndef TRD_METRICS_H
#define TRD_METRICS_H

#include <stdio.h>

typedef struct {
    int step; /* 1-based: optimizer steps completed */
    double loss, lr, grad_norm;
    long long tokens; /* tokens trained on so far */
    double step_ms, tokens_per_s, mfu;
    double comm_ms;                /* exposed (not overlapped) DP communication */
    double data_ms;                /* reading and assembling this rank's batches */
    unsigned long long comm_bytes; /* payload bytes this rank handed to DP collectives */
    double pp_idle; /* pipeline: measured idle fraction of the step (< 0: no pipeline) */
    double cp_ms;   /* context parallel: time in its K/V exchange (< 0: no cp) */
    unsigned long long cp_bytes; /* ... and the bytes this rank sent in it */
    double val_loss;             /* < 0: not computed this step */
    const char *extra;           /* NULL, or more JSON members ("\"k\": v, ...") */
    double elapsed_s, eta_s;     /* since this run's first step, and to its last (log line) */
} StepMetrics;

typedef struct {
    FILE *jsonl;
    char path[1024];
    int steps, log_every;
} Metrics;

/* Opens <dir>/metrics.jsonl: truncated for a fresh run, appended to when
 * resuming (the records of earlier steps stay); exits on failure. */
void metrics_open(Metrics *m, const char *dir, int steps, int log_every, int append);
/* Every write is checked: a failure (full disk, lost mount) exits 1 naming
 * the file.  Close flushes and fsyncs. */
void metrics_record(Metrics *m, const StepMetrics *s);
void metrics_close(Metrics *m);

#endif
