/* main.c — the test runner: forks each registered test, enforces a
 * per-test time limit, gives each test its own temporary directory and
 * removes them all when the run ends, and prints one line per test and the
 * totals ("N passed, N failed, N skipped", the last line).
 * Usage: ember-tests [substring ...]   (only tests whose name contains one)
 * Environment: EMBER_TEST_NOFORK=1 runs tests in-process (for a debugger),
 * EMBER_TEST_TIMEOUT=S, EMBER_TEST_KEEP_TMP=1 (tests/harness.h says all).
 *
 * Temporary files: the run's directory ROOT = $TMPDIR/ember-tests-XXXXXX
 * (/tmp without TMPDIR) holds ROOT/<test name> for each test, which is that
 * test's EMBER_TEST_TMP and TMPDIR. A test's directory goes when it passes
 * or skips; ROOT goes when the run ends, also when SIGINT, SIGTERM or SIGHUP
 * stops it (the test running is killed first). Only the process that made
 * ROOT removes it: tests, their ranks and the programs they start inherit
 * the runner's globals or environment, never that duty. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

typedef struct {
    const char *name, *file;
    th_fn fn;
} th_test;

static th_test tests[4096];
static int n_tests;
static int result_fd = -1;

/* ---- the run's temporary directory ------------------------------------------ */

static char tmp_root[PATH_MAX]; /* ROOT; "" before it is made and after it is gone */
static pid_t tmp_owner;         /* the runner's pid: the one process that removes ROOT */
static bool keep_tmp;           /* EMBER_TEST_KEEP_TMP=1 */

/* Makes ROOT under $TMPDIR (/tmp when unset or empty); false, saying why, when it cannot. */
static bool tmp_begin(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    const char *keep = getenv("EMBER_TEST_KEEP_TMP");
    keep_tmp = keep && *keep && strcmp(keep, "0") != 0;
    int w = snprintf(tmp_root, sizeof tmp_root, "%s/ember-tests-XXXXXX", base);
    if (w < 0 || (size_t)w >= sizeof tmp_root || !mkdtemp(tmp_root)) {
        fprintf(stderr, "ember-tests: cannot make the run's temporary directory under %s: %s\n", base,
                w < 0 || (size_t)w >= sizeof tmp_root ? "path too long" : strerror(errno));
        tmp_root[0] = '\0';
        return false;
    }
    tmp_owner = getpid();
    return true;
}

/* ROOT/name into dir (PATH_MAX bytes), made; false when it cannot be. */
static bool test_dir(char *dir, const char *name)
{
    int w = snprintf(dir, PATH_MAX, "%s/%s", tmp_root, name);
    return w >= 0 && w < PATH_MAX && mkdir(dir, 0700) == 0;
}

/* The environment a test runs in: its directory for th_tmpdir and as TMPDIR. */
static void enter_test_dir(const char *dir)
{
    setenv("EMBER_TEST_TMP", dir, 1);
    setenv("TMPDIR", dir, 1);
}

static bool has_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));) any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return any;
}

/* The line after a failed test's: where its files are (when it made any). */
static void say_test_files(FILE *to, const char *dir)
{
    if (has_entries(dir))
        fprintf(to, "     its files: %s%s\n", dir, keep_tmp ? "" : " (removed when the run ends)");
}

/* Removes ROOT, unless EMBER_TEST_KEEP_TMP=1 or this is not the runner's
 * process; the line before the summary says so when a test failed or
 * ROOT is kept. */
static void tmp_end(FILE *to, bool failed)
{
    if (!tmp_root[0] || getpid() != tmp_owner) return;
    if (keep_tmp)
        fprintf(to, "temporary files kept in %s\n", tmp_root);
    else if (th_remove_tree(tmp_root) != 0)
        fprintf(to, "could not remove all of %s\n", tmp_root);
    else if (failed)
        fprintf(to, "temporary files removed with %s (EMBER_TEST_KEEP_TMP=1 keeps them)\n", tmp_root);
    tmp_root[0] = '\0';
}

/* SIGINT, SIGTERM, SIGHUP while tests run in children: kill the one running,
 * then main removes ROOT and ends by the same signal. A signal the runner was
 * started ignoring (nohup) stays ignored. */
static volatile sig_atomic_t stop_signal, running_child;

static void on_stop(int sig)
{
    stop_signal = sig;
    if (running_child > 0) kill((pid_t)running_child, SIGKILL);
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP (int)(sizeof stop_signals / sizeof stop_signals[0])
static struct sigaction stop_before[N_STOP]; /* their dispositions before: for tests and the end */

static void catch_stop_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_STOP; i++) {
        sigaction(stop_signals[i], NULL, &stop_before[i]);
        if (stop_before[i].sa_handler != SIG_IGN) sigaction(stop_signals[i], &sa, NULL);
    }
}

static void restore_stop_signals(void)
{
    for (int i = 0; i < N_STOP; i++) sigaction(stop_signals[i], &stop_before[i], NULL);
}

void th_register(const char *name, th_fn fn, const char *file)
{
    if (n_tests < (int)(sizeof tests / sizeof tests[0])) tests[n_tests++] = (th_test){name, file, fn};
}

static char current_case[256];

void th_case(const char *fmt, ...)
{
    current_case[0] = 0;
    if (!fmt) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(current_case, sizeof current_case, fmt, ap);
    va_end(ap);
}

void th_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char where[512];
    snprintf(where, sizeof where, "%s:%d: ", file, line);
    char msg[1536];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char full[2400];
    snprintf(full, sizeof full, "%s%s%s%s%s", where, msg, current_case[0] ? " [in case: " : "", current_case,
             current_case[0] ? "]" : "");
    if (result_fd >= 0) {
        ssize_t w = write(result_fd, full, strlen(full));
        (void)w;
    } else {
        fprintf(stderr, "%s\n", full);
        /* EMBER_TEST_NOFORK: this ends the run (in the runner itself) */
        const char *dir = getenv("EMBER_TEST_TMP");
        if (dir && getpid() == tmp_owner) say_test_files(stderr, dir);
        tmp_end(stderr, true);
    }
    _exit(1);
}

void th_skip(const char *reason)
{
    if (result_fd >= 0) {
        ssize_t w = write(result_fd, reason, strlen(reason));
        (void)w;
    } else {
        fprintf(stderr, "skip: %s\n", reason);
        tmp_end(stderr, false);
    }
    _exit(77);
}

static int cmp_test(const void *a, const void *b)
{
    const th_test *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

static bool selected(const char *name, int argc, char **argv)
{
    if (argc <= 1) return true;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return true;
    return false;
}

int main(int argc, char **argv)
{
    qsort(tests, (size_t)n_tests, sizeof tests[0], cmp_test);
    int passed = 0, failed = 0, skipped = 0;
    bool nofork = getenv("EMBER_TEST_NOFORK") != NULL;
    int limit = getenv("EMBER_TEST_TIMEOUT") ? atoi(getenv("EMBER_TEST_TIMEOUT")) : 120;
    if (!tmp_begin()) return 2;
    if (!nofork) catch_stop_signals();
    for (int i = 0; i < n_tests && !stop_signal; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        char dir[PATH_MAX];
        if (!test_dir(dir, tests[i].name)) {
            printf("FAIL %s: cannot make its temporary directory %s: %s\n", tests[i].name, dir,
                   strerror(errno));
            failed++;
            continue;
        }
        if (nofork) {
            enter_test_dir(dir);
            tests[i].fn();
            printf("ok   %s\n", tests[i].name);
            passed++;
            if (!keep_tmp) th_remove_tree(dir);
            continue;
        }
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) { /* programs a test execs do not hold its result pipe open */
            perror("pipe");
            tmp_end(stdout, true);
            return 2;
        }
        fflush(stdout);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t pid = fork();
        if (pid == 0) {
            restore_stop_signals();
            close(fds[0]);
            result_fd = fds[1];
            enter_test_dir(dir);
            alarm((unsigned)limit);
            tests[i].fn();
            exit(0); /* not _exit: LeakSanitizer checks at exit */
        }
        running_child = pid;
        close(fds[1]);
        char msg[2200];
        size_t got = 0;
        ssize_t r;
        while (got < sizeof msg - 1 && (r = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
            got += (size_t)r;
        msg[got] = '\0';
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        running_child = 0;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            printf("ok   %s (%.2fs)\n", tests[i].name, secs);
            passed++;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            printf("skip %s: %s\n", tests[i].name, msg);
            skipped++;
        } else {
            if (stop_signal && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                printf("STOP %s: the runner got signal %d (%s)\n", tests[i].name, (int)stop_signal,
                       strsignal(stop_signal));
            else if (WIFSIGNALED(status))
                printf("FAIL %s: killed by signal %d (%s)%s%s\n", tests[i].name, WTERMSIG(status),
                       WTERMSIG(status) == SIGALRM ? "time limit" : strsignal(WTERMSIG(status)),
                       got ? ": " : "", msg);
            else
                printf("FAIL %s: %s\n", tests[i].name, got ? msg : "exited non-zero");
            say_test_files(stdout, dir);
            failed++;
            continue;
        }
        if (!keep_tmp) th_remove_tree(dir);
    }
    if (stop_signal) {
        /* no summary: the run did not end; leave nothing behind and die of the signal */
        int sig = stop_signal;
        tmp_end(stdout, failed > 0);
        fflush(stdout);
        restore_stop_signals();
        raise(sig);
        return 128 + sig;
    }
    tmp_end(stdout, failed > 0);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
