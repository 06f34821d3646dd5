/* test_loader.c — the loader (coverage per epoch, shuffle by (seed, epoch),
 * drop_last, prefetch equal to no prefetch, exact resume with seek, clean
 * shutdown mid-epoch) and the random-window sampler for language models. */
#include <dirent.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

/* ---- a dataset of indices: x = (i, -i) f32, y = i as a 0-dim i32 -------------------- */

typedef struct ids_data {
    int64_t n;
    int64_t fail_at; /* get(fail_at) fails while fail_left > 0 */
    atomic_int fail_left;
} ids_data;

static int64_t ids_len(void *user) { return ((ids_data *)user)->n; }

static em_status ids_get(void *user, int64_t i, void *x, void *y)
{
    ids_data *d = user;
    if (i == d->fail_at && atomic_load(&d->fail_left) > 0) {
        atomic_fetch_sub(&d->fail_left, 1);
        return em_set_error(EM_ERR_IO, "ids: example %lld failed", (long long)i);
    }
    float *px = x;
    px[0] = (float)i;
    px[1] = (float)-i;
    *(int32_t *)y = (int32_t)i;
    return EM_OK;
}

static em_dataset ids_dataset(ids_data *d)
{
    return (em_dataset){ids_len, ids_get, NULL, d, {EM_F32, 1, {2}}, {EM_I32, 0, {0}}, NULL};
}

/* The y values of a batch (its example indices) into out; returns the count. */
static int64_t batch_ids(em_batch *b, int32_t *out)
{
    CHECK(em_ndim(b->y) == 1 && em_size(b->y, 0) == b->size);
    CHECK_OK(em_to_array(b->y, EM_I32, out));
    return b->size;
}

/* Runs the loader for `calls` calls of em_loader_next and records what each
 * gave: the example ids of a batch, or -1 for an epoch end (0 returned, no
 * error). Returns entries. */
static int record(em_loader *l, int calls, int32_t *out)
{
    int k = 0;
    for (int c = 0; c < calls; c++) {
        em_scope s = em_scope_begin();
        em_batch b;
        int r = em_loader_next(l, &b);
        if (r > 0)
            k += (int)batch_ids(&b, out + k);
        else {
            CHECK(r == 0 && em_last_status() == EM_OK);
            out[k++] = -1;
        }
        em_scope_end(s);
    }
    return k;
}

static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* count_threads once it equals want, or after about a second: a joined
 * thread's entry can outlive pthread_join by a moment (the kernel wakes the
 * joiner as the thread exits, before the task is reaped). */
static int threads_settled_at(int want)
{
    int n = count_threads();
    for (int i = 0; i < 1000 && n != want; i++) {
        usleep(1000);
        n = count_threads();
    }
    return n;
}

/* ---- batching ------------------------------------------------------------------------- */

TEST(test_loader_stacks_examples_into_batch_tensors)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 4});
    CHECK_NOTNULL(l);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1 && em_loader_next(l, &b) == 1);
    CHECK(b.size == 4 && em_ndim(b.x) == 2 && em_size(b.x, 0) == 4 && em_size(b.x, 1) == 2);
    CHECK(em_dtype_of(b.x) == EM_F32 && em_dtype_of(b.y) == EM_I32);
    CHECK_VALUES(b.x, 0, 4, -4, 5, -5, 6, -6, 7, -7);
    CHECK_VALUES(b.y, 0, 4, 5, 6, 7);
    em_scope_end(s);
    CHECK(!em_is_alive(b.x) && !em_is_alive(b.y)); /* the batch died with the caller's scope */
    em_loader_free(l);
}

TEST(test_loader_without_shuffle_yields_indices_in_order_with_ragged_last_batch)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 3});
    CHECK(em_loader_num_batches(l) == 4);
    int32_t got[64];
    int k = record(l, 6, got); /* 4 batches, the epoch end, then epoch 1's first batch */
    int32_t want[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1, 0, 1, 2};
    CHECK(k == 14 && memcmp(got, want, sizeof want) == 0);
    em_loader_free(l);
}

TEST(test_loader_drop_last_drops_the_ragged_batch)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 3, .drop_last = true});
    CHECK(em_loader_num_batches(l) == 3);
    int32_t got[64];
    int k = record(l, 4, got);
    int32_t want[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, -1};
    CHECK(k == 10 && memcmp(got, want, sizeof want) == 0);
    em_loader_free(l);
}

/* Every index exactly once per epoch (drop_last false), or all but n % B. */
static void check_epochs_cover(bool drop_last, int prefetch)
{
    ids_data d = {23, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){5, true, 7, drop_last, prefetch, NULL, NULL});
    int64_t nb = em_loader_num_batches(l);
    CHECK(nb == (drop_last ? 4 : 5));
    for (int e = 0; e < 3; e++) {
        int32_t got[64];
        int k = record(l, (int)nb + 1, got);
        CHECK(got[k - 1] == -1);
        CHECK(k - 1 == (drop_last ? 20 : 23));
        int seen[23] = {0};
        for (int i = 0; i < k - 1; i++) {
            CHECK(got[i] >= 0 && got[i] < 23);
            seen[got[i]]++;
        }
        for (int i = 0; i < 23; i++) CHECK(seen[i] <= 1 && (drop_last || seen[i] == 1));
    }
    em_loader_free(l);
}

TEST(test_loader_shuffle_covers_every_index_once_per_epoch)
{
    check_epochs_cover(false, 0);
    check_epochs_cover(false, 2);
}

TEST(test_loader_shuffle_with_drop_last_takes_distinct_indices)
{
    check_epochs_cover(true, 0);
    check_epochs_cover(true, 3);
}

TEST(test_loader_shuffle_order_differs_between_epochs)
{
    ids_data d = {50, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 50, .shuffle = true, .seed = 1});
    int32_t e0[64], e1[64];
    record(l, 2, e0);
    record(l, 2, e1);
    CHECK(memcmp(e0, e1, 50 * sizeof(int32_t)) != 0);
    int32_t seq[50];
    for (int i = 0; i < 50; i++) seq[i] = i;
    CHECK(memcmp(e0, seq, sizeof seq) != 0);
    em_loader_free(l);
}

TEST(test_loader_order_depends_only_on_seed_and_epoch)
{
    ids_data d = {50, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader_config cfg = {.batch_size = 8, .shuffle = true, .seed = 42};
    em_loader *a = em_loader_new(&ds, &cfg), *b = em_loader_new(&ds, &cfg);
    cfg.seed = 43;
    em_loader *c = em_loader_new(&ds, &cfg);
    int32_t ga[256], gb[256], gc[256];
    int ka = record(a, 20, ga), kb = record(b, 20, gb);
    record(c, 20, gc);
    CHECK(ka == kb && memcmp(ga, gb, (size_t)ka * sizeof(int32_t)) == 0);
    CHECK(memcmp(ga, gc, (size_t)ka * sizeof(int32_t)) != 0);
    em_loader_free(a);
    em_loader_free(b);
    em_loader_free(c);
}

TEST(test_loader_prefetch_gives_the_same_batches_as_no_prefetch)
{
    ids_data d = {37, -1, 0};
    em_dataset ds = ids_dataset(&d);
    int32_t want[512], got[512];
    em_loader *l = em_loader_new(&ds, &(em_loader_config){6, true, 5, false, 0, NULL, NULL});
    int kw = record(l, 25, want); /* 3+ epochs of 7 batches */
    em_loader_free(l);
    for (int prefetch = 1; prefetch <= 5; prefetch += 2) {
        l = em_loader_new(&ds, &(em_loader_config){6, true, 5, false, prefetch, NULL, NULL});
        int k = record(l, 25, got);
        CHECK(k == kw && memcmp(got, want, (size_t)k * sizeof(int32_t)) == 0);
        em_loader_free(l);
    }
}

/* ---- position and resume --------------------------------------------------------------- */

static void check_resume(int prefetch)
{
    ids_data d = {17, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader_config cfg = {4, true, 9, false, prefetch, NULL, NULL};
    int32_t want[512], got[512];
    em_loader *l = em_loader_new(&ds, &cfg);
    int kw = record(l, 18, want); /* 3 epochs of 5 batches + epoch ends */
    em_loader_free(l);
    for (int stop = 0; stop <= 18; stop++) {
        l = em_loader_new(&ds, &cfg);
        int k = record(l, stop, got);
        em_loader_pos pos = em_loader_position(l);
        em_loader_free(l); /* interrupted, maybe mid-epoch */
        l = em_loader_new(&ds, &cfg);
        CHECK_OK(em_loader_seek(l, pos));
        CHECK(em_loader_position(l).epoch == pos.epoch && em_loader_position(l).batch == pos.batch);
        k += record(l, 18 - stop, got + k);
        CHECK(k == kw && memcmp(got, want, (size_t)k * sizeof(int32_t)) == 0);
        em_loader_free(l);
    }
}

TEST(test_loader_seek_resumes_exactly_without_prefetch) { check_resume(0); }

TEST(test_loader_seek_resumes_exactly_with_prefetch) { check_resume(2); }

TEST(test_loader_position_counts_batches_and_epochs)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 5, .prefetch = 1});
    int32_t got[64];
    record(l, 2, got);
    em_loader_pos p = em_loader_position(l);
    CHECK(p.epoch == 0 && p.batch == 2);
    record(l, 1, got); /* the epoch end */
    p = em_loader_position(l);
    CHECK(p.epoch == 1 && p.batch == 0);
    em_loader_free(l);
}

TEST(test_loader_seek_rejects_positions_outside_the_epoch)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 5});
    CHECK_ERR(em_loader_seek(l, (em_loader_pos){0, 3}), EM_ERR_ARG,
              "batch 3} outside epochs >= 0, batches [0, 2]");
    CHECK_ERR(em_loader_seek(l, (em_loader_pos){-1, 0}), EM_ERR_ARG, "em_loader_seek");
    em_loader_free(l);
}

/* ---- lifetime and errors ---------------------------------------------------------------- */

TEST(test_loader_free_mid_epoch_with_prefetch_leaves_no_thread_or_tensor)
{
    ids_data d = {100, -1, 0};
    em_dataset ds = ids_dataset(&d);
    int32_t got[64];
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 3});
    record(l, 2, got); /* warm up: whatever threads the library starts on first use */
    em_loader_free(l);
    int64_t live = em_live_tensors();
    int threads = count_threads();
    l = em_loader_new(&ds, &(em_loader_config){3, true, 1, false, 4, NULL, NULL});
    CHECK(count_threads() == threads + 1);
    record(l, 2, got);
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1); /* no scope: a persistent batch, ours to free */
    CHECK(em_live_tensors() == live + 2);
    em_free(b.x);
    em_free(b.y);
    em_loader_free(l); /* the worker is mid-epoch and its ring is full */
    CHECK(threads_settled_at(threads) == threads);
    CHECK(em_live_tensors() == live);
}

TEST(test_loader_rejects_bad_config)
{
    ids_data d = {10, -1, 0};
    em_dataset ds = ids_dataset(&d);
    CHECK_ERR(em_loader_new(&ds, &(em_loader_config){.batch_size = 0}), EM_ERR_ARG,
              "batch_size must be >= 1, got 0");
    CHECK_ERR(em_loader_new(&ds, &(em_loader_config){.batch_size = 2, .prefetch = -1}), EM_ERR_ARG,
              "prefetch must be >= 0, got -1");
    CHECK_ERR(em_loader_new(NULL, &(em_loader_config){.batch_size = 2}), EM_ERR_ARG, "em_loader_new");
}

static void check_dataset_error_then_retry(int prefetch)
{
    ids_data d = {10, 5, 1};
    em_dataset ds = ids_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 3, .prefetch = prefetch, NULL, NULL});
    int64_t live = em_live_tensors();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1);
    em_free(b.x);
    em_free(b.y);
    int got = 0;
    CHECK_ERR(got = em_loader_next(l, &b), EM_ERR_IO, "ids: example 5 failed"); /* batch 1 holds 3, 4, 5 */
    CHECK(got == -1);
    CHECK(b.x == NULL && em_live_tensors() == live);
    CHECK(em_loader_position(l).batch == 1);
    em_scope s = em_scope_begin();
    CHECK(em_loader_next(l, &b) == 1); /* the retry succeeds */
    CHECK_VALUES(b.y, 0, 3, 4, 5);
    em_scope_end(s);
    em_loader_free(l);
}

TEST(test_loader_reports_dataset_error_and_retries_the_batch)
{
    check_dataset_error_then_retry(0);
    check_dataset_error_then_retry(2);
}

TEST(test_loader_over_sequence_dataset_gives_token_blocks)
{
    int32_t tok[21];
    for (int i = 0; i < 21; i++) tok[i] = i;
    em_tokens t = em_tokens_view(tok, 21, EM_TOK_I32);
    em_dataset *ds = em_sequence_dataset(&t, 5); /* 4 blocks */
    em_loader *l = em_loader_new(ds, &(em_loader_config){.batch_size = 2, .prefetch = 1});
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1 && em_loader_next(l, &b) == 1);
    CHECK(em_ndim(b.x) == 2 && em_size(b.x, 0) == 2 && em_size(b.x, 1) == 5 && em_dtype_of(b.x) == EM_I32);
    CHECK_VALUES(b.x, 0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19);
    CHECK_VALUES(b.y, 0, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20);
    em_scope_end(s);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- the random-window sampler ------------------------------------------------------------ */

TEST(test_window_sampler_gives_windows_with_y_shifted_by_one)
{
    int32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = 1000 + i;
    em_tokens t = em_tokens_view(tok, 100, EM_TOK_I32);
    em_window_sampler ws;
    CHECK_OK(em_window_sampler_init(&ws, &t, 4, 8, 3));
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK_OK(em_window_sampler_next(&ws, &b));
    CHECK(b.size == 4 && em_ndim(b.x) == 2 && em_size(b.x, 0) == 4 && em_size(b.x, 1) == 8);
    CHECK(em_dtype_of(b.x) == EM_I32 && em_dtype_of(b.y) == EM_I32);
    int32_t x[32], y[32];
    em_to_array(b.x, EM_I32, x);
    em_to_array(b.y, EM_I32, y);
    for (int r = 0; r < 4; r++) {
        CHECK(x[r * 8] >= 1000 && x[r * 8] <= 1000 + 100 - 9); /* start in [0, n - T - 1] */
        for (int k = 0; k < 8; k++) {
            CHECK(x[r * 8 + k] == x[r * 8] + k); /* a contiguous window */
            CHECK(y[r * 8 + k] == x[r * 8 + k] + 1);
        }
    }
    CHECK(ws.rng.offset == 4);
    em_scope_end(s);
}

TEST(test_window_sampler_draws_every_start_and_none_past_the_end)
{
    uint16_t tok[7] = {0, 1, 2, 3, 4, 5, 6};
    em_tokens t = em_tokens_view(tok, 7, EM_TOK_U16);
    em_window_sampler ws;
    CHECK_OK(em_window_sampler_init(&ws, &t, 64, 5, 0)); /* windows of 6: starts 0, 1 */
    int seen[7] = {0};
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK_OK(em_window_sampler_next(&ws, &b));
    int32_t x[64 * 5];
    em_to_array(b.x, EM_I32, x);
    for (int r = 0; r < 64; r++) seen[x[r * 5]]++;
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] == 0);
    em_scope_end(s);
}

TEST(test_window_sampler_depends_only_on_seed_and_offset)
{
    uint16_t t16[300];
    int32_t t32[300];
    for (int i = 0; i < 300; i++) t16[i] = (uint16_t)(t32[i] = (i * 7919) % 1000);
    em_tokens a = em_tokens_view(t16, 300, EM_TOK_U16), c = em_tokens_view(t32, 300, EM_TOK_I32);
    em_window_sampler s1, s2, s3;
    em_window_sampler_init(&s1, &a, 3, 16, 11);
    em_window_sampler_init(&s2, &c, 3, 16, 11); /* u16 and i32 give the same windows */
    em_scope s = em_scope_begin();
    em_batch b1, b2, b3;
    em_window_sampler_next(&s1, &b1);
    em_window_sampler_next(&s2, &b2);
    CHECK(th_max_abs_diff(b1.x, b2.x) == 0 && th_max_abs_diff(b1.y, b2.y) == 0);
    em_rng saved = s1.rng; /* resume: a new sampler with the saved rng */
    em_window_sampler_next(&s1, &b1);
    em_window_sampler_init(&s3, &a, 3, 16, 0);
    s3.rng = saved;
    em_window_sampler_next(&s3, &b3);
    CHECK(th_max_abs_diff(b1.x, b3.x) == 0);
    em_window_sampler_init(&s3, &a, 3, 16, 12); /* another seed, other windows */
    em_window_sampler_next(&s3, &b3);
    CHECK(th_max_abs_diff(b2.x, b3.x) > 0);
    em_scope_end(s);
}

TEST(test_window_sampler_rejects_data_shorter_than_block_plus_one)
{
    int32_t tok[8] = {0};
    em_tokens t = em_tokens_view(tok, 8, EM_TOK_I32);
    em_window_sampler ws;
    CHECK_ERR(em_window_sampler_init(&ws, &t, 2, 8, 0), EM_ERR_ARG, "8 tokens is shorter than T + 1 = 9");
    CHECK_ERR(em_window_sampler_init(&ws, &t, 0, 4, 0), EM_ERR_ARG, "B 0, T 4");
    CHECK_OK(em_window_sampler_init(&ws, &t, 2, 7, 0));
}
