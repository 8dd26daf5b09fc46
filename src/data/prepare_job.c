/* prepare_job.c — prepare-data over the ranks of an MPI job (see
 * prepare_job.h).  Every call to another rank goes through src/comm. */
#include "data/prepare_job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/reader.h"

/* How often the ranks meet to sum their counters while they work: the
 * progress line's freshness and how soon a bad document stops the job. */
#define ROUND_SECONDS 0.5

struct PrepJob {
    Comm world;
    uint64_t *sizes; /* of every input file, as rank 0 saw them */
    CommHandle round;
    int in_flight;
    uint64_t buf[PREP_COUNTERS];  /* the round in flight */
    uint64_t sums[PREP_COUNTERS]; /* the last complete one */
    double t_round;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

PrepJob *prep_job_start(void)
{
    /* srun without MPI (--mpi=none) starts tasks that do not know of each
     * other: each would write --out on its own, over the others' files. */
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS"), *id = getenv("SLURM_PROCID");
    if (!comm_launched() && tasks && atoi(tasks) > 1) {
        if (!id || atoi(id) == 0)
            fprintf(stderr,
                    "trident: error: srun started %d tasks without MPI: each would prepare "
                    "the whole dataset over the others' files\n---> pass srun --mpi=pmi2 (as "
                    "slurm/prepare.sbatch does), or start one task\n",
                    atoi(tasks));
        exit(TRD_EXIT_INPUT);
    }
    if (!comm_launched())
        return NULL;
    comm_init(NULL, NULL);
    Comm w = comm_world();
    if (w.size == 1) /* mpiexec -n 1: one process, as without MPI */
        return NULL;
    PrepJob *j = trd_calloc(1, sizeof *j, "the prepare-data job");
    j->world = w;
    j->round = comm_handle_none();
    return j;
}

int prep_job_rank(const PrepJob *j) { return j->world.rank; }

int prep_job_size(const PrepJob *j) { return j->world.size; }

/* Until every rank is here, tested every millisecond: the others wait for
 * rank 0's checks without the busy wait of a blocking MPI call, which would
 * take a core from the rank they wait for. */
static void meet(PrepJob *j)
{
    uint64_t none = 0;
    CommHandle h = comm_iallreduce_sum_u64(&j->world, &none, 1);
    while (!comm_test(&h))
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
}

void prep_job_share(PrepJob *j, InputList *docs, uint64_t *total_bytes)
{
    Comm *c = &j->world;
    meet(j);
    uint64_t head[2] = {0, 0}; /* files, bytes of their names */
    char *blob = NULL;
    if (c->rank == 0) {
        for (size_t f = 0; f < docs->n; f++) {
            if (!strcmp(docs->paths[f], "-"))
                trd_fatal(TRD_EXIT_INPUT, "save it to a file, or run prepare-data as one process",
                          "--input - (stdin) cannot be read by the %d ranks of an MPI job",
                          c->size);
            head[1] += strlen(docs->paths[f]) + 1;
        }
        head[0] = docs->n;
    }
    comm_broadcast(c, head, sizeof head, 0);
    const size_t n = (size_t)head[0];
    j->sizes = trd_calloc(n + 1, sizeof *j->sizes, "the input sizes");
    blob = trd_malloc((size_t)head[1] + 1, "the input list");
    if (c->rank == 0) {
        size_t at = 0;
        for (size_t f = 0; f < n; f++) {
            struct stat st;
            j->sizes[f] = stat(docs->paths[f], &st) == 0 ? (uint64_t)st.st_size : 0;
            size_t k = strlen(docs->paths[f]) + 1;
            memcpy(blob + at, docs->paths[f], k);
            at += k;
        }
    }
    comm_broadcast(c, j->sizes, n * sizeof *j->sizes, 0);
    comm_broadcast(c, blob, (size_t)head[1], 0);
    if (c->rank != 0) {
        memset(docs, 0, sizeof *docs);
        docs->paths = trd_calloc(n + 1, sizeof *docs->paths, "the input list");
        docs->n = docs->cap = n;
        for (size_t f = 0, at = 0; f < n; f++) {
            docs->paths[f] = strdup(blob + at);
            if (!docs->paths[f])
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory listing inputs");
            at += strlen(blob + at) + 1;
        }
    }
    free(blob);
    *total_bytes = 0;
    for (size_t f = 0; f < n; f++)
        *total_bytes += j->sizes[f];
}

/* Where the cut before rank k falls in the stream of all input bytes
 * (start[f]: where file f starts in it; T the total): k/N of the way, moved
 * to the next line start in a plain JSON lines file, to the nearer end of
 * any other file. */
static uint64_t cut(const PrepJob *j, const InputList *docs, const unsigned char *splittable,
                    const uint64_t *start, int k)
{
    const uint64_t T = start[docs->n], N = (uint64_t)j->world.size;
    if (k == 0)
        return 0;
    if ((uint64_t)k >= N)
        return T;
    const uint64_t c = T / N * (uint64_t)k + T % N * (uint64_t)k / N; /* floor(k T / N) */
    size_t f = 0;
    while (f < docs->n && start[f + 1] <= c)
        f++;
    if (f == docs->n || c == start[f])
        return c;
    const uint64_t size = start[f + 1] - start[f], local = c - start[f];
    if (!splittable[f])
        return 2 * local < size ? start[f] : start[f + 1];
    char err[TRD_ERR];
    uint64_t b;
    if (reader_line_start(docs->paths[f], local, size, &b, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "%s", err);
    return start[f] + b;
}

size_t prep_job_units(PrepJob *j, const InputList *docs, const unsigned char *splittable,
                      PrepUnit **units)
{
    const size_t n = docs->n;
    const int r = j->world.rank, N = j->world.size;
    uint64_t *start = trd_calloc(n + 1, sizeof *start, "the input offsets");
    for (size_t f = 0; f < n; f++)
        start[f + 1] = start[f] + j->sizes[f];
    const uint64_t a = cut(j, docs, splittable, start, r);
    const uint64_t b = cut(j, docs, splittable, start, r + 1);
    const uint64_t T = start[n];
    PrepUnit *u = trd_calloc(n + 1, sizeof *u, "this rank's inputs");
    size_t k = 0;
    for (size_t f = 0; f < n; f++) {
        const uint64_t s = start[f], e = start[f + 1];
        if (s == e) { /* empty: the first rank whose range ends after it (a
                       * text file is still a document, in its place) */
            if ((a <= s && s < b) || (r == N - 1 && s == T))
                u[k++] = (PrepUnit){f, 0, 0, 0};
            continue;
        }
        const uint64_t lo = a > s ? a : s, hi = b < e ? b : e;
        if (lo < hi)
            u[k++] = (PrepUnit){f, lo > s || hi < e, lo - s, hi - s};
    }
    free(start);
    *units = u;
    return k;
}

static void round_start(PrepJob *j, const uint64_t mine[PREP_COUNTERS])
{
    memcpy(j->buf, mine, sizeof j->buf);
    j->round = comm_iallreduce_sum_u64(&j->world, j->buf, PREP_COUNTERS);
    j->in_flight = 1;
    j->t_round = now_s();
}

/* Whether the round in flight completed now (its sums are then current). */
static int round_done(PrepJob *j)
{
    if (!j->in_flight || !comm_test(&j->round))
        return 0;
    memcpy(j->sums, j->buf, sizeof j->sums);
    j->in_flight = 0;
    return 1;
}

int prep_job_poll(PrepJob *j, const uint64_t mine[PREP_COUNTERS], uint64_t sums[PREP_COUNTERS])
{
    round_done(j);
    if (!j->in_flight && now_s() - j->t_round >= ROUND_SECONDS)
        round_start(j, mine);
    memcpy(sums, j->sums, sizeof j->sums);
    return j->sums[PREP_FAILED] > 0;
}

void prep_job_finish(PrepJob *j, const uint64_t mine[PREP_COUNTERS], uint64_t sums[PREP_COUNTERS])
{
    uint64_t m[PREP_COUNTERS];
    memcpy(m, mine, sizeof m);
    m[PREP_FINISHED] = 1;
    /* Every rank takes part in every round until one in which all have
     * finished: all see that round's sums, so all stop after it.  A rank
     * that waits tests every millisecond instead of blocking in MPI, which
     * would spin on a core that a working rank may need. */
    for (;;) {
        while (j->in_flight && !round_done(j))
            nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
        if (j->sums[PREP_FINISHED] == (uint64_t)j->world.size)
            break;
        round_start(j, m);
    }
    memcpy(sums, j->sums, sizeof j->sums);
}

_Noreturn void prep_job_fail(PrepJob *j, int failed, const char *msg, const char *hint)
{
    int first = failed ? j->world.rank : j->world.size;
    comm_allreduce_min_i32(&j->world, &first, 1);
    if (j->world.rank == first) {
        fprintf(stderr, "trident: error: %s\n", msg);
        if (hint)
            fprintf(stderr, "---> %s\n", hint);
        fflush(stderr);
    }
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}

uint64_t prep_job_bad(PrepJob *j, uint64_t bad, const char *mine, int n, size_t len, char *out,
                      int shown)
{
    uint64_t total = prep_job_sum(j, bad);
    size_t bytes;
    char *all = comm_allgatherv_bytes(&j->world, mine, (size_t)n * len, &bytes, NULL);
    if (j->world.rank == 0) /* rank order is input order */
        memcpy(out, all, (bytes / len < (size_t)shown ? bytes / len : (size_t)shown) * len);
    free(all);
    return total;
}

uint64_t prep_job_sum(PrepJob *j, uint64_t v)
{
    comm_allreduce_sum_u64(&j->world, &v, 1);
    return v;
}

double prep_job_max(PrepJob *j, double v)
{
    comm_allreduce_max_f64(&j->world, &v, 1);
    return v;
}

void prep_shard_prefix(char *dst, size_t n, const char *out, int rank, int size)
{
    snprintf(dst, n, "%s-%05d-of-%05d", out, rank, size);
}

/* The spool's documents: their lengths (malloc'd), the mapped tokens. */
static int32_t *spool_open(TokenDataset *ds, const char *spool, uint64_t *n)
{
    char err[CFG_ERR];
    if (dataset_open(ds, spool, DATA_MEGATRON, err) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    *n = ds->n_docs;
    int32_t *len = trd_calloc(*n + 1, sizeof *len, "the spool's document lengths");
    for (uint64_t i = 0; i < *n; i++)
        len[i] = (int32_t)dataset_sequence_length(ds, i);
    return len;
}

static void spool_remove(const char *spool)
{
    const char *ext[] = {".bin", ".idx", ".bin.tmp", ".idx.tmp", ".mask", ".mask.tmp"};
    char path[CFG_STR + 16];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s%s", spool, ext[i]);
        unlink(path);
    }
}

/* The loss mask of a split (--template), written in parts as the tokens
 * are: PREFIX.mask.tmp made at its full size by its owner (create), each
 * rank's bytes at its first token's offset, renamed before the dataset is
 * published, so that a visible dataset has its mask. */
static int mask_open(const char *prefix, uint64_t bytes, int create)
{
    char path[1024]; /* a prefix of prep_job_write, and ".mask.tmp" */
    snprintf(path, sizeof path, "%s.mask.tmp", prefix);
    int fd = open(path, O_WRONLY | (create ? O_CREAT | O_TRUNC : 0), 0666);
    if (fd < 0 || (create && ftruncate(fd, (off_t)bytes) != 0))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot create %s: %s", path, strerror(errno));
    return fd;
}

static void mask_write(int fd, const uint8_t *m, uint64_t n, uint64_t at, const char *prefix)
{
    while (n > 0) {
        ssize_t k = pwrite(fd, m, n, (off_t)at);
        if (k <= 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s.mask.tmp: %s", prefix,
                      strerror(errno));
        m += k;
        n -= (uint64_t)k;
        at += (uint64_t)k;
    }
}

static void mask_publish(const char *prefix)
{
    char tmp[1024], path[1024];
    snprintf(tmp, sizeof tmp, "%s.mask.tmp", prefix);
    snprintf(path, sizeof path, "%s.mask", prefix);
    if (rename(tmp, path) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot rename %s: %s", tmp, strerror(errno));
}

void prep_job_write(PrepJob *j, const PrepWrite *w, PrepSplit split[2])
{
    Comm *c = &j->world;
    const int R = c->rank, N = c->size, n_split = w->val_every ? 2 : 1;
    char err[CFG_ERR], prefix[2][CFG_STR + 24], base[CFG_STR + 8];
    TokenDataset ds;
    uint64_t n;
    int32_t *len = spool_open(&ds, w->spool, &n);

    /* The global index of this rank's first document, then each split's
     * documents and tokens on every rank. */
    uint64_t *all = trd_calloc(4 * (size_t)N, sizeof *all, "the ranks' counts");
    comm_allgather_bytes(c, &n, all, sizeof n);
    uint64_t d0 = 0;
    for (int r = 0; r < R; r++)
        d0 += all[r];
    const uint64_t K = (uint64_t)w->val_every;
    uint64_t mine[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < n; i++) {
        int s = K && (d0 + i) % K == K - 1;
        mine[2 * s]++;
        mine[2 * s + 1] += (uint64_t)len[i];
    }
    comm_allgather_bytes(c, mine, all, sizeof mine);

    DatasetShape shape[2];
    uint64_t first[2][2] = {{0, 0}, {0, 0}};
    for (int s = 0; s < n_split; s++) {
        snprintf(base, sizeof base, "%s%s", w->out, s ? "_val" : "");
        split[s] = (PrepSplit){0, 0};
        for (int r = 0; r < N; r++) {
            split[s].docs += all[4 * r + 2 * s];
            split[s].tokens += all[4 * r + 2 * s + 1];
            if (r < R && !w->shards) {
                first[s][0] += all[4 * r + 2 * s];
                first[s][1] += all[4 * r + 2 * s + 1];
            }
        }
        if (w->shards)
            prep_shard_prefix(prefix[s], sizeof prefix[s], base, R, N);
        else
            snprintf(prefix[s], sizeof prefix[s], "%s", base);
        shape[s] = (DatasetShape){prefix[s], w->llmc, w->token_bytes,
                                  w->shards ? mine[2 * s] : split[s].docs,
                                  w->shards ? mine[2 * s + 1] : split[s].tokens};
        /* Merged: rank 0 makes the files at their full size; shards: each
         * rank its own. */
        if ((w->shards || R == 0) && dataset_parts_create(&shape[s], err) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
        if (w->mask && (w->shards || R == 0))
            close(mask_open(prefix[s], shape[s].tokens, 1));
    }
    comm_barrier(c); /* the files exist before anyone opens them */
    if (w->mask && !ds.mask)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s: the spool has no loss mask", w->spool);
    int mask_fd[2] = {-1, -1};
    uint64_t mask_at[2] = {first[0][1], first[1][1]};
    for (int s = 0; s < n_split && w->mask; s++)
        mask_fd[s] = mask_open(prefix[s], 0, 0);

    DatasetPart *part[2] = {NULL, NULL};
    for (int s = 0; s < n_split; s++)
        if (!(part[s] = dataset_part_open(&shape[s], first[s][0], first[s][1], err)))
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    /* Runs of consecutive documents of one split, each one write. */
    const unsigned char *tok = ds.tokens;
    uint64_t at = 0; /* token offset of document i in the spool */
    for (uint64_t i = 0; i < n;) {
        const int s = K && (d0 + i) % K == K - 1;
        uint64_t e = i, k = 0;
        while (e < n && (int)(K && (d0 + e) % K == K - 1) == s)
            k += (uint64_t)len[e++];
        if (dataset_part_add(part[s], tok + at * (uint64_t)w->token_bytes, len + i, e - i, err))
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
        if (w->mask) {
            mask_write(mask_fd[s], ds.mask + at, k, mask_at[s], prefix[s]);
            mask_at[s] += k;
        }
        at += k;
        i = e;
    }
    for (int s = 0; s < n_split; s++) {
        if (dataset_part_close(part[s], err) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
        if (mask_fd[s] >= 0 && close(mask_fd[s]) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s.mask.tmp: %s", prefix[s],
                      strerror(errno));
    }
    dataset_close(&ds);
    free(len);
    spool_remove(w->spool);
    /* Renamed only when every rank has written its part: a rank that
     * failed to write has ended the job (exit 1) before this barrier. */
    comm_barrier(c);
    for (int s = 0; s < n_split; s++) {
        if (w->mask && (w->shards || R == 0))
            mask_publish(prefix[s]);
        if ((w->shards || R == 0) && dataset_parts_publish(&shape[s], err) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    }
    comm_barrier(c); /* every shard is in place when rank 0 reports */
    free(all);
}
