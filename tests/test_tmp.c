/* test_tmp.c — temporary files of the test suite: th_tmpdir, th_tmpfile and
 * th_remove_tree (tests/util.c), and the runner (tests/main.c) leaving
 * nothing behind in TMPDIR, whatever the results and however it ends.
 *
 * The runner tests run this very binary on the three "inner" tests below
 * (test_tmpdir_..., test_tmpfile_..., test_programs_...), which make files,
 * with TMPDIR pointed at a fresh empty directory, and look in that
 * directory afterwards. The inner test_tmpdir_ test carries the planted
 * outcomes they need: EMBER_TEST_TMP_PLANT=fail fails it after it made its
 * files, =hang makes it write `ready` in its directory and wait to be
 * killed. A normal run sets neither. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define TESTS_BIN EMBER_BUILD_DIR "/tests/ember-tests"
#define PLANTED "test_tmpdir_makes_fresh_directories_named_by_prefix_in_the_tests_own"

/* true when path is dir/<name starting with prefix>, directly in dir */
static bool directly_in(const char *path, const char *dir, const char *prefix)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && path[n] == '/' && !strncmp(path + n + 1, prefix, strlen(prefix)) &&
           !strchr(path + n + 1, '/');
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

TEST(test_tmpdir_makes_fresh_directories_named_by_prefix_in_the_tests_own)
{
    const char *mine = th_tmp();
    const char *base = strrchr(mine, '/');
    CHECK(base && !strcmp(base + 1, __func__)); /* the test's directory is named after it */
    CHECK(!strcmp(getenv("TMPDIR"), mine));
    char a[PATH_MAX], b[PATH_MAX];
    CHECK(th_tmpdir(a, sizeof a, "ember-x") == a);
    th_tmpdir(b, sizeof b, "ember-x");
    CHECK(strcmp(a, b) != 0 && is_dir(a) && is_dir(b));
    CHECK(directly_in(a, mine, "ember-x-") && directly_in(b, mine, "ember-x-"));
    th_write_file(th_path(a, "f"), "x", 1);

    const char *plant = getenv("EMBER_TEST_TMP_PLANT");
    if (plant && !strcmp(plant, "fail"))
        th_fail(__FILE__, __LINE__, "planted failure (EMBER_TEST_TMP_PLANT)");
    if (plant && !strcmp(plant, "hang")) {
        th_write_file(th_path(mine, "ready"), "", 0);
        for (;;) pause();
    }
}

TEST(test_tmpfile_makes_an_empty_file_named_by_prefix_in_the_tests_own)
{
    char p[PATH_MAX];
    int fd = th_tmpfile(p, sizeof p, "ember-y");
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0);
    CHECK(write(fd, "ab", 2) == 2);
    close(fd);
    CHECK(directly_in(p, th_tmp(), "ember-y-"));
    size_t n;
    char *text = th_slurp(p, &n);
    CHECK(n == 2 && !memcmp(text, "ab", 2));
    free(text);
}

TEST(test_programs_a_test_starts_make_their_temporaries_in_its_directory)
{
    th_run_result *r = th_run("/bin/sh", "-c", "mktemp && mktemp -d", NULL);
    CHECK_EXIT(r, 0);
    char file[PATH_MAX], dir[PATH_MAX];
    CHECK(sscanf(r->out, "%4095s %4095s", file, dir) == 2);
    CHECK(directly_in(file, th_tmp(), "tmp.") && directly_in(dir, th_tmp(), "tmp."));
    CHECK(is_dir(dir) && !is_dir(file));
}

TEST(test_remove_tree_removes_read_only_directories_and_never_follows_links)
{
    char dir[PATH_MAX], keep[PATH_MAX], sub[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-rm");
    th_tmpdir(keep, sizeof keep, "ember-keep");
    th_write_file(th_path(keep, "precious"), "p", 1);
    th_pathf(sub, sizeof sub, "%s/a/b", dir);
    CHECK(mkdir(th_path(dir, "a"), 0700) == 0 && mkdir(sub, 0700) == 0);
    th_write_file(th_path(sub, "f"), "f", 1);
    CHECK(symlink(keep, th_path(sub, "link")) == 0);
    CHECK(chmod(sub, 0500) == 0 && chmod(th_path(dir, "a"), 0500) == 0);
    CHECK(th_remove_tree(dir) == 0);
    CHECK(access(dir, F_OK) != 0 && errno == ENOENT);
    CHECK(access(th_path(keep, "precious"), F_OK) == 0);
    CHECK(th_remove_tree(dir) == 0); /* nothing there: nothing to do */
}

/* ---- the runner ------------------------------------------------------------------------ */

/* The entries of dir (not . and ..) whose names start with prefix; the
 * name of the last one into last (n bytes) when last is not NULL. */
static int entries(const char *dir, const char *prefix, char *last, size_t n)
{
    DIR *d = opendir(dir);
    if (!d) th_fail(__FILE__, __LINE__, "cannot open %s", dir);
    int k = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            !strncmp(e->d_name, prefix, strlen(prefix))) {
            k++;
            if (last) th_pathf(last, n, "%s", e->d_name);
        }
    closedir(d);
    return k;
}

/* Nothing in dir at all. */
static bool empty(const char *dir) { return entries(dir, "", NULL, 0) == 0; }

/* A fresh empty directory (into tmp, PATH_MAX bytes) as the runner's TMPDIR,
 * and the environment of a plain run (no keeping, forked tests). */
static void fresh_tmpdir(char *tmp)
{
    th_tmpdir(tmp, PATH_MAX, "ember-runner");
    setenv("TMPDIR", tmp, 1);
    unsetenv("EMBER_TEST_KEEP_TMP");
    unsetenv("EMBER_TEST_NOFORK");
}

/* The runner on the three inner tests; plant: NULL, "fail" or "hang". */
static th_run_result *run_inner(const char *plant)
{
    if (plant)
        setenv("EMBER_TEST_TMP_PLANT", plant, 1);
    else
        unsetenv("EMBER_TEST_TMP_PLANT");
    return th_run(TESTS_BIN, "test_tmpdir_", "test_tmpfile_", "test_programs_a_test_starts", NULL);
}

TEST(test_runner_leaves_its_tmpdir_empty_after_a_run)
{
    char tmp[PATH_MAX];
    fresh_tmpdir(tmp);
    th_run_result *r = run_inner(NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "3 passed, 0 failed, 0 skipped\n"));
    CHECK(empty(tmp));
}

TEST(test_runner_removes_a_failed_tests_files_after_saying_where_they_were)
{
    char tmp[PATH_MAX];
    fresh_tmpdir(tmp);
    th_run_result *r = run_inner("fail");
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->out, "planted failure"));
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "     its files: %s/ember-tests-", tmp);
    if (!strstr(r->out, want) || !strstr(r->out, "/" PLANTED " (removed when the run ends)\n"))
        th_fail(__FILE__, __LINE__, "the failure does not say where its files were:\n%s", r->out);
    CHECK(strstr(r->out, "(EMBER_TEST_KEEP_TMP=1 keeps them)\n2 passed, 1 failed, 0 skipped\n"));
    CHECK(empty(tmp));
}

/* The check the other runner tests make can see what a run leaves: with
 * EMBER_TEST_KEEP_TMP=1 the run's one directory stays, with every test's files. */
TEST(test_runner_keeps_the_run_directory_with_keep_tmp)
{
    char tmp[PATH_MAX], root[NAME_MAX + 1], dir[PATH_MAX];
    fresh_tmpdir(tmp);
    setenv("EMBER_TEST_KEEP_TMP", "1", 1);
    th_run_result *r = run_inner("fail");
    CHECK_EXIT(r, 1);
    CHECK(entries(tmp, "", root, sizeof root) == 1 && !strncmp(root, "ember-tests-", 12));
    th_pathf(dir, sizeof dir, "%s/%s", tmp, root);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "temporary files kept in %s\n2 passed, 1 failed, 0 skipped\n", dir);
    if (!strstr(r->out, want))
        th_fail(__FILE__, __LINE__, "the summary does not say what was kept:\n%s", r->out);
    CHECK(entries(dir, "test_", NULL, 0) == 3); /* the three tests' directories, the passed ones too */
    char mine[PATH_MAX];
    th_pathf(mine, sizeof mine, "%s/" PLANTED, dir);
    CHECK(entries(mine, "", NULL, 0) == 2 && entries(mine, "ember-x-", NULL, 0) == 2);
}

TEST(test_runner_run_in_process_removes_its_directory_when_a_test_fails)
{
    char tmp[PATH_MAX];
    fresh_tmpdir(tmp);
    setenv("EMBER_TEST_NOFORK", "1", 1);
    th_run_result *r = run_inner(NULL);
    CHECK_EXIT(r, 0);
    CHECK(empty(tmp));
    r = run_inner("fail");
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "planted failure") && strstr(r->err, "its files: "));
    CHECK(empty(tmp));
}

/* SIGTERM while a test runs (as `timeout` sends): the runner kills the test,
 * removes its directory and dies of the signal. */
TEST(test_runner_stopped_by_sigterm_removes_its_directory)
{
    char tmp[PATH_MAX], out[PATH_MAX];
    fresh_tmpdir(tmp);
    setenv("EMBER_TEST_TMP_PLANT", "hang", 1); /* the planted test alone, as `ready` needs it */
    int fd = th_tmpfile(out, sizeof out, "ember-runner-out");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execl(TESTS_BIN, TESTS_BIN, PLANTED, (char *)NULL);
        _exit(127);
    }
    close(fd);
    /* wait for the planted test's `ready` in TMPDIR/ember-tests-XXXXXX/PLANTED/ */
    bool ready = false;
    for (int i = 0; i < 2000 && !ready; i++) {
        char root[NAME_MAX + 1], p[PATH_MAX];
        if (entries(tmp, "", root, sizeof root) == 1) {
            th_pathf(p, sizeof p, "%s/%s/" PLANTED "/ready", tmp, root);
            ready = access(p, F_OK) == 0;
        }
        if (!ready) usleep(10000);
    }
    kill(pid, ready ? SIGTERM : SIGKILL);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    size_t n;
    char *said = th_slurp(out, &n);
    if (!ready) th_fail(__FILE__, __LINE__, "the planted test never got ready:\n%s", said);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGTERM)
        th_fail(__FILE__, __LINE__, "the runner did not die of SIGTERM (status %d):\n%s", st, said);
    CHECK(strstr(said, "STOP " PLANTED ": the runner got signal 15"));
    CHECK(!strstr(said, "passed, "));
    free(said);
    CHECK(empty(tmp));
}
