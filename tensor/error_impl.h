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
 * carries an error to another thread keeps it in a buffer of this size (and
 * held_error, below, does), so no message is cut on its way to the user. */
enum { ERROR_BYTES = 4096 };

/* The thread's error held aside while cleanup that may set errors of its
 * own runs (freeing what a failed constructor made, closing what it
 * opened), then set again:
 *     held_error h;
 *     error_hold(&h, s);   (s: the status to report, usually em_last_status())
 *     ...cleanup...
 *     return error_restore(&h);
 * em_err and em_fail may also be given em_last_error() as an argument
 * (a prefix added to the message): they format into a copy first. */
typedef struct held_error {
    em_status status;
    char msg[ERROR_BYTES];
} held_error;
void error_hold(held_error *h, em_status s);
/* sets the thread's error to h's; returns h's status */
em_status error_restore(const held_error *h);

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
