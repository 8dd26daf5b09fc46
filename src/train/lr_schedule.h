/* lr_schedule.h — the learning-rate schedule: linear warm-up, then cosine,
 * linear or constant decay from training.lr to training.min_lr. */
#ifndef TRD_LR_SCHEDULE_H
#define TRD_LR_SCHEDULE_H

#include "config/config.h"

/* Learning rate of optimizer step `step` (0-based). */
float schedule_lr(const TrainingConfig *tc, int step);

#endif
