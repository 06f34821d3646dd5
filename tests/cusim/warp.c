/* warp.c — the calls device code makes that involve more than one thread
 * or a memory word: warp operations (shuffles, votes, __syncwarp) and
 * atomics.
 *
 * Warps are 32 consecutive linear thread indices (x fastest), as on a GPU.
 * A warp operation is a meeting: the lane waits until every lane its mask
 * names has arrived at an operation of the same kind with the same mask,
 * then each gets its result and all continue. A mask that leaves out the
 * caller, names lanes that do not exist or have exited, or lanes meeting at
 * different kinds of operation under one mask, is reported (the launch
 * fails); lanes that wait for each other at different masks forever show
 * up as a deadlock (exec.c).
 *
 * Atomics run as plain read-modify-writes: only one GPU thread runs at a
 * time, so nothing can come between the read and the write. */
#include <stdio.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "exec_impl.h"

static const char *op_name(int op)
{
    switch ((cusim_warp_kind)op) {
    case CUSIM_SYNCWARP: return "__syncwarp";
    case CUSIM_SHFL: return "__shfl_sync";
    case CUSIM_SHFL_UP: return "__shfl_up_sync";
    case CUSIM_SHFL_DOWN: return "__shfl_down_sync";
    case CUSIM_SHFL_XOR: return "__shfl_xor_sync";
    case CUSIM_BALLOT: return "__ballot_sync";
    case CUSIM_ANY: return "__any_sync";
    case CUSIM_ALL: return "__all_sync";
    }
    return "?";
}

static bool is_shuffle(int op) { return op >= CUSIM_SHFL && op <= CUSIM_SHFL_XOR; }

void cusim_warps_begin_block(void)
{
    unsigned n = cusim_ex.nthreads;
    for (unsigned w = 0; w < cusim_ex.nwarps; w++) {
        cusim_warp *wp = &cusim_ex.warps[w];
        unsigned lanes = n - w * CUSIM_WARP >= CUSIM_WARP ? CUSIM_WARP : n - w * CUSIM_WARP;
        wp->lanes = wp->live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        wp->npending = 0;
        memset(wp->clock, 0, sizeof wp->clock);
    }
}

const char *cusim_wait_text(const cusim_thread *t, char *buf, size_t n)
{
    if (t->state == CUSIM_T_BARRIER) {
        snprintf(buf, n, "waits at __syncthreads (%s:%d)", t->file, t->line);
        return buf;
    }
    const cusim_warp *w = &cusim_ex.warps[t->warp];
    unsigned missing = 0, mask = 0;
    for (int i = 0; i < w->npending; i++)
        if (w->pending[i].arrived & (1u << t->lane)) {
            mask = w->pending[i].mask;
            missing = mask & ~w->pending[i].arrived;
        }
    snprintf(buf, n, "waits in %s(mask 0x%08x) (%s:%d) for lanes 0x%08x", op_name(t->op), mask, t->file,
             t->line, missing);
    return buf;
}

/* Every lane of p has arrived: hand out the results and wake them. */
static void complete(cusim_warp *w, cusim_warp_pending *p, unsigned warp)
{
    cusim_thread *lanes = &cusim_ex.threads[warp * CUSIM_WARP];
    unsigned mask = p->mask, width = (unsigned)p->width, votes = 0;
    uint16_t clock = 0;
    for (unsigned l = 0; l < CUSIM_WARP; l++)
        if (mask >> l & 1) {
            votes |= (unsigned)(lanes[l].value != 0) << l;
            if (w->clock[l] > clock) clock = w->clock[l];
        }
    for (unsigned l = 0; l < CUSIM_WARP; l++) {
        if (!(mask >> l & 1)) continue;
        cusim_thread *t = &lanes[l];
        unsigned seg = l & ~(width - 1), src = l, a = (unsigned)t->arg;
        switch ((cusim_warp_kind)p->op) {
        case CUSIM_SHFL: src = seg + a % width; break;
        case CUSIM_SHFL_UP: src = (l - seg) >= a ? l - a : l; break;
        case CUSIM_SHFL_DOWN: src = (l - seg) + a < width ? l + a : l; break;
        case CUSIM_SHFL_XOR: src = (l ^ a) < seg + width ? l ^ a : l; break;
        case CUSIM_BALLOT: t->result = votes; break;
        case CUSIM_ANY: t->result = votes != 0; break;
        case CUSIM_ALL: t->result = votes == mask; break;
        case CUSIM_SYNCWARP: t->result = 0; break;
        }
        if (is_shuffle(p->op)) {
            if (src >= CUSIM_WARP || !(mask >> src & 1)) {
                char who[200];
                cusim_report(
                    "%s: %s reads lane %u, which its mask 0x%08x does not name (the value is undefined)",
                    cusim_who(t, who, sizeof who), op_name(p->op), src, mask);
                cusim_ex.failed = true;
                src = l;
            }
            t->result = lanes[src].value;
        }
        w->clock[l] = (uint16_t)(clock + 1);
        cusim_wake(t);
    }
    *p = w->pending[--w->npending];
}

uint64_t cusim_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, const char *file,
                       int line, int column)
{
    cusim_thread *t = cusim_cur;
    cusim_warp *w = &cusim_ex.warps[t->warp];
    unsigned bit = 1u << t->lane;
    char who[200];
    t->file = file;
    t->line = line;
    t->column = column;
    if (is_shuffle(kind) && (width < 1 || width > CUSIM_WARP || (width & (width - 1)))) {
        cusim_report("%s: %s at %s:%d with width %d (a power of two, at most 32)",
                     cusim_who(t, who, sizeof who), op_name(kind), file, line, width);
        cusim_abort_launch();
    }
    if (!(mask & bit) || (mask & ~w->lanes) || (mask & ~w->live)) {
        const char *why = !(mask & bit)        ? "does not name the calling lane"
                          : (mask & ~w->lanes) ? "names lanes past the block's last thread"
                                               : "names lanes that have exited";
        cusim_report("%s: %s at %s:%d: mask 0x%08x %s (lane %u; lanes alive 0x%08x)",
                     cusim_who(t, who, sizeof who), op_name(kind), file, line, mask, why, t->lane, w->live);
        cusim_abort_launch();
    }
    cusim_warp_pending *p = NULL;
    for (int i = 0; i < w->npending; i++)
        if (w->pending[i].mask == mask) p = &w->pending[i];
    if (p && (p->op != kind || (is_shuffle(kind) && p->width != width))) {
        cusim_report(
            "%s: lanes of one warp meet at different operations: it calls %s (width %d) at %s:%d while "
            "lanes 0x%08x wait in %s (width %d) with the same mask 0x%08x",
            cusim_who(t, who, sizeof who), op_name(kind), width, file, line, p->arrived, op_name(p->op),
            p->width, mask);
        cusim_abort_launch();
    }
    if (!p) {
        p = &w->pending[w->npending++];
        *p = (cusim_warp_pending){.mask = mask, .arrived = 0, .op = kind, .width = width};
    }
    t->state = CUSIM_T_WARP;
    t->op = kind;
    t->value = value;
    t->arg = arg;
    p->arrived |= bit;
    if (p->arrived == mask) complete(w, p, t->warp);
    cusim_block_current();
    return t->result;
}

void cusim_warps_thread_exits(cusim_thread *t)
{
    cusim_warp *w = &cusim_ex.warps[t->warp];
    unsigned bit = 1u << t->lane;
    w->live &= ~bit;
    for (int i = 0; i < w->npending; i++)
        if (w->pending[i].mask & bit) {
            char who[200];
            cusim_report("%s exited while lanes 0x%08x of its warp wait for it in %s(mask 0x%08x)",
                         cusim_who(t, who, sizeof who), w->pending[i].arrived, op_name(w->pending[i].op),
                         w->pending[i].mask);
            cusim_abort_launch();
        }
}

unsigned cusim_activemask(void) { return cusim_ex.warps[cusim_cur->warp].live; }

/* ---- atomics -------------------------------------------------------------------------------- */

static uint64_t load(const void *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n);
    return v;
}

static int64_t sext32(uint64_t v) { return (int32_t)(uint32_t)v; }

static float as_f32(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double as_f64(uint64_t v)
{
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* The new value of an integer atomic on old (signed: compared as such). */
static uint64_t int_op(int op, bool is_signed, uint64_t old, uint64_t a, uint64_t b)
{
    int64_t so = (int64_t)old, sa = (int64_t)a;
    switch ((cusim_atomic_op)op) {
    case CUSIM_AT_ADD: return old + a;
    case CUSIM_AT_SUB: return old - a;
    case CUSIM_AT_MAX: return is_signed ? (uint64_t)(sa > so ? sa : so) : a > old ? a : old;
    case CUSIM_AT_MIN: return is_signed ? (uint64_t)(sa < so ? sa : so) : a < old ? a : old;
    case CUSIM_AT_EXCH: return a;
    case CUSIM_AT_CAS: return old == a ? b : old;
    }
    return old;
}

uint64_t cusim_atomic(int op, int type, void *p, uint64_t a, uint64_t b)
{
    cusim_thread *t = cusim_cur;
    size_t n = type == CUSIM_AT_I32 || type == CUSIM_AT_U32 || type == CUSIM_AT_F32 ? 4 : 8;
    if ((uintptr_t)p % n) {
        char who[200];
        cusim_report("%s: atomic on %zu bytes at %p, which is not aligned to %zu",
                     cusim_who(t, who, sizeof who), n, p, n);
        cusim_abort_launch();
    }
    char *lo = cusim_fiber_stack_lo(&t->fiber);
    if (!((char *)p >= lo && (char *)p < lo + t->fiber.stack_size))
        cusim_access(p, n, CUSIM_READ | CUSIM_WRITE | CUSIM_ATOMIC);
    uint64_t old = load(p, n), v;
    switch ((cusim_atomic_type)type) {
    case CUSIM_AT_I32:
        v = int_op(op, true, (uint64_t)sext32(old), (uint64_t)sext32(a), (uint64_t)sext32(b));
        break;
    case CUSIM_AT_U32: v = int_op(op, false, old, a & 0xffffffffu, b & 0xffffffffu); break;
    case CUSIM_AT_I64: v = int_op(op, true, old, a, b); break;
    case CUSIM_AT_U64: v = int_op(op, false, old, a, b); break;
    case CUSIM_AT_F32:
        if (op == CUSIM_AT_ADD || op == CUSIM_AT_SUB) cusim_ex.fp_atomics = true;
        v = op == CUSIM_AT_ADD   ? f32_bits(as_f32(old) + as_f32(a))
            : op == CUSIM_AT_SUB ? f32_bits(as_f32(old) - as_f32(a))
                                 : int_op(op, false, old, a & 0xffffffffu, b & 0xffffffffu);
        break;
    case CUSIM_AT_F64:
        if (op == CUSIM_AT_ADD || op == CUSIM_AT_SUB) cusim_ex.fp_atomics = true;
        v = op == CUSIM_AT_ADD   ? f64_bits(as_f64(old) + as_f64(a))
            : op == CUSIM_AT_SUB ? f64_bits(as_f64(old) - as_f64(a))
                                 : int_op(op, false, old, a, b);
        break;
    default: v = old;
    }
    memcpy(p, &v, n); /* little-endian: the low n bytes */
    return old;
}
