#include "comm/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "core/error.h"

/* One span as it travels to rank 0: plain bytes, the same layout on every
 * rank of a job (one binary). */
typedef struct {
    double t0, t1; /* seconds since the rank's time zero */
    uint64_t bytes;
    int32_t lane, mb, chunk, pad;
    char name[32];
} Span;

/* What a rank sends ahead of its spans. */
typedef struct {
    uint64_t n, dropped;
    char label[64];
} Header;

enum { TAG_HEADER = 0x7e01, TAG_SPANS = 0x7e02, TAG_CLOCK = 0x7e03 };
#define CLOCK_TRIES 5
#define PIECE       ((size_t)1 << 16) /* spans per message: counts stay far below INT_MAX */

static struct {
    int active, rank, size;
    MPI_Comm world;
    double zero; /* rank 0's clock at the start, on this rank's clock */
    Header h;
    Span *spans;
    size_t cap;
} g;

static const char *sep; /* before the next event in the file: "" first, then ",\n" */

static void next_event(FILE *f)
{
    fputs(sep, f);
    sep = ",\n";
}

static const char *const lane_names[TRACE_LANES] = {"compute", "point-to-point", "collectives",
                                                    "steps"};

/* Rank 0's MPI_Wtime, read while this rank waits for it, is taken to be
 * this rank's clock at the middle of the round trip (the best of a few):
 * that aligns ranks whose clocks differ (other machines; MPI_Wtime need not
 * be global) to within half the shortest round trip, and ranks sharing a
 * clock whatever the scheduler does around a barrier.  Rank 0 answers the
 * ranks one by one.  Returns rank 0's start time on this rank's clock. */
static double clock_zero(void)
{
    double offset = 0; /* rank 0's clock minus ours */
    if (g.rank == 0) {
        for (int r = 1; r < g.size; r++)
            for (int k = 0; k < CLOCK_TRIES; k++) {
                double now;
                MPI_Recv(&now, 1, MPI_DOUBLE, r, TAG_CLOCK, g.world, MPI_STATUS_IGNORE);
                now = MPI_Wtime();
                MPI_Send(&now, 1, MPI_DOUBLE, r, TAG_CLOCK, g.world);
            }
    } else {
        double best_rtt = 1e30;
        for (int k = 0; k < CLOCK_TRIES; k++) {
            double t1 = MPI_Wtime(), t0;
            MPI_Send(&t1, 1, MPI_DOUBLE, 0, TAG_CLOCK, g.world);
            MPI_Recv(&t0, 1, MPI_DOUBLE, 0, TAG_CLOCK, g.world, MPI_STATUS_IGNORE);
            double t2 = MPI_Wtime();
            if (t2 - t1 < best_rtt) {
                best_rtt = t2 - t1;
                offset = t0 - 0.5 * (t1 + t2);
            }
        }
        /* An offset within the round trip's uncertainty is no evidence of
         * a different clock: ranks on one machine share theirs exactly, and
         * a correction there would only add the estimate's noise (ms when
         * ranks outnumber cores). */
        if (fabs(offset) <= 0.5 * best_rtt)
            offset = 0;
    }
    double zero = MPI_Wtime(); /* rank 0's is the one that counts */
    MPI_Bcast(&zero, 1, MPI_DOUBLE, 0, g.world);
    return zero - offset;
}

void trace_start(const Comm *comm, const char *label, size_t max_spans)
{
    TRD_ASSERT(!g.active && max_spans > 0);
    g.world = comm_mpi(comm);
    MPI_Comm_rank(g.world, &g.rank);
    MPI_Comm_size(g.world, &g.size);
    g.cap = max_spans;
    g.spans = trd_malloc(max_spans * sizeof(Span), "trace spans");
    memset(&g.h, 0, sizeof g.h);
    snprintf(g.h.label, sizeof g.h.label, "%s", label);
    g.zero = clock_zero();
    g.active = 1;
}

int trace_active(void) { return g.active; }

void trace_span(const char *name, TraceLane lane, double t0, double t1, int mb, int chunk,
                uint64_t bytes)
{
    if (!g.active)
        return;
    if (g.h.n == g.cap) {
        g.h.dropped++;
        return;
    }
    Span *s = &g.spans[g.h.n++];
    *s = (Span){.t0 = t0 - g.zero,
                .t1 = t1 - g.zero,
                .bytes = bytes,
                .lane = (int32_t)lane,
                .mb = mb,
                .chunk = chunk};
    snprintf(s->name, sizeof s->name, "%s", name);
}

/* A string as a JSON string body: our names and labels are plain ASCII,
 * but a quote or backslash must not break the file. */
static void put_string(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
}

static void put_rank_meta(FILE *f, int rank, const Header *h)
{
    next_event(f);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"", rank);
    put_string(f, h->label);
    if (h->dropped)
        fprintf(f, " (%llu spans past the cap not kept)", (unsigned long long)h->dropped);
    fprintf(f, "\"}}");
    next_event(f);
    fprintf(f,
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
            "\"args\":{\"sort_index\":%d}}",
            rank, rank);
    for (int l = 0; l < TRACE_LANES; l++) {
        next_event(f);
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"name\":\"%s\"}}",
                rank, l, lane_names[l]);
    }
}

static void put_spans(FILE *f, int rank, const Span *s, size_t n)
{
    for (size_t i = 0; i < n; i++, s++) {
        next_event(f);
        fprintf(f, "{\"name\":\"");
        put_string(f, s->name);
        /* Microseconds, as the format wants. */
        fprintf(f, "\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{",
                rank, s->lane, 1e6 * s->t0, 1e6 * (s->t1 - s->t0));
        const char *sep = "";
        if (s->mb >= 0) {
            fprintf(f, "\"mb\":%d", s->mb);
            sep = ",";
        }
        if (s->chunk >= 0) {
            fprintf(f, "%s\"chunk\":%d", sep, s->chunk);
            sep = ",";
        }
        if (s->bytes)
            fprintf(f, "%s\"bytes\":%llu", sep, (unsigned long long)s->bytes);
        fprintf(f, "}}");
    }
}

static void send_spans(void)
{
    MPI_Send(&g.h, (int)sizeof g.h, MPI_BYTE, 0, TAG_HEADER, g.world);
    for (size_t i = 0; i < g.h.n; i += PIECE) {
        size_t k = g.h.n - i < PIECE ? g.h.n - i : PIECE;
        MPI_Send(g.spans + i, (int)(k * sizeof(Span)), MPI_BYTE, 0, TAG_SPANS, g.world);
    }
}

/* Rank 0: take rank r's spans piece by piece, writing them when f is open
 * (and draining them when it is not, so no rank waits forever). */
static size_t receive_spans(FILE *f, int r, Span *buf)
{
    Header h;
    MPI_Recv(&h, (int)sizeof h, MPI_BYTE, r, TAG_HEADER, g.world, MPI_STATUS_IGNORE);
    h.label[sizeof h.label - 1] = '\0';
    if (f)
        put_rank_meta(f, r, &h);
    for (size_t i = 0; i < h.n; i += PIECE) {
        size_t k = h.n - i < PIECE ? h.n - i : PIECE;
        MPI_Recv(buf, (int)(k * sizeof(Span)), MPI_BYTE, r, TAG_SPANS, g.world, MPI_STATUS_IGNORE);
        if (f)
            put_spans(f, r, buf, k);
    }
    return (size_t)h.n;
}

long trace_finish(const char *path)
{
    TRD_ASSERT(g.active);
    g.active = 0;
    long written = 0;
    if (g.rank != 0) {
        send_spans();
    } else {
        FILE *f = fopen(path, "w");
        int err = f ? 0 : errno;
        if (f) {
            sep = "";
            fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
            put_rank_meta(f, 0, &g.h);
            put_spans(f, 0, g.spans, g.h.n);
        }
        written = (long)g.h.n;
        Span *buf = trd_malloc(PIECE * sizeof(Span), "trace receive buffer");
        for (int r = 1; r < g.size; r++)
            written += (long)receive_spans(f, r, buf);
        free(buf);
        if (f) {
            fprintf(f, "\n]}\n");
            /* Flushed and fsynced, so a full disk fails here, not silently. */
            errno = 0;
            if (!err && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0))
                err = errno ? errno : EIO;
            if (fclose(f) != 0 && !err)
                err = errno;
        }
        if (err) {
            errno = err;
            written = -1;
        }
    }
    free(g.spans);
    g.spans = NULL;
    return written;
}

long trace_write_rank(const char *path)
{
    if (!g.active)
        return 0;
    const size_t n = g.h.n; /* the spans so far; the main thread is stuck elsewhere */
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    sep = "";
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    put_rank_meta(f, g.rank, &g.h);
    put_spans(f, g.rank, g.spans, n);
    fprintf(f, "\n]}\n");
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int saved = errno ? errno : EIO;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    if (bad) {
        errno = saved;
        return -1;
    }
    return (long)n;
}
