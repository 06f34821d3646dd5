/* path_test.h — the tests' switch between product paths: sets (or, with
 * NULL, clears) EMBER_F32_PATH / EMBER_BF16_PATH and forgets the path the
 * process chose, so the next product chooses again (tensor/gemm_path.c). */
#ifndef EMBER_PATH_TEST_H
#define EMBER_PATH_TEST_H

#include <stdlib.h>

#include "tensor/kernel_impl.h"

/* EMBER_<which>_PATH = p (NULL: unset); reset() forgets the chosen path */
static inline void set_path_env(const char *var, const char *p, void (*reset)(void))
{
    if (p)
        setenv(var, p, 1);
    else
        unsetenv(var);
    reset();
}

static inline void use_f32_path(const char *p) { set_path_env("EMBER_F32_PATH", p, gemm_f32_path_reset); }

static inline void use_bf16_path(const char *p) { set_path_env("EMBER_BF16_PATH", p, gemm_bf16_path_reset); }

#endif
