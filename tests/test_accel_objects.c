/* test_accel_objects.c — main_process_first (the main process's block runs
 * before the others', seen through a shared log file) and gather_object
 * (bytes of any length per rank, 0 included, on every rank in rank order). */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

static em_accelerator *accel(void)
{
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    return a;
}

/* Appends one line to the log in one write (O_APPEND: lines never mix). */
static void log_line(const char *path, const char *line)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, line, strlen(line)) == (ssize_t)strlen(line));
    close(fd);
}

/* ---- main_process_first --------------------------------------------------------------- */

static void main_first(int rank, int world, void *ctx)
{
    (void)world;
    const char *log = ctx;
    em_accelerator *a = accel();
    CHECK_OK(em_accel_main_process_first_begin(a));
    char line[32];
    snprintf(line, sizeof line, "%d begin\n", rank);
    log_line(log, line);
    if (rank == 0) nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL); /* a slow download */
    snprintf(line, sizeof line, "%d end\n", rank);
    log_line(log, line);
    CHECK_OK(em_accel_main_process_first_end(a));
    CHECK_OK(em_accel_wait_for_everyone(a));
    size_t n;
    char *got = th_slurp(log, &n);
    CHECK(strcmp(got, "0 begin\n0 end\n1 begin\n1 end\n") == 0);
    free(got);
    em_accelerator_free(a);
}

TEST(test_main_process_first_runs_the_main_block_before_the_others_start_theirs)
{
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-mpf");
    char log[PATH_MAX];
    th_pathf(log, sizeof log, "%s/log", dir);
    TH_RANKS_ENV(2, main_first, log);
}

TEST(test_main_process_first_refuses_end_without_begin_and_a_nested_begin)
{
    unsetenv("WORLD_SIZE");
    em_accelerator *a = accel();
    CHECK_ERR(em_accel_main_process_first_end(a), EM_ERR_ARG,
              "em_accel_main_process_first_end: no main_process_first block is open on rank 0 (call "
              "em_accel_main_process_first_begin first)");
    CHECK_OK(em_accel_main_process_first_begin(a));
    CHECK_ERR(em_accel_main_process_first_begin(a), EM_ERR_ARG, "a main_process_first block is already open");
    CHECK_OK(em_accel_main_process_first_end(a));
    CHECK_OK(em_accel_main_process_first_begin(a)); /* and again, after the first block */
    CHECK_OK(em_accel_main_process_first_end(a));
    CHECK_ERR(em_accel_main_process_first_begin(NULL), EM_ERR_ARG, "accelerator is NULL");
    em_accelerator_free(a);
}

/* ---- gather_object -------------------------------------------------------------------- */

/* Rank r's bytes: rank 1 sends nothing; the others 4r + 5 bytes b_k = r * 16
 * + k, zero bytes included (rank 0 starts with one). */
static size_t bytes_of(int r, uint8_t *buf)
{
    if (r == 1) return 0;
    size_t n = (size_t)(4 * r + 5);
    for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)(r * 16 + (int)k);
    return n;
}

static void gather(int rank, int world, void *ctx)
{
    (void)ctx;
    em_accelerator *a = accel();
    uint8_t mine[64], want[64];
    size_t n = bytes_of(rank, mine);
    void *out;
    size_t sizes[8];
    CHECK_OK(em_accel_gather_object(a, n ? mine : NULL, n, &out, sizes));
    size_t at = 0;
    for (int r = 0; r < world; r++) {
        size_t m = bytes_of(r, want);
        th_case("rank %d's bytes", r);
        CHECK(sizes[r] == m);
        CHECK(memcmp((uint8_t *)out + at, want, m) == 0);
        at += m;
    }
    CHECK(((uint8_t *)out)[at] == 0); /* the NUL after the bytes */
    free(out);
    /* nothing anywhere: every length 0, out a lone NUL */
    CHECK_OK(em_accel_gather_object(a, NULL, 0, &out, sizes));
    for (int r = 0; r < world; r++) CHECK(sizes[r] == 0);
    CHECK(out != NULL && ((char *)out)[0] == 0);
    free(out);
    /* text stays a C string */
    char text[32];
    snprintf(text, sizeof text, "rank%d;", rank);
    CHECK_OK(em_accel_gather_object(a, text, strlen(text), &out, sizes));
    CHECK(strcmp(out, "rank0;rank1;rank2;") == 0);
    free(out);
    em_accelerator_free(a);
}

TEST(test_gather_object_gives_every_rank_all_ranks_bytes_in_rank_order) { TH_RANKS_ENV(3, gather, NULL); }

TEST(test_gather_object_alone_returns_its_own_bytes_and_rejects_null_arguments)
{
    unsetenv("WORLD_SIZE");
    em_accelerator *a = accel();
    void *out;
    size_t sizes[1];
    CHECK_OK(em_accel_gather_object(a, "abc", 3, &out, sizes));
    CHECK(sizes[0] == 3 && strcmp(out, "abc") == 0);
    free(out);
    CHECK_ERR(em_accel_gather_object(a, NULL, 2, &out, sizes), EM_ERR_ARG, "nor data with n 2 > 0");
    CHECK(out == NULL);
    CHECK_ERR(em_accel_gather_object(a, "abc", 3, NULL, sizes), EM_ERR_ARG, "must not be NULL");
    CHECK_ERR(em_accel_gather_object(a, "abc", 3, &out, NULL), EM_ERR_ARG, "must not be NULL");
    em_accelerator_free(a);
}
