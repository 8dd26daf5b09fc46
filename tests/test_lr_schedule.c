/* The learning-rate schedule at hand-computed points. */
#include "check.h"
#include "train/lr_schedule.h"

int main(void)
{
    TrainingConfig tc = {
        .steps = 11, .lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 4, .decay = DECAY_COSINE};
    /* warm-up: (step+1)/warmup */
    CHECK_CLOSE(schedule_lr(&tc, 0), 0.25, 1e-6, 0, "warmup step 0");
    CHECK_CLOSE(schedule_lr(&tc, 3), 1.0, 1e-6, 0, "warmup last step = peak");
    /* after warm-up, steps 4..10 span progress 0..1 over 6 intervals */
    CHECK_CLOSE(schedule_lr(&tc, 4), 1.0, 1e-6, 0, "cosine start");
    CHECK_CLOSE(schedule_lr(&tc, 7), 0.1 + 0.9 * 0.5, 1e-6, 0, "cosine middle");
    CHECK_CLOSE(schedule_lr(&tc, 10), 0.1, 1e-6, 0, "cosine end = min_lr");
    CHECK_CLOSE(schedule_lr(&tc, 5), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI / 6)), 1e-6, 0,
                "cosine at 1/6");
    tc.decay = DECAY_LINEAR;
    CHECK_CLOSE(schedule_lr(&tc, 7), 0.55, 1e-6, 0, "linear middle");
    CHECK_CLOSE(schedule_lr(&tc, 6), 1.0 - 0.9 * (2.0 / 6.0), 1e-6, 0, "linear at 2/6");
    tc.decay = DECAY_CONSTANT;
    CHECK_CLOSE(schedule_lr(&tc, 9), 1.0, 1e-6, 0, "constant");
    tc.warmup_steps = 0;
    tc.decay = DECAY_COSINE;
    CHECK_CLOSE(schedule_lr(&tc, 0), 1.0, 1e-6, 0, "no warm-up starts at peak");
    return check_summary("schedule");
}
