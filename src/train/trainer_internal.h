/* trainer_internal.h — the Trainer's state, shared by trainer.c (building,
 * the step, validation), trainer_ckpt.c (resume, init_from, saves) and
 * trainer_device.c (threads, GPUs, NCCL, peak FLOP/s).  Not for callers:
 * they use trainer.h. */
#ifndef TRD_TRAINER_INTERNAL_H
#define TRD_TRAINER_INTERNAL_H

#include "checkpoint/ckpt.h"
#include "data/blend.h"
#include "train/guard.h"
#include "train/memcheck.h"
#include "pipeline_par/pp_stage.h"
#include "train/trainer.h"
#include "zero/zero.h"

struct Trainer {
    const Config *cfg;
    TrainerMode mode;
    TrainerInfo info; /* what callers read; points into the fields below */
    const Backend *be;
    Topology topo;
    TopologyComms comms;
    Model *models[CFG_MAX_VIRTUAL]; /* this rank's model chunks (bound by the engine) */
    Zero *zero;
    Blend train_data, val_data;  /* one dataset, or data.blend's (data/blend.h) */
    int32_t *tokens, *targets;   /* the step's micro-batches: [n_micro][B*T/cp] */
    int32_t *pos;                /* data.document_mask: their positions in documents;
                                   cp > 1: their global positions (or in documents) */
    int32_t *whole;              /* cp > 1: one micro-batch's whole sequences, before
                                   this rank's chunks are cut out: [3][B*T] */
    uint64_t *drop_rows;         /* model.lora.dropout: each row's place in the token
                                   stream, [n_micro][B*T/cp] (model_set_dropout_rows) */
    float *loss_share;           /* [n_micro]: each one's share of the step's counted targets */
    int dp, dp_rank, n_micro;    /* dp: replicas reading different sequences (not cp) */
    int cp;                      /* topology.cp: ranks sharing each sequence */
    size_t rows;                 /* a micro-batch's token rows here: B*T/cp */
    PpStage *pipe;               /* pp > 1 */
    CkptShardView ckpt;          /* what this rank saves and loads (host memory) */
    Comm ckpt_world;             /* the world the checkpoint's collectives run on */
    CkptAsync *async;            /* checkpoint.async on: the background writer */
    double async_blocked_s;      /* the write in flight: what its save step blocked */
    float *ckpt_dev[CKPT_KINDS]; /* device backends: the engine's buffers that ckpt's
                                    host copies mirror (NULL: none, or host backend) */
    int ckpt_host[CKPT_KINDS];   /* that buffer is host memory (topology.offload): memcpy */
    char device[128];            /* device backends: the device's name */
    MemBudget device_memory;     /* device backends: the memory the state lives in */
    int nccl;                    /* device buffers go through NCCL (topology.comm) */
    int start_step;              /* first step of this run (> 0 when resumed) */
    uint64_t start_position;     /* sample stream position at start_step */
    double step_trained;         /* targets the last step counted (global: summed over DP) */
    int resumed;
    int steps_taken;       /* trainer_step calls so far */
    uint64_t staged_first; /* staging buffers allocated by the end of the first step */
    NonfiniteGuard guard;  /* training.nonfinite: skipped steps */
    /* One rank on a device: the step's loss, gradient norm and update
     * decision kept in device memory and read once, at the step's end
     * (one_step); NULL otherwise. */
    BackendStepState *step_dev, *step_host;
};

/* trainer_device.c */
void trainer_set_threads(Comm world);
void trainer_use_device(Trainer *tr);

/* trainer_ckpt.c */
int trainer_async_decide(const Trainer *tr, Comm *world);
void trainer_ckpt_setup(Trainer *tr);
void trainer_ckpt_teardown(Trainer *tr);
int trainer_resume(Trainer *tr);
void trainer_init_from(Trainer *tr, int resumed);

#endif
