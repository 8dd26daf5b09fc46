#include "cli/commands.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

/* One metrics.jsonl record: NAN where the record has no such member. */
enum { F_LOSS, F_VAL_LOSS, F_LR, F_GRAD_NORM, F_TOKENS_PER_S, F_MFU, F_STEP_MS, F_COUNT };
static const char *const FIELD_KEYS[F_COUNT] = {"loss",         "val_loss", "lr",     "grad_norm",
                                                "tokens_per_s", "mfu",      "step_ms"};

typedef struct {
    int step;
    double v[F_COUNT];
} Record;

typedef struct {
    Record *rec;
    int n, cap;
    cJSON *memory; /* the first record's memory_bytes (NULL: none) */
} Run;

static void usage(FILE *f)
{
    fprintf(f, "usage: trident report RUN_DIR [--out FILE]\n\n"
               "Writes one self-contained HTML page (default RUN_DIR/report.html) from\n"
               "RUN_DIR/metrics.jsonl, RUN_DIR/config.yaml and, when present,\n"
               "RUN_DIR/trace.json: loss and validation loss, learning rate, gradient\n"
               "norm, throughput and MFU over steps, the memory table, the config, and\n"
               "per-rank step and idle times.  Open it in any browser; it loads nothing.\n"
               "Exit codes: 0 success, 2 bad input, 1 runtime failure.\n");
}

static void add_record(Run *run, const Record *r)
{
    if (run->n == run->cap) {
        run->cap = run->cap ? 2 * run->cap : 256;
        Record *grown = realloc(run->rec, (size_t)run->cap * sizeof *grown);
        if (!grown)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory reading metrics.jsonl");
        run->rec = grown;
    }
    run->rec[run->n++] = *r;
}

/* Reads every record; a line that is not a JSON object with an integer
 * "step" is bad input (exit 2, file:line). */
static void read_metrics(Run *run, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        trd_fatal(TRD_EXIT_INPUT, "give the run.dir of a run (it holds metrics.jsonl)",
                  "cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (int lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        cJSON *obj = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
        if (!cJSON_IsObject(obj) || !cJSON_IsNumber(step) || step->valuedouble < 0 ||
            step->valuedouble != (double)(int)step->valuedouble)
            trd_fatal(TRD_EXIT_INPUT,
                      "each line of metrics.jsonl is one JSON object with a "
                      "\"step\" (a run killed mid-write can leave a torn line: delete it)",
                      "%s:%d: %s", path, lineno,
                      !obj                   ? "not valid JSON"
                      : !cJSON_IsObject(obj) ? "not a JSON object"
                                             : "no integer \"step\"");
        Record r = {.step = step->valueint};
        for (int k = 0; k < F_COUNT; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, FIELD_KEYS[k]);
            r.v[k] = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        }
        cJSON *mem = cJSON_GetObjectItemCaseSensitive(obj, "memory_bytes");
        if (!run->memory && cJSON_IsObject(mem))
            run->memory = cJSON_DetachItemViaPointer(obj, mem);
        add_record(run, &r);
        cJSON_Delete(obj);
    }
    const int read_error = ferror(f);
    free(line);
    fclose(f);
    if (read_error)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot read %s", path);
    if (run->n == 0)
        trd_fatal(TRD_EXIT_INPUT, "run the training first", "%s: no records", path);
    /* A resumed run repeats the steps after its checkpoint: the later
     * record of a step (the one the curve continued from) wins. */
    int *order = trd_malloc((size_t)run->n * sizeof(int), "report order");
    Record *sorted = trd_malloc((size_t)run->n * sizeof(Record), "report records");
    for (int i = 0; i < run->n; i++)
        order[i] = i;
    /* Stable insertion by step over the file order: small files, and the
     * file is nearly sorted already (only a resume goes back). */
    for (int i = 1; i < run->n; i++) {
        int o = order[i], j = i - 1;
        while (j >= 0 && run->rec[order[j]].step > run->rec[o].step) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = o;
    }
    int m = 0;
    for (int i = 0; i < run->n; i++) {
        const Record *r = &run->rec[order[i]];
        if (m > 0 && sorted[m - 1].step == r->step)
            sorted[m - 1] = *r;
        else
            sorted[m++] = *r;
    }
    free(order);
    free(run->rec);
    run->rec = sorted;
    run->n = m;
}

/* Text for HTML: the config and file names may hold <, & and quotes. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
}

/* A compact number for axis labels and tables. */
static const char *num(double v, char buf[32])
{
    const double a = fabs(v);
    if (v == 0)
        snprintf(buf, 32, "0");
    else if (a >= 1e6 || a < 1e-3)
        snprintf(buf, 32, "%.3g", v);
    else
        snprintf(buf, 32, "%.4g", v);
    return buf;
}

typedef struct {
    int field;
    const char *color;
} Series;

enum { CHART_W = 560, CHART_H = 240, PAD_L = 64, PAD_R = 16, PAD_T = 28, PAD_B = 36 };

/* One chart: an SVG of the given series over steps.  Each series is one
 * <path> with a point per record that has a finite value, and a dot per
 * point when there are few (a validation curve of two points is still
 * seen).  data-points on the path says how many points it holds. */
static void chart(FILE *f, const Run *run, const char *title, const Series *ser, int n_ser)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int s = 0; s < n_ser; s++)
        for (int i = 0; i < run->n; i++) {
            const double v = run->rec[i].v[ser[s].field];
            if (isfinite(v)) {
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        }
    const double x0 = run->rec[0].step, x1 = run->rec[run->n - 1].step;
    const double pw = CHART_W - PAD_L - PAD_R, ph = CHART_H - PAD_T - PAD_B;
    fprintf(f,
            "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\">\n",
            CHART_W, CHART_H, CHART_W, CHART_H);
    fprintf(f, "<text x=\"%d\" y=\"18\" class=\"title\">", PAD_L);
    put_escaped(f, title);
    fprintf(f,
            "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/>\n",
            PAD_L, PAD_T, pw, ph);
    if (!isfinite(lo)) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"none\">no values</text></svg></figure>\n",
                PAD_L + 12, PAD_T + 24);
        return;
    }
    if (hi - lo < 1e-12 * (fabs(hi) + 1e-30)) { /* a flat line: give it a band to sit in */
        hi += fabs(hi) * 0.05 + 1e-12;
        lo -= fabs(lo) * 0.05 + 1e-12;
    }
    char a[32], b[32], c[32];
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" class=\"ylab\">%s</text>\n"
            "<text x=\"%d\" y=\"%.0f\" class=\"ylab\">%s</text>\n"
            "<text x=\"%d\" y=\"%d\" class=\"ylab\">%s</text>\n",
            PAD_L - 6, PAD_T + 4, num(hi, a), PAD_L - 6, PAD_T + ph / 2 + 4, num((lo + hi) / 2, b),
            PAD_L - 6, PAD_T + (int)ph, num(lo, c));
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" class=\"xlab\">step %d</text>\n"
            "<text x=\"%d\" y=\"%d\" class=\"xlab end\">step %d</text>\n",
            PAD_L, CHART_H - 12, run->rec[0].step, CHART_W - PAD_R, CHART_H - 12,
            run->rec[run->n - 1].step);
    for (int s = 0; s < n_ser; s++) {
        const int fld = ser[s].field;
        int points = 0;
        for (int i = 0; i < run->n; i++)
            points += isfinite(run->rec[i].v[fld]) != 0;
        fprintf(f,
                "<path class=\"series\" data-series=\"%s\" data-points=\"%d\" stroke=\"%s\" d=\"",
                FIELD_KEYS[fld], points, ser[s].color);
        /* Two passes over the points: the path, then its dots. */
        for (int pass = 0; pass < (points <= 32 ? 2 : 1); pass++) {
            int k = 0;
            for (int i = 0; i < run->n; i++) {
                const double v = run->rec[i].v[fld];
                if (!isfinite(v))
                    continue;
                const double x = PAD_L + (x1 > x0 ? (run->rec[i].step - x0) / (x1 - x0) : 0.5) * pw;
                const double y = PAD_T + (hi - v) / (hi - lo) * ph;
                if (pass == 0)
                    fprintf(f, "%s%.1f,%.1f", k++ ? " L" : "M", x, y);
                else
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y,
                            ser[s].color);
            }
            if (pass == 0)
                fputs("\"/>\n", f);
        }
        fprintf(f, "<text x=\"%d\" y=\"18\" class=\"legend\" fill=\"%s\">%s</text>\n",
                CHART_W - PAD_R - 110 * (n_ser - s), ser[s].color, FIELD_KEYS[fld]);
    }
    fputs("</svg></figure>\n", f);
}

static void memory_table(FILE *f, const cJSON *mem)
{
    fputs("<h2>Memory per rank</h2>\n", f);
    if (!mem) {
        fputs("<p>metrics.jsonl has no memory_bytes.</p>\n", f);
        return;
    }
    fputs("<table><tr><th>category</th><th>bytes</th><th>MiB</th></tr>\n", f);
    const cJSON *item;
    double total = 0;
    cJSON_ArrayForEach(item, mem)
    {
        if (!cJSON_IsNumber(item))
            continue;
        fputs("<tr><td>", f);
        put_escaped(f, item->string);
        fprintf(f, "</td><td>%.0f</td><td>%.1f</td></tr>\n", item->valuedouble,
                item->valuedouble / (1024.0 * 1024.0));
        total += item->valuedouble;
    }
    fprintf(f, "<tr><th>total</th><th>%.0f</th><th>%.1f</th></tr></table>\n", total,
            total / (1024.0 * 1024.0));
}

/* Copies a text file into the page (escaped); returns 0, or -1 when it
 * cannot be opened. */
static int put_file(FILE *out, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf - 1, f)) > 0) {
        buf[n] = '\0';
        put_escaped(out, buf);
    }
    fclose(f);
    return 0;
}

/* Reads a whole file into a NUL-ended buffer (NULL when it cannot be
 * opened); exits 1 on a read error. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = trd_malloc(cap, "trace.json");
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory reading %s", path);
            buf = grown;
        }
    }
    if (ferror(f))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Per rank from trace.json (docs/pipeline.md, "The timeline"): the time inside "step N" spans
 * (the step lane), the compute spans in them (forward, backward,
 * optimizer), and the rest, which the rank spent waiting: on collectives,
 * on pipeline neighbours, on data. */
static void trace_table(FILE *f, const char *path)
{
    char *text = slurp(path);
    if (!text)
        return; /* no trace: the run did not ask for one */
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
    if (!cJSON_IsArray(events))
        trd_fatal(TRD_EXIT_INPUT,
                  "trace.json is written by training.trace: true; delete a "
                  "damaged one",
                  "%s: not a Chrome trace (no traceEvents array)", path);
    enum { MAX_RANKS = 4096 };
    double *step_us = calloc(MAX_RANKS, sizeof(double)),
           *compute_us = calloc(MAX_RANKS, sizeof(double));
    int *steps = calloc(MAX_RANKS, sizeof(int)), ranks = 0;
    if (!step_us || !compute_us || !steps)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory reading %s", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"),
                    *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"),
                    *tid = cJSON_GetObjectItemCaseSensitive(e, "tid"),
                    *dur = cJSON_GetObjectItemCaseSensitive(e, "dur"),
                    *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !cJSON_IsNumber(pid) ||
            !cJSON_IsNumber(tid) || !cJSON_IsNumber(dur) || !cJSON_IsString(name) ||
            pid->valueint < 0 || pid->valueint >= MAX_RANKS)
            continue;
        const int r = pid->valueint;
        ranks = r + 1 > ranks ? r + 1 : ranks;
        if (tid->valueint == 3 && !strncmp(name->valuestring, "step ", 5)) { /* TRACE_STEP */
            step_us[r] += dur->valuedouble;
            steps[r]++;
        } else if (tid->valueint == 0) { /* TRACE_COMPUTE */
            compute_us[r] += dur->valuedouble;
        }
    }
    cJSON_Delete(doc);
    fputs("<h2>Per-rank step and idle time (trace.json)</h2>\n"
          "<table><tr><th>rank</th><th>steps</th><th>step ms</th><th>compute ms</th>"
          "<th>idle ms</th><th>idle %</th></tr>\n",
          f);
    for (int r = 0; r < ranks; r++) {
        if (!steps[r])
            continue;
        const double st = step_us[r] / steps[r] / 1e3, co = compute_us[r] / steps[r] / 1e3;
        const double idle = st > co ? st - co : 0;
        fprintf(f,
                "<tr><td>%d</td><td>%d</td><td>%.2f</td><td>%.2f</td><td>%.2f</td>"
                "<td>%.1f</td></tr>\n",
                r, steps[r], st, co, idle, st > 0 ? 100 * idle / st : 0);
    }
    fputs("</table>\n<p>Idle is the step time outside compute spans: waiting on collectives, "
          "pipeline neighbours and data. Validation steps are not counted.</p>\n",
          f);
    free(step_us);
    free(compute_us);
    free(steps);
}

static const char *const STYLE =
    "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}"
    "figure{display:inline-block;margin:0 12px 12px 0}"
    ".frame{fill:none;stroke:#bbb}.series{fill:none;stroke-width:2}"
    ".title{font-weight:bold;font-size:14px}.legend{font-size:12px;font-weight:bold}"
    ".ylab{font-size:11px;text-anchor:end;fill:#555}.xlab{font-size:11px;fill:#555}"
    ".end{text-anchor:end}.none{fill:#999}"
    "table{border-collapse:collapse;margin-bottom:12px}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "pre{background:#f6f6f6;padding:8px;font-size:12px}";

int report_main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return TRD_EXIT_OK;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-' || dir) {
            usage(stderr);
            trd_fatal(TRD_EXIT_INPUT, NULL, "unexpected argument '%s'", argv[i]);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        usage(stderr);
        trd_fatal(TRD_EXIT_INPUT, NULL, "missing RUN_DIR");
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        trd_fatal(TRD_EXIT_INPUT, "give the run.dir of a run", "%s: %s", dir,
                  stat(dir, &st) != 0 ? strerror(errno) : "not a directory");
    const size_t plen = strlen(dir) + 32;
    char *metrics = trd_malloc(plen, "path"), *config = trd_malloc(plen, "path"),
         *trace = trd_malloc(plen, "path"), *def_out = trd_malloc(plen, "path");
    snprintf(metrics, plen, "%s/metrics.jsonl", dir);
    snprintf(config, plen, "%s/config.yaml", dir);
    snprintf(trace, plen, "%s/trace.json", dir);
    snprintf(def_out, plen, "%s/report.html", dir);
    if (!out)
        out = def_out;

    Run run = {0};
    read_metrics(&run, metrics);

    FILE *f = fopen(out, "w");
    if (!f)
        trd_fatal(TRD_EXIT_RUNTIME, "check that the directory exists and is writable",
                  "cannot write %s: %s", out, strerror(errno));
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>trident report: ", f);
    put_escaped(f, dir);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>trident report: ", STYLE);
    put_escaped(f, dir);
    const Record *last = &run.rec[run.n - 1];
    char a[32], b[32];
    fprintf(f, "</h1>\n<p>%d steps recorded (%d to %d); last loss %s", run.n, run.rec[0].step,
            last->step, num(last->v[F_LOSS], a));
    for (int i = run.n - 1; i >= 0; i--)
        if (isfinite(run.rec[i].v[F_VAL_LOSS])) {
            fprintf(f, ", last validation loss %s (step %d)", num(run.rec[i].v[F_VAL_LOSS], b),
                    run.rec[i].step);
            break;
        }
    fputs(".</p>\n<h2>Curves</h2>\n<div class=\"charts\">\n", f);
    chart(f, &run, "loss", (Series[]){{F_LOSS, "#1f77b4"}, {F_VAL_LOSS, "#d62728"}}, 2);
    chart(f, &run, "learning rate", (Series[]){{F_LR, "#2ca02c"}}, 1);
    chart(f, &run, "gradient norm (before clipping)", (Series[]){{F_GRAD_NORM, "#9467bd"}}, 1);
    chart(f, &run, "throughput (tokens/s)", (Series[]){{F_TOKENS_PER_S, "#ff7f0e"}}, 1);
    chart(f, &run, "MFU (fraction of peak FLOP/s)", (Series[]){{F_MFU, "#8c564b"}}, 1);
    fputs("</div>\n", f);
    memory_table(f, run.memory);
    trace_table(f, trace);
    fputs("<h2>Config and layout (config.yaml)</h2>\n<pre>", f);
    if (put_file(f, config) != 0)
        fprintf(f, "(no config.yaml in this run.dir)");
    fputs("</pre>\n</body></html>\n", f);
    const int failed = ferror(f);
    if (fclose(f) != 0 || failed)
        trd_fatal(TRD_EXIT_RUNTIME, "check that the disk has space", "cannot write %s: %s", out,
                  strerror(errno ? errno : EIO));
    printf("report: %s (%d steps)\n", out, run.n);
    cJSON_Delete(run.memory);
    free(run.rec);
    free(metrics);
    free(config);
    free(trace);
    free(def_out);
    return TRD_EXIT_OK;
}
