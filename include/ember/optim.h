/* ember/optim.h — optimizers, LR schedules, gradient clipping (issue 3). */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H
#include "tensor.h"
#endif
