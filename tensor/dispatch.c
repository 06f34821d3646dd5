/* dispatch.c — the steps every op shares (dispatch.h), and the state they
 * consult: grad mode, autocast and the tape, each owned here. */
#include <stdlib.h>

#include "dispatch.h"
#include "kernel_impl.h"

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over the policies names each */

/* ---- state ------------------------------------------------------------------------------ */

static _Thread_local bool grad_mode = true;
static _Thread_local em_dtype autocast = EM_F32; /* EM_F32: off */
static _Thread_local node **tape;
static _Thread_local int64_t tape_len, tape_cap;

/* The policy of every op, by op id: ops.def's, until em_amp_set_policy. */
static op_policy policy[] = {
#define DEF_OP(id, name, kind, arity, amp, be) [OP_##id] = POL_##amp,
#include "ops.def"
};
_Static_assert(sizeof policy / sizeof policy[0] == OP_COUNT, "dispatch: one autocast policy per op");

static grad_sink sink;
static grad_acc_fn sink_acc;
static grad_done_fn sink_done;

bool op_grad_mode(void) { return grad_mode; }

bool op_set_grad_mode(bool on)
{
    bool prev = grad_mode;
    grad_mode = on;
    return prev;
}

em_dtype op_autocast(void) { return autocast; }

em_dtype op_set_autocast(em_dtype dt)
{
    em_dtype prev = autocast;
    autocast = dt;
    return prev;
}

op_policy op_policy_of(op_id op) { return policy[op]; }
void op_set_policy(op_id op, op_policy p) { policy[op] = p; }

int64_t tape_length(void) { return tape_len; }
node *tape_at(int64_t i) { return tape[i]; }

void tape_truncate(int64_t len)
{
    if (len < tape_len) tape_len = len;
}

void op_set_grad_sink(grad_sink s, grad_acc_fn acc, grad_done_fn done)
{
    sink = s;
    sink_acc = acc;
    sink_done = done;
}

em_status op_grad(tensor *t, tensor *g)
{
    if (!t->requires_grad) return EM_OK;
    if (!sink) return em_err(EM_ERR_AUTOGRAD, "backward: no autograd engine is registered");
    return sink(t, g);
}

tensor *op_grad_acc(tensor *t, bool *fresh)
{
    *fresh = false;
    return t->requires_grad && sink_acc ? sink_acc(t, fresh) : NULL;
}

em_status op_grad_done(tensor *t)
{
    if (!t->requires_grad) return EM_OK;
    if (!sink_done) return em_err(EM_ERR_AUTOGRAD, "backward: no autograd engine is registered");
    return sink_done(t);
}

/* ---- autocast ----------------------------------------------------------------------------- */

/* A cast that keeps a transposed matrix transposed (W^T in a Linear): the
 * copy then runs along memory instead of across it, and the matmul still
 * sees a BLAS layout. */
static tensor *cast_keeping_layout(tensor *t, em_dtype dt)
{
    if (t->ndim >= 2 && !t_is_contig(t)) {
        tensor *tt = t_transpose(t, -1, -2);
        if (!tt) return NULL;
        if (t_is_contig(tt)) {
            tensor *c = t_cast(tt, dt);
            return c ? t_transpose(c, -1, -2) : NULL;
        }
    }
    return t_cast(t, dt);
}

/* One input under op's policy; keep_f32: a LOW op leaves an f32 input as it
 * is (its kernel rounds it as it reads it: reads_f32_as_low). */
static tensor *autocast_one(op_id op, tensor *t, bool keep_f32)
{
    if (autocast == EM_F32 || !t || !em_dtype_is_float(t->dtype)) return t;
    switch (policy[op]) {
    case POL_LOW:
        if (t->dtype == EM_F32 && keep_f32) return t;
        return t->dtype == EM_F32 || t->dtype == EM_F64 ? cast_keeping_layout(t, autocast) : t;
    case POL_F32: return t->dtype == EM_F16 || t->dtype == EM_BF16 ? cast_keeping_layout(t, EM_F32) : t;
    case POL_NONE: return t;
    case POL_PROMOTE: return t; /* over all inputs: promote() */
    }
    return t;
}

tensor *op_autocast_one(op_id op, tensor *t) { return autocast_one(op, t, false); }

/* Whether op, under LOW on device dev, takes f32 operands as they are and
 * computes its products in the autocast dtype from them, rounding each
 * operand as it reads it: the values a cast would make, without the cast's
 * pass over the operand (a weight, every step) and without a copy to keep
 * for backward. Only where the product is computed in f32 anyway (the CPU's
 * f32 path: gemm_low_reads_f32); a fast bf16 product (AMX, AVX512-BF16, a
 * GPU) wants bf16 operands, and there the cast pays for itself. Of the
 * kinds, only matmul's kernel does this (op_call.low). */
static bool reads_f32_as_low(op_id op, em_device dev)
{
    return policy[op] == POL_LOW && op_table[op].kind == OPK_MATMUL && dev.type == EM_CPU &&
           gemm_low_reads_f32(autocast);
}

/* f64 > f32 > bf16, f16; bf16 against f16 meets at f32 */
static em_dtype wider(em_dtype a, em_dtype b)
{
    if (a == EM_F64 || b == EM_F64) return EM_F64;
    if (a == EM_F32 || b == EM_F32 || a != b) return EM_F32;
    return a;
}

/* Whether op, under PROMOTE on device dev, reads float inputs of different
 * dtypes as they are, each converted as it is read, so that no cast pass
 * makes a wider copy first (a bf16 product's output meeting an f32 bias):
 * binary ops on the CPU (ops_binary.c); the bits are those of casting. */
static bool reads_mixed(op_id op, em_device dev)
{
    return op_table[op].kind == OPK_BINARY && dev.type == EM_CPU;
}

/* PROMOTE: the float inputs that differ are cast to the widest of them, or
 * (mixed non-NULL) left as they are, *mixed set to that widest dtype. */
static bool promote(int nin, tensor **in, em_dtype *mixed)
{
    int nf = 0;
    em_dtype w = EM_F32;
    bool differ = false;
    for (int i = 0; i < nin; i++) {
        if (!em_dtype_is_float(in[i]->dtype)) continue;
        if (nf++ == 0)
            w = in[i]->dtype;
        else if (in[i]->dtype != w) {
            differ = true;
            w = wider(w, in[i]->dtype);
        }
    }
    if (!differ) return true;
    if (mixed) {
        *mixed = w;
        return true;
    }
    for (int i = 0; i < nin; i++)
        if (em_dtype_is_float(in[i]->dtype) && in[i]->dtype != w && !(in[i] = t_cast(in[i], w))) return false;
    return true;
}

/* keep_f32: see autocast_one; mixed: see promote. LOW casts the operands
 * of a product, a MATMUL-kind op's first two inputs: a third (linear's
 * bias) is added to the rounded product in its own dtype, as an add after
 * a matmul would add it (PROMOTE), so it is left as it is. */
static bool autocast_inputs(op_id op, int nin, tensor **in, bool keep_f32, em_dtype *mixed)
{
    if (autocast == EM_F32 || policy[op] == POL_NONE) return true;
    if (policy[op] == POL_PROMOTE) return promote(nin, in, mixed);
    if (policy[op] == POL_LOW && op_table[op].kind == OPK_MATMUL && nin > 2) nin = 2;
    for (int i = 0; i < nin; i++)
        if (!(in[i] = autocast_one(op, in[i], keep_f32))) return false;
    return true;
}

bool op_autocast_inputs(op_id op, int nin, tensor **in) { return autocast_inputs(op, nin, in, false, NULL); }

/* The checks all ops of a kind share (dispatch.h, op_begin). */
static bool kind_checks(op_call *c)
{
    const char *name = op_name(c->op);
    tensor **in = c->in;
    switch (op_table[c->op].kind) {
    case OPK_BINARY:
    case OPK_COMPARE:
        if (c->mixed == EM_BOOL && !chk_same_dtype(name, in[0], in[1])) return false;
        return bcast_shape(name, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &c->ndim, c->shape) ==
               EM_OK;
    case OPK_SOFTMAX:
    case OPK_NORM:
    case OPK_LOSS:
    case OPK_DROPOUT:
    case OPK_ATTENTION:
    case OPK_CONV:
    case OPK_POOL: return chk_float(name, in[0]);
    case OPK_UNARY: /* float, but abs takes integers too: the op checks */
    case OPK_AFFINE:
    case OPK_SELECT:
    case OPK_REDUCE:
    case OPK_VIEW:
    case OPK_COPY:
    case OPK_JOIN:
    case OPK_MATMUL:
    case OPK_INDEX:
    case OPK_COMPOSITE: return true;
    }
    return true;
}

/* ---- parameters resident in part ------------------------------------------------------ */

static const storage *fetch_st;
static op_fetch_fn fetch_fn;
static void *fetch_ctx;

void op_set_fetch(const storage *st, op_fetch_fn fetch, void *ctx)
{
    fetch_st = fetch ? st : NULL;
    fetch_fn = fetch;
    fetch_ctx = ctx;
}

/* Makes every input on the registered storage resident; false + error. */
static bool fetch_inputs(int nin, tensor *const *in)
{
    if (!fetch_fn) return true;
    for (int i = 0; i < nin; i++)
        if (in[i] && in[i]->st == fetch_st && fetch_fn(fetch_ctx, in[i])) return false;
    return true;
}

/* ---- the steps --------------------------------------------------------------------------- */

/* op_begin's checks, between the profiler's begin and its abandon on failure */
static bool begin_checks(op_call *c, op_id op, int nin, tensor **in)
{
    const char *name = op_name(op);
    for (int i = 0; i < nin; i++)
        if (!in[i]) {
            if (em_last_status() == EM_OK) em_fail(EM_ERR_ARG, "%s: input %d is NULL", name, i);
            return false;
        }
    if (!fetch_inputs(nin, in)) return false;
    /* the device first: where the product runs decides whether LOW casts */
    if (t_same_device(name, nin, in, &c->dev)) return false;
    if (autocast != EM_F32 && reads_f32_as_low(op, c->dev)) c->low = autocast;
    if (!autocast_inputs(op, nin, in, c->low != EM_F32, reads_mixed(op, c->dev) ? &c->mixed : NULL))
        return false;
    if (c->dev.type == EM_CUDA && !(op_table[op].backends & OPB_CUDA)) {
        em_fail(EM_ERR_DEVICE,
                "%s: no CUDA kernel for this op yet; its input is on cuda:%d (em_to(t, em_device_cpu()) "
                "moves it to the CPU)",
                name, c->dev.index);
        return false;
    }
    if (!kind_checks(c)) return false;
    if (grad_mode)
        for (int i = 0; i < nin && !c->record; i++) c->record = in[i]->requires_grad;
    return true;
}

bool op_begin(op_call *c, op_id op, int nin, tensor **in)
{
    *c = (op_call){.op = op, .nin = nin, .in = in, .dev = em_device_cpu(), .mixed = EM_BOOL};
    prof_begin_zeroed(&c->pm); /* before autocast: a cast it makes is this op's child */
    if (begin_checks(c, op, nin, in)) return true;
    prof_abandon(&c->pm);
    return false;
}

bool op_begin_backward(op_call *c, const node *n, int nin, tensor **in)
{
    *c = (op_call){
        .op = n->op, .nin = nin, .in = in, .dev = em_device_cpu(), .saved = n->saved, .mixed = EM_BOOL};
    memcpy(c->ip, n->ip, sizeof c->ip);
    memcpy(c->dp, n->dp, sizeof c->dp);
    return fetch_inputs(nin, in) && t_same_device(op_name(n->op), nin, in, &c->dev) == EM_OK;
}

tensor *op_out(const op_call *c, em_dtype dt, int ndim, const int64_t *shape)
{
    return t_new_on(c->dev, dt, ndim, shape);
}

em_status op_run(const op_call *c, const op_kernels *k, tensor *out)
{
    op_kernel fn = c->dev.type == EM_CUDA ? k->cuda : k->cpu;
    if (!fn)
        return em_err(EM_ERR_DEVICE, "%s: no kernel for %s tensors (the op list says there is one)",
                      op_name(c->op), c->dev.type == EM_CUDA ? "CUDA" : "CPU");
    return fn(c, out);
}

/* Appends a node for out = c->op(c->in) to the tape. On failure out is
 * dropped here, so no op leaks it. */
static node *record(const op_call *c, backward_fn bw, tensor *out)
{
    const char *name = op_name(c->op);
    node *n = NULL;
    if (em_scope_depth() == 0)
        em_fail(EM_ERR_SCOPE,
                "%s: recording a gradient needs an open step scope (em_scope_begin), or run it "
                "under em_set_grad_enabled(false)",
                name);
    else if (tape_len == tape_cap) {
        int64_t cap = tape_cap ? tape_cap * 2 : 1024;
        node **nt = realloc(tape, (size_t)cap * sizeof *nt);
        if (nt) {
            tape = nt;
            tape_cap = cap;
        } else {
            em_fail(EM_ERR_OOM, "%s: out of memory growing the tape", name);
        }
    }
    if (em_scope_depth() && tape_len < tape_cap)
        n = scope_alloc(sizeof *n + (size_t)c->nin * sizeof(tensor *));
    if (!n) {
        t_drop(out);
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->op = c->op;
    n->backward = bw;
    n->nin = c->nin;
    n->in = (tensor **)(n + 1);
    for (int i = 0; i < c->nin; i++) n->in[i] = c->in[i];
    n->out = out;
    memcpy(n->ip, c->ip, sizeof n->ip);
    memcpy(n->dp, c->dp, sizeof n->dp);
    n->saved = c->saved;
    n->grad_view = c->grad_view;
    n->grad_reads_f32 = c->grad_reads_f32;
    n->index = tape_len;
    tape[tape_len++] = n;
    out->requires_grad = true;
    out->grad_fn = n;
    return n;
}

tensor *op_end(op_call *c, tensor *out, backward_fn bw)
{
    if (out && c->record && !record(c, bw, out)) out = NULL;
    if (out)
        prof_end_op(&c->pm, c->op, false);
    else
        prof_abandon(&c->pm);
    return out;
}

void op_call_leave(op_call *c) { prof_abandon(&c->pm); }

void op_done(op_call *c, bool ok)
{
    if (ok)
        prof_end_op(&c->pm, c->op, false);
    else
        prof_abandon(&c->pm);
}
