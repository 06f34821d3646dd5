/* test_fault.c — EMBER_FAULT (tensor/fault.c): the failure injection the
 * fault tests rely on kills exactly where it is told to, and nowhere else. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tensor/fault_impl.h"

/* Runs, in a child with the given environment, `calls` fault points named
 * "a" (and one "b" after each); returns how many "a" points it got through
 * before dying (calls when it was never killed), or -1 if it died some other
 * way. */
static int points_survived(const char *fault, const char *rank, const char *attempt, int calls)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        setenv("EMBER_FAULT", fault, 1);
        if (rank)
            setenv("RANK", rank, 1);
        else
            unsetenv("RANK");
        if (attempt)
            setenv("EMBER_RESTART_COUNT", attempt, 1);
        else
            unsetenv("EMBER_RESTART_COUNT");
        for (int i = 0; i < calls; i++) {
            fault_point("a");
            char c = 'x';
            if (write(fds[1], &c, 1) != 1) _exit(3);
            fault_point("b");
        }
        _exit(0);
    }
    close(fds[1]);
    int got = 0;
    char c;
    while (read(fds[0], &c, 1) == 1) got++;
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return got;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return got;
    return -1;
}

TEST(test_fault_kills_at_the_nth_time_a_point_is_reached)
{
    CHECK(points_survived("a:3", NULL, NULL, 5) == 2);
    CHECK(points_survived("a:1", NULL, NULL, 5) == 0);
    CHECK(points_survived("b:2", NULL, NULL, 5) == 2); /* the 2nd "b" follows the 2nd "a" */
    CHECK(points_survived("*:4", NULL, NULL, 5) == 2); /* a b a [b] */
    CHECK(points_survived("a:9", NULL, NULL, 5) == 5); /* never reached 9 times */
    CHECK(points_survived("c:1", NULL, NULL, 5) == 5); /* another point */
}

TEST(test_fault_only_kills_the_named_rank_and_attempt)
{
    CHECK(points_survived("a:2:1", "1", NULL, 5) == 1);
    CHECK(points_survived("a:2:1", "0", NULL, 5) == 5);
    CHECK(points_survived("a:2:1", NULL, NULL, 5) == 5); /* no RANK: rank 0 */
    CHECK(points_survived("a:2:0:0", NULL, NULL, 5) == 1);
    CHECK(points_survived("a:2:0:0", "0", "1", 5) == 5); /* a restarted attempt lives */
    CHECK(points_survived("a:2:0:1", "0", "1", 5) == 1);
    CHECK(points_survived("b:9,a:3", NULL, NULL, 5) == 2); /* a list: the first to fire */
}

TEST(test_fault_ignores_a_malformed_value)
{
    const char *bad[] = {"a", "a:0", "a:x", "a:1:2:3:4", ":1", "a:-1", "a:1:-2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(points_survived(bad[i], NULL, NULL, 3) == 3);
}
