/* error_impl.h — how ember's code reports an error: the calling thread's
 * error (tensor/error.c) set with a message naming the function and the
 * values that were wrong. Everything that only reports errors includes this
 * alone; tensor_impl.h includes it for the rest. */
#ifndef EMBER_ERROR_IMPL_H
#define EMBER_ERROR_IMPL_H

#include <stdint.h>

#include "ember/tensor.h"

typedef struct tensor tensor;

/* The size of the thread's error message, its NUL included. Code that
 * holds an error aside while it cleans up (cleanup that may set errors of
 * its own), or carries one to another thread, keeps it in a buffer of this
 * size, so no message is cut on its way back to the user. */
enum { ERROR_BYTES = 4096 };

/* em_fail sets the thread's error and returns NULL; em_err returns the code.
 * Messages read "op: what is wrong: values". */
void *em_fail(em_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
em_status em_err(em_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "(2,3)" for t's shape, in one of 8 rotating thread-local buffers, so up to 8
 * can appear in one message. */
const char *shp(const tensor *t);
/* Errors set on this thread so far: a caller that rewrites an error (a
 * layer naming itself, nn/module.c) tells a new error from one it handled. */
uint64_t error_seq(void);
const char *shp_of(int ndim, const int64_t *shape);

#endif
