/* harness.h — ember's test harness. A test is a function registered with
 * TEST(name); the runner executes each in its own forked process (a crash or
 * a hang fails that test, not the suite) and ends with the line
 * "N passed, N failed, N skipped".
 *
 *   TEST(test_add_broadcasts_row) {
 *       em_scope s = em_scope_begin();
 *       ...
 *       CHECK(cond);  CHECK_NEAR(got, want, tol);  CHECK_OK(status);
 *       CHECK_ERR(call_returning_NULL_or_status, EM_ERR_SHAPE, "substring");
 *       em_scope_end(s);
 *   }
 * A failed CHECK ends the test at once with file:line and the values.
 *
 * Temporary files: the runner makes one directory per run (ROOT, below) and
 * gives each test its own; tests make theirs with th_tmpdir / th_tmpfile,
 * never under a path of their own choosing, so a run leaves nothing behind.
 *
 * The runner's environment variables (tests/main.c):
 *   EMBER_TEST_NOFORK=1     run the tests in the runner's own process (for a
 *                           debugger); the first failure or skip ends the run
 *                           (ROOT is removed all the same)
 *   EMBER_TEST_TIMEOUT=S    each test's time limit in seconds (default 120)
 *   EMBER_TEST_KEEP_TMP=1   keep ROOT and every test's files when the run
 *                           ends; the line before the summary says where
 *                           (by default they are removed, whatever the
 *                           results; a failed test's line says where its
 *                           files were)
 * and the ones it sets for each test (inherited by whatever the test starts):
 *   EMBER_TEST_TMP, TMPDIR  the test's directory, ROOT/<test name>, where ROOT
 *                           is $TMPDIR/ember-tests-XXXXXX (/tmp without
 *                           TMPDIR) of the runner's environment
 */
#ifndef EMBER_TEST_HARNESS_H
#define EMBER_TEST_HARNESS_H

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ember/ember.h"

typedef void (*th_fn)(void);
void th_register(const char *name, th_fn fn, const char *file);
_Noreturn void th_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
_Noreturn void th_skip(const char *reason);
/* Names the case a table-driven test is on: a failure until the next call
 * (or th_case(NULL)) says "[in case: ...]" after its message. */
void th_case(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TEST(name)                                                                                           \
    static void name(void);                                                                                  \
    __attribute__((constructor)) static void th_reg_##name(void) { th_register(#name, name, __FILE__); }     \
    static void name(void)

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            th_fail(__FILE__, __LINE__, "CHECK(%s) failed; last error: %s", #cond, em_last_error());         \
    } while (0)

#define CHECK_NEAR(got, want, tol)                                                                           \
    do {                                                                                                     \
        double th_g = (double)(got), th_w = (double)(want), th_t = (double)(tol);                            \
        if (!(fabs(th_g - th_w) <= th_t))                                                                    \
            th_fail(__FILE__, __LINE__, "%s = %.10g, want %.10g (tol %g)", #got, th_g, th_w, th_t);          \
    } while (0)

#define CHECK_OK(status_expr)                                                                                \
    do {                                                                                                     \
        em_status th_s = (status_expr);                                                                      \
        if (th_s != EM_OK)                                                                                   \
            th_fail(__FILE__, __LINE__, "%s returned %s: %s", #status_expr, em_status_name(th_s),            \
                    em_last_error());                                                                        \
    } while (0)

#define CHECK_NOTNULL(expr)                                                                                  \
    do {                                                                                                     \
        if (!(expr)) th_fail(__FILE__, __LINE__, "%s is NULL: %s", #expr, em_last_error());                  \
    } while (0)

/* expr must fail (return NULL or a non-OK status) with status `want`, and the
 * message must contain `sub`. */
#define CHECK_ERR(expr, want, sub)                                                                           \
    do {                                                                                                     \
        em_clear_error();                                                                                    \
        (void)(expr);                                                                                        \
        if (em_last_status() != (want))                                                                      \
            th_fail(__FILE__, __LINE__, "%s: want status %s, got %s (\"%s\")", #expr, em_status_name(want),  \
                    em_status_name(em_last_status()), em_last_error());                                      \
        if (!strstr(em_last_error(), (sub)))                                                                 \
            th_fail(__FILE__, __LINE__, "%s: message \"%s\" lacks \"%s\"", #expr, em_last_error(), (sub));   \
    } while (0)

#define SKIP(reason) th_skip(reason)

/* ---- helpers shared by tests (tests/util.c) -------------------------------- */
/* max |a - b| over all elements (shapes must match; converts to double). */
double th_max_abs_diff(em_tensor *a, em_tensor *b);
/* Checks every element of t against want[] (numel entries) within tol. */
void th_check_values(const char *file, int line, em_tensor *t, const double *want, double tol);
#define CHECK_VALUES(t, tol, ...)                                                                            \
    th_check_values(__FILE__, __LINE__, (t), (const double[]){__VA_ARGS__}, (tol))
/* A tensor of doubles converted to dtype dt. */
em_tensor *th_tensor(em_dtype dt, int ndim, const int64_t *shape, const double *vals);

/* Finite-difference gradient check. `f` builds a tensor from the n inputs
 * (f64 leaves with requires_grad set); the check backpropagates a fixed
 * random cotangent through f's output and compares each input's gradient
 * with central differences (step eps). Fails the test with the op name,
 * input index, element and both values on a mismatch beyond atol + rtol*|x|. */
typedef em_tensor *(*th_graph_fn)(em_tensor **inputs, void *ctx);
void th_gradcheck(const char *file, int line, const char *what, th_graph_fn f, void *ctx, int n,
                  em_tensor **inputs, double eps, double atol, double rtol);
#define GRADCHECK(what, f, ctx, n, inputs)                                                                   \
    th_gradcheck(__FILE__, __LINE__, (what), (f), (ctx), (n), (inputs), 1e-6, 1e-7, 1e-5)
/* Runs f on f64 inputs and on f32 copies of them; fails if the f32 result
 * differs from the f64 one by more than tol (relative to max |f64|). */
void th_f32_matches_f64(const char *file, int line, const char *what, th_graph_fn f, void *ctx, int n,
                        em_tensor **inputs, double tol);
#define F32_MATCHES_F64(what, f, ctx, n, inputs, tol)                                                        \
    th_f32_matches_f64(__FILE__, __LINE__, (what), (f), (ctx), (n), (inputs), (tol))
/* The backward in f32 agrees with f64: gradients of sum(f(x) * cot) for the
 * f64 inputs and for f32 copies of them differ by less than tol (absolute). */
void th_grad_f32_matches_f64(const char *file, int line, th_graph_fn f, void *ctx, int n, em_tensor **in64,
                             double tol);
#define GRAD_F32_MATCHES_F64(f, ctx, n, in64, tol)                                                           \
    th_grad_f32_matches_f64(__FILE__, __LINE__, (f), (ctx), (n), (in64), (tol))
/* Runs program `bin` with the NULL-terminated arguments after it, stdout and
 * stderr into temporary files (no pipe to fill up), and returns what
 * happened (a static result, overwritten by the next call). */
typedef struct th_run_result {
    int status; /* exit code; 128+signal when killed */
    char out[16384];
    char err[16384];
} th_run_result;
th_run_result *th_run(const char *bin, ...);
th_run_result *th_vrun(const char *bin, va_list ap);
#define CHECK_EXIT(r, want)                                                                                  \
    do {                                                                                                     \
        if ((r)->status != (want))                                                                           \
            th_fail(__FILE__, __LINE__, "exit status %d, want %d; stderr: %s", (r)->status, (want),          \
                    (r)->err);                                                                               \
    } while (0)

/* (Call inside a scope, or its intermediates outlive it.)
 * A non-contiguous tensor with the values of t: t is copied into the
 * transpose of a bigger buffer and a view returned (same shape as t). */
em_tensor *th_noncontig(em_tensor *t);
/* A fresh temp directory (its name into dir, n bytes) holding corpus.txt
 * (its path into txt, tn bytes): a rhyme repeated 300 times, so a tiny
 * `ember train` model's loss clearly falls within a few dozen steps. */
void th_rhyme_corpus(char *dir, size_t n, char *txt, size_t tn);
/* The training steps an `ember train` run wrote in RUN/metrics.jsonl, one
 * line per step ("STEP LOSS GRAD_NORM", the numbers as written), into buf
 * (n bytes): two runs trained alike have equal texts. "" when the file
 * cannot be read. */
void th_train_steps(const char *run, char *buf, size_t n);

/* For tests that edit a checkpoint's files by hand (to build a save that is
 * not one save, as a bug could write it): rewrites DIR/manifest.json's size
 * and crc32 of every file it names to the files as they are now, and the
 * manifest's own crc32, so the load gets past its checksums to the check
 * under test. */
void th_reseal_checkpoint(const char *dir);
/* Hides the user's ember config file from the Accelerator: unsets
 * EMBER_CONFIG_FILE (naming a missing file is an error) and points
 * XDG_CONFIG_HOME at a directory that does not exist. */
void th_no_user_config(void);

/* ---- temporary files ----------------------------------------------------------
 * Everything lives in the running test's directory (EMBER_TEST_TMP, also its
 * TMPDIR, so `ember`, sh, python and mpirun started by the test put their
 * temporaries there too). The runner removes it when the test passes or
 * skips, and the whole run's directory when the run ends (or is stopped by
 * SIGINT, SIGTERM or SIGHUP); a runner killed outright leaves that one
 * directory. Each helper fails the test (naming the path) when the name does
 * not fit in n bytes or the directory or file cannot be made.
 *
 * th_tmp: the test's directory (the environment's string; do not free);
 *   fails the test outside the runner (EMBER_TEST_TMP unset).
 * th_tmpdir: makes a fresh directory TEST_DIR/<prefix>-XXXXXX and writes its
 *   path into dir (n bytes); returns dir. Give buffers PATH_MAX bytes: a
 *   test's directory is deep (TMPDIR, ROOT, the test's name) and paths are
 *   built inside it. Name prefix after what the test makes ("ember-ddp"),
 *   so a kept directory reads like the test that made it.
 * th_tmpfile: makes a fresh empty file TEST_DIR/<prefix>-XXXXXX (mkstemp),
 *   its path into path (n bytes); returns its descriptor, open for reading
 *   and writing (the caller closes it).
 * th_remove_tree: removes path and everything under it (read-only
 *   directories too; symbolic links are removed, never followed); 0, or -1
 *   when something could not be removed. */
const char *th_tmp(void);
char *th_tmpdir(char *dir, size_t n, const char *prefix);
int th_tmpfile(char *path, size_t n, const char *prefix);
int th_remove_tree(const char *path);

/* Small files for tests. th_read_file: the whole file (malloc'd, NUL after
 * *n bytes; the caller frees), NULL when it cannot be read; th_slurp: the
 * same, failing the test instead of returning NULL. th_write_file writes
 * n bytes (replacing the file) or fails the test. th_pathf: snprintf into
 * buf (n bytes) that fails the test when the text does not fit (a path cut
 * short names another file); returns buf. th_path: "dir/name" in one of 4
 * rotating static buffers of PATH_MAX bytes (valid until the 4th call
 * after). */
char *th_read_file(const char *path, size_t *n);
char *th_slurp(const char *path, size_t *n);
void th_write_file(const char *path, const void *p, size_t n);
char *th_pathf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *th_path(const char *dir, const char *name);

#endif
