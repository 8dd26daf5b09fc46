#include "train/lr_schedule.h"

#include <math.h>

float schedule_lr(const TrainingConfig *tc, int step)
{
    /* Warm-up reaches the peak on its last step, so step 0 never trains at
     * lr 0 (a wasted step), as in Megatron-LM and llm.c. */
    if (step < tc->warmup_steps)
        return tc->lr * (float)(step + 1) / (float)tc->warmup_steps;
    if (tc->decay == DECAY_CONSTANT || tc->steps <= tc->warmup_steps)
        return tc->lr;
    /* progress 0 at the first step after warm-up, 1 at the last step */
    double span = (double)(tc->steps - tc->warmup_steps - 1);
    double progress = span > 0 ? (double)(step - tc->warmup_steps) / span : 1.0;
    if (progress > 1.0)
        progress = 1.0;
    double coeff = tc->decay == DECAY_COSINE ? 0.5 * (1.0 + cos(M_PI * progress)) : 1.0 - progress;
    return (float)(tc->min_lr + coeff * (tc->lr - tc->min_lr));
}
