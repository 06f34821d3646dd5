/* test_shard.c — sharding data over ranks: the loader's distributed sampler
 * (disjoint chunks of each global batch, split_batches, even_batches padding,
 * drop_last, per-epoch reshuffle, prefetch and seek) and the sharded
 * random-window sampler. Sharding is arithmetic on (seed, epoch, rank,
 * world), so each test builds one loader per rank in this one process and
 * compares them with an unsharded loader. */
#include "harness.h"

/* ---- a dataset of indices: x = (i, -i) f32, y = i as a 0-dim i32 -------------------- */

static int64_t ids_len(void *user) { return *(int64_t *)user; }

static em_status ids_get(void *user, int64_t i, void *x, void *y)
{
    (void)user;
    float *px = x;
    px[0] = (float)i;
    px[1] = (float)-i;
    *(int32_t *)y = (int32_t)i;
    return EM_OK;
}

static em_dataset ids_dataset(int64_t *n)
{
    return (em_dataset){ids_len, ids_get, NULL, n, {EM_F32, 1, {2}}, {EM_I32, 0, {0}}, NULL};
}

#define MAXB 64   /* batches per epoch in these tests */
#define MAXN 1024 /* example ids per epoch */

/* What one rank (or an unsharded loader) yields in an epoch. */
typedef struct epoch_rec {
    int nb;                  /* batches */
    int64_t size[MAXB];      /* each batch's size */
    int32_t ids[MAXB][MAXN]; /* each batch's example ids (its y) */
} epoch_rec;

/* Runs one epoch of l into *r: batches until em_loader_next returns 0
 * (the epoch end, with no error). Checks x against y as it goes. */
static void run_epoch(em_loader *l, epoch_rec *r)
{
    r->nb = 0;
    for (;;) {
        em_scope s = em_scope_begin();
        em_batch b;
        int got = em_loader_next(l, &b);
        if (got <= 0) {
            CHECK(got == 0 && em_last_status() == EM_OK);
            em_scope_end(s);
            return;
        }
        CHECK(r->nb < MAXB && b.size >= 1 && b.size <= MAXN);
        CHECK(em_size(b.x, 0) == b.size && em_size(b.y, 0) == b.size);
        float x[2 * MAXN];
        CHECK_OK(em_to_array(b.y, EM_I32, r->ids[r->nb]));
        CHECK_OK(em_to_array(b.x, EM_F32, x));
        for (int64_t j = 0; j < b.size; j++) CHECK(x[2 * j] == (float)r->ids[r->nb][j]);
        r->size[r->nb++] = b.size;
        em_scope_end(s);
    }
}

static em_loader *new_loader(int64_t *n, em_dataset *ds, int64_t B, bool drop_last, int prefetch)
{
    *ds = ids_dataset(n);
    em_loader *l = em_loader_new(ds, &(em_loader_config){B, true, 1234, drop_last, prefetch, NULL, NULL});
    CHECK_NOTNULL(l);
    return l;
}

/* One loader per rank of world over the same dataset, each sharded. */
static void new_ranks(em_loader **ranks, int world, em_dataset *ds, int64_t B, bool drop_last, int prefetch,
                      bool split, bool even)
{
    for (int r = 0; r < world; r++) {
        ranks[r] = em_loader_new(ds, &(em_loader_config){B, true, 1234, drop_last, prefetch, NULL, NULL});
        CHECK_NOTNULL(ranks[r]);
        CHECK_OK(em_loader_set_shard(ranks[r], r, world, split, even));
    }
}

static void free_ranks(em_loader **ranks, int world)
{
    for (int r = 0; r < world; r++) em_loader_free(ranks[r]);
}

/* One epoch of every rank gathered per global batch, in rank order: the
 * ids of global batch g into g->ids[g] (ranks without a batch g add
 * nothing). */
static void gather_epoch(em_loader **ranks, int world, epoch_rec *g)
{
    static epoch_rec per[4];
    CHECK(world <= 4);
    g->nb = 0;
    for (int r = 0; r < world; r++) {
        run_epoch(ranks[r], &per[r]);
        if (per[r].nb > g->nb) g->nb = per[r].nb;
    }
    for (int b = 0; b < g->nb; b++) {
        g->size[b] = 0;
        for (int r = 0; r < world; r++) {
            if (b >= per[r].nb) continue;
            memcpy(g->ids[b] + g->size[b], per[r].ids[b], (size_t)per[r].size[b] * sizeof(int32_t));
            g->size[b] += per[r].size[b];
        }
    }
}

static bool same_epochs(const epoch_rec *a, const epoch_rec *b)
{
    if (a->nb != b->nb) return false;
    for (int i = 0; i < a->nb; i++)
        if (a->size[i] != b->size[i] || memcmp(a->ids[i], b->ids[i], (size_t)a->size[i] * sizeof(int32_t)))
            return false;
    return true;
}

/* The epoch's order: an unsharded loader with one batch of all n. */
static void epoch_order(int64_t n, int epoch, int32_t *order)
{
    int64_t nn = n;
    em_dataset ds;
    em_loader *l = new_loader(&nn, &ds, n, false, 0);
    CHECK_OK(em_loader_seek(l, (em_loader_pos){epoch, 0}));
    static epoch_rec r;
    run_epoch(l, &r);
    CHECK(r.nb == 1 && r.size[0] == n);
    memcpy(order, r.ids[0], (size_t)n * sizeof(int32_t));
    em_loader_free(l);
}

static epoch_rec got_, want_, other_;

/* ---- the loader's distributed sampler ------------------------------------------------- */

TEST(test_shard_ranks_are_disjoint_and_cover_the_epoch_once)
{
    int64_t n = 24; /* 2 global batches of 3 * 4: no padding */
    em_dataset ds = ids_dataset(&n);
    em_loader *ranks[4];
    new_ranks(ranks, 4, &ds, 3, false, 0, false, true);
    int seen[24] = {0};
    for (int r = 0; r < 4; r++) {
        CHECK(em_loader_num_batches(ranks[r]) == 2 && em_loader_padding(ranks[r]) == 0);
        run_epoch(ranks[r], &got_);
        CHECK(got_.nb == 2);
        for (int b = 0; b < got_.nb; b++)
            for (int64_t j = 0; j < got_.size[b]; j++) seen[got_.ids[b][j]]++;
    }
    for (int i = 0; i < 24; i++) CHECK(seen[i] == 1);
    free_ranks(ranks, 4);
}

TEST(test_shard_split_batches_chunks_concatenate_to_the_world1_batch)
{
    int64_t n = 30; /* global batches 12, 12, 6: rank 1 has nothing in the last */
    em_dataset ds;
    em_loader *one = new_loader(&n, &ds, 12, false, 0);
    em_loader *ranks[2];
    new_ranks(ranks, 2, &ds, 12, false, 0, true, false);
    CHECK(em_loader_num_batches(ranks[0]) == 3 && em_loader_num_batches(ranks[1]) == 2);
    gather_epoch(ranks, 2, &got_);
    run_epoch(one, &want_);
    CHECK(want_.nb == 3 && same_epochs(&got_, &want_));
    em_loader_free(one);
    free_ranks(ranks, 2);
}

TEST(test_shard_batch_6_over_2_ranks_concatenates_to_the_world1_batch_12)
{
    int64_t n = 30;
    em_dataset ds;
    em_loader *one = new_loader(&n, &ds, 12, false, 0);
    em_loader *ranks[2];
    new_ranks(ranks, 2, &ds, 6, false, 0, false, false);
    gather_epoch(ranks, 2, &got_);
    run_epoch(one, &want_);
    CHECK(want_.nb == 3 && same_epochs(&got_, &want_));
    em_loader_free(one);
    free_ranks(ranks, 2);
}

TEST(test_shard_even_batches_pads_the_last_global_batch_from_the_epoch_start)
{
    int64_t n = 26; /* G = 4 * 3 = 12: 12, 12, then 2 + 10 padding */
    em_dataset ds = ids_dataset(&n);
    em_loader *ranks[3];
    new_ranks(ranks, 3, &ds, 4, false, 0, false, true);
    for (int r = 0; r < 3; r++) {
        CHECK(em_loader_num_batches(ranks[r]) == 3);
        CHECK(em_loader_padding(ranks[r]) == 10);
    }
    gather_epoch(ranks, 3, &got_);
    for (int b = 0; b < 3; b++) CHECK(got_.size[b] == 12); /* every rank's batches are full */
    int32_t order[26];
    epoch_order(26, 0, order);
    for (int k = 0; k < 36; k++) CHECK(got_.ids[k / 12][k % 12] == order[k % 26]);
    free_ranks(ranks, 3);
}

TEST(test_shard_even_batches_wraps_repeatedly_when_the_epoch_is_shorter_than_a_global_batch)
{
    int64_t n = 3; /* G = 4 * 2 = 8: 3 examples + 5 padding */
    em_dataset ds = ids_dataset(&n);
    em_loader *ranks[2];
    new_ranks(ranks, 2, &ds, 4, false, 0, false, true);
    CHECK(em_loader_padding(ranks[0]) == 5 && em_loader_padding(ranks[1]) == 5);
    gather_epoch(ranks, 2, &got_);
    int32_t order[3];
    epoch_order(3, 0, order);
    CHECK(got_.nb == 1 && got_.size[0] == 8);
    for (int k = 0; k < 8; k++) CHECK(got_.ids[0][k] == order[k % 3]);
    free_ranks(ranks, 2);
}

TEST(test_shard_without_even_batches_ranks_get_the_leftovers)
{
    int64_t n = 30; /* G = 12: 12, 12, then 6 = rank 0's 4 + rank 1's 2, rank 2 nothing */
    em_dataset ds;
    em_loader *one = new_loader(&n, &ds, 12, false, 0);
    em_loader *ranks[3];
    new_ranks(ranks, 3, &ds, 4, false, 0, false, false);
    static epoch_rec per[3];
    int64_t want_last[3] = {4, 2, 0};
    for (int r = 0; r < 3; r++) {
        CHECK(em_loader_padding(ranks[r]) == 0);
        CHECK(em_loader_num_batches(ranks[r]) == (want_last[r] ? 3 : 2));
        run_epoch(ranks[r], &per[r]);
        CHECK(per[r].nb == (want_last[r] ? 3 : 2));
        if (want_last[r]) CHECK(per[r].size[2] == want_last[r]);
    }
    run_epoch(one, &want_);
    CHECK(want_.size[2] == 6);
    CHECK(memcmp(per[0].ids[2], want_.ids[2], 4 * sizeof(int32_t)) == 0);
    CHECK(memcmp(per[1].ids[2], want_.ids[2] + 4, 2 * sizeof(int32_t)) == 0);
    em_loader_free(one);
    free_ranks(ranks, 3);
}

TEST(test_shard_drop_last_drops_the_short_global_batch)
{
    int64_t n = 26; /* G = 12: the last global batch of 2 is dropped, even_batches or not */
    em_dataset ds;
    em_loader *one = new_loader(&n, &ds, 12, true, 0);
    em_loader *ranks[3];
    new_ranks(ranks, 3, &ds, 4, true, 0, false, true);
    for (int r = 0; r < 3; r++)
        CHECK(em_loader_num_batches(ranks[r]) == 2 && em_loader_padding(ranks[r]) == 0);
    gather_epoch(ranks, 3, &got_);
    run_epoch(one, &want_);
    CHECK(want_.nb == 2 && same_epochs(&got_, &want_));
    em_loader_free(one);
    free_ranks(ranks, 3);
}

TEST(test_shard_each_epoch_reshuffles_identically_on_all_ranks)
{
    int64_t n = 30;
    em_dataset ds;
    em_loader *one = new_loader(&n, &ds, 12, false, 0);
    em_loader *ranks[2];
    new_ranks(ranks, 2, &ds, 6, false, 0, false, false);
    for (int e = 0; e < 3; e++) {
        gather_epoch(ranks, 2, &got_);
        run_epoch(one, &want_);
        CHECK(same_epochs(&got_, &want_));
        if (e > 0) CHECK(!same_epochs(&got_, &other_)); /* a new order */
        other_ = got_;
    }
    CHECK(em_loader_position(ranks[0]).epoch == 3 && em_loader_position(ranks[1]).epoch == 3);
    em_loader_free(one);
    free_ranks(ranks, 2);
}

TEST(test_shard_prefetch_yields_the_same_batches_as_no_prefetch)
{
    int64_t n = 26;
    em_dataset ds = ids_dataset(&n);
    em_loader *plain[3], *pre[3];
    new_ranks(plain, 3, &ds, 4, false, 0, false, true);
    new_ranks(pre, 3, &ds, 4, false, 2, false, true);
    for (int e = 0; e < 2; e++)
        for (int r = 0; r < 3; r++) {
            run_epoch(plain[r], &want_);
            run_epoch(pre[r], &got_);
            CHECK(want_.nb == 3 && same_epochs(&got_, &want_));
        }
    free_ranks(plain, 3);
    free_ranks(pre, 3);
}

TEST(test_shard_seek_mid_epoch_resumes_exactly)
{
    int64_t n = 26;
    em_dataset ds = ids_dataset(&n);
    em_loader *whole[3], *resumed[3];
    new_ranks(whole, 3, &ds, 4, false, 2, false, false);
    new_ranks(resumed, 3, &ds, 4, false, 2, false, false);
    for (int r = 0; r < 3; r++) {
        run_epoch(whole[r], &want_); /* epoch 0 */
        run_epoch(whole[r], &want_); /* epoch 1, the one resumed at batch 1 */
        CHECK_OK(em_loader_seek(resumed[r], (em_loader_pos){1, 1}));
        run_epoch(resumed[r], &got_);
        CHECK(got_.nb == want_.nb - 1);
        for (int b = 0; b < got_.nb; b++) {
            CHECK(got_.size[b] == want_.size[b + 1]);
            CHECK(memcmp(got_.ids[b], want_.ids[b + 1], (size_t)got_.size[b] * sizeof(int32_t)) == 0);
        }
        em_loader_pos p = em_loader_position(resumed[r]);
        CHECK(p.epoch == 2 && p.batch == 0);
    }
    free_ranks(whole, 3);
    free_ranks(resumed, 3);
}

TEST(test_shard_position_counts_this_ranks_batches)
{
    int64_t n = 30; /* rank 2 of 3 has 2 batches an epoch */
    em_dataset ds = ids_dataset(&n);
    em_loader *ranks[3];
    new_ranks(ranks, 3, &ds, 4, false, 0, false, false);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(ranks[2], &b) == 1 && em_loader_next(ranks[2], &b) == 1);
    em_loader_pos p = em_loader_position(ranks[2]);
    CHECK(p.epoch == 0 && p.batch == 2);
    CHECK(em_loader_next(ranks[2], &b) == 0 && em_last_status() == EM_OK);
    CHECK_ERR(em_loader_seek(ranks[2], (em_loader_pos){0, 3}), EM_ERR_ARG, "[0, 2]");
    em_scope_end(s);
    free_ranks(ranks, 3);
}

TEST(test_shard_takes_effect_at_a_later_epoch_start)
{
    int64_t n = 24;
    em_dataset ds;
    em_loader *l = new_loader(&n, &ds, 4, false, 1);
    run_epoch(l, &got_); /* epoch 0 unsharded; now at {1, 0} */
    CHECK(got_.nb == 6);
    CHECK_OK(em_loader_set_shard(l, 1, 2, false, true));
    CHECK(em_loader_num_batches(l) == 3);
    run_epoch(l, &got_);
    int32_t order[24];
    epoch_order(24, 1, order);
    for (int b = 0; b < 3; b++) CHECK(memcmp(got_.ids[b], order + b * 8 + 4, 4 * sizeof(int32_t)) == 0);
    em_loader_free(l);
}

TEST(test_shard_world_1_is_the_plain_loader)
{
    int64_t n = 26; /* a ragged last batch of 2: kept as it is, even_batches or not */
    em_dataset ds;
    em_loader *plain = new_loader(&n, &ds, 4, false, 0);
    em_loader *one = new_loader(&n, &ds, 4, false, 0);
    CHECK_OK(em_loader_set_shard(one, 0, 1, true, true));
    CHECK(em_loader_padding(one) == 0 && em_loader_num_batches(one) == 7);
    run_epoch(plain, &want_);
    run_epoch(one, &got_);
    CHECK(same_epochs(&got_, &want_) && got_.size[6] == 2);
    em_loader_free(plain);
    em_loader_free(one);
}

TEST(test_shard_world_1_restores_an_unsharded_loader)
{
    int64_t n = 26;
    em_dataset ds;
    em_loader *plain = new_loader(&n, &ds, 4, false, 0);
    em_loader *l = new_loader(&n, &ds, 4, false, 0);
    CHECK_OK(em_loader_set_shard(l, 1, 3, false, true));
    CHECK_OK(em_loader_set_shard(l, 0, 1, false, false));
    run_epoch(plain, &want_);
    run_epoch(l, &got_);
    CHECK(same_epochs(&got_, &want_));
    em_loader_free(plain);
    em_loader_free(l);
}

TEST(test_shard_rejects_rank_outside_world)
{
    int64_t n = 10;
    em_dataset ds;
    em_loader *l = new_loader(&n, &ds, 4, false, 0);
    CHECK_ERR(em_loader_set_shard(l, 2, 2, false, true), EM_ERR_ARG, "rank 2 outside [0, world 2)");
    CHECK_ERR(em_loader_set_shard(l, -1, 2, false, true), EM_ERR_ARG, "rank -1 outside [0, world 2)");
    CHECK_ERR(em_loader_set_shard(l, 0, 0, false, true), EM_ERR_ARG, "rank 0 outside [0, world 0)");
    CHECK_ERR(em_loader_set_shard(NULL, 0, 1, false, true), EM_ERR_ARG, "em_loader_set_shard");
    CHECK(em_loader_num_batches(l) == 3); /* unchanged */
    em_loader_free(l);
}

TEST(test_shard_rejects_split_batches_with_batch_size_not_divisible_by_world)
{
    int64_t n = 30;
    em_dataset ds;
    em_loader *l = new_loader(&n, &ds, 10, false, 0);
    CHECK_ERR(em_loader_set_shard(l, 0, 3, true, true), EM_ERR_ARG, "batch_size 10, world 3");
    CHECK(em_loader_num_batches(l) == 3);
    CHECK_OK(em_loader_set_shard(l, 0, 3, false, true)); /* without split: G = 30 */
    CHECK(em_loader_num_batches(l) == 1);
    em_loader_free(l);
}

TEST(test_shard_rejects_a_loader_mid_epoch)
{
    int64_t n = 10;
    em_dataset ds;
    em_loader *l = new_loader(&n, &ds, 4, false, 1);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1);
    CHECK_ERR(em_loader_set_shard(l, 0, 2, false, true), EM_ERR_ARG, "{epoch 0, batch 1}");
    CHECK(em_loader_num_batches(l) == 3);
    CHECK(em_loader_next(l, &b) == 1 && b.size == 4); /* still the unsharded epoch */
    em_scope_end(s);
    em_loader_free(l);
}

/* ---- the sharded random-window sampler ------------------------------------------------------ */

/* world ranks with B / world windows each draw, over several calls, exactly
 * the windows (x and y) of one sampler with B, and advance rng.offset alike. */
static void check_window_shards(int world)
{
    enum { N = 500, T = 8, B = 12, CALLS = 3 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % 1000;
    em_tokens t = em_tokens_view(tok, N, EM_TOK_I32);
    em_window_sampler one, ranks[3];
    CHECK_OK(em_window_sampler_init(&one, &t, B, T, 42));
    for (int r = 0; r < world; r++) {
        CHECK_OK(em_window_sampler_init(&ranks[r], &t, B, T, 42));
        CHECK_OK(em_window_sampler_shard(&ranks[r], r, world));
    }
    for (int c = 0; c < CALLS; c++) {
        em_scope s = em_scope_begin();
        em_batch want, got;
        CHECK_OK(em_window_sampler_next(&one, &want));
        int32_t wx[B * T], wy[B * T], gx[B * T], gy[B * T];
        CHECK_OK(em_to_array(want.x, EM_I32, wx));
        CHECK_OK(em_to_array(want.y, EM_I32, wy));
        for (int r = 0; r < world; r++) {
            CHECK_OK(em_window_sampler_next(&ranks[r], &got));
            int bl = B / world;
            CHECK(got.size == bl && em_size(got.x, 0) == bl && em_size(got.y, 0) == bl);
            CHECK(em_size(got.x, 1) == T);
            CHECK_OK(em_to_array(got.x, EM_I32, gx + r * bl * T));
            CHECK_OK(em_to_array(got.y, EM_I32, gy + r * bl * T));
            CHECK(ranks[r].rng.offset == one.rng.offset);
        }
        CHECK(memcmp(gx, wx, sizeof wx) == 0 && memcmp(gy, wy, sizeof wy) == 0);
        em_scope_end(s);
    }
    CHECK(one.rng.offset == CALLS * B);
}

TEST(test_window_sampler_2_ranks_draw_the_windows_of_one_sampler) { check_window_shards(2); }

TEST(test_window_sampler_3_ranks_draw_the_windows_of_one_sampler) { check_window_shards(3); }

TEST(test_window_sampler_shard_rejects_bad_rank_and_indivisible_batch)
{
    int32_t tok[64] = {0};
    em_tokens t = em_tokens_view(tok, 64, EM_TOK_I32);
    em_window_sampler ws;
    CHECK_OK(em_window_sampler_init(&ws, &t, 12, 8, 0));
    CHECK(ws.rank == 0 && ws.world == 1);
    CHECK_ERR(em_window_sampler_shard(&ws, 3, 3), EM_ERR_ARG, "rank 3 outside [0, world 3)");
    CHECK_ERR(em_window_sampler_shard(&ws, 0, 0), EM_ERR_ARG, "rank 0 outside [0, world 0)");
    CHECK_ERR(em_window_sampler_shard(&ws, 0, 5), EM_ERR_ARG, "batch 12 is not divisible by world 5");
    CHECK(ws.rank == 0 && ws.world == 1); /* unchanged */
    CHECK_ERR(em_window_sampler_shard(NULL, 0, 1), EM_ERR_ARG, "em_window_sampler_shard");
}

TEST(test_window_sampler_next_rejects_a_bad_shard_set_by_hand)
{
    int32_t tok[64] = {0};
    em_tokens t = em_tokens_view(tok, 64, EM_TOK_I32);
    em_window_sampler ws;
    CHECK_OK(em_window_sampler_init(&ws, &t, 12, 8, 0));
    ws.world = 5;
    em_batch b;
    CHECK_ERR(em_window_sampler_next(&ws, &b), EM_ERR_ARG, "rank 0 of world 5 with batch 12");
    CHECK(b.x == NULL && ws.rng.offset == 0);
}
