/* profile.c — the profiler: per-thread records, the table, the trace
 * (include/ember/profile.h says what is recorded and how it is read;
 * profile_impl.h how the hooks bracket work).
 *
 * Each thread that records gets a prof_thread, made on its first record and
 * kept (listed in `threads`) until the process ends, so the records of a
 * thread that has exited still reach the table and the trace. A thread
 * writes only its own prof_thread: the running child time without a lock
 * (no one else reads it), the records and the per-name totals under the
 * thread's own mutex, which only a reader of the table or trace (or a
 * reset) contends for. The totals are a small hash table per thread keyed by
 * (name pointer, category): names are the library's static strings or, for
 * ranges, interned copies, so equal names share a pointer within a thread
 * and across threads they are merged by text when the table is read. */
#include "ember/profile.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ember/runtime.h"
#include "error_impl.h"
#include "ops.h"
#include "profile_impl.h"
#include "settings_impl.h"

int prof_flag;

enum {
    CHUNK_EVENTS = 4096,
    MAX_EVENTS = 1 << 20, /* per thread, for the trace; the table counts past it */
    MAX_RANGES = 64,
    NAME_MAX_LEN = 128,
};

static const char *const cat_names[PROF_CAT_COUNT] = {
    [PROF_OP] = "op",         [PROF_BACKWARD] = "backward",   [PROF_COLLECTIVE] = "collective",
    [PROF_LOADER] = "loader", [PROF_OPTIMIZER] = "optimizer", [PROF_RANGE] = "range",
};

/* "matmul_backward", ...: each op's backward name, from the op list */
static const char *const backward_names[] = {
#define DEF_OP(id, name, kind, arity, amp, be) [OP_##id] = name "_backward",
#include "ops.def"
};
_Static_assert(sizeof backward_names / sizeof backward_names[0] == OP_COUNT,
               "profile: a backward name per op");

/* ---- per-thread records ------------------------------------------------------------------ */

typedef struct prof_event {
    int64_t t0, dur; /* ns */
    const char *name;
    int64_t bytes; /* -1: none */
    int16_t dtype; /* -1: none */
    uint8_t cat;
} prof_event;

typedef struct chunk {
    struct chunk *next;
    int n;
    prof_event ev[CHUNK_EVENTS];
} chunk;

typedef struct agg {
    const char *name; /* NULL: empty slot */
    int cat;
    int64_t calls, total, self; /* ns */
} agg;

typedef struct prof_thread {
    struct prof_thread *next;
    pthread_mutex_t mu; /* the records and totals below */
    int tid, order;
    const char *name;
    int64_t child; /* the owner's only: finished children of its innermost open record */
    int64_t open;  /* the owner's only: records begun and not yet ended or abandoned */
    chunk *first, *last;
    int64_t nevents, dropped;
    agg *tab;
    int tab_cap, tab_n;
} prof_thread;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER; /* threads, nthreads, the interned names */
static prof_thread *threads;
static int nthreads;
static int prof_rank;
static _Thread_local prof_thread *me;
static _Thread_local const char *my_name;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static prof_thread *self_thread(void)
{
    if (me) return me;
    prof_thread *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mu, NULL);
    t->tid = (int)syscall(SYS_gettid);
    t->name = my_name ? my_name : t->tid == getpid() ? "main" : "thread";
    pthread_mutex_lock(&reg_mu);
    t->order = nthreads++;
    t->next = threads;
    threads = t;
    pthread_mutex_unlock(&reg_mu);
    return me = t;
}

int64_t prof_open_records(void) { return me ? me->open : 0; }

void prof_thread_name(const char *name)
{
    my_name = name;
    if (me) {
        pthread_mutex_lock(&me->mu);
        me->name = name;
        pthread_mutex_unlock(&me->mu);
    }
}

void prof_begin_slow(prof_mark *m)
{
    prof_thread *t = self_thread();
    if (!t) return; /* out of memory: this record is not made */
    m->outer = t->child;
    t->child = 0;
    t->open++;
    m->t0 = now_ns();
}

void prof_abandon_slow(prof_mark *m)
{
    me->child = m->outer; /* its time stays with the parent's own */
    me->open--;
    m->t0 = 0;
}

static size_t agg_hash(const char *name, int cat, int cap)
{
    uintptr_t h = (uintptr_t)name * 0x9e3779b97f4a7c15ull + (uintptr_t)cat;
    return (size_t)(h >> 17) & (size_t)(cap - 1);
}

/* The totals' slot of (name, cat), made when missing; NULL when the table
 * cannot grow. Under t->mu. */
static agg *agg_slot(prof_thread *t, const char *name, int cat)
{
    if (t->tab) {
        for (size_t i = agg_hash(name, cat, t->tab_cap);; i = (i + 1) & (size_t)(t->tab_cap - 1)) {
            agg *a = &t->tab[i];
            if (a->name == name && a->cat == cat) return a;
            if (!a->name) break;
        }
    }
    if (2 * (t->tab_n + 1) > t->tab_cap) { /* grow, at most half full */
        int cap = t->tab_cap ? 2 * t->tab_cap : 128;
        agg *nt = calloc((size_t)cap, sizeof *nt);
        if (!nt) return NULL;
        for (int j = 0; j < t->tab_cap; j++) {
            agg *a = &t->tab[j];
            if (!a->name) continue;
            size_t i = agg_hash(a->name, a->cat, cap);
            while (nt[i].name) i = (i + 1) & (size_t)(cap - 1);
            nt[i] = *a;
        }
        free(t->tab);
        t->tab = nt;
        t->tab_cap = cap;
    }
    size_t i = agg_hash(name, cat, t->tab_cap);
    while (t->tab[i].name) i = (i + 1) & (size_t)(t->tab_cap - 1);
    t->tab_n++;
    t->tab[i] = (agg){.name = name, .cat = cat};
    return &t->tab[i];
}

void prof_record(prof_mark *m, const char *name, prof_cat cat, int64_t bytes, int dtype)
{
    int64_t t1 = now_ns(), dur = t1 - m->t0;
    prof_thread *t = me;
    int64_t self = dur - t->child;
    t->child = m->outer + dur;
    t->open--;
    pthread_mutex_lock(&t->mu);
    agg *a = agg_slot(t, name, (int)cat);
    if (a) {
        a->calls++;
        a->total += dur;
        a->self += self;
    }
    if (t->nevents >= MAX_EVENTS) {
        t->dropped++;
    } else {
        if (!t->last || t->last->n == CHUNK_EVENTS) {
            chunk *c = malloc(sizeof *c);
            if (c) {
                c->next = NULL;
                c->n = 0;
                if (t->last)
                    t->last->next = c;
                else
                    t->first = c;
                t->last = c;
            }
        }
        if (t->last && t->last->n < CHUNK_EVENTS) {
            t->last->ev[t->last->n++] = (prof_event){.t0 = m->t0,
                                                     .dur = dur,
                                                     .name = name,
                                                     .bytes = bytes,
                                                     .dtype = (int16_t)dtype,
                                                     .cat = (uint8_t)cat};
            t->nevents++;
        } else {
            t->dropped++;
        }
    }
    pthread_mutex_unlock(&t->mu);
    m->t0 = 0;
}

void prof_record_op(prof_mark *m, int op, bool backward)
{
    if (op < 0 || op >= OP_COUNT)
        prof_abandon_slow(m);
    else if (backward)
        prof_record(m, backward_names[op], PROF_BACKWARD, -1, -1);
    else
        prof_record(m, op_name((op_id)op), PROF_OP, -1, -1);
}

/* Drops t's records and totals. Under t->mu. */
static void thread_clear(prof_thread *t)
{
    for (chunk *c = t->first, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    t->first = t->last = NULL;
    t->nevents = t->dropped = 0;
    free(t->tab);
    t->tab = NULL;
    t->tab_cap = t->tab_n = 0;
}

/* ---- switching ------------------------------------------------------------------------------ */

void em_profile_start(void) { __atomic_store_n(&prof_flag, 1, __ATOMIC_RELAXED); }
void em_profile_stop(void) { __atomic_store_n(&prof_flag, 0, __ATOMIC_RELAXED); }
bool em_profile_enabled(void) { return __atomic_load_n(&prof_flag, __ATOMIC_RELAXED) != 0; }

void em_profile_reset(void)
{
    pthread_mutex_lock(&reg_mu);
    for (prof_thread *t = threads; t; t = t->next) {
        pthread_mutex_lock(&t->mu);
        thread_clear(t);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&reg_mu);
}

void prof_set_rank(int rank) { __atomic_store_n(&prof_rank, rank, __ATOMIC_RELAXED); }

/* ---- interned names (ranges) ------------------------------------------------------------- */

typedef struct iname {
    struct iname *next;
    char s[];
} iname;
static iname *interned[256];

/* A copy of name that lives as long as the process; one per distinct text.
 * NULL when out of memory. */
static const char *intern(const char *name)
{
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    pthread_mutex_lock(&reg_mu);
    iname **b = &interned[h & 255], *e;
    for (e = *b; e; e = e->next)
        if (!strcmp(e->s, name)) break;
    if (!e && (e = malloc(sizeof *e + strlen(name) + 1))) {
        strcpy(e->s, name);
        e->next = *b;
        *b = e;
    }
    pthread_mutex_unlock(&reg_mu);
    return e ? e->s : NULL;
}

/* ---- ranges ----------------------------------------------------------------------------------- */

static _Thread_local struct {
    const char *name;
    prof_mark m;
} ranges[MAX_RANGES];
static _Thread_local int nranges;

em_status em_profile_range_begin(const char *name)
{
    if (!name || !name[0])
        return em_err(EM_ERR_ARG, "em_profile_range_begin: name is %s", name ? "empty" : "NULL");
    if (strlen(name) > NAME_MAX_LEN)
        return em_err(EM_ERR_ARG, "em_profile_range_begin: name '%.32s...' is longer than %d bytes", name,
                      NAME_MAX_LEN);
    if (nranges == MAX_RANGES)
        return em_err(EM_ERR_ARG, "em_profile_range_begin: '%s': %d ranges are open on this thread already",
                      name, MAX_RANGES);
    int i = nranges++;
    ranges[i].name = NULL;
    prof_begin(&ranges[i].m);
    if (ranges[i].m.t0 && !(ranges[i].name = intern(name))) prof_abandon(&ranges[i].m);
    return EM_OK;
}

em_status em_profile_range_end(void)
{
    if (nranges == 0) return em_err(EM_ERR_ARG, "em_profile_range_end: no range is open on this thread");
    int i = --nranges;
    prof_end(&ranges[i].m, ranges[i].name, PROF_RANGE);
    return EM_OK;
}

/* ---- the table ------------------------------------------------------------------------------ */

static int row_order(const void *pa, const void *pb)
{
    const em_profile_row *a = pa, *b = pb;
    if (a->total_ms != b->total_ms) return a->total_ms > b->total_ms ? -1 : 1;
    int c = strcmp(a->name, b->name);
    return c ? c : strcmp(a->category, b->category);
}

/* Every thread's totals merged by (name text, category), sorted by total
 * time, into *out (*n rows; free it), with the number of threads that
 * recorded and of records. EM_ERR_OOM. */
static em_status collect(em_profile_row **out, int64_t *n, int *nthr, int64_t *nrec)
{
    *out = NULL;
    *n = *nrec = 0;
    *nthr = 0;
    size_t cap = 0;
    em_profile_row *rows = NULL;
    bool oom = false;
    pthread_mutex_lock(&reg_mu);
    for (prof_thread *t = threads; t && !oom; t = t->next) {
        pthread_mutex_lock(&t->mu);
        if (t->tab_n) ++*nthr;
        for (int j = 0; j < t->tab_cap && !oom; j++) {
            agg *a = &t->tab[j];
            if (!a->name) continue;
            *nrec += a->calls;
            int64_t k = 0;
            while (k < *n && (rows[k].category != cat_names[a->cat] || strcmp(rows[k].name, a->name))) k++;
            if (k == *n) {
                if ((size_t)*n == cap) {
                    size_t nc = cap ? 2 * cap : 64;
                    em_profile_row *nr = realloc(rows, nc * sizeof *nr);
                    if (!nr) {
                        oom = true;
                        break;
                    }
                    rows = nr;
                    cap = nc;
                }
                rows[(*n)++] = (em_profile_row){.name = a->name, .category = cat_names[a->cat]};
            }
            rows[k].calls += a->calls;
            rows[k].total_ms += (double)a->total / 1e6;
            rows[k].self_ms += (double)a->self / 1e6;
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&reg_mu);
    if (oom) {
        free(rows);
        *n = 0;
        return em_err(EM_ERR_OOM, "em_profile: out of memory reading the records");
    }
    if (*n) qsort(rows, (size_t)*n, sizeof *rows, row_order);
    *out = rows;
    return EM_OK;
}

int64_t em_profile_rows(em_profile_row *rows, int64_t cap)
{
    if (cap < 0 || (cap > 0 && !rows)) {
        em_err(EM_ERR_ARG, "em_profile_rows: cap %lld with rows %s", (long long)cap, rows ? "set" : "NULL");
        return -1;
    }
    em_profile_row *all;
    int64_t n, nrec;
    int nthr;
    if (collect(&all, &n, &nthr, &nrec)) return -1;
    if (n && cap) memcpy(rows, all, (size_t)(n < cap ? n : cap) * sizeof *rows);
    free(all);
    return n;
}

em_status em_profile_print(FILE *f)
{
    if (!f) return em_err(EM_ERR_ARG, "em_profile_print: f is NULL");
    em_profile_row *rows;
    int64_t n, nrec;
    int nthr;
    em_status s = collect(&rows, &n, &nthr, &nrec);
    if (s) return s;
    double covered = 0;
    int w = 24; /* the name column: as wide as the longest name */
    for (int64_t i = 0; i < n; i++) {
        covered += rows[i].self_ms;
        int l = (int)strlen(rows[i].name);
        if (l > w) w = l;
    }
    if (w > NAME_MAX_LEN) w = NAME_MAX_LEN;
    /* one buffer, one write: ranks sharing a terminal do not interleave lines */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        free(rows);
        return em_err(EM_ERR_OOM, "em_profile_print: out of memory");
    }
    fprintf(m, "ember profile, rank %d: %lld records on %d thread%s covering %.3f ms\n",
            __atomic_load_n(&prof_rank, __ATOMIC_RELAXED), (long long)nrec, nthr, nthr == 1 ? "" : "s",
            covered);
    fprintf(m, "%-*s  %-10s  %9s  %12s  %12s  %11s  %7s  %7s\n", w, "name", "category", "calls", "total ms",
            "self ms", "avg ms", "total %", "self %");
    for (int64_t i = 0; i < n; i++) {
        const em_profile_row *r = &rows[i];
        fprintf(m, "%-*.*s  %-10s  %9lld  %12.3f  %12.3f  %11.4f  %6.1f%%  %6.1f%%\n", w, w, r->name,
                r->category, (long long)r->calls, r->total_ms, r->self_ms, r->total_ms / (double)r->calls,
                covered > 0 ? 100 * r->total_ms / covered : 0.0,
                covered > 0 ? 100 * r->self_ms / covered : 0.0);
    }
    if (n == 0) fprintf(m, "(nothing recorded: profiling was off, or nothing ran)\n");
    bool ok = fclose(m) == 0 && buf;
    free(rows);
    if (ok) ok = fwrite(buf, 1, len, f) == len && fflush(f) == 0;
    free(buf);
    return ok ? EM_OK : em_err(EM_ERR_IO, "em_profile_print: writing the table failed: %s", strerror(errno));
}

/* ---- the trace ------------------------------------------------------------------------------ */

/* The writer formats by hand into a line buffer (printf took 6,000
 * instructions an event, seconds for a million at exit). Each appends at p
 * and returns the end. */
static char *put_lit(char *p, const char *s)
{
    while (*s) *p++ = *s++;
    return p;
}

static char *put_u64(char *p, uint64_t v)
{
    char d[20];
    int n = 0;
    do d[n++] = (char)('0' + v % 10);
    while ((v /= 10));
    while (n) *p++ = d[--n];
    return p;
}

/* ns as microseconds with three decimals, exactly (ns >= 0) */
static char *put_us(char *p, int64_t ns)
{
    p = put_u64(p, (uint64_t)ns / 1000);
    int r = (int)((uint64_t)ns % 1000);
    *p++ = '.';
    *p++ = (char)('0' + r / 100);
    *p++ = (char)('0' + r / 10 % 10);
    *p++ = (char)('0' + r % 10);
    return p;
}

/* s as a JSON string; at most 6 bytes per byte of s (names are at most
 * NAME_MAX_LEN bytes) */
static char *put_str(char *p, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    *p++ = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *p++ = '\\';
            *p++ = (char)*c;
        } else if (*c < 0x20) {
            p = put_lit(p, "\\u00");
            *p++ = hex[*c >> 4];
            *p++ = hex[*c & 15];
        } else {
            *p++ = (char)*c;
        }
    }
    *p++ = '"';
    return p;
}

static void write_events(FILE *f, int pid, int64_t *dropped)
{
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}",
            pid, pid);
    pthread_mutex_lock(&reg_mu);
    for (prof_thread *t = threads; t; t = t->next) {
        pthread_mutex_lock(&t->mu);
        char line[1024], ids[64], *p;
        p = put_lit(ids, ",\"pid\":");
        p = put_u64(p, (uint64_t)pid);
        p = put_lit(p, ",\"tid\":");
        p = put_u64(p, (uint64_t)t->tid);
        *p = 0;
        if (t->tab_n) {
            p = put_lit(line, ",\n{\"name\":\"thread_name\",\"ph\":\"M\"");
            p = put_lit(p, ids);
            p = put_lit(p, ",\"args\":{\"name\":");
            p = put_str(p, t->name);
            p = put_lit(p, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\"");
            p = put_lit(p, ids);
            p = put_lit(p, ",\"args\":{\"sort_index\":");
            p = put_u64(p, (uint64_t)t->order);
            p = put_lit(p, "}}");
            fwrite(line, 1, (size_t)(p - line), f);
        }
        for (chunk *c = t->first; c; c = c->next)
            for (int i = 0; i < c->n; i++) {
                const prof_event *e = &c->ev[i];
                p = put_lit(line, ",\n{\"name\":");
                p = put_str(p, e->name);
                p = put_lit(p, ",\"cat\":\"");
                p = put_lit(p, cat_names[e->cat]);
                p = put_lit(p, "\",\"ph\":\"X\",\"ts\":");
                p = put_us(p, e->t0);
                p = put_lit(p, ",\"dur\":");
                p = put_us(p, e->dur);
                p = put_lit(p, ids);
                p = put_lit(p, ",\"args\":{");
                if (e->bytes >= 0) {
                    p = put_lit(p, "\"bytes\":");
                    p = put_u64(p, (uint64_t)e->bytes);
                }
                if (e->dtype >= 0) {
                    p = put_lit(p, e->bytes >= 0 ? ",\"dtype\":\"" : "\"dtype\":\"");
                    p = put_lit(p, em_dtype_name(e->dtype));
                    *p++ = '"';
                }
                p = put_lit(p, "}}");
                fwrite(line, 1, (size_t)(p - line), f);
            }
        *dropped += t->dropped;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&reg_mu);
}

em_status em_profile_write_trace(const char *path)
{
    int rank = __atomic_load_n(&prof_rank, __ATOMIC_RELAXED);
    char def[4096], tmp[4200];
    if (!path) {
        const char *dir = getenv("EMBER_PROFILE_DIR");
        if (!dir || !dir[0]) dir = ".";
        int k = snprintf(def, sizeof def, "%s/trace.rank%d.json", dir, rank);
        if (k < 0 || (size_t)k >= sizeof def)
            return em_err(EM_ERR_ARG, "em_profile_write_trace: EMBER_PROFILE_DIR '%.64s...' is too long",
                          dir);
        path = def;
    }
    if (!path[0]) return em_err(EM_ERR_ARG, "em_profile_write_trace: path is empty");
    int k = snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    if (k < 0 || (size_t)k >= sizeof tmp)
        return em_err(EM_ERR_ARG, "em_profile_write_trace: path '%.64s...' is too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return em_err(EM_ERR_IO, "em_profile_write_trace: cannot write '%s': %s", tmp, strerror(errno));
    int64_t dropped = 0;
    fputs("{\"traceEvents\":[\n", f);
    write_events(f, rank, &dropped);
    fprintf(f,
            "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"ember %s\",\"rank\":%d,"
            "\"clock\":\"CLOCK_MONOTONIC\",\"dropped_events\":%lld}}\n",
            em_version(), rank, (long long)dropped);
    bool ok = !ferror(f);
    int err = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        return em_err(EM_ERR_IO, "em_profile_write_trace: writing '%s' failed: %s", path, strerror(err));
    }
    return EM_OK;
}

/* ---- EMBER_PROFILE, exit, fork -------------------------------------------------------------- */

static bool env_bad;
static char env_value[80];

em_status em_profile_env(void)
{
    bool on;
    return env_bad ? setting_bool("EMBER_PROFILE", env_value, &on) : EM_OK;
}

/* At exit of a process profiled through EMBER_PROFILE: the table to stderr,
 * the trace to its default place. */
static void report_at_exit(void)
{
    em_profile_stop();
    if (em_profile_rows(NULL, 0) <= 0) return; /* nothing ran here (ember launch's own process) */
    em_profile_print(stderr);
    if (em_profile_write_trace(NULL) == EM_OK) {
        const char *dir = getenv("EMBER_PROFILE_DIR");
        fprintf(stderr, "ember profile: trace written to %s/trace.rank%d.json (open it in ui.perfetto.dev)\n",
                dir && dir[0] ? dir : ".", __atomic_load_n(&prof_rank, __ATOMIC_RELAXED));
    } else {
        fprintf(stderr, "ember profile: %s\n", em_last_error());
    }
}

void prof_read_env(void)
{
    static bool at_exit;
    const char *v = getenv("EMBER_PROFILE");
    bool on = false;
    env_bad = false;
    if (!v || !v[0]) return;
    if (!setting_bool_parse(v, &on)) {
        env_bad = true;
        snprintf(env_value, sizeof env_value, "%s", v);
        return;
    }
    if (!on) return;
    if (!at_exit) at_exit = atexit(report_at_exit) == 0;
    em_profile_start();
}

/* A forked child starts with the parent's records in its memory: they are
 * the parent's, so the child drops them (and takes the locks fresh). */
static void fork_prepare(void)
{
    pthread_mutex_lock(&reg_mu);
    for (prof_thread *t = threads; t; t = t->next) pthread_mutex_lock(&t->mu);
}

static void fork_parent(void)
{
    for (prof_thread *t = threads; t; t = t->next) pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&reg_mu);
}

static void fork_child(void)
{
    for (prof_thread *t = threads; t; t = t->next) {
        thread_clear(t);
        pthread_mutex_unlock(&t->mu);
    }
    if (me) { /* the forking thread goes on as the child's one thread */
        me->tid = (int)syscall(SYS_gettid);
        if (!my_name) me->name = "main";
    }
    pthread_mutex_unlock(&reg_mu);
}

__attribute__((constructor)) static void prof_load(void)
{
    const char *r = getenv("RANK");
    char *end;
    long v = r && r[0] ? strtol(r, &end, 10) : 0;
    if (r && r[0] && !*end && v >= 0 && v < (1 << 20)) prof_rank = (int)v;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    prof_read_env();
}
