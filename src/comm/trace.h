/* trace.h — a timeline of what every rank did, written as one Chrome trace
 * (JSON "trace event" format: open it in ui.perfetto.dev or chrome://tracing).
 *
 * Each rank keeps its spans in memory (a fixed cap, so a long run cannot
 * exhaust memory: spans past the cap are counted, not kept) and rank 0
 * writes the file at the end, taking the other ranks' spans one rank at a
 * time.  A span is a name, a lane, a start and an end in seconds of
 * comm_wtime, and optional micro-batch, chunk and byte count.  Lanes are the
 * rows of one rank in the viewer: compute (forward, backward, optimizer),
 * point-to-point (pipeline sends and receives), collectives (all-reduce,
 * reduce-scatter, all-gather, from issue to completion, so overlap with
 * compute shows), and steps.
 *
 * Time zero is rank 0's clock when recording starts; every other rank
 * measures its clock's offset from rank 0's by round trips at the start
 * (the best of five), so spans of different machines line up to within
 * half the shortest round trip (microseconds on InfiniBand).  An offset
 * smaller than that uncertainty is taken as none (ranks of one machine
 * share a clock exactly).  The offset is
 * not re-measured: clocks that drift apart during a long run drift in the
 * trace too. */
#ifndef TRD_TRACE_H
#define TRD_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

typedef enum { TRACE_COMPUTE = 0, TRACE_P2P, TRACE_COLLECTIVE, TRACE_STEP, TRACE_LANES } TraceLane;

/* Start recording on every rank of world (collective): label names this
 * rank's row ("rank 3 (tp 1, pp 1, dp 0)"); at most max_spans are kept. */
void trace_start(const Comm *world, const char *label, size_t max_spans);
int trace_active(void);

/* Record a span [t0, t1] (comm_wtime seconds).  mb / chunk < 0 and bytes 0
 * are left out of the span's arguments.  name is copied (truncated to 31
 * characters).  Does nothing unless trace_start ran. */
void trace_span(const char *name, TraceLane lane, double t0, double t1, int mb, int chunk,
                uint64_t bytes);

/* Write the trace of every rank to path (collective over the world given to
 * trace_start; rank 0 writes) and stop recording.  Returns the number of
 * spans written on rank 0 (0 elsewhere), or -1 with errno set when rank 0
 * could not write the file. */
long trace_finish(const char *path);

/* This rank's spans so far, alone, to path (not collective: for a rank that
 * gives up on the others, src/train/watchdog.h).  Recording goes on.
 * Returns the spans written (0 when not recording), or -1 with errno set. */
long trace_write_rank(const char *path);

#endif
