/* trainer.h — training as a library: one rank's share of a model, its
 * optimizer, data and checkpoints, driven a step at a time.
 *
 * The `train` command's loop (train.c) is a few lines over this API, and a
 * test or another front end can drive it the same way:
 *
 *     Trainer *tr = trainer_create(&cfg, world, TRAINER_TRAIN);
 *     for (int s = trainer_info(tr)->start_step; s < cfg.training.steps; s++) {
 *         TrainerStep r = trainer_step(tr, s);
 *         ...
 *     }
 *     trainer_save(tr, cfg.training.steps, 1);
 *     trainer_destroy(tr);
 *
 * One optimizer step: zero gradients; for each micro-batch, forward and
 * backward (gradients accumulate, scaled by 1/micro-batches); global
 * gradient norm and clipping; AdamW at the scheduled learning rate.
 *
 * Every function is collective over the world the trainer was created on.
 * Bad input (a refused layout, a missing dataset, a checkpoint that does
 * not fit) makes every rank exit 2 together with one message from rank 0;
 * a failed write exits 1 (guard.h).  The trainer owns the checkpoint
 * directory and the run lock; the run's other outputs (metrics, TensorBoard,
 * samples) belong to its caller. */
#ifndef TRD_TRAINER_H
#define TRD_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"
#include "model/model.h"
#include "topology/topology.h"

typedef struct Trainer Trainer;

typedef enum {
    TRAINER_TRAIN, /* claims run.dir and checkpoint.dir, resumes, saves */
    TRAINER_EVAL,  /* weights from checkpoint.init_from; writes nothing, locks nothing */
} TrainerMode;

/* What a front end may read about the trainer. */
typedef struct {
    const Backend *be;
    const Topology *topo;
    const TopologyComms *comms;
    int dp, n_micro; /* data-parallel replicas; micro-steps per step */
    int start_step;  /* the first step this run trains (> 0: resumed) */
    int resumed;
    int has_val;        /* data.val_path or data.val_blend is set */
    int n_datasets;     /* of the training data: 1, or data.blend's count */
    const char *device; /* device backends: the GPU's name; "" on the CPU */
    int nccl;           /* device buffers go through NCCL */
    int device_step;    /* the step's loss, norm and update decided on the device: one
                         * host wait a step (one rank; trainer.c device_step) */
} TrainerInfo;

/* Build everything for one rank of cfg's layout on world.  cfg must have
 * passed config_validate for world->size and must outlive the trainer. */
Trainer *trainer_create(const Config *cfg, Comm world, TrainerMode mode);
void trainer_destroy(Trainer *tr);

const TrainerInfo *trainer_info(const Trainer *tr);

/* One training dataset (of data.path, or of data.blend) and what the run
 * has drawn from it by the end of a step. */
typedef struct {
    const char *name; /* as configured: a prefix, a pattern, a list */
    double weight;    /* normalized */
    int n_shards;
    uint64_t n_tokens, samples_per_epoch;
    uint64_t samples, tokens; /* drawn in steps [0, steps) */
    double epochs;            /* samples / samples_per_epoch */
} TrainerDataset;

/* Fill out[0..n_datasets) for the first `steps` steps; returns n_datasets. */
int trainer_data_seen(Trainer *tr, int steps, TrainerDataset *out);

/* One optimizer step, step 0-based: the global batch at sample positions
 * [step * global_batch, (step + 1) * global_batch) of the stream. */
typedef struct {
    double loss;      /* mean over the global batch, on every rank */
    double grad_norm; /* before clipping */
    float lr;
    int skipped;                   /* training.nonfinite: no update was made */
    double comm_ms;                /* communication not hidden behind compute */
    double data_ms;                /* reading this rank's samples (data loading) */
    unsigned long long comm_bytes; /* payload bytes this rank handed to DP collectives */
    double pp_idle;                /* fraction of the step the pipeline waited; -1: no pipeline */
    double cp_ms;                  /* the context-parallel exchange (blocking, so exposed);
                                      -1: no cp */
    unsigned long long cp_bytes;   /* bytes this rank sent in it */
    double trained;                /* targets the loss counted, over the global batch (not -1: the
                       instruction data's mask, data.eod_mask_loss); rank 0 has it */
} TrainerStep;
TrainerStep trainer_step(Trainer *tr, int step);

/* The targets counted in the samples before this run's first one (a
 * resume continues the count): seq_len each unless the data has a loss
 * mask or data.eod_mask_loss is on, when they are read again (one pass
 * over the samples trained so far).  Not collective. */
uint64_t trainer_trained_before(Trainer *tr);

/* The mean loss per token of the validation set (data.val_sequences
 * sequences, the same ones on every layout); tokens: how many counted. */
double trainer_validate(Trainer *tr, double *tokens);

/* Save the state after steps_done steps into checkpoint.dir: synchronously,
 * or (checkpoint.async) snapshot and write in the background; wait: also
 * wait for that write (the run ends). */
void trainer_save(Trainer *tr, int steps_done, int wait);
/* A background write that has finished on every rank is reported; block:
 * wait for the one in flight.  No-op without one. */
void trainer_poll_save(Trainer *tr, int block);

/* Memory per rank by category; snapshot: the asynchronous checkpoint's
 * host snapshot (0 without one). */
MemoryReport trainer_memory(const Trainer *tr, size_t *snapshot);

/* The model of chunk c of this rank (pp > 1 with virtual stages: several). */
Model *trainer_model(Trainer *tr, int c);

/* All parameters in table order (fp32), gathered over ZeRO's shards, into
 * buf on every rank; only for tp = pp = 1 (returns -1 otherwise). */
int trainer_gather_weights(Trainer *tr, float *buf, size_t *numel);

/* The FLOP/s that MFU is measured against: the GPU's dense bf16 peak by
 * name (TRIDENT_PEAK_TFLOPS overrides; 0 = unknown), or this CPU's SGEMM
 * rate on this rank's threads, times the world size. */
double trainer_peak_flops(const Trainer *tr);

/* Device backends: rank 0 prints the largest device memory a rank held and
 * the host staging buffers allocated after the first step.  Collective. */
void trainer_report_device_memory(Trainer *tr);

/* SGEMM FLOP/s of this machine's CPU BLAS (best of 9 n^3 products after a
 * warm-up): the physical limit that CPU MFU is measured against.  Training
 * probes n = 512 (27 ms at 100 GFLOP/s, the rate of 1024 within a few per
 * cent: every rank of every run pays it), bench/bench_cpu n = 1024. */
double train_cpu_peak_flops(int n);

/* A model for inference only: cfg's model (tp = pp = 1, no optimizer),
 * weights from the trident step directory `step_dir`, on backend be.
 * Bad input exits 2. */
Model *trainer_load_model(const Config *cfg, const Backend *be, const char *step_dir);

#endif
