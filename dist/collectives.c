/* collectives.c — the collectives of a process group (CPU backend, TCP):
 * argument checks at the entry points, then the algorithms, which run on
 * the group's communication thread once every rank's call has been checked
 * (pg.c).
 *
 * Reductions work in a wide buffer (f32 for f32/f16/bf16, f64, i32) and
 * round to the tensor's dtype once at the end, so f16/bf16 results are one
 * rounding of the exact-order sum. Algorithms:
 *   small messages (< 64 KiB) — reduce at rank 0 in rank order, send back:
 *       2 latency steps, results bitwise equal everywhere by construction.
 *   large messages — ring: reduce-scatter (world-1 steps, each rank adds the
 *       chunk its left neighbour sends), then all-gather of the reduced
 *       chunks: each byte crosses each link about twice, the bandwidth
 *       optimum; every chunk is reduced once by one rank, then copied, so
 *       all ranks hold the same bytes.
 *   all_gather and reduce_scatter use the same ring; broadcast and gather
 *   go directly between the root and each rank.
 * The data moves with peer_send / peer_recv / peer_exchange (wire.c), which
 * put a DATA frame before a call's first bytes on each connection.
 * AVG is the sum divided by the world size (integer division toward zero
 * for i32). CUDA tensors take the NCCL path instead (dist/nccl.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_impl.h"
#include "dist/pg_impl.h"
#include "tensor/tensor_impl.h"

#define SMALL_BYTES (64 * 1024)

/* ---- the wide working type --------------------------------------------------------- */

static size_t wide_size(em_dtype dt) { return dt == EM_F64 ? 8 : 4; }

/* n elements of dt at src -> wide buffer */
void red_widen(em_dtype dt, const void *src, void *dst, int64_t n)
{
    switch (dt) {
    case EM_F16:
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = em_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case EM_BF16:
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = em_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * wide_size(dt));
    }
}

void red_narrow(em_dtype dt, const void *src, void *dst, int64_t n)
{
    switch (dt) {
    case EM_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = em_f32_to_f16(((const float *)src)[i]);
        break;
    case EM_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = em_f32_to_bf16(((const float *)src)[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * wide_size(dt));
    }
}

/* acc[i] = acc[i] op x[i], in the wide type of dt. MAX/MIN propagate NaN,
 * as torch does. The sum loops are plain so the compiler vectorises them. */
void red_combine(em_dtype dt, int op, void *acc, const void *x, int64_t n)
{
    bool sum = op == EM_RED_SUM || op == EM_RED_AVG, max = op == EM_RED_MAX;
    if (dt == EM_F64) {
        double *restrict a = acc;
        const double *restrict b = x;
        if (sum)
            for (int64_t i = 0; i < n; i++) a[i] += b[i];
        else
            for (int64_t i = 0; i < n; i++)
                a[i] = (max ? b[i] > a[i] : b[i] < a[i]) || isnan(b[i]) ? b[i] : a[i];
    } else if (dt == EM_I32) {
        int32_t *restrict a = acc;
        const int32_t *restrict b = x;
        if (sum) /* wraps, as torch */
            for (int64_t i = 0; i < n; i++) a[i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
        else
            for (int64_t i = 0; i < n; i++) a[i] = (max ? b[i] > a[i] : b[i] < a[i]) ? b[i] : a[i];
    } else {
        float *restrict a = acc;
        const float *restrict b = x;
        if (sum)
            for (int64_t i = 0; i < n; i++) a[i] += b[i];
        else
            for (int64_t i = 0; i < n; i++)
                a[i] = (max ? b[i] > a[i] : b[i] < a[i]) || isnan(b[i]) ? b[i] : a[i];
    }
}

void red_finish_avg(em_dtype dt, int op, void *acc, int64_t n, int world)
{
    if (op != EM_RED_AVG) return;
    if (dt == EM_F64)
        for (int64_t i = 0; i < n; i++) ((double *)acc)[i] /= world;
    else if (dt == EM_I32)
        for (int64_t i = 0; i < n; i++) ((int32_t *)acc)[i] /= world;
    else
        for (int64_t i = 0; i < n; i++) ((float *)acc)[i] /= (float)world;
}

void reduce_sources(em_dtype dt, int op, int world, void *dst, const void *const *src, int nsrc, int64_t n)
{
    enum { BLOCK = 2048 }; /* elements: the accumulator stays in L1 */
    size_t es = em_dtype_size(dt);
    bool half = dt == EM_F16 || dt == EM_BF16;
    _Alignas(64) char acc[BLOCK * 8], x[BLOCK * 4];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t m = n - i < BLOCK ? n - i : BLOCK;
        red_widen(dt, (const char *)src[0] + i * (int64_t)es, acc, m);
        for (int k = 1; k < nsrc; k++) {
            const void *xs = (const char *)src[k] + i * (int64_t)es;
            if (half) {
                red_widen(dt, xs, x, m);
                xs = x;
            }
            red_combine(dt, op, acc, xs, m);
        }
        red_finish_avg(dt, op, acc, m, world);
        red_narrow(dt, acc, (char *)dst + i * (int64_t)es, m);
    }
}

/* ---- algorithms ---------------------------------------------------------------------- */

/* chunk r of n elements split over w: [start, start + len) */
static void chunk(int64_t n, int w, int r, int64_t *start, int64_t *len)
{
    int64_t base = n / w, extra = n % w;
    *start = r * base + (r < extra ? r : extra);
    *len = base + (r < extra ? 1 : 0);
}

/* Ring reduce-scatter over wide buffer `buf` (n elements): afterwards rank r
 * holds the full reduction of chunk (r + 1) % w. tmp holds one chunk. */
static em_status ring_reduce_scatter(em_pg *pg, call *c, em_dtype dt, int op, char *buf, int64_t n, char *tmp,
                                     double deadline)
{
    int w = pg->world, r = pg->rank, right = (r + 1) % w, left = (r + w - 1) % w;
    size_t es = wide_size(dt);
    for (int step = 0; step < w - 1; step++) {
        int sc = (r - step + w) % w, rc = (r - step - 1 + w) % w;
        int64_t ss, sl, rs, rl;
        chunk(n, w, sc, &ss, &sl);
        chunk(n, w, rc, &rs, &rl);
        em_status s = peer_exchange(pg, c, right, buf + ss * es, (size_t)sl * es, left, tmp, (size_t)rl * es, deadline);
        if (s) return s;
        red_combine(dt, op, buf + rs * es, tmp, rl);
    }
    return EM_OK;
}

/* Ring all-gather of chunks of `buf` (esz bytes per element): rank r starts
 * owning chunk (r + first) % w; afterwards everyone has every chunk. */
static em_status ring_all_gather(em_pg *pg, call *c, char *buf, int64_t n, size_t es, int first, double deadline)
{
    int w = pg->world, r = pg->rank, right = (r + 1) % w, left = (r + w - 1) % w;
    for (int step = 0; step < w - 1; step++) {
        int sc = (r + first - step + w) % w, rc = (r + first - step - 1 + w) % w;
        int64_t ss, sl, rs, rl;
        chunk(n, w, sc, &ss, &sl);
        chunk(n, w, rc, &rs, &rl);
        em_status s =
            peer_exchange(pg, c, right, buf + ss * es, (size_t)sl * es, left, buf + rs * es, (size_t)rl * es, deadline);
        if (s) return s;
    }
    return EM_OK;
}

static em_status all_reduce(em_pg *pg, call *c, double deadline)
{
    em_dtype dt = (em_dtype)c->h.dtype;
    int64_t n = c->h.count;
    size_t es = wide_size(dt);
    bool small = (int64_t)es * n < SMALL_BYTES;
    /* f32/f64/i32 reduce in the tensor itself (a DDP bucket: no copy in or
     * out); f16/bf16 go through an f32 copy. tmp holds what one receive
     * brings: a whole message (small path) or one ring chunk. */
    bool in_place = dt != EM_F16 && dt != EM_BF16;
    size_t tmp_elems = small ? (size_t)n : (size_t)(n / pg->world + 1);
    char *buf = in_place ? c->in : malloc((size_t)n * es + 1), *tmp = malloc(tmp_elems * es + 1);
    if (!buf || !tmp) {
        if (!in_place) free(buf);
        free(tmp);
        return call_fail(c, EM_ERR_OOM, "all_reduce: out of memory for %lld elements", (long long)n);
    }
    if (!in_place) red_widen(dt, c->in, buf, n);
    em_status s = EM_OK;
    if (small) {
        if (pg->rank == 0) {
            for (int r = 1; r < pg->world && !s; r++) {
                s = peer_recv(pg, c, r, tmp, (size_t)n * es, deadline);
                if (!s) red_combine(dt, c->h.op, buf, tmp, n);
            }
            red_finish_avg(dt, c->h.op, buf, n, pg->world);
            for (int r = 1; r < pg->world && !s; r++) s = peer_send(pg, c, r, buf, (size_t)n * es, deadline);
        } else {
            s = peer_send(pg, c, 0, buf, (size_t)n * es, deadline);
            if (!s) s = peer_recv(pg, c, 0, buf, (size_t)n * es, deadline);
        }
    } else {
        s = ring_reduce_scatter(pg, c, dt, c->h.op, buf, n, tmp, deadline);
        if (!s) { /* rank r owns chunk (r+1)%w: finish it before sharing */
            int64_t st, len;
            chunk(n, pg->world, (pg->rank + 1) % pg->world, &st, &len);
            red_finish_avg(dt, c->h.op, buf + st * (int64_t)es, len, pg->world);
            s = ring_all_gather(pg, c, buf, n, es, 1, deadline);
        }
    }
    if (!in_place) {
        if (!s) red_narrow(dt, buf, c->in, n);
        free(buf);
    }
    free(tmp);
    return s;
}

static em_status reduce_scatter(em_pg *pg, call *c, double deadline)
{
    /* in: world * m elements; out: chunk `rank` (m elements) */
    em_dtype dt = (em_dtype)c->h.dtype;
    int w = pg->world;
    int64_t total = c->h.count, m = total / w;
    size_t es = wide_size(dt);
    char *buf = malloc((size_t)total * es + 1), *tmp = malloc((size_t)m * es + 1);
    if (!buf || !tmp) {
        free(buf);
        free(tmp);
        return call_fail(c, EM_ERR_OOM, "reduce_scatter: out of memory");
    }
    red_widen(dt, c->in, buf, total);
    /* ring on chunks of exactly m, shifted by one from all_reduce's so that
     * rank r ends holding the full reduction of chunk r */
    em_status s = EM_OK;
    int right = (pg->rank + 1) % w, left = (pg->rank + w - 1) % w;
    for (int step = 0; step < w - 1 && !s; step++) {
        int sc = (pg->rank - step - 1 + 2 * w) % w, rc = (pg->rank - step - 2 + 2 * w) % w;
        s = peer_exchange(pg, c, right, buf + (size_t)sc * (size_t)m * es, (size_t)m * es, left, tmp, (size_t)m * es,
                          deadline);
        if (!s) red_combine(dt, c->h.op, buf + (size_t)rc * (size_t)m * es, tmp, m);
    }
    if (!s) {
        char *mine = buf + (size_t)pg->rank * (size_t)m * es;
        red_finish_avg(dt, c->h.op, mine, m, w);
        red_narrow(dt, mine, c->out, m);
    }
    free(buf);
    free(tmp);
    return s;
}

static em_status all_gather(em_pg *pg, call *c, double deadline)
{
    size_t es = em_dtype_size((em_dtype)c->h.dtype);
    int64_t n = c->h.count, w = pg->world;
    char *out = c->out;
    /* in may already be out's own chunk (ZeRO gathers in place) */
    memmove(out + (size_t)pg->rank * (size_t)n * es, c->in, (size_t)n * es);
    /* chunks of the out buffer are exactly the ranks' pieces: chunk(w*n, w, r) = r*n .. */
    return ring_all_gather(pg, c, out, w * n, es, 0, deadline);
}

static em_status broadcast(em_pg *pg, call *c, double deadline)
{
    size_t bytes = (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype);
    if (pg->rank != c->h.root) return peer_recv(pg, c, c->h.root, c->in, bytes, deadline);
    for (int r = 0; r < pg->world; r++)
        if (r != c->h.root) {
            em_status s = peer_send(pg, c, r, c->in, bytes, deadline);
            if (s) return s;
        }
    return EM_OK;
}

static em_status gather(em_pg *pg, call *c, double deadline)
{
    size_t bytes = (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype);
    if (pg->rank != c->h.root) return peer_send(pg, c, c->h.root, c->in, bytes, deadline);
    char *out = c->out;
    memcpy(out + (size_t)pg->rank * bytes, c->in, bytes);
    for (int r = 0; r < pg->world; r++)
        if (r != c->h.root) {
            em_status s = peer_recv(pg, c, r, out + (size_t)r * bytes, bytes, deadline);
            if (s) return s;
        }
    return EM_OK;
}

em_status run_call(em_pg *pg, call *c, double deadline)
{
    size_t bytes = (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype);
    if (pg->world == 1) { /* a group of one: the identities */
        switch (c->h.kind) {
        case CALL_ALL_REDUCE: return EM_OK; /* AVG over one rank is the value itself */
        case CALL_ALL_GATHER:
        case CALL_GATHER:
        case CALL_REDUCE_SCATTER:
            if (c->out) memmove(c->out, c->in, bytes);
            return EM_OK;
        case CALL_SEND:
        case CALL_RECV: return call_fail(c, EM_ERR_ARG, "send/recv: a group of one has no peer");
        default: return EM_OK;
        }
    }
    switch (c->h.kind) {
    case CALL_ALL_REDUCE: return all_reduce(pg, c, deadline);
    case CALL_BROADCAST: return broadcast(pg, c, deadline);
    case CALL_ALL_GATHER: return all_gather(pg, c, deadline);
    case CALL_REDUCE_SCATTER: return reduce_scatter(pg, c, deadline);
    case CALL_GATHER: return gather(pg, c, deadline);
    case CALL_SEND:
    case CALL_RECV: return p2p_run(pg, c, deadline); /* wire.c */
    default: return EM_OK;                           /* barrier: the check was the rendezvous */
    }
}

/* ---- entry points ---------------------------------------------------------------------- */

/* Resolves and checks a tensor argument: its data, element count, dtype and
 * device. CUDA tensors go through NCCL (dist/nccl.c), which also takes u8. */
static em_status arg(const char *fn, const char *what, em_tensor *h, void **data, int64_t *n, em_dtype *dt,
                     em_device *dev)
{
    if (!h) return em_err(EM_ERR_ARG, "%s: %s is NULL", fn, what);
    tensor *t = t_resolve(h, fn);
    if (!t) return em_last_status();
    if (t_on_cuda(t) && !EM_HAVE_NCCL)
        return em_err(EM_ERR_DEVICE, "%s: %s is a CUDA tensor, and this ember was built without NCCL", fn, what);
    if (t->dtype != EM_F32 && t->dtype != EM_F64 && t->dtype != EM_F16 && t->dtype != EM_BF16 && t->dtype != EM_I32 &&
        !(t->dtype == EM_U8 && t_on_cuda(t)))
        return em_err(EM_ERR_DTYPE, "%s: %s is %s; collectives take f32, f64, f16, bf16 or i32 (and u8 on CUDA)", fn,
                      what, em_dtype_name(t->dtype));
    if (!t_is_contig(t)) return em_err(EM_ERR_ARG, "%s: %s %s is not contiguous", fn, what, shp(t));
    *data = t_ptr(t);
    *n = t_numel(t);
    *dt = t->dtype;
    *dev = t->device;
    return EM_OK;
}

/* EM_OK when a and b (the tensors of one call) are on one device. */
static em_status same_dev(const char *fn, em_device a, em_device b)
{
    if (em_device_equal(a, b)) return EM_OK;
    char x[16], y[16];
    return em_err(EM_ERR_DEVICE, "%s: in is on %s but out is on %s", fn, em_device_str(a, x, sizeof x),
                  em_device_str(b, y, sizeof y));
}

static em_status group(const char *fn, em_pg *pg)
{
    if (!pg) return em_err(EM_ERR_ARG, "%s: process group is NULL", fn);
    if (pg->broken)
        return em_err(EM_ERR_DIST, "%s: the process group is broken by an earlier failure: %s", fn, pg->broken_msg);
    return EM_OK;
}

static em_status rank_arg(const char *fn, const char *what, em_pg *pg, int r)
{
    if (r < 0 || r >= pg->world) return em_err(EM_ERR_ARG, "%s: %s %d is outside [0, %d)", fn, what, r, pg->world);
    return EM_OK;
}

/* Runs the call: NCCL for CUDA tensors, the TCP/shm algorithms for CPU ones. */
static em_status issue(em_pg *pg, int kind, em_dtype dt, int op, int root, int64_t count, void *in, void *out,
                       em_device dev, em_work **work)
{
    if (work) *work = NULL;
    call c = {.h = {.kind = kind, .dtype = dt, .op = op, .root = root, .count = count}, .in = in, .out = out};
#if EM_HAVE_NCCL
    if (dev.type == EM_CUDA) {
        /* checked in the group's call sequence like any call (NCCL itself
         * would hang on a mismatch), at once; then NCCL moves the data */
        call check = {.h = c.h};
        check.h.cuda = 1;
        em_status s = pg_issue(pg, &check, NULL);
        return s ? s : nccl_issue(pg, &c, dev.index, work);
    }
#else
    (void)dev;
#endif
    return pg_issue(pg, &c, work);
}

em_status em_all_reduce(em_pg *pg, em_tensor *t, em_reduce_op op, em_work **work)
{
    void *p;
    int64_t n;
    em_dtype dt;
    em_device dev;
    em_status s = group("all_reduce", pg);
    if (!s) s = arg("all_reduce", "tensor", t, &p, &n, &dt, &dev);
    if (!s && (op < EM_RED_SUM || op > EM_RED_MIN)) s = em_err(EM_ERR_ARG, "all_reduce: unknown reduce op %d", (int)op);
    return s ? s : issue(pg, CALL_ALL_REDUCE, dt, op, 0, n, p, NULL, dev, work);
}

/* em_scaler_unscale's overflow vote (amp/amp_impl.h): the max of a 0/1
 * flag over the group, so every rank skips the same steps. A group of one
 * agrees with itself. */
static em_status overflow_vote(em_pg *pg, bool *bad)
{
    if (em_pg_world(pg) <= 1) return EM_OK;
    int64_t one = 1;
    em_tensor *flag = em_full(EM_F32, 1, &one, *bad ? 1.0 : 0.0);
    if (!flag) return em_last_status();
    em_status st = em_all_reduce(pg, flag, EM_RED_MAX, NULL);
    *bad = ((float *)em_data(flag))[0] != 0;
    if (!em_scope_depth()) em_free(flag);
    return st;
}

__attribute__((constructor)) static void register_overflow_vote(void) { amp_set_overflow_vote(overflow_vote); }

em_status em_broadcast(em_pg *pg, em_tensor *t, int root, em_work **work)
{
    void *p;
    int64_t n;
    em_dtype dt;
    em_device dev;
    em_status s = group("broadcast", pg);
    if (!s) s = arg("broadcast", "tensor", t, &p, &n, &dt, &dev);
    if (!s) s = rank_arg("broadcast", "root", pg, root);
    return s ? s : issue(pg, CALL_BROADCAST, dt, 0, root, n, p, NULL, dev, work);
}

em_status em_all_gather(em_pg *pg, em_tensor *out, em_tensor *in, em_work **work)
{
    void *pi, *po;
    int64_t ni, no;
    em_dtype di, dout;
    em_device dvi, dvo;
    em_status s = group("all_gather", pg);
    if (!s) s = arg("all_gather", "in", in, &pi, &ni, &di, &dvi);
    if (!s) s = arg("all_gather", "out", out, &po, &no, &dout, &dvo);
    if (!s) s = same_dev("all_gather", dvi, dvo);
    if (!s && di != dout)
        s = em_err(EM_ERR_DTYPE, "all_gather: out is %s but in is %s", em_dtype_name(dout), em_dtype_name(di));
    if (!s && no != ni * pg->world)
        s = em_err(EM_ERR_SHAPE, "all_gather: out has %lld elements; it needs world %d x %lld", (long long)no,
                   pg->world, (long long)ni);
    return s ? s : issue(pg, CALL_ALL_GATHER, di, 0, 0, ni, pi, po, dvi, work);
}

em_status em_reduce_scatter(em_pg *pg, em_tensor *out, em_tensor *in, em_reduce_op op, em_work **work)
{
    void *pi, *po;
    int64_t ni, no;
    em_dtype di, dout;
    em_device dvi, dvo;
    em_status s = group("reduce_scatter", pg);
    if (!s) s = arg("reduce_scatter", "in", in, &pi, &ni, &di, &dvi);
    if (!s) s = arg("reduce_scatter", "out", out, &po, &no, &dout, &dvo);
    if (!s) s = same_dev("reduce_scatter", dvi, dvo);
    if (!s && di != dout)
        s = em_err(EM_ERR_DTYPE, "reduce_scatter: out is %s but in is %s", em_dtype_name(dout), em_dtype_name(di));
    if (!s && ni != no * pg->world)
        s = em_err(EM_ERR_SHAPE, "reduce_scatter: in has %lld elements; it needs world %d x out's %lld",
                   (long long)ni, pg->world, (long long)no);
    if (!s && (op < EM_RED_SUM || op > EM_RED_MIN))
        s = em_err(EM_ERR_ARG, "reduce_scatter: unknown reduce op %d", (int)op);
    if (!s && pg->world == 1 && op == EM_RED_AVG) op = EM_RED_SUM;
    return s ? s : issue(pg, CALL_REDUCE_SCATTER, di, op, 0, ni, pi, po, dvi, work);
}

em_status em_gather(em_pg *pg, em_tensor *out, em_tensor *in, int root, em_work **work)
{
    void *pi, *po = NULL;
    int64_t ni, no;
    em_dtype di, dout;
    em_device dvi, dvo;
    em_status s = group("gather", pg);
    if (!s) s = arg("gather", "in", in, &pi, &ni, &di, &dvi);
    if (!s) s = rank_arg("gather", "root", pg, root);
    if (!s && pg->rank == root) {
        s = arg("gather", "out (on the root)", out, &po, &no, &dout, &dvo);
        if (!s) s = same_dev("gather", dvi, dvo);
        if (!s && di != dout)
            s = em_err(EM_ERR_DTYPE, "gather: out is %s but in is %s", em_dtype_name(dout), em_dtype_name(di));
        if (!s && no != ni * pg->world)
            s = em_err(EM_ERR_SHAPE, "gather: out has %lld elements; it needs world %d x %lld", (long long)no,
                       pg->world, (long long)ni);
    }
    return s ? s : issue(pg, CALL_GATHER, di, 0, root, ni, pi, po, dvi, work);
}

em_status em_barrier(em_pg *pg, em_work **work)
{
    em_status s = group("barrier", pg);
    return s ? s : issue(pg, CALL_BARRIER, EM_F32, 0, 0, 0, NULL, NULL, em_device_cpu(), work);
}

static em_status p2p(const char *fn, int kind, em_pg *pg, em_tensor *t, int peer, em_work **work)
{
    void *p;
    int64_t n;
    em_dtype dt;
    em_device dev;
    em_status s = group(fn, pg);
    if (!s) s = arg(fn, "tensor", t, &p, &n, &dt, &dev);
    if (!s) s = rank_arg(fn, kind == CALL_SEND ? "dst" : "src", pg, peer);
    if (!s && peer == pg->rank) s = em_err(EM_ERR_ARG, "%s: rank %d cannot %s itself", fn, peer, fn);
    return s ? s : issue(pg, kind, dt, 0, peer, n, p, NULL, dev, work);
}

em_status em_send(em_pg *pg, em_tensor *t, int dst, em_work **work) { return p2p("send", CALL_SEND, pg, t, dst, work); }
em_status em_recv(em_pg *pg, em_tensor *t, int src, em_work **work) { return p2p("recv", CALL_RECV, pg, t, src, work); }
