/* test_collectives_shm.c — the shared-memory all_reduce element by element:
 * sizes at the edges of its paths (one element, odd counts, the tiny path's
 * limit, piece and accumulator-block boundaries, many pieces with a short
 * last one) in every dtype and op for 2, 3 and 4 ranks; f32 sums that are
 * bitwise the rank-order sum on every rank; and calls back to back, with
 * nothing between them, reusing the segment's halves. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_util.h"
#include "harness.h"

static const em_dtype dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32};

/* element i on rank r: a small integer, exact in every dtype, and so are
 * sums of up to 4 of them */
static int ival(int r, int64_t i) { return (int)((r * 7 + i * 3 + i / 1000) % 23) - 9; }

static void put(em_dtype dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_F16: ((uint16_t *)p)[i] = em_f32_to_f16((float)v); break;
    case EM_BF16: ((uint16_t *)p)[i] = em_f32_to_bf16((float)v); break;
    default: ((int32_t *)p)[i] = (int32_t)v;
    }
}

static double get(em_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_F16: return em_f16_to_f32(((const uint16_t *)p)[i]);
    case EM_BF16: return em_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const int32_t *)p)[i];
    }
}

/* What element i of the all_reduce must be: the op over ranks; AVG rounded
 * as the reduction rounds it (the f32 sum divided in f32, then to dt) */
static double expect(em_dtype dt, int op, int world, int64_t i)
{
    int sum = 0, mx = -1000, mn = 1000;
    for (int r = 0; r < world; r++) {
        int v = ival(r, i);
        sum += v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    if (op == EM_RED_SUM) return sum;
    if (op == EM_RED_MAX) return mx;
    if (op == EM_RED_MIN) return mn;
    if (dt == EM_I32) return sum / world;
    if (dt == EM_F64) return (double)sum / world;
    float avg = (float)sum / (float)world;
    return dt == EM_F16    ? em_f16_to_f32(em_f32_to_f16(avg))
           : dt == EM_BF16 ? em_bf16_to_f32(em_f32_to_bf16(avg))
                           : avg;
}

/* every dtype at n elements, every element checked; every op up to the
 * tiny path's limit, sum and avg (the ones with their own f32 loop) beyond */
static void check_n(em_pg *pg, int rank, int world, int64_t n)
{
    int last = n > 16384 ? EM_RED_AVG : EM_RED_MIN;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (int op = EM_RED_SUM; op <= last; op++) {
            em_dtype dt = dtypes[d];
            em_tensor *t = em_empty(dt, 1, &n);
            CHECK_NOTNULL(t);
            for (int64_t i = 0; i < n; i++) put(dt, em_data(t), i, ival(rank, i));
            CHECK_OK(em_all_reduce(pg, t, (em_reduce_op)op, NULL));
            for (int64_t i = 0; i < n; i++) {
                double want = expect(dt, op, world, i), got = get(dt, em_data(t), i);
                if (got != want)
                    th_fail(__FILE__, __LINE__,
                            "all_reduce op %d %s n=%lld world %d rank %d: [%lld] = %g, want %g", op,
                            em_dtype_name(dt), (long long)n, world, rank, (long long)i, got, want);
            }
            em_free(t);
        }
}

/* the tiny path's limit is 16 KiB, the f32 accumulator block 2048
 * elements; up to 1 MiB (262144 f32) is one piece, beyond it pieces are
 * 512 KiB (131072 f32) and the last one short */
static void edges(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    static const int64_t ns[] = {1,    3,     2047,   2049,   4095,
                                 4097, 16384, 131073, 262145, 2 * 131072 + 2 * 65536 + 5};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        th_case("n=%lld", (long long)ns[k]);
        check_n(pg, rank, world, ns[k]);
    }
}

TEST(test_shm_all_reduce_is_exact_at_every_size_edge_world_2) { TH_RANKS(2, EM_TRANSPORT_SHM, edges, NULL); }
TEST(test_shm_all_reduce_is_exact_at_every_size_edge_world_3) { TH_RANKS(3, EM_TRANSPORT_SHM, edges, NULL); }
TEST(test_shm_all_reduce_is_exact_at_every_size_edge_world_4) { TH_RANKS(4, EM_TRANSPORT_SHM, edges, NULL); }

/* a reproducible float for element i of rank r: 24 random bits times 2^-12
 * to 2^11, so that sums of a few of them round, differently in another order */
static float noise(int r, int64_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1) * 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return ldexpf((float)(x >> 40) / (float)(1u << 24) * 2.0f - 1.0f, (int)(x & 31) - 12);
}

/* f32 sums and averages of values that round differently in another order:
 * every rank must hold exactly ((x0 + x1) + x2) + ... (then / world) */
static void rank_order(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    int64_t n = 3 * 131072 + 4097;
    for (int op = EM_RED_SUM; op <= EM_RED_AVG; op++) {
        em_tensor *t = em_empty(EM_F32, 1, &n);
        float *p = em_data(t);
        for (int64_t i = 0; i < n; i++) p[i] = noise(rank, i);
        CHECK_OK(em_all_reduce(pg, t, (em_reduce_op)op, NULL));
        for (int64_t i = 0; i < n; i++) {
            float want = noise(0, i);
            for (int r = 1; r < world; r++) want += noise(r, i);
            if (op == EM_RED_AVG) want /= (float)world;
            if (memcmp(&want, &p[i], sizeof want))
                th_fail(__FILE__, __LINE__, "op %d world %d rank %d: [%lld] = %.9g, want %.9g bitwise", op,
                        world, rank, (long long)i, p[i], want);
        }
        em_free(t);
    }
}

TEST(test_shm_all_reduce_f32_is_the_rank_order_sum_bitwise_world_2)
{
    TH_RANKS(2, EM_TRANSPORT_SHM, rank_order, NULL);
}
/* 3: dividing by the world is not multiplying by its inverse, and the
 * grouping of three terms shows */
TEST(test_shm_all_reduce_f32_is_the_rank_order_sum_bitwise_world_3)
{
    TH_RANKS(3, EM_TRANSPORT_SHM, rank_order, NULL);
}

/* Asynchronous all_reduces of 1, 2 and 3 pieces queued back to back (the
 * communication thread runs them with nothing in between), interleaved with
 * broadcasts, each checked in full: a rank refilling a half that a peer
 * still reads would show here. */
static void back_to_back(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    enum { CALLS = 24 };
    em_tensor *t[CALLS];
    em_work *w[CALLS];
    for (int c = 0; c < CALLS; c++) {
        int64_t n = 131072 * (c % 3) + 65536 + c;
        t[c] = em_empty(EM_F32, 1, &n);
        float *p = em_data(t[c]);
        for (int64_t i = 0; i < n; i++)
            p[i] = (float)(ival(rank, i + c) + (c % 4 == 3 && rank == 0 ? 100 : 0));
        if (c % 4 == 3)
            CHECK_OK(em_broadcast(pg, t[c], 0, &w[c]));
        else
            CHECK_OK(em_all_reduce(pg, t[c], EM_RED_SUM, &w[c]));
    }
    for (int c = 0; c < CALLS; c++) {
        CHECK_OK(em_work_wait(w[c]));
        const float *p = em_data(t[c]);
        int64_t n = em_numel(t[c]);
        for (int64_t i = 0; i < n; i++) {
            double want = c % 4 == 3 ? ival(0, i + c) + 100 : expect(EM_F32, EM_RED_SUM, world, i + c);
            if (p[i] != want)
                th_fail(__FILE__, __LINE__, "call %d world %d rank %d: [%lld] = %g, want %g", c, world, rank,
                        (long long)i, p[i], want);
        }
        em_free(t[c]);
    }
}

TEST(test_shm_all_reduces_back_to_back_are_exact_world_2)
{
    TH_RANKS(2, EM_TRANSPORT_SHM, back_to_back, NULL);
}
TEST(test_shm_all_reduces_back_to_back_are_exact_world_3)
{
    TH_RANKS(3, EM_TRANSPORT_SHM, back_to_back, NULL);
}
