/* main.c — the test runner: forks each registered test, enforces a
 * per-test time limit, and prints one line per test and the totals.
 * Usage: ember-tests [substring ...]   (only tests whose name contains one)
 * EMBER_TEST_NOFORK=1 runs tests in-process (for a debugger). */
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
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
    for (int i = 0; i < n_tests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        if (nofork) {
            tests[i].fn();
            printf("ok   %s\n", tests[i].name);
            passed++;
            continue;
        }
        int fds[2];
        if (pipe(fds) != 0) {
            perror("pipe");
            return 2;
        }
        fflush(stdout);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            result_fd = fds[1];
            alarm((unsigned)limit);
            tests[i].fn();
            exit(0); /* not _exit: LeakSanitizer checks at exit */
        }
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
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            printf("ok   %s (%.2fs)\n", tests[i].name, secs);
            passed++;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            printf("skip %s: %s\n", tests[i].name, msg);
            skipped++;
        } else {
            if (WIFSIGNALED(status))
                printf("FAIL %s: killed by signal %d (%s)%s%s\n", tests[i].name, WTERMSIG(status),
                       WTERMSIG(status) == SIGALRM ? "time limit" : strsignal(WTERMSIG(status)),
                       got ? ": " : "", msg);
            else
                printf("FAIL %s: %s\n", tests[i].name, got ? msg : "exited non-zero");
            failed++;
        }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
