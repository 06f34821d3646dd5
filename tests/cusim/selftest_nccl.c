/* selftest_nccl.c — tests of the emulator's NCCL (nccl.c) on its own, ranks
 * as forked processes (or threads), against the stand-in runtime
 * stub_runtime_for_nccl_tests.c. Built by hand (see the end of this comment);
 * each test is one behaviour, named for it. Every checked result is also
 * hashed into shared memory so the parent can check that all ranks got the
 * same bits.
 *
 *   gcc -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -pthread \
 *       -Itests/cusim -Itests/cusim/include tests/cusim/selftest_nccl.c \
 *       tests/cusim/nccl.c tests/cusim/report.c \
 *       tests/cusim/stub_runtime_for_nccl_tests.c -lm -lrt -o selftest_nccl
 *   ./selftest_nccl            (add -fsanitize=address,undefined to check it)
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "stub_runtime_for_nccl_tests.h"

enum { MAX_WORLD = 4, MAX_HASHES = 512 };

/* Shared with the children: each rank's hashes of its checked results. */
typedef struct shared {
    int nhash[MAX_WORLD];
    uint64_t hash[MAX_WORLD][MAX_HASHES];
} shared;
static shared *sh;
static int my_rank;
static bool child_failed;
static int failures;

static void check_at(bool ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void check_at(bool ok, const char *file, int line, const char *fmt, ...)
{
    if (ok) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  rank %d: %s:%d: ", my_rank, file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    child_failed = true;
}
#define CHECK(ok, ...) check_at((ok), __FILE__, __LINE__, __VA_ARGS__)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void record(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ULL;
    if (sh->nhash[my_rank] < MAX_HASHES) sh->hash[my_rank][sh->nhash[my_rank]++] = h;
}

/* Runs fn on n forked ranks; killed: ranks expected to die by a signal. */
typedef void (*rank_fn)(int rank, int n, ncclUniqueId id);
static void run_ranks(const char *name, int n, rank_fn fn, unsigned killed)
{
    ncclUniqueId id;
    memset(sh, 0, sizeof *sh);
    if (ncclGetUniqueId(&id)) {
        printf("FAIL %s: no unique id\n", name);
        failures++;
        return;
    }
    pid_t pid[MAX_WORLD];
    fflush(stdout);
    for (int r = 0; r < n; r++)
        if ((pid[r] = fork()) == 0) {
            my_rank = r;
            fn(r, n, id);
            fflush(stdout);
            _exit(child_failed ? 1 : 0);
        }
    bool ok = true;
    for (int r = 0; r < n; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        bool want_killed = killed >> r & 1;
        if (want_killed ? !WIFSIGNALED(st) : !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) ok = false;
    }
    for (int r = 1; r < n && ok; r++) {
        if (killed >> r & 1) continue;
        if (sh->nhash[r] != sh->nhash[0]) ok = false;
        for (int k = 0; k < sh->nhash[0] && ok; k++)
            if (sh->hash[r][k] != sh->hash[0][k]) {
                printf("  result #%d differs between rank 0 and rank %d\n", k, r);
                ok = false;
            }
    }
    printf("%s %s (%d ranks)\n", ok ? "ok  " : "FAIL", name, n);
    if (!ok) failures++;
}

static ncclComm_t init(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, n, id, rank);
    CHECK(r == ncclSuccess, "ncclCommInitRank: %s", ncclGetErrorString(r));
    return c;
}

/* ---- element access for the tests (small integers are exact in every type) ---- */

static double half_value(uint16_t h, bool bf)
{
    if (bf) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = h >> 10 & 31, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static uint16_t half_of_int(int v, bool bf) /* |v| < 256: exact in both */
{
    if (bf) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        return (uint16_t)(u >> 16);
    }
    if (v == 0) return 0;
    unsigned a = (unsigned)abs(v), e = 0;
    while (a >> (e + 1)) e++;
    return (uint16_t)((v < 0 ? 0x8000 : 0) | (e + 15) << 10 | ((a << (10 - e)) & 0x3ff));
}

static size_t tsize(ncclDataType_t t)
{
    static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return s[t];
}

static double get(ncclDataType_t t, const void *p, size_t i)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return half_value(((const uint16_t *)p)[i], false);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclBfloat16: return half_value(((const uint16_t *)p)[i], true);
    case ncclNumTypes: break;
    }
    return 0;
}

static void put(ncclDataType_t t, void *p, size_t i, int v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; return;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; return;
    case ncclInt32: ((int32_t *)p)[i] = v; return;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; return;
    case ncclInt64: ((int64_t *)p)[i] = v; return;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; return;
    case ncclFloat16: ((uint16_t *)p)[i] = half_of_int(v, false); return;
    case ncclFloat32: ((float *)p)[i] = (float)v; return;
    case ncclFloat64: ((double *)p)[i] = v; return;
    case ncclBfloat16: ((uint16_t *)p)[i] = half_of_int(v, true); return;
    case ncclNumTypes: break;
    }
}

static bool is_unsigned(ncclDataType_t t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }
static bool is_float(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

/* Rank r's element i: small, so sums and products are exact in every type. */
static int input(ncclDataType_t t, ncclRedOp_t op, int r, size_t i)
{
    int v = op == ncclProd ? (int)((r + i) % 3) - 1 : (int)((r * 3 + i * 7) % 11) - 5;
    return is_unsigned(t) ? v + (op == ncclProd ? 1 : 5) : v;
}

/* ---- tests ----------------------------------------------------------------------------- */

static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

static void all_reduce_every_type_and_op(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    size_t counts[] = {1, 1000, 0};
    for (int t = 0; t < ncclNumTypes; t++) {
        counts[2] = (size_t)7 << 19; /* 3.5 MiB */
        counts[2] /= tsize((ncclDataType_t)t);
        for (int op = 0; op < ncclNumOps; op++)
            for (int k = 0; k < 3; k++) {
                size_t cnt = counts[k], bytes = cnt * tsize((ncclDataType_t)t);
                uint8_t *in = stub_dev_alloc(bytes), *out = (op & 1) ? in : stub_dev_alloc(bytes);
                for (size_t i = 0; i < cnt; i++)
                    put((ncclDataType_t)t, in, i, input((ncclDataType_t)t, (ncclRedOp_t)op, rank, i));
                ncclResult_t r = ncclAllReduce(in, out, cnt, (ncclDataType_t)t, (ncclRedOp_t)op, c, NULL);
                CHECK(r == ncclSuccess, "all_reduce %s %s: %s", op_names[op], "", ncclGetLastError(c));
                int bad = 0;
                for (size_t i = 0; i < cnt && bad < 3; i++) {
                    double want = 0, got = get((ncclDataType_t)t, out, i);
                    for (int q = 0; q < n; q++) {
                        double v = input((ncclDataType_t)t, (ncclRedOp_t)op, q, i);
                        if (q == 0)
                            want = v;
                        else if (op == ncclSum || op == ncclAvg)
                            want += v;
                        else if (op == ncclProd)
                            want *= v;
                        else if (op == ncclMax)
                            want = v > want ? v : want;
                        else
                            want = v < want ? v : want;
                    }
                    bool ok;
                    if (op == ncclAvg && !is_float((ncclDataType_t)t))
                        ok = got == trunc(want / n);
                    else if (op == ncclAvg) {
                        double eps = t == ncclFloat16    ? 0x1p-11
                                     : t == ncclBfloat16 ? 0x1p-8
                                     : t == ncclFloat32  ? 0x1p-24
                                                         : 0x1p-53;
                        ok = fabs(got - want / n) <= fabs(want / n) * eps;
                    } else
                        ok = got == want;
                    if (!ok) {
                        bad++;
                        CHECK(false, "all_reduce %s type %d count %zu: [%zu] = %g, want %g", op_names[op], t,
                              cnt, i, got, op == ncclAvg ? want / n : want);
                    }
                }
                record(out, bytes);
                if (out != in) stub_dev_free(out);
                stub_dev_free(in);
            }
    }
    ncclCommDestroy(c);
}

static void integer_sums_wrap_around(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    int32_t *b = stub_dev_alloc(4);
    *b = INT32_MAX;
    CHECK(!ncclAllReduce(b, b, 1, ncclInt32, ncclSum, c, NULL), "%s", ncclGetLastError(c));
    CHECK(*b == (int32_t)((uint32_t)INT32_MAX * (uint32_t)n), "int32 sum %d", *b);
    stub_dev_free(b);
    ncclCommDestroy(c);
}

/* 2048 + 1 + 1 is 2050 in f16 when rounded once, 2048 when rounded at each step. */
static void half_sums_round_once(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    uint16_t *h = stub_dev_alloc(4);
    h[0] = rank == 0 ? 0x6800 : 0x3c00; /* f16 2048 : 1 */
    h[1] = rank == 0 ? 0x4380 : 0x3f80; /* bf16 256 : 1 */
    CHECK(!ncclAllReduce(h, h, 1, ncclFloat16, ncclSum, c, NULL), "%s", ncclGetLastError(c));
    CHECK(!ncclAllReduce(h + 1, h + 1, 1, ncclBfloat16, ncclSum, c, NULL), "%s", ncclGetLastError(c));
    CHECK(half_value(h[0], false) == 2048 + n - 1, "f16 sum %g", half_value(h[0], false));
    CHECK(half_value(h[1], true) == 256 + n - 1, "bf16 sum %g", half_value(h[1], true));
    stub_dev_free(h);
    ncclCommDestroy(c);
}

/* The mean of two neighbouring halves is a tie: it goes to the even one. */
static void half_averages_round_ties_to_even(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    for (int bf = 0; bf < 2; bf++) {
        /* every finite positive value below the largest (bf16: whose sum does not overflow float) */
        size_t cnt = bf ? 0x7eff : 0x7bff;
        uint16_t *h = stub_dev_alloc(cnt * 2);
        for (size_t i = 0; i < cnt; i++) h[i] = (uint16_t)(i + (size_t)rank);
        CHECK(!ncclAllReduce(h, h, cnt, bf ? ncclBfloat16 : ncclFloat16, ncclAvg, c, NULL), "%s",
              ncclGetLastError(c));
        int bad = 0;
        for (size_t i = 0; i < cnt && bad < 3; i++) {
            uint16_t want = (uint16_t)(i & 1 ? i + 1 : i);
            if (h[i] != want) bad++;
            CHECK(h[i] == want, "%s avg of %#zx and %#zx = %#x, want %#x", bf ? "bf16" : "f16", i, i + 1,
                  h[i], want);
        }
        record(h, cnt * 2);
        stub_dev_free(h);
    }
    ncclCommDestroy(c);
}

static void broadcast_reduce_gather_scatter(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    size_t cnt = 300000; /* 1.2 MB of f32: three pieces */
    float *a = stub_dev_alloc(cnt * n * 4), *b = stub_dev_alloc(cnt * n * 4);
    for (int root = 0; root < n; root += n - 1) { /* in place from rank 0, out of place from the last */
        for (size_t i = 0; i < cnt; i++) a[i] = (float)(rank * 1000 + i % 997);
        float *out = root == 0 ? a : b;
        CHECK(!ncclBroadcast(a, out, cnt, ncclFloat32, root, c, NULL), "%s", ncclGetLastError(c));
        for (size_t i = 0; i < cnt; i++)
            if (out[i] != (float)(root * 1000 + i % 997)) {
                CHECK(false, "broadcast from %d: [%zu] = %g", root, i, out[i]);
                break;
            }
        record(out, cnt * 4);
        if (n == 1) break;
    }
    /* reduce to the last rank: the others' recvbuff untouched */
    double *d = stub_dev_alloc(1000 * 8), *e = stub_dev_alloc(1000 * 8);
    for (int i = 0; i < 1000; i++) d[i] = rank + i * 0.5, e[i] = -1;
    CHECK(!ncclReduce(d, e, 1000, ncclFloat64, ncclSum, n - 1, c, NULL), "%s", ncclGetLastError(c));
    for (int i = 0; i < 1000; i++) {
        double want = rank == n - 1 ? n * (n - 1) / 2.0 + n * i * 0.5 : -1;
        if (e[i] != want) {
            CHECK(false, "reduce: [%d] = %g, want %g", i, e[i], want);
            break;
        }
    }
    /* all_gather, out of place then in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        float *send = inplace ? b + (size_t)rank * cnt : a;
        for (size_t i = 0; i < cnt; i++) send[i] = (float)(rank * 7 + i % 13);
        CHECK(!ncclAllGather(send, b, cnt, ncclFloat32, c, NULL), "%s", ncclGetLastError(c));
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < cnt; i++)
                if (b[q * cnt + i] != (float)(q * 7 + i % 13)) {
                    CHECK(false, "all_gather (in place %d): block %d [%zu] = %g", inplace, q, i,
                          b[q * cnt + i]);
                    q = n;
                    break;
                }
        record(b, cnt * n * 4);
    }
    /* reduce_scatter, out of place then in place: block r of the sum */
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < cnt * n; i++) a[i] = (float)(rank + i % 101);
        float *out = inplace ? a + (size_t)rank * cnt : b;
        CHECK(!ncclReduceScatter(a, out, cnt, ncclFloat32, ncclSum, c, NULL), "%s", ncclGetLastError(c));
        for (size_t i = 0; i < cnt; i++) {
            float want = (float)(n * (n - 1) / 2 + n * (int)((rank * cnt + i) % 101));
            if (out[i] != want) {
                CHECK(false, "reduce_scatter (in place %d): [%zu] = %g, want %g", inplace, i, out[i], want);
                break;
            }
        }
    }
    stub_dev_free(a), stub_dev_free(b), stub_dev_free(d), stub_dev_free(e);
    ncclCommDestroy(c);
}

static void send_recv_ring_in_a_group(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    size_t cnt = 100000; /* 400 KB: four chunks */
    float *s = stub_dev_alloc(cnt * 4), *r = stub_dev_alloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) s[i] = (float)(rank * 100000 + i);
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    ncclGroupStart();
    CHECK(!ncclSend(s, cnt, ncclFloat32, to, c, NULL), "%s", ncclGetLastError(c));
    CHECK(!ncclRecv(r, cnt, ncclFloat32, from, c, NULL), "%s", ncclGetLastError(c));
    CHECK(!ncclGroupEnd(), "group: %s", ncclGetLastError(c));
    for (size_t i = 0; i < cnt; i++)
        if (r[i] != (float)(from * 100000 + i)) {
            CHECK(false, "recv from %d: [%zu] = %g", from, i, r[i]);
            break;
        }
    /* outside a group: 0 sends to 1, which receives */
    if (rank == 0) CHECK(!ncclSend(s, cnt, ncclFloat32, 1, c, NULL), "%s", ncclGetLastError(c));
    if (rank == 1) {
        CHECK(!ncclRecv(r, cnt, ncclFloat32, 0, c, NULL), "%s", ncclGetLastError(c));
        CHECK(r[cnt - 1] == (float)(cnt - 1), "plain recv: %g", r[cnt - 1]);
    }
    stub_dev_free(s), stub_dev_free(r);
    ncclCommDestroy(c);
}

static void expect_usage_error(ncclComm_t c, ncclResult_t r, const char *a, const char *b)
{
    const char *m = ncclGetLastError(c);
    CHECK(r == ncclInvalidUsage, "got %d (%s), want ncclInvalidUsage", r, ncclGetErrorString(r));
    CHECK(strstr(m, a) && strstr(m, b), "message '%s' should name '%s' and '%s'", m, a, b);
}

static void all_reduce_against_broadcast_fails_on_both(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    float *x = stub_dev_alloc(40);
    ncclResult_t r = rank == 0 ? ncclAllReduce(x, x, 10, ncclFloat32, ncclSum, c, NULL)
                               : ncclBroadcast(x, x, 10, ncclFloat32, 0, c, NULL);
    expect_usage_error(c, r, "rank 0 called #0 all_reduce(count=10, float32, sum)",
                       "rank 1 called #0 broadcast(count=10, float32, root=0)");
    r = ncclAllReduce(x, x, 10, ncclFloat32, ncclSum, c, NULL);
    CHECK(r == ncclInvalidUsage && strstr(ncclGetLastError(c), "failed earlier"),
          "a broken comm stays broken: %d", r);
    stub_dev_free(x);
    ncclCommDestroy(c);
}

static void all_reduce_of_different_counts_fails_on_both(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    float *x = stub_dev_alloc(48);
    ncclResult_t r = ncclAllReduce(x, x, rank ? 12 : 10, ncclFloat32, ncclSum, c, NULL);
    expect_usage_error(c, r, "all_reduce(count=10,", "rank 1 called #0 all_reduce(count=12,");
    stub_dev_free(x);
    ncclCommDestroy(c);
}

static void send_and_recv_of_different_counts_fail_on_both(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    float *x = stub_dev_alloc(48);
    ncclResult_t r =
        rank == 0 ? ncclSend(x, 10, ncclFloat32, 1, c, NULL) : ncclRecv(x, 12, ncclFloat32, 0, c, NULL);
    expect_usage_error(c, r, "(count=10, float32)", "(count=12, float32)");
    stub_dev_free(x);
    ncclCommDestroy(c);
    (void)n;
}

static void different_nranks_fail_at_init_on_both(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, rank ? 3 : 2, id, rank);
    CHECK(r == ncclInvalidUsage && !c, "init: %d", r);
    const char *m = ncclGetLastError(NULL);
    CHECK(strstr(m, "nranks=2") && strstr(m, "nranks=3"), "message '%s' should name both", m);
    (void)n;
}

static void dead_peer_fails_fast_naming_it(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    if (rank == n - 1) raise(SIGKILL);
    float *x = stub_dev_alloc(4000);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(x, x, 1000, ncclFloat32, ncclSum, c, NULL);
    double dt = now_s() - t0;
    char want[32];
    snprintf(want, sizeof want, "rank %d", n - 1);
    CHECK(r == ncclRemoteError, "got %d, want ncclRemoteError", r);
    CHECK(strstr(ncclGetLastError(c), want) != NULL, "message '%s' should name %s", ncclGetLastError(c),
          want);
    CHECK(dt < 2, "took %.2f s", dt);
    stub_dev_free(x);
    ncclCommDestroy(c);
}

static void peer_that_never_calls_times_out(int rank, int n, ncclUniqueId id)
{
    setenv("EMBER_CUSIM_NCCL_TIMEOUT", "2", 1);
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    if (rank == n - 1) {
        sleep(5);
        _exit(0);
    }
    float *x = stub_dev_alloc(4000);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(x, x, 1000, ncclFloat32, ncclSum, c, NULL);
    double dt = now_s() - t0;
    char want[32];
    snprintf(want, sizeof want, "rank %d", n - 1);
    CHECK(r == ncclSystemError, "got %d, want ncclSystemError", r);
    CHECK(strstr(ncclGetLastError(c), want) != NULL, "message '%s' should name %s", ncclGetLastError(c),
          want);
    CHECK(dt > 1.9 && dt < 3.5, "took %.2f s", dt);
    stub_dev_free(x);
    ncclCommDestroy(c);
}

static void bad_arguments_are_named(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    float host[4], *dev = stub_dev_alloc(16);
    CHECK(ncclAllReduce(host, dev, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument &&
              strstr(ncclGetLastError(c), "sendbuff") && strstr(ncclGetLastError(c), "not device memory"),
          "host sendbuff: %s", ncclGetLastError(c));
    CHECK(ncclAllReduce(dev, dev, 5, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument &&
              strstr(ncclGetLastError(c), "past the end"),
          "overrun: %s", ncclGetLastError(c));
    CHECK(ncclAllReduce(dev, dev, 4, (ncclDataType_t)42, ncclSum, c, NULL) == ncclInvalidArgument, "dtype");
    CHECK(ncclAllReduce(dev, dev, 4, ncclFloat32, (ncclRedOp_t)9, c, NULL) == ncclInvalidArgument, "op");
    CHECK(ncclBroadcast(dev, dev, 4, ncclFloat32, n, c, NULL) == ncclInvalidArgument &&
              strstr(ncclGetLastError(c), "root"),
          "root: %s", ncclGetLastError(c));
    CHECK(ncclAllReduce(dev, dev, SIZE_MAX / 2, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument,
          "count");
    CHECK(ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument, "NULL comm");
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "group end without start");
    /* nothing above broke the communicator */
    CHECK(!ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, c, NULL), "%s", ncclGetLastError(c));
    int k = -1, v = 0;
    CHECK(!ncclCommCount(c, &k) && k == n, "count %d", k);
    CHECK(!ncclCommUserRank(c, &k) && k == rank, "rank %d", k);
    CHECK(!ncclGetVersion(&v) && v == NCCL_VERSION_CODE && v == 22105, "version %d", v);
    stub_dev_free(dev);
    ncclCommDestroy(c);
}

/* ---- ranks as threads of one process ---------------------------------------------------- */

typedef struct thread_rank {
    int rank;
    ncclUniqueId id;
    ncclComm_t comm;
    bool ok;
} thread_rank;

static void *thread_init_and_all_reduce(void *arg)
{
    thread_rank *t = arg;
    stub_set_device(t->rank);
    t->ok = !ncclCommInitRank(&t->comm, 2, t->id, t->rank);
    size_t cnt = 1 << 20; /* 4 MiB */
    float *x = stub_dev_alloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) x[i] = (float)(t->rank + i % 5);
    t->ok = t->ok && !ncclAllReduce(x, x, cnt, ncclFloat32, ncclSum, t->comm, NULL);
    for (size_t i = 0; i < cnt && t->ok; i++) t->ok = x[i] == (float)(1 + 2 * (i % 5));
    stub_dev_free(x);
    return NULL;
}

static void two_threads_are_two_ranks(void)
{
    thread_rank t[2];
    pthread_t tid[2];
    ncclGetUniqueId(&t[0].id);
    for (int r = 0; r < 2; r++) {
        t[r].rank = r, t[r].id = t[0].id;
        pthread_create(&tid[r], NULL, thread_init_and_all_reduce, &t[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(tid[r], NULL);
    bool ok = t[0].ok && t[1].ok;
    /* one thread drives both communicators in a group */
    float *x[2];
    for (int r = 0; r < 2; r++) {
        x[r] = stub_dev_alloc(4 * 1000);
        for (int i = 0; i < 1000; i++) x[r][i] = (float)(r * 10 + i);
    }
    ncclGroupStart();
    for (int r = 0; r < 2; r++) ok &= !ncclAllReduce(x[r], x[r], 1000, ncclFloat32, ncclMax, t[r].comm, NULL);
    ok &= !ncclGroupEnd();
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 1000; i++) ok &= x[r][i] == (float)(10 + i);
        stub_dev_free(x[r]);
        ncclCommDestroy(t[r].comm);
    }
    printf("%s two threads are two ranks (and one thread drives both in a group)\n", ok ? "ok  " : "FAIL");
    failures += !ok;
}

/* ---- throughput ----------------------------------------------------------------------------- */

static void measure_all_reduce(int rank, int n, ncclUniqueId id)
{
    ncclComm_t c = init(rank, n, id);
    if (!c) return;
    size_t cnt = 4 << 20; /* 16 MiB of f32 */
    float *x = stub_dev_alloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) x[i] = 1;
    for (int i = 0; i < 3; i++) ncclAllReduce(x, x, cnt, ncclFloat32, ncclSum, c, NULL);
    int iters = 20;
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        CHECK(!ncclAllReduce(x, x, cnt, ncclFloat32, ncclSum, c, NULL), "%s", ncclGetLastError(c));
    double dt = (now_s() - t0) / iters;
    if (rank == 0)
        printf("     all_reduce 16 MiB f32, %d processes: %.2f ms, %.2f GB/s (algorithm bandwidth)\n", n,
               dt * 1e3, cnt * 4 / dt / 1e9);
    stub_dev_free(x);
    ncclCommDestroy(c);
}

int main(int argc, char **argv)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    bool quick = argc > 1 && !strcmp(argv[1], "quick");
    for (int n = 1; n <= MAX_WORLD; n++) {
        if (n > 1) run_ranks("all_reduce_every_type_and_op", n, all_reduce_every_type_and_op, 0);
        run_ranks("broadcast_reduce_gather_scatter", n, broadcast_reduce_gather_scatter, 0);
        if (n > 1) run_ranks("send_recv_ring_in_a_group", n, send_recv_ring_in_a_group, 0);
        if (quick) break;
    }
    run_ranks("integer_sums_wrap_around", 2, integer_sums_wrap_around, 0);
    run_ranks("half_sums_round_once", 3, half_sums_round_once, 0);
    run_ranks("half_averages_round_ties_to_even", 2, half_averages_round_ties_to_even, 0);
    run_ranks("all_reduce_against_broadcast_fails_on_both", 2, all_reduce_against_broadcast_fails_on_both, 0);
    run_ranks("all_reduce_of_different_counts_fails_on_both", 2, all_reduce_of_different_counts_fails_on_both,
              0);
    run_ranks("send_and_recv_of_different_counts_fail_on_both", 2,
              send_and_recv_of_different_counts_fail_on_both, 0);
    run_ranks("different_nranks_fail_at_init_on_both", 2, different_nranks_fail_at_init_on_both, 0);
    run_ranks("dead_peer_fails_fast_naming_it", 3, dead_peer_fails_fast_naming_it, 1u << 2);
    run_ranks("peer_that_never_calls_times_out", 3, peer_that_never_calls_times_out, 0);
    run_ranks("bad_arguments_are_named", 1, bad_arguments_are_named, 0);
    two_threads_are_two_ranks();
    run_ranks("measure_all_reduce", 2, measure_all_reduce, 0);
    printf("%s: %d failed\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
