/* test_cli_progress.c — `ember train` and `ember sample` as a terminal and a
 * log see them: under a pseudo-terminal (forkpty) a progress bar redrawn in
 * place with the step, loss, tokens/s and ETA; into files, the plain lines
 * of before, with no control character. */
#include <errno.h>
#include <pty.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* Runs ember with the NULL-terminated arguments, stdout and stderr both the
 * slave side of a new pseudo-terminal; everything it wrote (the terminal
 * turns "\n" into "\r\n") into a static buffer. *status: the exit code. */
static const char *run_on_tty(int *status, ...)
{
    const char *argv[40] = {EMBER_BIN};
    int argc = 1;
    va_list ap;
    va_start(ap, status);
    for (const char *a = va_arg(ap, const char *); a && argc < 39; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    static char out[1 << 18];
    size_t n = 0;
    fflush(stdout);
    fflush(stderr);
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    if (pid < 0) th_fail(__FILE__, __LINE__, "forkpty failed: %s", strerror(errno));
    if (pid == 0) {
        execv(EMBER_BIN, (char *const *)argv);
        _exit(127);
    }
    for (;;) { /* until the child's side closes: EIO on Linux */
        ssize_t k = read(master, out + n, sizeof out - 1 - n);
        if (k > 0) n += (size_t)k;
        if (k == 0 || (k < 0 && errno != EINTR) || n == sizeof out - 1) break;
    }
    out[n] = 0;
    close(master);
    int st = 0;
    waitpid(pid, &st, 0);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return out;
}

#define TINY                                                                                                 \
    "--layers", "1", "--heads", "2", "--embd", "16", "--block", "16", "--batch", "4", "--eval-iters", "2"

TEST(test_cli_train_on_a_terminal_draws_a_bar_with_loss_rate_and_eta)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    int st;
    const char *o = run_on_tty(&st, "train", "--data", txt, "--out", out, TINY, "--iters", "12",
                               "--log-every", "6", "--eval-every", "12", NULL);
    CHECK(st == 0);
    /* every step redraws the line: "\r", erase, the bar */
    CHECK(strstr(o, "\r\033[K[##########..............] 5/12  loss ") != NULL);
    CHECK(strstr(o, "\r\033[K[########################] 12/12  loss ") != NULL);
    const char *b = strstr(o, "] 7/12  loss ");
    double loss, rate;
    char eta[16];
    CHECK(b && sscanf(b, "] 7/12  loss %lf  %lf tok/s  ETA %15s", &loss, &rate, eta) == 3);
    CHECK(loss > 0 && rate > 0 && strchr(eta, 'm') && strchr(eta, 's'));
    /* the bar is erased before a plain line, and the plain log lines are not printed */
    CHECK(strstr(o, "\r\033[Keval step=12 train_loss=") != NULL);
    CHECK(strstr(o, "step 6/12 loss") == NULL);
    CHECK(strstr(o, "\r\nember train: done in ") != NULL);
}

/* Each line of a log is one of train's plain lines, printed exactly as the
 * format it is parsed with would print it; no "\r" or escape anywhere. */
TEST(test_cli_train_into_a_log_prints_the_plain_lines_only)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r = th_run(EMBER_BIN, "train", "--data", txt, "--out", out, TINY, "--iters", "12",
                              "--log-every", "6", "--eval-every", "12", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strpbrk(r->out, "\r\033") == NULL && strpbrk(r->err, "\r\033") == NULL);
    int steps = 0, evals = 0;
    for (char *line = strtok(r->out, "\n"); line; line = strtok(NULL, "\n")) {
        long long s, n;
        double loss, lr, ms, tps, tl, vl;
        char again[PATH_MAX];
        th_case("line '%s'", line);
        if (sscanf(line, "step %lld/%lld loss %lf lr %lf %lf ms/step %lf tok/s", &s, &n, &loss, &lr, &ms,
                   &tps) == 6) {
            snprintf(again, sizeof again, "step %lld/%lld loss %.4f lr %.3g %.1f ms/step %.0f tok/s", s, n,
                     loss, lr, ms, tps);
            CHECK(!strcmp(line, again) && n == 12 && s == 6 * ++steps);
        } else if (sscanf(line, "eval step=%lld train_loss=%lf val_loss=%lf", &s, &tl, &vl) == 3) {
            snprintf(again, sizeof again, "eval step=%lld train_loss=%.4f val_loss=%.4f", s, tl, vl);
            CHECK(!strcmp(line, again) && s == 12 * evals++);
        } else {
            CHECK(!strncmp(line, "ember train: ", 13));
        }
    }
    th_case("%s", "");
    CHECK(steps == 2 && evals == 2);
}

TEST(test_cli_sample_on_a_terminal_shows_a_bar_for_a_long_generation_only)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r = th_run(EMBER_BIN, "train", "--data", txt, "--out", out, TINY, "--iters", "2",
                              "--eval-every", "2", NULL);
    CHECK_EXIT(r, 0);
    int st;
    const char *o = run_on_tty(&st, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "300", NULL);
    CHECK(st == 0);
    const char *last = strstr(o, "\r\033[K[########################] 300/300 tokens  ");
    CHECK(last && strstr(last, " tok/s  ETA 0m00s\r\033[Kthe ") != NULL); /* erased before the text */
    /* the same text as without a terminal (whose "\r\n" are "\n") */
    char text[1024];
    size_t n = 0;
    for (const char *c = strstr(last, "\r\033[Kthe ") + 4; *c && n < sizeof text - 1; c++)
        if (*c != '\r') text[n++] = *c;
    text[n] = 0;
    r = th_run(EMBER_BIN, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "300", NULL);
    CHECK_EXIT(r, 0);
    CHECK(r->err[0] == 0 && strpbrk(r->out, "\r\033") == NULL);
    CHECK(!strcmp(r->out, text));
    /* a short generation: no bar */
    o = run_on_tty(&st, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "40", NULL);
    CHECK(st == 0 && strchr(o, '\033') == NULL);
}
