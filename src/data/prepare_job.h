/* prepare_job.h — prepare-data over the ranks of an MPI job (internal to
 * src/data; docs/data.md, "Several processes: mpiexec and Slurm").
 *
 * prepare.c tokenizes; this file decides who tokenizes what and puts the
 * pieces together:
 *   1. rank 0 checks the inputs and hands the list, with the file sizes,
 *      to every rank (prep_job_share);
 *   2. the input, taken as one stream of bytes in input order, is cut into
 *      one contiguous range per rank of about the same size: a plain JSON
 *      lines file is cut at line starts, any other file goes whole to one
 *      rank (a cut that falls inside it moves to its nearer end)
 *      (prep_job_units);
 *   3. each rank tokenizes its range into a spool of its own (a Megatron
 *      dataset under a .tmp name), meeting the others every half second in
 *      a non-blocking sum of counters (prep_job_poll): the progress rank 0
 *      prints, and a bad document on any rank that stops them all;
 *   4. the document counts are exchanged, so that each document knows its
 *      global index (the --val-every split), and every rank writes its
 *      documents at their place in one dataset, or into a shard of its own
 *      (prep_job_write); the files are renamed when all ranks are done.
 * The result is byte for byte what one process makes. */
#ifndef TRD_DATA_PREPARE_JOB_H
#define TRD_DATA_PREPARE_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "data/inputs.h"

typedef struct PrepJob PrepJob;

/* The job when a launcher started this process as one of several ranks;
 * NULL for one plain process, as without MPI (under `mpiexec -n 1` MPI is
 * initialized all the same: the caller finalizes it).  The tasks of an
 * srun without MPI, which do not know of each other, exit 2. */
PrepJob *prep_job_start(void);
int prep_job_rank(const PrepJob *j);
int prep_job_size(const PrepJob *j);

/* Rank 0's checked input list (and *total_bytes, their size) to every
 * rank: the others' docs are filled here. */
void prep_job_share(PrepJob *j, InputList *docs, uint64_t *total_bytes);

/* A piece of this rank's range: file `file` of the list, whole, or bytes
 * [lo, hi) of it (part: a plain JSON lines file cut at line starts). */
typedef struct {
    size_t file;
    int part;
    uint64_t lo, hi;
} PrepUnit;

/* This rank's pieces, in input order (free them); splittable[f]: file f
 * is plain JSON lines. */
size_t prep_job_units(PrepJob *j, const InputList *docs, const unsigned char *splittable,
                      PrepUnit **units);

/* What a rank has done so far, summed over ranks by prep_job_poll. */
enum { PREP_DOCS, PREP_BYTES, PREP_TOKENS, PREP_FINISHED, PREP_FAILED, PREP_COUNTERS };

/* Between documents: completes the round of sums in flight, starts the
 * next one at most every half second.  Returns 1 once a round says that
 * a rank failed (stop working).  sums: the last complete round's totals
 * (all zero before the first). */
int prep_job_poll(PrepJob *j, const uint64_t mine[PREP_COUNTERS], uint64_t sums[PREP_COUNTERS]);

/* This rank is done (or failed, or stopped): rounds until every rank is;
 * sums gets the final totals.  Waits without spinning. */
void prep_job_finish(PrepJob *j, const uint64_t mine[PREP_COUNTERS], uint64_t sums[PREP_COUNTERS]);

/* After a failed job: the lowest failing rank prints its message (the
 * first bad document in input order among those found); every rank exits 2. */
_Noreturn void prep_job_fail(PrepJob *j, int failed, const char *msg, const char *hint);

/* The --skip-bad report: every rank's count summed, the first `shown` of
 * their messages in input order (each rank passes its first ones, n of
 * them, `len` bytes apart).  Returns the total; rank 0 gets the messages
 * in out (shown of them, `len` bytes apart). */
uint64_t prep_job_bad(PrepJob *j, uint64_t bad, const char *mine, int n, size_t len, char *out,
                      int shown);

/* Sum of a counter over ranks (blocking). */
uint64_t prep_job_sum(PrepJob *j, uint64_t v);
double prep_job_max(PrepJob *j, double v);

/* What to write from the spools. */
typedef struct {
    const char *out;   /* --out PREFIX */
    const char *spool; /* this rank's spool (a Megatron dataset) */
    int llmc, token_bytes, shards;
    long val_every;
    int mask; /* --template: the spool's loss mask (SPOOL.mask) into PREFIX.mask too */
} PrepWrite;

/* Documents and tokens written to a split (train, val) over all ranks. */
typedef struct {
    uint64_t docs, tokens;
} PrepSplit;

/* Every rank's spool into the outputs (merged, or one shard each), renamed
 * when all ranks are done; the spool is removed.  split[0] train, [1] val. */
void prep_job_write(PrepJob *j, const PrepWrite *w, PrepSplit split[2]);

/* A shard's prefix: OUT-00003-of-00004 (OUT the prefix of its split). */
void prep_shard_prefix(char *dst, size_t n, const char *out, int rank, int size);

#endif
