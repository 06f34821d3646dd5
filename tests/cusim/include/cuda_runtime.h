/* cuda_runtime.h — the header CUDA sources include, as ember's emulator
 * serves it (meson -Dcuda=sim): the runtime API (cuda_runtime_api.h), and
 * from C++ also everything device code needs (cusim_device.h: qualifiers,
 * threadIdx, barriers, warp operations, atomics, the launch). */
#ifndef EMBER_CUSIM_CUDA_RUNTIME_H
#define EMBER_CUSIM_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "cusim_device.h"
#endif

#endif
