/* profile_impl.h — the profiler's hooks (tensor/profile.c; the public side
 * is include/ember/profile.h).
 *
 * A hook brackets work with a mark that lives on the caller's C stack:
 *
 *     prof_mark m;
 *     prof_begin(&m);                          one branch on prof_flag
 *     ... the work ...
 *     prof_end(&m, "all_reduce", PROF_COLLECTIVE);   one branch on m.t0
 *
 * Self time needs no stack of the profiler's own: each thread keeps the time
 * of the finished children of its innermost open record (prof_thread.child);
 * a mark saves the enclosing value at begin and restores it, plus its own
 * duration, at end. So nesting follows the C stack, and a mark that is
 * never ended (an op that fails between op_begin and op_end) only leaves
 * its parent's self time a little long; nothing else goes wrong. Every path
 * out of a bracket that does end should call prof_end or prof_abandon. */
#ifndef EMBER_PROFILE_IMPL_H
#define EMBER_PROFILE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

/* The category of a record: what the table and the trace call it. */
typedef enum prof_cat {
    PROF_OP,         /* a forward op (dispatcher) */
    PROF_BACKWARD,   /* a backward node (autograd walk) */
    PROF_COLLECTIVE, /* a collective, send/recv, or waiting for one */
    PROF_LOADER,     /* data loading and waiting for it */
    PROF_OPTIMIZER,  /* an optimizer step, zero_grad */
    PROF_RANGE,      /* a named range */
    PROF_CAT_COUNT
} prof_cat;

/* Non-zero while profiling is on: the one thing a hook reads when off. */
extern int prof_flag;

typedef struct prof_mark {
    int64_t t0;    /* start (CLOCK_MONOTONIC ns); 0: not recording */
    int64_t outer; /* the enclosing record's child time at begin */
} prof_mark;

void prof_begin_slow(prof_mark *m);
/* Ends m and records it. bytes/dtype: a collective's payload (-1: none). */
void prof_record(prof_mark *m, const char *name, prof_cat cat, int64_t bytes, int dtype);
/* Ends op's forward (backward false) or backward node (true). */
void prof_record_op(prof_mark *m, int op, bool backward);
/* Ends m without recording it (the work failed). */
void prof_abandon_slow(prof_mark *m);

static inline void prof_begin(prof_mark *m)
{
    m->t0 = 0;
    if (__builtin_expect(__atomic_load_n(&prof_flag, __ATOMIC_RELAXED), 0)) prof_begin_slow(m);
}

/* prof_begin for a mark that is zero already (op_begin's, in a zeroed op_call) */
static inline void prof_begin_zeroed(prof_mark *m)
{
    if (__builtin_expect(__atomic_load_n(&prof_flag, __ATOMIC_RELAXED), 0)) prof_begin_slow(m);
}

static inline void prof_end(prof_mark *m, const char *name, prof_cat cat)
{
    if (__builtin_expect(m->t0 != 0, 0)) prof_record(m, name, cat, -1, -1);
}

static inline void prof_end_bytes(prof_mark *m, const char *name, prof_cat cat, int64_t bytes, int dtype)
{
    if (__builtin_expect(m->t0 != 0, 0)) prof_record(m, name, cat, bytes, dtype);
}

static inline void prof_end_op(prof_mark *m, int op, bool backward)
{
    if (__builtin_expect(m->t0 != 0, 0)) prof_record_op(m, op, backward);
}

static inline void prof_abandon(prof_mark *m)
{
    if (__builtin_expect(m->t0 != 0, 0)) prof_abandon_slow(m);
}

/* The rank this process's trace is named after (dist/pg.c, on joining). */
void prof_set_rank(int rank);
/* Names the calling thread's track in the trace ("pg comm", "loader");
 * name must live as long as the process (a string literal). */
void prof_thread_name(const char *name);
/* Records begun on the calling thread and not yet ended or abandoned (for
 * the tests: 0 between top-level calls, or some path of an op leaves its
 * record open and its parent's self time too long). */
int64_t prof_open_records(void);
/* Reads EMBER_PROFILE again as at load (for the tests; the library reads
 * it once). */
void prof_read_env(void);

#endif
