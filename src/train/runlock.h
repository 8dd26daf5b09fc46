/* runlock.h — one run per directory, and directories that can be written.
 *
 * Before a run writes anything, rank 0 creates run.dir and checkpoint.dir
 * (when set), checks that each is writable (creates and removes a probe
 * file), and takes an exclusive flock(2) on <dir>/.trident.lock, recording
 * host, pid and SLURM_JOB_ID in it.  The lock is held until the process
 * ends: the kernel releases a flock when its holder dies however it dies,
 * so a lock file left by a dead run is simply taken over (its old record is
 * named on stdout).  A second run on a held directory, or a directory that
 * cannot be written, ends every rank with exit 2 and a message naming the
 * holder or the reason.  docs/reliability.md has the details, including
 * what the lock guarantees on shared filesystems. */
#ifndef TRD_TRAIN_RUNLOCK_H
#define TRD_TRAIN_RUNLOCK_H

#include "comm/comm.h"
#include "config/config.h"

#define RUNLOCK_FILE ".trident.lock"

/* Collective over world: rank 0 prepares and locks run.dir and
 * checkpoint.dir (ckpt_dir "": none); on failure every rank exits 2 (rank
 * 0 says why). */
void runlock_claim(const char *run_dir, const char *ckpt_dir, Comm *world);

/* Rank 0, at the end of a run: empty the lock records (so the next run does
 * not report a dead holder) and release the locks.  The files stay: removing
 * a lock file another run has open would let two runs hold "the" lock. */
void runlock_release(void);

#endif
