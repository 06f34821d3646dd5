/* error.c — the thread's last error: a status code plus a message naming the
 * op and the values that were wrong. The library never exits; callers read
 * this. */
#include <stdio.h>
#include <string.h>

#include "tensor_impl.h"

static _Thread_local em_status last_status = EM_OK;
static _Thread_local char last_msg[ERROR_BYTES]; /* two file paths and the text around them fit */
static _Thread_local uint64_t error_count; /* errors set on this thread so far */

uint64_t error_seq(void) { return error_count; }

em_status em_last_status(void) { return last_status; }
const char *em_last_error(void) { return last_msg; }

void em_clear_error(void)
{
    last_status = EM_OK;
    last_msg[0] = '\0';
}

const char *em_status_name(em_status s)
{
    static const char *names[] = {"ok",    "bad argument",  "shape", "dtype",       "device",  "index",
                                  "scope", "out of memory", "io",    "unsupported", "autograd",
                                  "distributed", "timeout"};
    if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
    return "unknown status";
}

static void set_error(em_status s, const char *fmt, va_list ap)
{
    char msg[sizeof last_msg]; /* fmt's arguments may point into last_msg (a prefix added to it) */
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_msg, msg, sizeof msg);
    last_status = s;
    error_count++;
}

void error_hold(held_error *h, em_status s)
{
    h->status = s;
    memcpy(h->msg, last_msg, sizeof h->msg);
}

em_status error_restore(const held_error *h)
{
    memcpy(last_msg, h->msg, sizeof last_msg);
    last_status = h->status;
    error_count++;
    return h->status;
}

void *em_fail(em_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(s, fmt, ap);
    va_end(ap);
    return NULL;
}

em_status em_err(em_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(s, fmt, ap);
    va_end(ap);
    return s;
}

const char *shp_of(int ndim, const int64_t *shape)
{
    static _Thread_local char bufs[8][EM_MAX_DIMS * 21 + 4];
    static _Thread_local int next;
    char *b = bufs[next];
    next = (next + 1) % 8;
    size_t n = 0, cap = sizeof bufs[0];
    n += (size_t)snprintf(b + n, cap - n, "(");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(b + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (ndim == 1 && n < cap) n += (size_t)snprintf(b + n, cap - n, ",");
    if (n < cap) snprintf(b + n, cap - n, ")");
    return b;
}

const char *shp(const tensor *t) { return shp_of(t->ndim, t->shape); }

em_status em_set_error(em_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(s, fmt, ap);
    va_end(ap);
    return s;
}
