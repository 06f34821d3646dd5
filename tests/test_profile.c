/* test_profile.c — the profiler (include/ember/profile.h): a two-step run of
 * a small GPT through the Accelerator, on 1 and on 2 processes under DDP,
 * with profiling on; its trace is valid JSON in the Trace Event Format with
 * the expected records (forward ops, their backward, the optimizer step,
 * and at world 2 a bucket all-reduce on its own thread overlapping a
 * backward node); its table is sorted by total time; every op call ends its
 * record; EMBER_PROFILE that is not a boolean is an error; and off, nothing
 * is recorded.
 *
 * The trace is read with a small JSON parser of this file's own: ember's
 * reader (nn/json.c) takes only integers, and a trace's times are
 * microseconds with fractions. */
#include <ctype.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tensor/profile_impl.h"
#include "dist_util.h"
#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* ---- a JSON reader (the whole grammar; numbers as doubles) ------------------------ */

typedef enum { JV_NULL, JV_BOOL, JV_NUM, JV_STR, JV_ARR, JV_OBJ } jv_kind;

typedef struct jv {
    jv_kind kind;
    double num;
    char *str;
    int n;            /* JV_ARR, JV_OBJ: members */
    struct jv *items; /* members' values */
    char **keys;      /* JV_OBJ: members' keys */
} jv;

typedef struct {
    const char *p, *end;
    const char *err;
} jp;

static void ws(jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static bool parse_value(jp *j, jv *v, int depth);

static bool parse_string(jp *j, char **out)
{
    if (j->p >= j->end || *j->p != '"') return j->err = "expected a string", false;
    j->p++;
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) return free(s), j->err = "control character in a string", false;
        if (c == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            if (e == 'u') {
                unsigned u = 0;
                for (int k = 0; k < 4; k++) {
                    if (j->p >= j->end || !isxdigit((unsigned char)*j->p))
                        return free(s), j->err = "bad \\u escape", false;
                    char h = *j->p++;
                    u = u * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (h | 32) - 'a' + 10);
                }
                c = u < 0x80 ? (unsigned char)u : '?'; /* ASCII is all a trace's names need */
            } else if (strchr("\"\\/bfnrt", e)) {
                c = (unsigned char)(e == 'n'   ? '\n'
                                    : e == 't' ? '\t'
                                    : e == 'r' ? '\r'
                                    : e == 'b' ? '\b'
                                    : e == 'f' ? '\f'
                                               : e);
            } else {
                return free(s), j->err = "bad escape", false;
            }
        }
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = (char)c;
    }
    if (j->p >= j->end) return free(s), j->err = "unterminated string", false;
    j->p++;
    s[n] = 0;
    *out = s;
    return true;
}

static bool parse_number(jp *j, jv *v)
{
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end || !isdigit((unsigned char)*j->p)) return j->err = "bad number", false;
    if (*j->p == '0')
        j->p++;
    else
        while (j->p < j->end && isdigit((unsigned char)*j->p)) j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || !isdigit((unsigned char)*j->p)) return j->err = "bad fraction", false;
        while (j->p < j->end && isdigit((unsigned char)*j->p)) j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (j->p >= j->end || !isdigit((unsigned char)*j->p)) return j->err = "bad exponent", false;
        while (j->p < j->end && isdigit((unsigned char)*j->p)) j->p++;
    }
    char buf[64];
    size_t n = (size_t)(j->p - s);
    if (n >= sizeof buf) return j->err = "number too long", false;
    memcpy(buf, s, n);
    buf[n] = 0;
    v->kind = JV_NUM;
    v->num = strtod(buf, NULL);
    return true;
}

static bool parse_members(jp *j, jv *v, bool obj, int depth)
{
    char close = obj ? '}' : ']';
    j->p++;
    v->kind = obj ? JV_OBJ : JV_ARR;
    int cap = 0;
    ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return true;
    }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 8;
            v->items = realloc(v->items, (size_t)cap * sizeof *v->items);
            if (obj) v->keys = realloc(v->keys, (size_t)cap * sizeof *v->keys);
        }
        ws(j);
        if (obj) {
            if (!parse_string(j, &v->keys[v->n])) return false;
            ws(j);
            if (j->p >= j->end || *j->p++ != ':') return j->err = "expected ':'", false;
        }
        memset(&v->items[v->n], 0, sizeof v->items[0]);
        if (!parse_value(j, &v->items[v->n++], depth + 1)) return false;
        ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return true;
        }
        return j->err = obj ? "expected ',' or '}'" : "expected ',' or ']'", false;
    }
}

static bool parse_value(jp *j, jv *v, int depth)
{
    if (depth > 32) return j->err = "nested too deep", false;
    ws(j);
    if (j->p >= j->end) return j->err = "unexpected end", false;
    char c = *j->p;
    if (c == '{' || c == '[') return parse_members(j, v, c == '{', depth);
    if (c == '"') {
        v->kind = JV_STR;
        return parse_string(j, &v->str);
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k]);
        if ((size_t)(j->end - j->p) >= l && !memcmp(j->p, words[k], l)) {
            j->p += l;
            v->kind = k < 2 ? JV_BOOL : JV_NULL;
            v->num = k == 0;
            return true;
        }
    }
    return parse_number(j, v);
}

static void jv_free(jv *v)
{
    free(v->str);
    for (int i = 0; i < v->n; i++) {
        jv_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
}

static const jv *jv_get(const jv *o, const char *key)
{
    if (o->kind != JV_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}

/* ---- a trace, read ------------------------------------------------------------------ */

typedef struct ev {
    const char *name, *cat, *thread; /* thread: the name its "M" event gives tid */
    double ts, dur;                  /* microseconds */
    int tid;
} ev;

typedef struct trace {
    jv root;
    ev *e;
    int n;
} trace;

/* Reads path: valid JSON, an object whose traceEvents is an array of
 * events; every "X" event has a string name and cat, numbers ts, dur >= 0,
 * pid == rank and tid, and an object args; each tid is named by an "M"
 * thread_name event. */
static void read_trace(const char *path, int rank, trace *t)
{
    size_t n;
    char *text = th_slurp(path, &n);
    jp j = {text, text + n, NULL};
    memset(t, 0, sizeof *t);
    if (!parse_value(&j, &t->root, 0))
        th_fail(__FILE__, __LINE__, "%s: %s at byte %zu", path, j.err, (size_t)(j.p - text));
    ws(&j);
    if (j.p != j.end)
        th_fail(__FILE__, __LINE__, "%s: text after the JSON value at byte %zu", path, (size_t)(j.p - text));
    free(text);
    const jv *evs = jv_get(&t->root, "traceEvents");
    CHECK(evs && evs->kind == JV_ARR);
    t->e = calloc((size_t)evs->n + 1, sizeof *t->e);
    int named[64], nnamed = 0;
    const char *names[64];
    for (int i = 0; i < evs->n; i++) {
        const jv *e = &evs->items[i], *ph = jv_get(e, "ph"), *name = jv_get(e, "name"),
                 *pid = jv_get(e, "pid"), *tid = jv_get(e, "tid"), *args = jv_get(e, "args");
        CHECK(e->kind == JV_OBJ && ph && ph->kind == JV_STR && name && name->kind == JV_STR);
        CHECK(pid && pid->kind == JV_NUM && pid->num == rank && tid && tid->kind == JV_NUM);
        CHECK(args && args->kind == JV_OBJ);
        if (!strcmp(ph->str, "M")) {
            if (!strcmp(name->str, "thread_name") && nnamed < 64) {
                const jv *tn = jv_get(args, "name");
                CHECK(tn && tn->kind == JV_STR);
                named[nnamed] = (int)tid->num;
                names[nnamed++] = tn->str;
            }
            continue;
        }
        CHECK(!strcmp(ph->str, "X"));
        const jv *cat = jv_get(e, "cat"), *ts = jv_get(e, "ts"), *dur = jv_get(e, "dur");
        CHECK(cat && cat->kind == JV_STR && ts && ts->kind == JV_NUM && dur && dur->kind == JV_NUM &&
              dur->num >= 0);
        t->e[t->n++] = (ev){name->str, cat->str, NULL, ts->num, dur->num, (int)tid->num};
    }
    for (int i = 0; i < t->n; i++) {
        for (int k = 0; k < nnamed; k++)
            if (named[k] == t->e[i].tid) t->e[i].thread = names[k];
        if (!t->e[i].thread)
            th_fail(__FILE__, __LINE__, "%s: thread %d has no thread_name", path, t->e[i].tid);
    }
}

static void trace_free(trace *t)
{
    jv_free(&t->root);
    free(t->e);
}

static int count(const trace *t, const char *name, const char *cat)
{
    int k = 0;
    for (int i = 0; i < t->n; i++) k += !strcmp(t->e[i].name, name) && !strcmp(t->e[i].cat, cat);
    return k;
}

/* ---- the run ------------------------------------------------------------------------ */

enum { VOCAB = 16, T = 8, NTOK = 2000, STEPS = 2 };

typedef struct job {
    char dir[PATH_MAX];
    bool profile; /* false: the same run with profiling off */
} job;

/* A backward node that takes a while (as the layers under the last one
 * would in a real model): the gradient hook of a parameter whose gradient
 * completes one of DDP's first buckets (bucket_mb 0.002 puts one or a few
 * parameters in each), running inside the node that produced it.
 * On an idle machine the communication thread runs the bucket's all-reduce
 * beside the walk anyway; on a loaded one (2 cores, ranks, their threads and
 * other work) it might get a core only once the walk blocks, and the test
 * is about what the profiler records, not about the scheduler. */
static em_status busy_backward(em_tensor *t, em_tensor *grad, void *ctx)
{
    (void)t, (void)grad, (void)ctx;
    usleep(30000);
    return EM_OK;
}

/* Two optimizer steps of a small GPT through the Accelerator (DDP at world
 * 2, one bucket per few parameters); with profiling on for exactly those,
 * then the table to DIR/table.rankR.txt and the trace to its default name
 * in DIR (EMBER_PROFILE_DIR). */
static void train_two_steps(int rank, int world, void *ctx)
{
    job *j = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(&(em_accel_config){.bucket_mb = 0.002});
    CHECK_NOTNULL(acc);
    static int32_t tok[NTOK];
    for (int i = 0; i < NTOK; i++) tok[i] = (i * 7 + i / 5) % VOCAB;
    em_tokens tokens = em_tokens_view(tok, NTOK, EM_TOK_I32);
    em_window_sampler sampler;
    CHECK_OK(em_window_sampler_init(&sampler, &tokens, 8, T, 7));
    em_gpt_config c = {
        .vocab_size = VOCAB, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 32, .bias = true};
    em_gpt *g = em_gpt_new(&c, 1234);
    CHECK_NOTNULL(g);
    em_named ps[64];
    em_tensor *pt[64];
    int n = em_module_params(g->m, NULL, 0);
    CHECK(n <= 64);
    em_module_params(g->m, ps, n);
    for (int i = 0; i < n; i++) pt[i] = ps[i].t;
    em_optimizer *opt = em_adamw_new(n, pt, NULL);
    CHECK_NOTNULL(opt);
    CHECK_OK(em_accel_prepare(acc, g->m, opt, NULL, NULL));
    if (world > 1) /* after DDP's own hook: its buckets 0 (ln_f, c_proj.bias) and 1 (this) have started */
        for (int i = 0; i < n; i++)
            if (!strcmp(ps[i].name, "h.1.mlp.c_proj.weight"))
                CHECK_OK(em_register_grad_hook(ps[i].t, busy_backward, NULL));
    CHECK_OK(em_accel_prepare_sampler(acc, &sampler));
    if (j->profile) em_profile_start();
    for (int step = 0; step < STEPS; step++) {
        CHECK_OK(em_profile_range_begin("step"));
        em_scope s = em_scope_begin();
        em_batch b;
        CHECK_OK(em_window_sampler_next(&sampler, &b));
        em_tensor *loss = em_gpt_loss(g, b.x, b.y);
        CHECK_NOTNULL(loss);
        CHECK_OK(em_accel_backward(acc, loss));
        em_scope_end(s);
        CHECK_OK(em_accel_step(acc));
        CHECK_OK(em_accel_zero_grad(acc));
        CHECK_OK(em_profile_range_end());
    }
    em_profile_stop();
    CHECK(prof_open_records() == 0); /* every op call, node and collective ended its record */
    FILE *f = fopen(th_path(j->dir, rank ? "table.rank1.txt" : "table.rank0.txt"), "w");
    CHECK(f != NULL);
    CHECK_OK(em_profile_print(f));
    CHECK(fclose(f) == 0);
    CHECK(setenv("EMBER_PROFILE_DIR", j->dir, 1) == 0);
    CHECK_OK(em_profile_write_trace(NULL));
    em_accelerator_free(acc);
    em_optim_free(opt);
    em_gpt_free(g);
}

static void run_job(job *j, int world)
{
    th_tmpdir(j->dir, sizeof j->dir, "ember-profile");
    TH_RANKS_ENV(world, train_two_steps, j);
}

/* The trace of a profiled two-step run has each kind of record. */
static void check_two_step_trace(const trace *t)
{
    CHECK(count(t, "step", "range") == STEPS);
    CHECK(count(t, "backward", "range") == STEPS); /* the Accelerator's */
    CHECK(count(t, "linear", "op") == STEPS * 8);  /* 2 layers x (qkv, proj, fc, fc2), every step */
    CHECK(count(t, "matmul", "op") >= STEPS);      /* the lm head, every step */
    CHECK(count(t, "layer_norm", "op") >= STEPS * 5);
    CHECK(count(t, "attention_qkv", "op") == STEPS * 2);
    CHECK(count(t, "linear_backward", "backward") == STEPS * 8);
    CHECK(count(t, "matmul_backward", "backward") >= STEPS);
    CHECK(count(t, "attention_qkv_backward", "backward") == STEPS * 2);
    CHECK(count(t, "adamw.step", "optimizer") == STEPS);
    CHECK(count(t, "zero_grad", "optimizer") == STEPS);
    CHECK(count(t, "window_sampler", "loader") == STEPS);
    /* every record lies within its step's range on the same thread, or on another thread */
    for (int i = 0; i < t->n; i++) {
        const ev *e = &t->e[i];
        if (strcmp(e->thread, "main")) continue;
        bool inside = false;
        for (int k = 0; k < t->n && !inside; k++) {
            const ev *s = &t->e[k];
            inside = !strcmp(s->name, "step") && s->tid == e->tid && e->ts >= s->ts &&
                     e->ts + e->dur <= s->ts + s->dur + 0.002;
        }
        if (!inside)
            th_fail(__FILE__, __LINE__, "record '%s' (%s) at %.3f us is outside every step", e->name, e->cat,
                    e->ts);
    }
}

TEST(test_profile_two_steps_trace_is_json_with_ops_backward_and_optimizer)
{
    job j = {.profile = true};
    run_job(&j, 1);
    trace t;
    read_trace(th_path(j.dir, "trace.rank0.json"), 0, &t);
    check_two_step_trace(&t);
    trace_free(&t);
}

TEST(test_profile_world_2_allreduce_runs_on_its_own_thread_overlapping_backward)
{
    job j = {.profile = true};
    run_job(&j, 2);
    for (int rank = 0; rank < 2; rank++) {
        trace t;
        read_trace(th_path(j.dir, rank ? "trace.rank1.json" : "trace.rank0.json"), rank, &t);
        check_two_step_trace(&t);
        /* DDP's bucket all-reduces run on the group's communication thread,
         * and at least one runs while a backward node runs on the main one */
        int on_comm = 0, overlapping = 0;
        for (int i = 0; i < t.n; i++) {
            const ev *a = &t.e[i];
            if (strcmp(a->name, "all_reduce") || strcmp(a->cat, "collective") || strcmp(a->thread, "pg comm"))
                continue;
            on_comm++;
            for (int k = 0; k < t.n; k++) {
                const ev *b = &t.e[k];
                if (!strcmp(b->cat, "backward") && !strcmp(b->thread, "main") && a->ts < b->ts + b->dur &&
                    b->ts < a->ts + a->dur) {
                    overlapping++;
                    break;
                }
            }
        }
        if (on_comm < STEPS * 2 || overlapping == 0)
            th_fail(__FILE__, __LINE__,
                    "rank %d: %d all_reduce records on 'pg comm', %d overlapping a backward node", rank,
                    on_comm, overlapping);
        trace_free(&t);
    }
}

/* ---- the table ----------------------------------------------------------------------- */

TEST(test_profile_table_is_sorted_by_total_time)
{
    job j = {.profile = true};
    run_job(&j, 1);
    size_t n;
    char *text = th_slurp(th_path(j.dir, "table.rank0.txt"), &n);
    char *line = strtok(text, "\n");
    CHECK(line && strstr(line, "ember profile, rank 0"));
    line = strtok(NULL, "\n");
    CHECK(line && strstr(line, "name") && strstr(line, "total ms") && strstr(line, "self ms"));
    double prev = INFINITY;
    int rows = 0;
    bool saw_matmul = false, saw_step = false;
    while ((line = strtok(NULL, "\n"))) {
        char name[160], cat[32];
        long long calls;
        double total, self;
        CHECK(sscanf(line, "%159s %31s %lld %lf %lf", name, cat, &calls, &total, &self) == 5);
        if (total > prev)
            th_fail(__FILE__, __LINE__, "row '%s' (%.3f ms) follows one of %.3f ms", name, total, prev);
        CHECK(calls > 0 && self <= total + 1e-3);
        saw_matmul |= !strcmp(name, "matmul");
        if (!strcmp(name, "step")) {
            saw_step = true;
            CHECK(rows == 0 && calls == STEPS); /* the step holds everything else */
        }
        prev = total;
        rows++;
    }
    CHECK(rows >= 10 && saw_matmul && saw_step);
    free(text);
}

TEST(test_profile_rows_are_sorted_and_self_time_excludes_children)
{
    em_profile_reset();
    em_profile_start();
    em_scope s = em_scope_begin();
    em_rng rng = em_rng_new(1);
    em_tensor *a = em_randn(EM_F32, 2, (int64_t[]){64, 64}, &rng);
    CHECK_OK(em_profile_range_begin("outer"));
    for (int i = 0; i < 20; i++) a = em_tanh(em_matmul(a, a));
    CHECK_OK(em_profile_range_end());
    CHECK_NOTNULL(a);
    em_scope_end(s);
    em_profile_stop();
    em_profile_row rows[16];
    int64_t n = em_profile_rows(rows, 16);
    CHECK(n >= 3 && n <= 16);
    for (int64_t i = 1; i < n; i++) CHECK(rows[i - 1].total_ms >= rows[i].total_ms);
    CHECK(!strcmp(rows[0].name, "outer") && !strcmp(rows[0].category, "range") && rows[0].calls == 1);
    double children = 0;
    for (int64_t i = 1; i < n; i++) {
        if (!strcmp(rows[i].name, "matmul")) CHECK(rows[i].calls == 20 && !strcmp(rows[i].category, "op"));
        children += rows[i].total_ms;
    }
    CHECK_NEAR(rows[0].self_ms, rows[0].total_ms - children, 1e-6);
    CHECK(rows[0].self_ms >= 0);
}

/* ---- every op call ends its record ----------------------------------------------------- */

TEST(test_profile_every_op_path_ends_its_record)
{
    em_profile_start();
    em_scope s = em_scope_begin();
    em_rng rng = em_rng_new(1);
    em_tensor *x = em_randn(EM_F32, 2, (int64_t[]){4, 6}, &rng), *parts[3];
    CHECK_OK(em_set_requires_grad(x, true));
    /* the shortcuts: dropout that is the identity, to() the same device, split and chunk (no node) */
    CHECK_NOTNULL(em_dropout(x, 0.0, true, &rng));
    CHECK_NOTNULL(em_dropout(x, 0.5, false, &rng));
    CHECK_NOTNULL(em_to(x, em_device_cpu()));
    CHECK(em_split(x, 2, 1, parts, 3) == 3);
    CHECK(em_chunk(x, 2, 0, parts, 3) == 2);
    CHECK_OK(em_backward(em_sum(em_mul(parts[0], parts[1]), 0, NULL, false), NULL));
    em_scope_end(s);
    em_profile_stop();
    CHECK(prof_open_records() == 0);
    CHECK(em_profile_rows(NULL, 0) > 0);
}

/* An op that fails its own checks after the dispatcher began its record
 * (shapes, indices, dims, parameters) ends the record all the same: none
 * stays open to take the time of what follows. */
TEST(test_profile_ops_failing_their_own_checks_end_their_records)
{
    em_profile_start();
    em_scope s = em_scope_begin();
    em_rng rng = em_rng_new(1);
    em_tensor *a = em_randn(EM_F32, 2, (int64_t[]){4, 6}, &rng),
              *b = em_randn(EM_F32, 2, (int64_t[]){5, 3}, &rng);
    em_tensor *i3 = em_randint(0, 4, EM_I32, 1, (int64_t[]){3}, &rng);
    em_tensor *bad[] = {
        em_matmul(a, b),                                             /* inner dims differ */
        em_linear(a, b, NULL),                                       /* x's last dim is not w's in */
        em_narrow(a, 1, 4, 5),                                       /* out of range */
        em_permute(a, (const int[]){0, 0}),                          /* a dim repeated */
        em_expand(a, 2, (int64_t[]){3, 6}),                          /* 4 does not expand to 3 */
        em_layer_norm(a, NULL, NULL, -1.0),                          /* eps below 0 */
        em_embedding(em_randn(EM_F32, 1, (int64_t[]){8}, &rng), i3), /* a 1-D weight */
        em_cross_entropy(a, i3, -100),                               /* 3 targets for 4 rows */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(bad[i] == NULL);
    CHECK(prof_open_records() == 0);
    CHECK_NOTNULL(em_add(a, a)); /* and the next op is recorded as usual */
    em_scope_end(s);
    em_profile_stop();
    CHECK(prof_open_records() == 0);
}

/* ---- off ------------------------------------------------------------------------------ */

TEST(test_profile_off_records_nothing)
{
    em_profile_reset();
    CHECK(!em_profile_enabled());
    job j = {.profile = false};
    run_job(&j, 1);
    size_t n;
    char *table = th_slurp(th_path(j.dir, "table.rank0.txt"), &n);
    CHECK(strstr(table, "0 records") && strstr(table, "nothing recorded"));
    free(table);
    trace t;
    read_trace(th_path(j.dir, "trace.rank0.json"), 0, &t);
    CHECK(t.n == 0);
    trace_free(&t);
    /* ranges stay balanced while off, and record nothing */
    CHECK_OK(em_profile_range_begin("r"));
    CHECK_OK(em_profile_range_end());
    CHECK(em_profile_rows(NULL, 0) == 0);
}

TEST(test_profile_range_end_without_begin_is_an_error)
{
    CHECK_ERR(em_profile_range_end(), EM_ERR_ARG, "no range is open");
    CHECK_ERR(em_profile_range_begin(NULL), EM_ERR_ARG, "em_profile_range_begin");
    CHECK_ERR(em_profile_rows(NULL, 3), EM_ERR_ARG, "em_profile_rows");
    CHECK_ERR(em_profile_print(NULL), EM_ERR_ARG, "em_profile_print");
}

/* ---- EMBER_PROFILE ---------------------------------------------------------------------- */

TEST(test_profile_env_value_that_is_not_a_boolean_is_an_error)
{
    CHECK(setenv("EMBER_PROFILE", "maybe", 1) == 0);
    prof_read_env();
    CHECK_ERR(em_profile_env(), EM_ERR_ARG, "EMBER_PROFILE='maybe' is not a boolean");
    CHECK(!em_profile_enabled());
    th_no_user_config();
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_PROFILE='maybe'");
    /* the ember command, which reads it as the library loads */
    th_run_result *r = th_run(EMBER_BIN, "env", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "EMBER_PROFILE='maybe' is not a boolean"));
    CHECK(setenv("EMBER_PROFILE", "off", 1) == 0);
    prof_read_env();
    CHECK_OK(em_profile_env());
    CHECK(!em_profile_enabled());
}

TEST(test_profile_env_on_writes_table_and_trace_at_exit)
{
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-profile");
    CHECK(setenv("EMBER_PROFILE", "1", 1) == 0);
    CHECK(setenv("EMBER_PROFILE_DIR", dir, 1) == 0);
    th_run_result *r = th_run(EMBER_BIN, "demo", "--steps", "20", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->err, "ember profile, rank 0") && strstr(r->err, "matmul_backward"));
    trace t;
    read_trace(th_path(dir, "trace.rank0.json"), 0, &t);
    CHECK(count(&t, "matmul", "op") > 0 && count(&t, "matmul_backward", "backward") > 0);
    trace_free(&t);
}

TEST(test_profile_trace_escapes_names)
{
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-profile");
    em_profile_reset();
    em_profile_start();
    CHECK_OK(em_profile_range_begin("a \"quoted\"\\name\twith tab"));
    CHECK_OK(em_profile_range_end());
    em_profile_stop();
    CHECK_OK(em_profile_write_trace(th_path(dir, "t.json")));
    trace t;
    read_trace(th_path(dir, "t.json"), 0, &t);
    CHECK(t.n == 1 && !strcmp(t.e[0].name, "a \"quoted\"\\name\twith tab") && !strcmp(t.e[0].cat, "range"));
    trace_free(&t);
}
