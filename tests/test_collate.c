/* test_collate.c — variable-length examples (em_dataset.lengths) batched
 * by a collate: em_collate_pad pads each batch to its longest example (or a
 * multiple), with a mask; with the prefetch thread on and off, sharded, and
 * the failures of lengths and of the collate reported by em_loader_next. */
#include <stdlib.h>

#include "cuda_test.h"
#include "harness.h"

/* ---- a dataset of token sequences ---------------------------------------------------
 * Example i has LEN[i] tokens x_t = 10 i + t + 1 and labels y_t = x_t + 100
 * (t < LEN[i]); get fills the rest of its buffers with 999, which must
 * never reach a batch. Fields hold up to MAXLEN. With label_only, y is the
 * 0-dim label i instead. */
#define N 7
#define MAXLEN 8
static const int64_t LEN[N] = {3, 7, 5, 2, 6, 4, 1};

typedef struct seqs {
    bool label_only;
    int64_t bad_len_at; /* lengths reports MAXLEN + 1 for this example */
} seqs;

static int64_t seq_len(void *user)
{
    (void)user;
    return N;
}

static em_status seq_lengths(void *user, int64_t i, int64_t *x_len, int64_t *y_len)
{
    seqs *d = user;
    *x_len = i == d->bad_len_at ? MAXLEN + 1 : LEN[i];
    if (!d->label_only) *y_len = LEN[i];
    return EM_OK;
}

static em_status seq_get(void *user, int64_t i, void *x, void *y)
{
    seqs *d = user;
    int32_t *px = x, *py = y;
    for (int t = 0; t < MAXLEN; t++) px[t] = t < LEN[i] ? (int32_t)(10 * i + t + 1) : 999;
    if (d->label_only)
        *py = (int32_t)i;
    else
        for (int t = 0; t < MAXLEN; t++) py[t] = t < LEN[i] ? (int32_t)(10 * i + t + 101) : 999;
    return EM_OK;
}

static em_dataset seq_dataset(seqs *d)
{
    return (em_dataset){.len = seq_len,
                        .get = seq_get,
                        .user = d,
                        .x_field = {EM_I32, 1, {MAXLEN}},
                        .y_field =
                            d->label_only ? (em_field){EM_I32, 0, {0}} : (em_field){EM_I32, 1, {MAXLEN}},
                        .lengths = seq_lengths};
}

static int64_t round_up(int64_t n, int64_t m) { return m > 1 ? (n + m - 1) / m * m : n; }

/* Checks a padded batch element by element and returns its example ids in
 * ids: the example of row b is read back from its first token. x_pad 0,
 * y_pad -100; L is the longest in the batch rounded up to `multiple`. */
static void check_padded(em_batch *b, int64_t multiple, bool label_only, int64_t *ids)
{
    int64_t B = b->size;
    CHECK(B >= 1 && em_ndim(b->x) == 2 && em_shape(b->x)[0] == B);
    int64_t L = em_shape(b->x)[1], longest = 0;
    const int32_t *x = em_data(b->x);
    for (int64_t r = 0; r < B; r++) {
        ids[r] = (x[r * L] - 1) / 10;
        CHECK(ids[r] >= 0 && ids[r] < N);
        if (LEN[ids[r]] > longest) longest = LEN[ids[r]];
    }
    CHECK(L == round_up(longest, multiple));
    CHECK(em_dtype_of(b->mask) == EM_F32 && em_ndim(b->mask) == 2 && em_shape(b->mask)[0] == B &&
          em_shape(b->mask)[1] == L);
    const float *m = em_data(b->mask);
    const int32_t *y = em_data(b->y);
    if (label_only)
        CHECK(em_ndim(b->y) == 1 && em_shape(b->y)[0] == B);
    else
        CHECK(em_ndim(b->y) == 2 && em_shape(b->y)[0] == B && em_shape(b->y)[1] == L);
    for (int64_t r = 0; r < B; r++) {
        int64_t i = ids[r];
        for (int64_t t = 0; t < L; t++) {
            bool real = t < LEN[i];
            th_case("row %lld (example %lld) position %lld", (long long)r, (long long)i, (long long)t);
            CHECK(x[r * L + t] == (real ? 10 * i + t + 1 : 0));
            CHECK(m[r * L + t] == (real ? 1.0f : 0.0f));
            if (!label_only) CHECK(y[r * L + t] == (real ? 10 * i + t + 101 : -100));
        }
        if (label_only) CHECK(y[r] == i);
    }
    th_case("%s", "");
}

static em_loader *pad_loader(em_dataset *ds, int64_t B, bool shuffle, int prefetch, em_pad_config *pc)
{
    em_loader *l = em_loader_new(ds, &(em_loader_config){.batch_size = B,
                                                         .shuffle = shuffle,
                                                         .seed = 3,
                                                         .prefetch = prefetch,
                                                         .collate = em_collate_pad,
                                                         .collate_ctx = pc});
    CHECK_NOTNULL(l);
    return l;
}

/* One epoch: every batch checked; the ids seen in order into seen. */
static int epoch(em_loader *l, int64_t multiple, bool label_only, int64_t *seen)
{
    int k = 0;
    em_batch b;
    for (;;) {
        em_scope s = em_scope_begin();
        int got = em_loader_next(l, &b);
        CHECK(got >= 0);
        if (got > 0) {
            check_padded(&b, multiple, label_only, seen + k);
            k += (int)b.size;
        }
        em_scope_end(s);
        if (got <= 0) break;
    }
    CHECK_OK(em_last_status());
    return k;
}

/* ---- padding ----------------------------------------------------------------------- */

TEST(test_collate_pad_pads_each_batch_to_its_longest_with_a_mask)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true};
    em_loader *l = pad_loader(&ds, 3, false, 0, &pc);
    int64_t want_L[] = {7, 6, 1}; /* lengths 3 7 5 | 2 6 4 | 1 */
    for (int k = 0; k < 3; k++) {
        em_scope s = em_scope_begin();
        em_batch b;
        CHECK(em_loader_next(l, &b) == 1);
        CHECK(em_shape(b.x)[1] == want_L[k]);
        int64_t ids[3];
        check_padded(&b, 0, false, ids);
        for (int r = 0; r < b.size; r++) CHECK(ids[r] == 3 * k + r);
        em_scope_end(s);
    }
    em_loader_free(l);
}

/* em_pad_defaults pads labels with -100, the loss's ignore_index */
TEST(test_collate_pad_defaults_pad_labels_with_the_ignore_index)
{
    em_pad_config pc = em_pad_defaults();
    CHECK(pc.y_pad == EM_IGNORE_INDEX && pc.x_pad == 0 && !pc.pad_y && pc.multiple == 0 &&
          pc.mask_dtype == EM_F32);
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    pc.pad_y = true;
    em_loader *l = pad_loader(&ds, 3, false, 0, &pc);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1);
    int64_t ids[3];
    check_padded(&b, 0, false, ids); /* y's padding is -100 */
    em_scope_end(s);
    em_loader_free(l);
}

static void shuffled_epochs(int prefetch)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true};
    em_loader *l = pad_loader(&ds, 2, true, prefetch, &pc);
    for (int e = 0; e < 2; e++) {
        int64_t seen[N];
        CHECK(epoch(l, 0, false, seen) == N);
        bool hit[N] = {false};
        for (int k = 0; k < N; k++) hit[seen[k]] = true;
        for (int k = 0; k < N; k++) CHECK(hit[k]);
    }
    em_loader_free(l);
}

TEST(test_collate_pad_batches_shuffled_epochs_without_prefetch) { shuffled_epochs(0); }
TEST(test_collate_pad_batches_shuffled_epochs_on_the_prefetch_thread) { shuffled_epochs(2); }

TEST(test_collate_pad_gives_the_same_batches_with_and_without_prefetch)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true};
    em_loader *a = pad_loader(&ds, 3, true, 0, &pc), *b = pad_loader(&ds, 3, true, 3, &pc);
    int64_t sa[2 * N], sb[2 * N];
    CHECK(epoch(a, 0, false, sa) == N && epoch(a, 0, false, sa + N) == N);
    CHECK(epoch(b, 0, false, sb) == N && epoch(b, 0, false, sb + N) == N);
    for (int k = 0; k < 2 * N; k++) CHECK(sa[k] == sb[k]);
    em_loader_free(a);
    em_loader_free(b);
}

TEST(test_collate_pad_rounds_the_length_up_to_a_multiple)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true, .multiple = 4};
    em_loader *l = pad_loader(&ds, 3, false, 0, &pc);
    int64_t want_L[] = {8, 8, 4};
    for (int k = 0; k < 3; k++) {
        em_scope s = em_scope_begin();
        em_batch b;
        CHECK(em_loader_next(l, &b) == 1);
        CHECK(em_shape(b.x)[1] == want_L[k]);
        int64_t ids[3];
        check_padded(&b, 4, false, ids);
        em_scope_end(s);
    }
    em_loader_free(l);
}

TEST(test_collate_pad_stacks_fixed_labels_and_uses_the_pad_value)
{
    seqs d = {.label_only = true, .bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.x_pad = 7, .mask_dtype = EM_I32};
    em_loader *l = pad_loader(&ds, 4, false, 0, &pc);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1); /* examples 0..3, lengths 3 7 5 2 */
    CHECK(em_shape(b.x)[1] == 7 && em_ndim(b.y) == 1 && em_dtype_of(b.mask) == EM_I32);
    const int32_t *x = em_data(b.x), *m = em_data(b.mask), *y = em_data(b.y);
    CHECK(x[3 * 7 + 1] == 32 && x[3 * 7 + 2] == 7 && x[0 * 7 + 6] == 7); /* example 3: 31 32, then pad 7 */
    CHECK(m[3 * 7 + 1] == 1 && m[3 * 7 + 2] == 0 && m[1 * 7 + 6] == 1);
    for (int r = 0; r < 4; r++) CHECK(y[r] == r);
    em_scope_end(s);
    em_loader_free(l);
}

TEST(test_collate_pad_shards_at_world_2_each_rank_padding_its_own_batch)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true};
    em_loader *r0 = pad_loader(&ds, 2, false, 0, &pc), *r1 = pad_loader(&ds, 2, false, 2, &pc);
    CHECK_OK(em_loader_set_shard(r0, 0, 2, false, true));
    CHECK_OK(em_loader_set_shard(r1, 1, 2, false, true));
    /* global batches of 4: {0 1 | 2 3}, {4 5 | 6 0(padding)} */
    int64_t want[2][2][2] = {{{0, 1}, {2, 3}}, {{4, 5}, {6, 0}}};
    int64_t want_L[2][2] = {{7, 5}, {6, 3}};
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 2; r++) {
            em_scope s = em_scope_begin();
            em_batch b;
            CHECK(em_loader_next(r ? r1 : r0, &b) == 1);
            int64_t ids[2];
            check_padded(&b, 0, false, ids);
            CHECK(b.size == 2 && ids[0] == want[k][r][0] && ids[1] == want[k][r][1]);
            CHECK(em_shape(b.x)[1] == want_L[k][r]);
            em_scope_end(s);
        }
    em_batch b;
    CHECK(em_loader_next(r0, &b) == 0 && em_loader_next(r1, &b) == 0);
    em_loader_free(r0);
    em_loader_free(r1);
}

/* ---- the dataset side -------------------------------------------------------------- */

TEST(test_dataset_get_gives_an_example_at_its_length)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_tensor *x, *y;
    CHECK_OK(em_dataset_get(&ds, 1, &x, &y));
    CHECK(em_ndim(x) == 1 && em_shape(x)[0] == 7 && em_shape(y)[0] == 7);
    CHECK(((int32_t *)em_data(x))[6] == 17 && ((int32_t *)em_data(y))[0] == 111);
    em_free(x);
    em_free(y);
}

TEST(test_loader_refuses_a_variable_length_dataset_without_a_collate)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    CHECK_ERR(em_loader_new(&ds, &(em_loader_config){.batch_size = 2}), EM_ERR_ARG,
              "variable-length examples (lengths is set): give the config a collate");
}

static void length_out_of_range(int prefetch)
{
    seqs d = {.bad_len_at = 4};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.pad_y = true};
    em_loader *l = pad_loader(&ds, 3, false, prefetch, &pc);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1);
    CHECK_ERR(em_loader_next(l, &b), EM_ERR_ARG,
              "em_loader_next: example 4 has lengths x 9, y 6; its fields allow x in [0, 8], y in [0, 8]");
    CHECK(b.x == NULL && b.mask == NULL);
    CHECK(em_loader_position(l).batch == 1);
    em_scope_end(s);
    em_loader_free(l);
}

TEST(test_loader_reports_a_length_out_of_range_without_prefetch) { length_out_of_range(0); }
TEST(test_loader_reports_a_length_out_of_range_from_the_prefetch_thread) { length_out_of_range(2); }

TEST(test_collate_pad_refuses_ragged_labels_without_pad_y)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_loader *l = pad_loader(&ds, 2, false, 0, NULL);
    em_batch b;
    CHECK_ERR(em_loader_next(l, &b), EM_ERR_SHAPE,
              "em_collate_pad: example 0 (batch row 0) has y length 3, not y_field's 8: set pad_y");
    em_loader_free(l);
}

/* ---- a failing collate --------------------------------------------------------------- */

/* Fails its first `fail` calls (after making a persistent x), then pads. */
typedef struct flaky {
    int fail;
    em_pad_config pad;
} flaky;

static em_status flaky_collate(void *ctx, const em_dataset *ds, int64_t n, const em_example *ex,
                               em_batch *out)
{
    flaky *f = ctx;
    if (f->fail > 0) {
        f->fail--;
        out->x = em_zeros(EM_F32, 1, (int64_t[]){n});
        return em_set_error(EM_ERR_IO, "flaky_collate: cannot build batch of %lld", (long long)n);
    }
    return em_collate_pad(&f->pad, ds, n, ex, out);
}

static void collate_fails(int prefetch)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    flaky f = {.fail = 2, .pad = {.y_pad = -100, .pad_y = true}};
    em_loader *l = em_loader_new(
        &ds, &(em_loader_config){
                 .batch_size = 3, .prefetch = prefetch, .collate = flaky_collate, .collate_ctx = &f});
    CHECK_NOTNULL(l);
    int64_t live = em_live_tensors();
    em_batch b;
    /* no scope open: the failed collate's persistent x must be freed */
    CHECK_ERR(em_loader_next(l, &b), EM_ERR_IO, "flaky_collate: cannot build batch of 3");
    CHECK(b.x == NULL && em_loader_position(l).batch == 0);
    CHECK_ERR(em_loader_next(l, &b), EM_ERR_IO, "flaky_collate");
    CHECK(em_live_tensors() == live);
    /* the retry gives batch 0 */
    CHECK(em_loader_next(l, &b) == 1);
    int64_t ids[3];
    check_padded(&b, 0, false, ids);
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && em_loader_position(l).batch == 1);
    em_free(b.x);
    em_free(b.y);
    em_free(b.mask);
    CHECK(em_live_tensors() == live);
    em_loader_free(l);
}

TEST(test_loader_collate_failure_fails_next_frees_its_tensors_and_retries_without_prefetch)
{
    collate_fails(0);
}
TEST(test_loader_collate_failure_fails_next_frees_its_tensors_and_retries_with_prefetch) { collate_fails(2); }

static em_status lazy_collate(void *ctx, const em_dataset *ds, int64_t n, const em_example *ex, em_batch *out)
{
    (void)ctx, (void)ds, (void)n, (void)ex, (void)out;
    return EM_OK;
}

TEST(test_loader_refuses_a_collate_that_makes_no_x)
{
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 3, .collate = lazy_collate});
    em_batch b;
    CHECK_ERR(em_loader_next(l, &b), EM_ERR_ARG, "the collate returned EM_OK but made no x");
    em_loader_free(l);
}

/* ---- through the Accelerator onto a device ------------------------------------------- */

TEST(test_accel_next_moves_the_collates_mask_to_the_device_with_x_and_y)
{
    CUDA_OR_SKIP();
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.device = "cuda"});
    CHECK_NOTNULL(a);
    seqs d = {.bad_len_at = -1};
    em_dataset ds = seq_dataset(&d);
    em_pad_config pc = {.y_pad = -100, .pad_y = true};
    em_loader *l = pad_loader(&ds, 3, false, 0, &pc);
    CHECK_OK(em_accel_prepare(a, NULL, NULL, l, NULL));
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_accel_next(a, &b) == 1);
    CHECK(em_device_of(b.x).type == EM_CUDA && em_device_of(b.y).type == EM_CUDA);
    CHECK(em_device_of(b.mask).type == EM_CUDA);
    b.x = ct_on_cpu(b.x);
    b.y = ct_on_cpu(b.y);
    b.mask = ct_on_cpu(b.mask);
    int64_t ids[3];
    check_padded(&b, 0, false, ids);
    em_scope_end(s);
    em_loader_free(l);
    em_accelerator_free(a);
}
