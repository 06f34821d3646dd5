/* ember/data.h — datasets, samplers and the loader (issue 3). */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H
#include "tensor.h"
#endif
