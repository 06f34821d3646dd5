/* test_accelerator.c — the Accelerator's own behaviour: configuration
 * precedence, accumulation bookkeeping, gather / gather_for_metrics /
 * reduce / pad / split / triggers across ranks, and save_state's checks.
 * (Training equivalences and exact resume are in test_ddp.c, resume at
 * another world size in test_resize.c.) */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

TEST(test_accelerator_alone_is_a_world_of_one)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK(em_accel_world(a) == 1 && em_accel_rank(a) == 0);
    CHECK(em_accel_is_main_process(a) && em_accel_is_local_main(a));
    CHECK(em_accel_grad_accum(a) == 1);
    em_accelerator_free(a);
}

TEST(test_accelerator_config_precedence_file_then_env_then_code)
{
    char dir[PATH_MAX], path[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-acc");
    th_pathf(path, sizeof path, "%s/c.yaml", dir);
    write_text(path, "gradient_accumulation_steps: 3\n");
    setenv("EMBER_CONFIG_FILE", path, 1);
    unsetenv("EMBER_GRAD_ACCUM");
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK(em_accel_grad_accum(a) == 3);
    em_accelerator_free(a);
    setenv("EMBER_GRAD_ACCUM", "2", 1);
    a = em_accelerator_new(NULL);
    CHECK(em_accel_grad_accum(a) == 2);
    em_accelerator_free(a);
    a = em_accelerator_new(&(em_accel_config){.grad_accum = 5});
    CHECK(em_accel_grad_accum(a) == 5);
    em_accelerator_free(a);
}

TEST(test_accelerator_rejects_bad_environment_values)
{
    th_no_user_config();
    setenv("EMBER_GRAD_ACCUM", "zero", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_GRAD_ACCUM='zero'");
    unsetenv("EMBER_GRAD_ACCUM");
    setenv("EMBER_SPLIT_BATCHES", "maybe", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_SPLIT_BATCHES");
}

/* zero_stage from the environment and code; stages out of range are
 * refused by name. A world of one runs no ZeRO (nothing to shard), whatever
 * the stage. */
TEST(test_accelerator_zero_stage_from_env_and_code_and_its_refusals)
{
    th_no_user_config();
    setenv("EMBER_ZERO_STAGE", "5", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_ZERO_STAGE='5'");
    setenv("EMBER_ZERO_STAGE", "3", 1);
    /* code wins over the environment */
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.zero_stage = 2});
    CHECK_NOTNULL(a);
    unsetenv("EMBER_ZERO_STAGE");
    CHECK(em_accel_zero_stage(a) == 0); /* world 1: nothing prepared, nothing sharded */
    em_accelerator_free(a);
    CHECK_ERR(em_accelerator_new(&(em_accel_config){.zero_stage = 7}), EM_ERR_ARG, "zero_stage 7");
    CHECK(em_accel_zero_stage(NULL) == -1);
}

/* A dataset of n examples x = (i) f32, y = (i) i32. */
static int64_t count_len(void *user) { return (int64_t)(intptr_t)user; }

static em_status count_get(void *user, int64_t i, void *x, void *y)
{
    (void)user;
    *(float *)x = (float)i;
    *(int32_t *)y = (int32_t)i;
    return EM_OK;
}

static em_dataset *counting(int64_t n)
{
    em_dataset def = {.len = count_len, .get = count_get, .user = (void *)(intptr_t)n,
                      .x_field = {EM_F32, 1, {1}}, .y_field = {EM_I32, 1, {1}}};
    return em_dataset_new(&def);
}

TEST(test_accumulate_syncs_every_k_and_at_the_end_of_the_data)
{
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.grad_accum = 3});
    em_dataset *ds = counting(7);
    CHECK_NOTNULL(ds);
    em_loader *l = em_loader_new(ds, &(em_loader_config){.batch_size = 1});
    CHECK_OK(em_accel_prepare(a, NULL, NULL, l, NULL));
    char got[16] = "";
    em_batch b;
    int i = 0, r;
    while ((r = em_accel_next(a, &b)) > 0) {
        got[i++] = em_accel_accumulate(a) ? 'S' : '.';
        em_free(b.x);
        em_free(b.y);
    }
    CHECK(r == 0);
    CHECK(strcmp(got, "..S..SS") == 0);
    em_loader_free(l);
    em_dataset_free(ds);
    em_accelerator_free(a);
}

static void collectives(int rank, int world, void *ctx)
{
    (void)ctx;
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK(em_accel_rank(a) == rank && em_accel_world(a) == world);
    CHECK(em_accel_is_main_process(a) == (rank == 0));
    em_scope s = em_scope_begin();
    /* gather: rank r contributes (r, 10r) */
    em_tensor *t = em_empty(EM_F32, 2, (int64_t[]){1, 2});
    ((float *)em_data(t))[0] = (float)rank;
    ((float *)em_data(t))[1] = 10.0f * rank;
    em_tensor *g = em_accel_gather(a, t);
    CHECK_NOTNULL(g);
    CHECK(em_shape(g)[0] == world && em_shape(g)[1] == 2);
    for (int r = 0; r < world; r++) CHECK(((float *)em_data(g))[2 * r + 1] == 10.0f * r);
    /* reduce */
    em_tensor *sum = em_accel_reduce(a, em_scalar(EM_F64, rank + 1), EM_RED_SUM);
    CHECK_NEAR(em_item(sum), world * (world + 1) / 2.0, 0);
    /* pad across processes: rank r has r+1 rows */
    em_tensor *p = em_accel_pad_across_processes(a, em_full(EM_I32, 1, (int64_t[]){rank + 1}, 7), 0, -1, false);
    CHECK_NOTNULL(p);
    CHECK(em_shape(p)[0] == world);
    CHECK(((int32_t *)em_data(p))[rank] == 7);
    if (rank + 1 < world) CHECK(((int32_t *)em_data(p))[world - 1] == -1);
    em_tensor *pf = em_accel_pad_across_processes(a, em_full(EM_I32, 1, (int64_t[]){rank + 1}, 7), 0, -1, true);
    CHECK(((int32_t *)em_data(pf))[world - 1] == 7);
    if (rank + 1 < world) CHECK(((int32_t *)em_data(pf))[0] == -1);
    em_scope_end(s);
    /* split_between_processes: 10 items */
    int64_t start, count;
    em_accel_split_between_processes(a, 10, &start, &count);
    int64_t want_count = 10 / world + (rank < 10 % world), want_start = 0;
    for (int r = 0; r < rank; r++) want_start += 10 / world + (r < 10 % world);
    CHECK(start == want_start && count == want_count);
    /* triggers: only the last rank sets it; everyone sees it once */
    if (rank == world - 1) em_accel_set_trigger(a);
    em_status st;
    CHECK(em_accel_check_trigger(a, &st));
    CHECK_OK(st);
    CHECK(!em_accel_check_trigger(a, &st));
    CHECK_OK(em_accel_wait_for_everyone(a));
    em_accelerator_free(a);
}

TEST(test_accelerator_gather_reduce_pad_split_and_trigger_on_three_ranks)
{
    TH_RANKS_ENV(3, collectives, NULL);
}

/* 5 examples, batch 2, 2 ranks: global batches [0 1 2 3] [4 p p p]; the
 * padded copies come from the start of the epoch and gather_for_metrics
 * drops them. */
static void metrics(int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    em_dataset *ds = counting(5);
    em_loader *l = em_loader_new(ds, &(em_loader_config){.batch_size = 2});
    CHECK_OK(em_accel_prepare(a, NULL, NULL, l, NULL));
    em_batch b;
    int seen = 0, batches = 0, r;
    while ((r = em_accel_next(a, &b)) > 0) {
        em_tensor *all = em_accel_gather_for_metrics(a, b.x);
        CHECK_NOTNULL(all);
        int64_t n = em_shape(all)[0];
        for (int64_t i = 0; i < n; i++) CHECK(((float *)em_data(all))[i] == (float)(seen + i));
        seen += (int)n;
        batches++;
        em_free(all);
        em_free(b.x);
        em_free(b.y);
    }
    CHECK(r == 0);
    CHECK(batches == 2);
    CHECK(seen == 5);
    (void)rank;
    em_loader_free(l);
    em_dataset_free(ds);
    em_accelerator_free(a);
}

TEST(test_gather_for_metrics_drops_the_even_batches_padding) { TH_RANKS_ENV(2, metrics, NULL); }

/* A save of 2 ranks without rank 1's file: every rank verifies every file
 * the manifest names, so each names it. */
static void rank_file_missing(int rank, int world, void *ctx)
{
    (void)world;
    th_no_user_config();
    const char *dir = ctx;
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    char path[PATH_MAX];
    th_pathf(path, sizeof path, "%s/rank_1.json", dir);
    CHECK_OK(em_accel_save_state(a, dir));
    CHECK_OK(em_accel_wait_for_everyone(a));
    if (rank == 0) CHECK(unlink(path) == 0);
    CHECK_OK(em_accel_wait_for_everyone(a));
    CHECK_ERR(em_accel_load_state(a, dir), EM_ERR_IO, path);
    em_accelerator_free(a);
}

TEST(test_load_state_names_a_missing_rank_file)
{
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-acc");
    TH_RANKS_ENV(2, rank_file_missing, dir);
}

TEST(test_load_state_of_a_missing_directory_names_it)
{
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_ERR(em_accel_load_state(a, "/nonexistent/state"), EM_ERR_IO, "no checkpoint at /nonexistent/state");
    em_accelerator_free(a);
}

/* A deep path (1,500 characters) is named whole: the thread's error
 * message holds more than one long path (tensor/error.c) */
TEST(test_load_state_names_a_long_missing_path_whole)
{
    th_no_user_config();
    char path[1600] = "/nonexistent", want[1700];
    while (strlen(path) < 1500) strcat(path, "/deeper");
    snprintf(want, sizeof want, "no checkpoint at %s", path);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_ERR(em_accel_load_state(a, path), EM_ERR_IO, want);
    em_accelerator_free(a);
}
