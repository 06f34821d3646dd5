/* tensor_impl.h — the inside of a tensor, for ember's own source files only.
 *
 * Users see `em_tensor *` handles; the library works on `tensor *`, the
 * struct a handle names. A public op is a thin wrapper: resolve the handles
 * (t_resolve), call the internal op (t_xxx), return a handle (t_handle).
 * Internal ops take and return `tensor *`, return NULL with the thread's
 * error set on failure, and are what backward functions call.
 *
 * Memory: tensor structs live in slots of a global slot table (stable
 * addresses); data lives in a storage that is either malloc'd (persistent,
 * reference-counted by its views) or carved from the calling thread's scope
 * arena (freed when the scope ends).
 *
 * The internal headers by role: error_impl.h (reporting errors: included
 * here), this file (the tensor, handles, making tensors and views, checks,
 * the internal ops), kernel_impl.h (what kernels compute with: element
 * access, iteration, broadcasting, scratch memory, the pool, GEMM) and
 * dispatch.h (the path every op takes: autocast, devices, the tape).
 */
#ifndef EMBER_TENSOR_IMPL_H
#define EMBER_TENSOR_IMPL_H

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "ember/tensor.h"
#include "ember_config.h"
#include "error_impl.h"
#include "ops.h"
#if EM_HAVE_CUDA
#include "cuda_impl.h"
#endif

typedef struct storage {
    void *data;
    size_t nbytes;
    int refcount;  /* views alive that use it (persistent storage only) */
    bool in_arena; /* carved from a scope arena: freed with the scope */
    em_device dev; /* where data lives: host memory, or the device's caching allocator */
} storage;

typedef struct tensor tensor;
typedef struct node node;
typedef struct hook_entry hook_entry;

/* a leaf's gradient hook: fn is an em_grad_hook (ember/autograd.h; the
 * autograd engine stores and calls them, the tensor only holds the list) */
struct hook_entry {
    hook_entry *next;
    em_status (*fn)(em_tensor *t, em_tensor *grad, void *ctx);
    void *ctx;
};

struct tensor {
    em_dtype dtype;
    em_device device;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t stride[EM_MAX_DIMS]; /* in elements */
    int64_t offset;              /* in elements, into st->data */
    storage *st;

    /* identity and lifetime */
    uint32_t slot;      /* index in the slot table */
    uint32_t gen;       /* a handle is valid while its gen equals this */
    int depth;          /* scope depth at creation; 0 = persistent */
    tensor *scope_next; /* tensors of the same scope, newest first */

    /* autograd */
    bool requires_grad;
    node *grad_fn;      /* the node that produced it; NULL for leaves */
    tensor *grad;       /* leaf: persistent; non-leaf: temporary of a walk */
    bool grad_external; /* grad set by em_set_grad_buffer: not ours to free */
    bool grad_shared;   /* non-leaf grad adopted from a backward function: copy before adding */
    bool grad_set;      /* leaf: a gradient was produced since the last set-to-none zero_grad
                         * (em_has_grad; grad may exist, zeroed, while this is false) */
    int pending;        /* leaf uses left in the running backward */
    hook_entry *hooks;
};

/* A backward function receives the gradient of n->out (shape of out, dtype of
 * out, any strides) and accumulates into each input that requires grad with
 * op_grad (tensor/dispatch.h). It runs with grad mode off. */
typedef em_status (*backward_fn)(node *n, tensor *gout);

/* A view op whose gradient is its input's gradient seen through the same
 * view (permute: a bijection of the elements): acc, an accumulator of the
 * input's gradient (its shape), seen as the output. The autograd engine uses
 * it to let a consumer add into the input's gradient directly
 * (op_grad_acc, tensor/dispatch.h). NULL + error when no view can be made. */
typedef tensor *(*grad_view_fn)(const node *n, tensor *acc);

struct node {
    op_id op;          /* the op that recorded it (its name: op_name) */
    backward_fn backward;
    int nin;
    tensor **in;
    tensor *out;
    void *saved;    /* op-specific, from the scope arena (ag_alloc) */
    int64_t ip[8];  /* small integer parameters */
    double dp[4];   /* small float parameters */
    int64_t index;  /* position on the tape */
    bool reachable; /* set during a backward walk */
    /* a view op's (op_call.grad_view); NULL for the others */
    grad_view_fn grad_view;
    /* set during a walk: a consumer added into in[0]'s gradient through
     * grad_view, so this use of in[0] counts even when out never gets a
     * gradient of its own */
    bool delivered;
    /* its backward reads the output's gradient in f32 too, rounding it to
     * the output's dtype as it reads it (op_call.grad_reads_f32): a first
     * f32 contribution is adopted as it is, not narrowed (the narrowing
     * pass would make the same bits the reading does) */
    bool grad_reads_f32;
};

/* Whether t's gradient may be handed over in dt as it is: its dtype, or
 * f32 where t's node reads that itself (node.grad_reads_f32). */
static inline bool t_takes_grad_in(const tensor *t, em_dtype dt)
{
    return dt == t->dtype || (dt == EM_F32 && t->grad_fn && t->grad_fn->grad_reads_f32);
}

/* ---- handles -------------------------------------------------------------- */
/* The tensor behind h. NULL if h is NULL (keeping an earlier error, or setting
 * "op: input is NULL" if there is none) or stale (EM_ERR_SCOPE naming op). */
tensor *t_resolve(const em_tensor *h, const char *op);
em_tensor *t_handle(tensor *t); /* NULL stays NULL */
/* Whether `name` (an op of tensor/ops.def or an API function, as passed to
 * t_resolve) takes CUDA tensors (tensor/device.c); t_resolve refuses a CUDA
 * tensor for any other name. */
bool cuda_op_ok(const char *name);
/* The API functions that are not ops but take CUDA tensors, for the test
 * that no name is both. */
size_t cuda_entry_count(void);
const char *cuda_entry_name(size_t i);

/* ---- making tensors ------------------------------------------------------- */
/* Contiguous, uninitialised, in the current scope (or persistent at depth 0). */
tensor *t_new(em_dtype dt, int ndim, const int64_t *shape);
tensor *t_zeros(em_dtype dt, int ndim, const int64_t *shape);
tensor *t_zeros_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape);
/* Zeroes contiguous t's elements (on its device). */
em_status t_fill_zero(tensor *t);
/* Same dtype, shape and device as t, contiguous, uninitialised. */
tensor *t_new_like(const tensor *t);
/* Like t_new on device `dev` (t_new for the CPU). */
tensor *t_new_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape);
/* Whether t lives on a CUDA device. */
static inline bool t_on_cuda(const tensor *t) { return t->device.type == EM_CUDA; }
/* EM_OK when every non-NULL tensor of in[0..n) is on one device (its device
 * in *dev); else EM_ERR_DEVICE naming op and the devices. */
em_status t_same_device(const char *op, int n, tensor *const *in, em_device *dev);
/* Like t_new, but persistent whatever scope is open (caller frees: t_free). */
tensor *t_new_persistent(em_dtype dt, int ndim, const int64_t *shape);
tensor *t_new_persistent_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape);
/* zeros of t's dtype, shape and device, contiguous */
tensor *t_zeros_like(const tensor *t);
/* A header over base's storage with the given geometry (no checks). */
tensor *t_view_of(tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset);
/* Like t_view_of, but persistent whatever scope is open (caller frees: t_free). */
tensor *t_view_persistent(tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset);
/* t's values on dev, contiguous (t itself when it is there already), in the
 * current scope, no autograd; a copy to the host waits for the device.
 * NULL + EM_ERR_DEVICE when dev is not a usable device. */
tensor *t_copy_to(tensor *t, em_device dev);
/* Contiguous copy of t (no autograd). */
tensor *t_clone(tensor *t);
/* t if contiguous, else a contiguous copy (no autograd). */
tensor *t_contig(tensor *t);
/* Row-major strides for shape. */
void t_contig_strides(int ndim, const int64_t *shape, int64_t *stride);
bool t_is_contig(const tensor *t);
int64_t t_numel(const tensor *t);
int64_t shape_numel(int ndim, const int64_t *shape);
static inline size_t t_esize(const tensor *t) { return em_dtype_size(t->dtype); }
/* Address of element 0. */
static inline void *t_ptr(const tensor *t)
{
    return (char *)t->st->data + (size_t)t->offset * em_dtype_size(t->dtype);
}
/* Makes t a contiguous view of src's storage starting at element `offset`
 * (t keeps its shape, dtype and handle), releasing the storage it had. */
void t_repoint(tensor *t, tensor *src, int64_t offset);
/* Frees a persistent tensor (internal counterpart of em_free). */
void t_free(tensor *t);
/* Ends an op's temporary: frees it if persistent (the op ran with no scope
 * open), leaves it to its scope otherwise. Every tensor an op makes for its
 * own use and does not return must be dropped, or a call outside a scope
 * leaks it. NULL is a no-op. */
static inline void t_drop(tensor *t)
{
    if (t && t->depth == 0) t_free(t);
}
/* t_drop for a temporary nothing will read again, whose device memory
 * goes back at once even in a scope (its header stays to the scope): the
 * caching allocator's block, reused only by kernels queued after it. For
 * the copies an op makes of strided inputs and results on a device; on
 * the CPU it is t_drop. Not what t_drop itself does: composite ops drop
 * tensors the tape has recorded as inputs (em_mse_loss's p - t, which
 * mul's backward reads again), and in a scope t_drop leaves them to the
 * scope; made global (2026-12-07), early release freed them under the
 * tape (UBSan: a NULL storage in bin_cuda from muldiv_backward, in
 * test_cuda_mse_loss_matches_the_cpu and every CUDA training test). */
void t_drop_now(tensor *t);
/* A leaf's gradient when one was produced since the last set-to-none
 * zero_grad (what the optimizer steps, clipping measures and the loss
 * scaler checks), else NULL: a parameter skipped as PyTorch skips a None
 * .grad. */
static inline tensor *t_live_grad(const tensor *t) { return !t->grad_fn && t->grad_set ? t->grad : NULL; }
/* Normalises dim (negative from the end) for a tensor of ndim dims; -1 plus
 * an EM_ERR_ARG error naming op on out of range. `extra` = 1 allows dim ==
 * ndim (for unsqueeze/stack). */
int t_dim(const char *op, int dim, int ndim, int extra);

/* ---- checks (each sets a message naming op and returns false) ------------- */
bool chk_same_dtype(const char *op, const tensor *a, const tensor *b);
bool chk_float(const char *op, const tensor *t);
bool chk_dtype(const char *op, const tensor *t, em_dtype want, const char *what);

/* ---- scope arena (for autograd saved data) -------------------------------- */
/* Memory that lives as long as the current scope (64-byte aligned); NULL with
 * EM_ERR_SCOPE when no scope is open. */
void *scope_alloc(size_t nbytes);

/* ---- internal ops, callable from backward functions ------------------------
 * Same contracts as the public em_ functions of the same name. */
tensor *t_add(tensor *a, tensor *b);
tensor *t_sub(tensor *a, tensor *b);
tensor *t_mul(tensor *a, tensor *b);
tensor *t_div(tensor *a, tensor *b);
tensor *t_neg(tensor *a);
tensor *t_add_scalar(tensor *a, double s);
tensor *t_mul_scalar(tensor *a, double s);
tensor *t_sum(tensor *t, int ndims, const int *dims, bool keepdim);
tensor *t_reshape(tensor *t, int ndim, const int64_t *shape);
tensor *t_expand(tensor *t, int ndim, const int64_t *shape);
tensor *t_transpose(tensor *t, int d0, int d1);
tensor *t_permute(tensor *t, const int *dims);
tensor *t_matmul(tensor *a, tensor *b);
tensor *t_linear(tensor *x, tensor *w, tensor *b); /* b may be NULL */
tensor *t_cast(tensor *t, em_dtype dt);
tensor *t_narrow(tensor *t, int dim, int64_t start, int64_t len);
tensor *t_unsqueeze(tensor *t, int dim);
tensor *t_squeeze(tensor *t, int dim);

#endif
