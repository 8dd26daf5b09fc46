/* test_trainer.c — the trainer API (src/train/trainer.h) driven from C, no
 * shell script: on 2 real ranks,
 *   - a single-rank trainer (each rank alone, on a communicator of its own)
 *     and a dp 2 / ZeRO-1 trainer on both ranks give the same per-step loss
 *     and validation loss (relative 1e-5) for the same config and seed;
 *   - trainer_save after 2 steps, a new trainer resumes at step 2 and its
 *     steps 3 and 4 equal the uninterrupted run's bit for bit;
 *   - a TRAINER_EVAL trainer with checkpoint.init_from that step gives the
 *     validation loss the training trainer had after step 2.
 * It trains configs/tiny.yaml shrunk to 2 layers on data/brown/gpt2
 * (scripts/get_corpus.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mpi_test.h"
#include "train/trainer.h"

#define STEPS 4

static void configure(Config *cfg, const char *run_dir, const char *ckpt_dir, int dp, int world)
{
    char err[CFG_ERR], set[CFG_STR + 32];
    const char *sets[] = {
        "model.layers=2",          "model.hidden=64",         "model.heads=4",
        "model.seq_len=32",        "training.warmup_steps=1", "training.lr=1e-3",
        "training.global_batch=4", "training.micro_batch=1",  "data.val_sequences=3",
        "topology.zero=1",         "checkpoint.async=false"};
    if (config_load(cfg, "configs/tiny.yaml", err) != 0) {
        fprintf(stderr, "test_trainer: %s\n", err);
        exit(1);
    }
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        CHECK(config_set(cfg, sets[i], err) == 0, "%s: %s", sets[i], err);
    snprintf(set, sizeof set, "training.steps=%d", STEPS);
    CHECK(config_set(cfg, set, err) == 0, "%s", err);
    snprintf(set, sizeof set, "topology.dp=%d", dp);
    CHECK(config_set(cfg, set, err) == 0, "%s", err);
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s", run_dir);
    snprintf(cfg->checkpoint.dir, sizeof cfg->checkpoint.dir, "%s", ckpt_dir);
    CHECK(config_validate(cfg, world, err) == 0, "config: %s", err);
}

/* Losses of steps [from, to) of a trainer; the validation loss after `to`. */
static double run_steps(Trainer *tr, int from, int to, double *loss)
{
    for (int s = from; s < to; s++) {
        const TrainerStep r = trainer_step(tr, s);
        CHECK(!r.skipped && r.grad_norm > 0 && r.lr > 0, "step %d: norm %g lr %g", s + 1,
              r.grad_norm, (double)r.lr);
        loss[s] = r.loss;
    }
    double tokens = 0;
    const double val = trainer_validate(tr, &tokens);
    CHECK(tokens == 3 * 32, "validation counted %g tokens, want 3 sequences of 32", tokens);
    return val;
}

int main(void)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("test_trainer", 2);
    comm_init(NULL, NULL);
    Comm world = comm_world();
    char tmp[] = "/tmp/test_trainer.XXXXXX", dir[CFG_STR], ck[64];
    if (world.rank == 0 && !mkdtemp(tmp))
        return 1;
    comm_broadcast(&world, tmp, sizeof tmp, 0);

    /* One rank alone: each rank trains the same single-rank run. */
    Comm self = comm_split(&world, world.rank, 0);
    Config one;
    snprintf(dir, sizeof dir, "%s/one%d", tmp, world.rank);
    configure(&one, dir, "", 1, 1);
    double ref[STEPS], got[STEPS], resumed[STEPS];
    Trainer *tr = trainer_create(&one, self, TRAINER_TRAIN);
    CHECK(trainer_info(tr)->dp == 1 && trainer_info(tr)->n_micro == 4, "one rank: dp %d",
          trainer_info(tr)->dp);
    const double ref_val = run_steps(tr, 0, STEPS, ref);
    trainer_destroy(tr);
    CHECK(ref[STEPS - 1] < ref[0], "loss did not fall: %g -> %g", ref[0], ref[STEPS - 1]);

    /* dp 2 over both ranks, saving after step 2. */
    Config dp2;
    snprintf(dir, sizeof dir, "%s/dp2", tmp);
    snprintf(ck, sizeof ck, "%s/ckpt", tmp);
    configure(&dp2, dir, ck, 2, 2);
    tr = trainer_create(&dp2, world, TRAINER_TRAIN);
    CHECK(trainer_info(tr)->dp == 2 && trainer_info(tr)->start_step == 0, "dp2: dp %d",
          trainer_info(tr)->dp);
    const double val2 = run_steps(tr, 0, 2, got);
    trainer_save(tr, 2, 1);
    const double val4 = run_steps(tr, 2, STEPS, got);
    trainer_destroy(tr);
    for (int s = 0; s < STEPS; s++)
        CHECK_CLOSE(got[s], ref[s], 1e-5, 0, "dp 2 loss against one rank");
    CHECK_CLOSE(val4, ref_val, 1e-5, 0, "dp 2 validation loss against one rank");

    /* Resume from the step-2 checkpoint: the same steps 3 and 4, exactly. */
    tr = trainer_create(&dp2, world, TRAINER_TRAIN);
    CHECK(trainer_info(tr)->resumed && trainer_info(tr)->start_step == 2, "resumed at %d",
          trainer_info(tr)->start_step);
    const double val4r = run_steps(tr, 2, STEPS, resumed);
    trainer_destroy(tr);
    for (int s = 2; s < STEPS; s++)
        CHECK(resumed[s] == got[s], "step %d after resume: %.9g, uninterrupted %.9g", s + 1,
              resumed[s], got[s]);
    CHECK(val4r == val4, "validation after resume %.9g, uninterrupted %.9g", val4r, val4);

    /* Evaluation only: the weights of step 2, no step taken. */
    Config ev;
    snprintf(dir, sizeof dir, "%s/eval", tmp);
    configure(&ev, dir, "", 2, 2);
    snprintf(ev.checkpoint.init_from, sizeof ev.checkpoint.init_from, "%s/step_00000002", ck);
    tr = trainer_create(&ev, world, TRAINER_EVAL);
    double tokens;
    CHECK(trainer_validate(tr, &tokens) == val2, "eval of step 2 differs from training's");
    trainer_destroy(tr);

    comm_free(&self);
    comm_barrier(&world);
    if (world.rank == 0) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        CHECK(system(cmd) == 0, "cleanup");
    }
    const int rc = check_summary(world.rank ? "test_trainer (rank 1)" : "test_trainer");
    comm_finalize();
    return rc;
}
