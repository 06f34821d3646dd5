/* dispatch.h — the one road every op takes, and the state it consults.
 *
 * An op (a line of tensor/ops.def) is written as four steps; the first,
 * third and fourth are the dispatcher's, the same for every op:
 *
 *     op_call c;
 *     if (!op_begin(&c, OP_X, 2, in)) return NULL;   inputs present, autocast,
 *                                                    one device, a kernel there,
 *                                                    whether to record
 *     ... the op's own checks, its output's shape ...
 *     tensor *out = op_out(&c, dtype, ndim, shape);  in the scope, on c.dev
 *     if (op_run(&c, &x_kernels, out)) return NULL;  the backend's kernel
 *     c.ip[0] = ...;                                 what backward needs
 *     return op_end(&c, out, x_backward);            onto the tape if c.record
 *
 * Kernels (op_kernels: one function per backend) see plain tensors and the
 * call's parameters; they know neither the tape nor autocast. Backward
 * functions hand each input's gradient to op_grad (which the autograd
 * engine, autograd/tape.c, serves: it registers itself with
 * op_set_grad_sink) and call internal t_ ops, which record nothing because
 * the engine runs them with grad mode off.
 *
 * State with one owner, here, per thread: grad mode, the autocast dtype,
 * the tape of recorded nodes (ended with the scope that holds them); and
 * per process the autocast policy of each op (ops.def's, until
 * em_amp_set_policy). autograd/ and amp/ read and set it through the
 * functions below; nothing in tensor/ calls up into them. */
#ifndef EMBER_DISPATCH_H
#define EMBER_DISPATCH_H

#include "ops.h"
#include "profile_impl.h"
#include "tensor_impl.h"

/* ---- one call of an op ---------------------------------------------------------------- */

typedef struct op_call {
    op_id op;
    int nin;
    tensor **in;   /* the caller's array of inputs, autocast applied in place */
    em_device dev; /* where every input is (the CPU for an op without inputs) */
    /* the elementwise kinds (BINARY, COMPARE): the inputs' broadcast shape */
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    bool record; /* grad mode is on and an input requires grad: op_end will
                  * record, so compute what backward needs */
    /* a LOW op (matmul) under autocast whose kernel computes in the autocast
     * dtype from f32 operands as they are (dispatch.c, reads_f32_as_low):
     * that dtype, and its f32 inputs were left uncast; EM_F32 otherwise */
    em_dtype low;
    /* a PROMOTE op under autocast whose float inputs differ in dtype, left
     * uncast because its kernel reads each in its own (binary ops on the
     * CPU: dispatch.c, reads_mixed): the dtype they meet in, the widest;
     * EM_BOOL when the inputs were not left mixed */
    em_dtype mixed;
    /* the call's parameters: the kernel reads them, op_end copies them to
     * the node for backward */
    int64_t ip[8];
    double dp[4];
    void *saved;            /* op-specific, in the scope arena (scope_alloc) */
    grad_view_fn grad_view; /* a view op's: its input's gradient seen as its
                             * output (tensor_impl.h); op_end copies it to the node */
    /* the backward reads its output's gradient in f32 as well, rounding it
     * as it reads it (a low product that reads f32 operands): the engine
     * then hands it an f32 gradient as it is (node.grad_reads_f32) */
    bool grad_reads_f32;
    prof_mark pm; /* the profiler's record of this call, op_begin to op_end */
} op_call;

/* How an op declares its call: zeroed, and left through op_call_leave
 * however the function returns, so an op that fails its own checks after
 * op_begin (a shape, a dtype, a kernel's error) without reaching op_end or
 * op_done still ends its profiler record (abandoned: its time stays with
 * the caller's). op_end and op_done end it first; then leaving does
 * nothing. */
#define OP_CALL(c) op_call c __attribute__((cleanup(op_call_leave))) = {.nin = 0}
void op_call_leave(op_call *c);

/* Starts op `op` on in[0..nin) (nin >= 0; `in` is updated in place and must
 * stay alive until op_end). In order: every input is non-NULL (a NULL keeps
 * the error that made it, or sets "op: input is NULL"); all inputs are on
 * one device; autocast applies the op's policy (LOW:
 * f32/f64 inputs cast to the autocast dtype, except that a matmul on a CPU
 * whose products in that dtype are computed in f32 anyway keeps its f32
 * inputs and gets c->low instead; F32: each f16/bf16 input cast; PROMOTE:
 * the float inputs cast to the widest of them); the op has a kernel on the
 * device (ops.def's backends); the checks every op of its
 * kind shares (BINARY, COMPARE: both inputs of one dtype, their shapes
 * broadcast, into c->ndim/c->shape; SOFTMAX, NORM, LOSS, DROPOUT,
 * ATTENTION, CONV, POOL: the first input is a float tensor); c->record is
 * set. false with the thread's error set (EM_ERR_DEVICE, EM_ERR_DTYPE,
 * EM_ERR_SHAPE, EM_ERR_OOM from a cast) otherwise. While profiling is on,
 * the op's record (include/ember/profile.h) runs from here to op_end. */
bool op_begin(op_call *c, op_id op, int nin, tensor **in);

/* A contiguous, uninitialised output on c->dev in the current scope
 * (persistent when none is open): t_new_on. NULL + EM_ERR_OOM. */
tensor *op_out(const op_call *c, em_dtype dt, int ndim, const int64_t *shape);

/* An op's kernels, one per backend: compute `out` from c->in and c's
 * parameters. NULL: the op has none on that backend. */
typedef em_status (*op_kernel)(const op_call *c, tensor *out);
typedef struct op_kernels {
    op_kernel cpu, cuda;
} op_kernels;
/* The table of an op with both kernels: the CUDA one is named only in CUDA
 * builds (elsewhere it is not compiled, and no tensor is on a CUDA device). */
#if EM_HAVE_CUDA
#define OP_KERNELS(cpu_fn, cuda_fn)                                                                          \
    {                                                                                                        \
        .cpu = cpu_fn, .cuda = cuda_fn                                                                       \
    }
#else
#define OP_KERNELS(cpu_fn, cuda_fn)                                                                          \
    {                                                                                                        \
        .cpu = cpu_fn                                                                                        \
    }
#endif

/* Runs the kernel of c->dev's backend from k on out. EM_ERR_DEVICE naming
 * the op when that backend has none (ops.def promised one: a bug). */
em_status op_run(const op_call *c, const op_kernels *k, tensor *out);

/* Ends the call: when c->record, records out = op(c->in) with backward `bw`
 * on the tape (node: the op's name, the inputs, c's ip/dp/saved) and marks
 * out as requiring grad. Returns out; NULL when out is NULL or recording
 * failed (no scope open, out of memory: error set, out dropped). */
tensor *op_end(op_call *c, tensor *out, backward_fn bw);

/* Ends a call that records no node of its own (split, chunk: each piece is
 * a narrow, recorded by itself); ok false: the call failed. Only the
 * profiler's record ends here. */
void op_done(op_call *c, bool ok);

/* ---- parameters resident in part (ZeRO stage 3) ------------------------------------------
 * dist/zero.c keeps only this rank's share of a model's flat parameter
 * buffer (storage st) resident between uses. fetch(ctx, t) must make the
 * elements of st that t covers resident before they are read; op_begin
 * calls it for every input on st, and op_begin_backward for every tensor a
 * backward kernel reads (a saved weight), so a forward or backward anywhere
 * reads whole parameters. fetch may run collectives: every rank must make
 * the same calls in the same order, as with DDP. A failing fetch fails the
 * op with its error. One registration at a time; NULL fetch removes it.
 * (tensor/ knows only the callback: dist registers it, as amp's overflow
 * vote is registered, so no dependency points up.) */
typedef em_status (*op_fetch_fn)(void *ctx, const tensor *t);
void op_set_fetch(const storage *st, op_fetch_fn fetch, void *ctx);

/* ---- for backward functions ------------------------------------------------------------ */

/* Starts a backward kernel call for node n on in[0..nin) (the tensors its
 * kernels read: saved inputs, the output, the incoming gradient): all on one
 * device, c's op and parameters (ip, dp, saved) those of n's forward call,
 * c->record false (backward runs with grad mode off). Then op_out and
 * op_run choose the backend's backward kernel as for a forward op. false +
 * EM_ERR_DEVICE when the tensors are on different devices. */
bool op_begin_backward(op_call *c, const node *n, int nin, tensor **in);

/* Hands g (t's shape, any strides and float dtype) to the autograd engine as
 * a contribution to t's gradient. No-op when t does not require grad. */
em_status op_grad(tensor *t, tensor *g);

/* Accumulating in place, for a backward function whose kernel can add its
 * contribution where the gradient lies (a GEMM with beta = 1, an index-add,
 * a slice) instead of making it in a new tensor for op_grad, which then
 * adds it: the gradient of a parameter is never made twice.
 *
 *     bool fresh;
 *     tensor *acc = op_grad_acc(t, &fresh);
 *     if (acc)  { fresh ? write the contribution into acc : add it; op_grad_done(t); }
 *     else      { make g; op_grad(t, g); }
 *
 * acc: t's gradient accumulator (t's shape and dtype, on t's device): the
 * leaf's gradient (its buffer; made, zero-filled, on the first
 * contribution), the running gradient of a non-leaf (made, uninitialised,
 * on the first), or, for a t made by a view op with a grad_view (a
 * transpose of a weight), the view of its input's accumulator: so
 * dW of x @ W^T lands in W's gradient buffer. It is contiguous or a
 * permutation of a contiguous tensor (strides say which). fresh: acc holds
 * no contribution yet (zeros or uninitialised): write, do not add. Once a
 * caller has acc it must fill it as said and call op_grad_done(t), even
 * when its contribution is zero.
 * NULL when t does not require grad (nothing to do) or the engine has no
 * accumulator to offer (the dtype differs, an error: check em_last_status
 * only when it matters); then use op_grad. */
tensor *op_grad_acc(tensor *t, bool *fresh);
/* Marks the contribution added into op_grad_acc(t)'s accumulator as made:
 * a leaf's last use fires its hooks, as op_grad would. */
em_status op_grad_done(tensor *t);

/* The engine's side: sink(t, g) receives every op_grad, acc and done the
 * two calls above. */
typedef em_status (*grad_sink)(tensor *t, tensor *g);
typedef tensor *(*grad_acc_fn)(tensor *t, bool *fresh);
typedef em_status (*grad_done_fn)(tensor *t);
void op_set_grad_sink(grad_sink sink, grad_acc_fn acc, grad_done_fn done);

/* ---- state: grad mode, autocast, the tape ---------------------------------------------- */

/* Grad mode of the calling thread (on by default): whether ops record. */
bool op_grad_mode(void);
bool op_set_grad_mode(bool on); /* returns the previous mode */

/* The calling thread's autocast dtype: EM_F32 is off, else EM_BF16 or EM_F16
 * (the caller, amp/autocast.c, checks). Returns the previous one. */
em_dtype op_autocast(void);
em_dtype op_set_autocast(em_dtype dt);
/* The autocast policy of op (per process). */
op_policy op_policy_of(op_id op);
void op_set_policy(op_id op, op_policy p);
/* in[0..nin) (non-NULL) as op's policy wants them under the current
 * autocast, replaced in place: what op_begin does first. For a composite op
 * that applies its policy before calling other ops (mse_loss). false + error
 * when a cast fails. */
bool op_autocast_inputs(op_id op, int nin, tensor **in);
/* One tensor under a LOW/F32 policy (t itself when autocast is off, for
 * NONE and PROMOTE, and for non-float t); NULL + error when the cast fails. */
tensor *op_autocast_one(op_id op, tensor *t);

/* The calling thread's tape: nodes recorded so far, oldest first. The
 * autograd engine walks it; scope ends truncate it to what was there when
 * the scope began. */
int64_t tape_length(void);
node *tape_at(int64_t i);
void tape_truncate(int64_t len);

#endif
