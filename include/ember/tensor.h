/* ember/tensor.h — tensors: dtypes, shapes, views, memory lifetimes, RNG and
 * every forward op.
 *
 * Handles. An `em_tensor *` is an opaque handle, never dereferenced by user
 * code. It encodes a slot and a generation, so a handle whose tensor has died
 * (its step scope ended, or em_free was called) is recognised as stale on
 * every later use: the op fails with EM_ERR_SCOPE instead of reading garbage.
 *
 * Errors. Every function that returns a tensor returns NULL on failure and
 * sets the calling thread's last error (em_last_status / em_last_error), a
 * message naming the op and the offending shapes or values. A NULL input makes
 * an op return NULL and keep the first error, so a chain of ops can be checked
 * once at its end. Functions that return em_status return EM_OK or the code.
 *
 * Lifetimes (DESIGN.md). A tensor made while no step scope is open is
 * persistent: it lives until em_free. A tensor made inside a scope lives until
 * that scope ends; em_keep copies one out to a persistent tensor.
 *
 * Shapes are written in comments as (B,T,C). Dims may be negative (counted from
 * the end). Broadcasting follows NumPy/PyTorch: shapes are aligned at the
 * right, and a dim of size 1 stretches to match.
 */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

#define EM_MAX_DIMS 8

typedef struct em_tensor em_tensor;

typedef enum em_dtype {
    EM_F32 = 0,
    EM_F64,
    EM_F16,
    EM_BF16,
    EM_I32,
    EM_U8,
    EM_BOOL, /* one byte, 0 or 1 */
    EM_NUM_DTYPES
} em_dtype;

typedef enum em_device_type { EM_CPU = 0, EM_CUDA } em_device_type;
typedef struct em_device {
    em_device_type type;
    int index;
} em_device;

typedef enum em_status {
    EM_OK = 0,
    EM_ERR_ARG,         /* a bad argument: NULL, out-of-range dim, bad value */
    EM_ERR_SHAPE,       /* shapes that do not fit together */
    EM_ERR_DTYPE,       /* a dtype the op does not take, or mixed dtypes */
    EM_ERR_DEVICE,      /* a device not built in, or mixed devices */
    EM_ERR_INDEX,       /* an index value out of range */
    EM_ERR_SCOPE,       /* a stale handle, or a lifetime rule broken */
    EM_ERR_OOM,         /* out of memory */
    EM_ERR_IO,          /* a file could not be read or written */
    EM_ERR_UNSUPPORTED, /* valid, but not implemented */
    EM_ERR_AUTOGRAD,    /* backward asked for something the tape cannot do */
    EM_ERR_DIST,        /* a peer failed, refused us, or called a different collective */
    EM_ERR_TIMEOUT      /* a blocking distributed call ran past its timeout */
} em_status;

/* ---- errors ---------------------------------------------------------------
 * The last error of the calling thread. The message stays valid until the next
 * failing call on the same thread. em_clear_error resets both to EM_OK / "". */
em_status em_last_status(void);
const char *em_last_error(void);
void em_clear_error(void);
const char *em_status_name(em_status s);
/* Sets the thread's last error (printf-style message) and returns s; for
 * callbacks such as gradient hooks that fail and want to say why. */
em_status em_set_error(em_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- dtypes --------------------------------------------------------------- */
size_t em_dtype_size(em_dtype dt);      /* bytes per element; 0 if invalid */
const char *em_dtype_name(em_dtype dt); /* "f32", ...; "?" if invalid */
bool em_dtype_is_float(em_dtype dt);    /* f32, f64, f16, bf16 */

/* Scalar conversions. Both round to nearest, ties to even, through
 * subnormals; overflow goes to infinity; a NaN stays a quiet NaN with its
 * sign and the top bits of its payload (as the x86 F16C instructions
 * convert). The same bits as em_cast and as the CUDA kernels. */
uint16_t em_f32_to_f16(float x);
float em_f16_to_f32(uint16_t h);
uint16_t em_f32_to_bf16(float x);
float em_bf16_to_f32(uint16_t h);

/* ---- shapes ----------------------------------------------------------------
 * EM_SHAPE(2, 3) expands to the two arguments `ndim, shape` that creation
 * functions take:  em_zeros(EM_F32, EM_SHAPE(2, 3)). */
#define EM_SHAPE(...)                                                                                        \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) { __VA_ARGS__ }

/* ---- metadata (all accept a live handle; on a bad handle they set the last
 * error and return 0 / NULL / -1 as said) ----------------------------------- */
int em_ndim(const em_tensor *t);               /* -1 on a bad handle */
int64_t em_size(const em_tensor *t, int dim);  /* dim may be negative; -1 on error */
const int64_t *em_shape(const em_tensor *t);   /* ndim entries; owned by t */
const int64_t *em_strides(const em_tensor *t); /* in elements; owned by t */
int64_t em_offset(const em_tensor *t);         /* storage offset, in elements */
int64_t em_numel(const em_tensor *t);          /* -1 on a bad handle */
em_dtype em_dtype_of(const em_tensor *t);      /* EM_NUM_DTYPES on a bad handle */
em_device em_device_of(const em_tensor *t);
/* Devices: em_device_cpu() is {EM_CPU, 0}; em_device_cuda(i) is cuda:i
 * (whether it exists is checked where it is used). */
em_device em_device_cpu(void);
em_device em_device_cuda(int index);
bool em_device_equal(em_device a, em_device b);
/* "cpu" or "cuda:N" into buf (size >= 16); returns buf. */
const char *em_device_str(em_device d, char *buf, size_t size);
/* Reads "cpu", "cuda" (index `cuda_default`) or "cuda:N" into *out. Whether
 * the device exists is not checked here. EM_ERR_ARG naming s otherwise. */
em_status em_device_parse(const char *s, int cuda_default, em_device *out);
/* A copy of t on `dev` (contiguous), or t itself when it is already there.
 * Differentiable: the gradient goes back to t's device. A host -> device
 * copy is staged through pinned memory and returns before it lands, so it
 * overlaps the device's work. Errors: EM_ERR_DEVICE when dev is not a
 * usable device of this build (no CUDA built in, index out of range). */
em_tensor *em_to(em_tensor *t, em_device dev);
bool em_is_contiguous(const em_tensor *t);
bool em_is_alive(const em_tensor *t); /* false for stale handles; sets no error */
bool em_shares_storage(const em_tensor *a, const em_tensor *b);
/* Pointer to element 0 (storage + offset). Writable; valid while t lives.
 * Only meaningful as a flat array when em_is_contiguous(t). */
void *em_data(em_tensor *t);
/* Writes "f32(2,3)" into buf (always NUL-terminated); returns buf. */
char *em_describe(const em_tensor *t, char *buf, size_t n);

/* ---- lifetimes ------------------------------------------------------------ */
typedef struct em_scope {
    int depth;   /* 1 for the outermost scope */
    uint64_t id; /* unique per begin, checked by em_scope_end */
} em_scope;

/* Opens a step scope on the calling thread. Tensors, autograd nodes and
 * temporaries made until the matching em_scope_end live in it and are freed
 * together. Scopes nest. The memory is kept and reused by the next scope, so a
 * steady-state loop does no malloc per op. */
em_scope em_scope_begin(void);
/* Ends s, which must be the innermost open scope (EM_ERR_SCOPE otherwise, and
 * nothing is freed). Every handle made in it becomes stale. */
em_status em_scope_end(em_scope s);
int em_scope_depth(void); /* open scopes on this thread; 0 = persistent */
/* Copies t (data only, no autograd history) into a new persistent tensor,
 * contiguous, same dtype. The caller owns it (em_free). */
em_tensor *em_keep(const em_tensor *t);
/* Frees a persistent tensor (a view frees its header; storage is freed when
 * its last view goes). NULL is a no-op. A scoped tensor gives EM_ERR_SCOPE. */
em_status em_free(em_tensor *t);
/* Bytes the calling thread's scope arena holds from the system (grows to the
 * high-water mark of a step, then stays). For tests and memory reports. */
size_t em_arena_reserved(void);
/* Number of times the arena has asked the system for memory. */
uint64_t em_arena_system_allocs(void);
/* Bytes of the calling thread's scope arena in use now: what the open scopes
 * hold (tensor data, tape nodes, saved values; 64-byte granules). The
 * difference across a call is what that call left in the scope (a
 * backward's gradients of non-leaves, say). For tests and memory reports. */
size_t em_arena_in_use(void);
/* Tensors alive now on all threads (persistent + scoped, views included):
 * a leak check for tests and long-running programs. */
int64_t em_live_tensors(void);

/* ---- creation ------------------------------------------------------------
 * New contiguous tensors, owned by the current scope (or persistent). NULL and
 * EM_ERR_ARG / EM_ERR_SHAPE on a negative dim or ndim > EM_MAX_DIMS. */
em_tensor *em_empty(em_dtype dt, int ndim, const int64_t *shape);
em_tensor *em_zeros(em_dtype dt, int ndim, const int64_t *shape);
em_tensor *em_ones(em_dtype dt, int ndim, const int64_t *shape);
em_tensor *em_full(em_dtype dt, int ndim, const int64_t *shape, double value);
em_tensor *em_scalar(em_dtype dt, double value); /* 0-dim */
/* 1-D: start, start+step, ... while < end (> end for negative step). */
em_tensor *em_arange(double start, double end, double step, em_dtype dt);
/* Copies numel elements of dtype dt from data (row-major). */
em_tensor *em_from_data(em_dtype dt, int ndim, const int64_t *shape, const void *data);
/* zeros / ones of t's dtype and shape on t's device. */
em_tensor *em_zeros_like(const em_tensor *t);
em_tensor *em_ones_like(const em_tensor *t);
/* A contiguous copy with the same dtype. Differentiable. */
em_tensor *em_copy(em_tensor *t);
/* Copies src's values into dst (shapes equal, src may broadcast; dtypes may
 * differ and are converted). Not recorded by autograd. Both on one device
 * (EM_ERR_DEVICE otherwise: move one with em_to). */
em_status em_copy_into(em_tensor *dst, const em_tensor *src);
/* Writes t's values as contiguous dtype dt elements into dst (numel of them),
 * host memory; a CUDA tensor is copied off its device (this waits for it). */
em_status em_to_array(const em_tensor *t, em_dtype dt, void *dst);
/* Element at a full index (ndim entries), as double. NAN + error if out of range. */
double em_get(const em_tensor *t, const int64_t *index);
em_status em_set(em_tensor *t, const int64_t *index, double value);
/* The single element of a tensor with numel 1, as double (NAN on error); a
 * CUDA tensor's is copied off the device (this waits for it). */
double em_item(const em_tensor *t);

/* ---- random numbers --------------------------------------------------------
 * Philox4x32-10, counter-based: the numbers depend only on (seed, offset),
 * never on thread count or device, so any draw can be replayed. Each draw
 * advances offset by the number of 128-bit counters it used. Saving {seed,
 * offset} is saving the generator. */
typedef struct em_rng {
    uint64_t seed;
    uint64_t offset;
} em_rng;
em_rng em_rng_new(uint64_t seed);
/* A seed for an independent stream `stream` of `seed` (splitmix64 of both):
 * give each use of randomness in a program (init, data order, dropout,
 * evaluation) its own stream, so none of them repeats another's numbers. */
uint64_t em_seed_derive(uint64_t seed, uint64_t stream);
/* The thread's default generator (seed 0 until em_manual_seed). */
em_rng *em_default_rng(void);
void em_manual_seed(uint64_t seed);
/* rng NULL means the default generator. Floats only for rand/randn. */
em_tensor *em_rand(em_dtype dt, int ndim, const int64_t *shape, em_rng *rng);  /* U[0,1) */
em_tensor *em_randn(em_dtype dt, int ndim, const int64_t *shape, em_rng *rng); /* N(0,1) */
/* Integers uniform in [low, high). i32, u8 or any float dtype. */
em_tensor *em_randint(int64_t low, int64_t high, em_dtype dt, int ndim, const int64_t *shape, em_rng *rng);
/* Four 32-bit words of Philox4x32-10 for (key, counter); for kernels. */
void em_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);

/* ---- views (share storage with the input; differentiable) ----------------- */
/* ndim/shape may hold one -1, inferred. Returns a view when the strides allow,
 * otherwise a contiguous copy (like torch.reshape). */
em_tensor *em_reshape(em_tensor *t, int ndim, const int64_t *shape);
/* Like em_reshape but never copies: EM_ERR_SHAPE when a view is impossible. */
em_tensor *em_view(em_tensor *t, int ndim, const int64_t *shape);
em_tensor *em_flatten(em_tensor *t); /* 1-D */
em_tensor *em_transpose(em_tensor *t, int dim0, int dim1);
/* dims: a permutation of 0..ndim-1 (ndim entries). */
em_tensor *em_permute(em_tensor *t, const int *dims);
/* Elements start .. start+length-1 along dim. */
em_tensor *em_narrow(em_tensor *t, int dim, int64_t start, int64_t length);
/* Python-style t[start:end:step] along dim (negative start/end count from the
 * end and are clamped; step >= 1). */
em_tensor *em_slice(em_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* Broadcast to shape (size-1 dims stretch with stride 0; new dims on the left;
 * -1 keeps a size). */
em_tensor *em_expand(em_tensor *t, int ndim, const int64_t *shape);
em_tensor *em_squeeze(em_tensor *t, int dim);   /* dim must have size 1 */
em_tensor *em_unsqueeze(em_tensor *t, int dim); /* dim in [-ndim-1, ndim] */
/* t itself (the same handle) if contiguous, else a contiguous copy. */
em_tensor *em_contiguous(em_tensor *t);
/* Converts to dtype dt (a copy, even if dt is t's dtype). Floats to f16/bf16
 * round to nearest even; floats to integers truncate toward zero; to bool
 * gives x != 0. Differentiable between float dtypes. */
em_tensor *em_cast(em_tensor *t, em_dtype dt);

/* ---- joining and splitting ------------------------------------------------ */
/* n tensors, same dtype, equal shapes except along dim. */
em_tensor *em_concat(int n, em_tensor *const *ts, int dim);
/* n tensors of equal shape, stacked along a new dim. */
em_tensor *em_stack(int n, em_tensor *const *ts, int dim);
/* Views of pieces of size `size` along dim (the last may be smaller). Writes at
 * most max_out handles to out; returns the number of pieces, -1 on error. */
int em_split(em_tensor *t, int64_t size, int dim, em_tensor **out, int max_out);
/* `chunks` views as equal as possible (torch.chunk); returns count, -1 on error. */
int em_chunk(em_tensor *t, int chunks, int dim, em_tensor **out, int max_out);

/* ---- elementwise (broadcasting; both operands the same dtype) -------------
 * Float dtypes compute in f32 (f64 for f64); integer dtypes are allowed for
 * add/sub/mul/neg/abs and comparisons. */
em_tensor *em_add(em_tensor *a, em_tensor *b);
em_tensor *em_sub(em_tensor *a, em_tensor *b);
em_tensor *em_mul(em_tensor *a, em_tensor *b);
em_tensor *em_div(em_tensor *a, em_tensor *b);
em_tensor *em_add_scalar(em_tensor *a, double s);
em_tensor *em_mul_scalar(em_tensor *a, double s);
em_tensor *em_pow_scalar(em_tensor *a, double p); /* a^p */
em_tensor *em_neg(em_tensor *a);
em_tensor *em_exp(em_tensor *a);
em_tensor *em_log(em_tensor *a);
em_tensor *em_sqrt(em_tensor *a);
em_tensor *em_rsqrt(em_tensor *a);
em_tensor *em_abs(em_tensor *a);
em_tensor *em_tanh(em_tensor *a);
em_tensor *em_sigmoid(em_tensor *a);
em_tensor *em_relu(em_tensor *a);
em_tensor *em_gelu(em_tensor *a);      /* exact: x * Phi(x) */
em_tensor *em_gelu_tanh(em_tensor *a); /* tanh approximation (GPT-2) */
em_tensor *em_silu(em_tensor *a);      /* x * sigmoid(x) */
/* Comparisons give EM_BOOL; not differentiable. */
em_tensor *em_eq(em_tensor *a, em_tensor *b);
em_tensor *em_ne(em_tensor *a, em_tensor *b);
em_tensor *em_lt(em_tensor *a, em_tensor *b);
em_tensor *em_le(em_tensor *a, em_tensor *b);
em_tensor *em_gt(em_tensor *a, em_tensor *b);
em_tensor *em_ge(em_tensor *a, em_tensor *b);
/* cond (EM_BOOL) ? a : b, all three broadcast together. */
em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b);
/* a with value wherever mask (EM_BOOL, broadcast to a) is true. */
em_tensor *em_masked_fill(em_tensor *a, em_tensor *mask, double value);

/* ---- reductions ------------------------------------------------------------
 * dims: ndims entries (negative allowed, no repeats); ndims 0 / dims NULL
 * reduces over every dim. keepdim leaves the reduced dims as size 1. */
em_tensor *em_sum(em_tensor *t, int ndims, const int *dims, bool keepdim);
em_tensor *em_mean(em_tensor *t, int ndims, const int *dims, bool keepdim);
/* max/min: gradient flows to the elements equal to the result, split evenly
 * among ties (torch.amax). */
em_tensor *em_max(em_tensor *t, int ndims, const int *dims, bool keepdim);
em_tensor *em_min(em_tensor *t, int ndims, const int *dims, bool keepdim);
/* Index (EM_I32) of the first maximum along dim. */
em_tensor *em_argmax(em_tensor *t, int dim, bool keepdim);

/* ---- linear algebra --------------------------------------------------------
 * a (...,M,K) @ b (...,K,N) -> (...,M,N); both at least 2-D; batch dims
 * broadcast. f32 -> sgemm, f64 -> dgemm, f16/bf16 computed in f32. */
em_tensor *em_matmul(em_tensor *a, em_tensor *b);
/* A linear layer's y = x @ w^T + b (torch.nn.functional.linear): x (...,in),
 * w (out,in), b (out) or NULL, y (...,out), a new tensor owned like every
 * op's result (the current scope's, persistent when none is open); x, w
 * and b stay the caller's, w read where it lies, never copied transposed.
 * The bias is added as the product is stored, with the bits of
 * em_add(em_matmul(x, em_transpose(w, 0, 1)), b): under autocast the
 * product is rounded to the low dtype and an f32 bias added to it in f32,
 * so y is then f32 (bf16 without a bias). Differentiable in x, w and b. NULL + EM_ERR_SHAPE naming the shapes when x is 0-D, w is not
 * 2-D, x's last dim is not w's in, or b is not (out); EM_ERR_DTYPE for
 * non-float tensors or (autocast off) dtypes that differ; EM_ERR_DEVICE
 * when they are on different devices. */
em_tensor *em_linear(em_tensor *x, em_tensor *w, em_tensor *b);

/* ---- neural-network ops ---------------------------------------------------- */
em_tensor *em_softmax(em_tensor *t, int dim);
em_tensor *em_log_softmax(em_tensor *t, int dim);
/* Normalises over the last dim C. x (...,C); weight, bias (C) or NULL. */
em_tensor *em_layer_norm(em_tensor *x, em_tensor *weight, em_tensor *bias, double eps);
em_tensor *em_rms_norm(em_tensor *x, em_tensor *weight, double eps);
/* weight (V,C), idx EM_I32 of any shape (...) -> (...,C). */
em_tensor *em_embedding(em_tensor *weight, em_tensor *idx);
/* Rows of t along dim picked by idx (EM_I32, 1-D). */
em_tensor *em_index_select(em_tensor *t, int dim, em_tensor *idx);
/* A copy of t with src added at index along dim (torch.scatter_add):
 * out[... index[i,j,k] (at dim) ...] += src[i,j,k]. index EM_I32, same ndim as
 * t, index and src the same shape. */
em_tensor *em_scatter_add(em_tensor *t, int dim, em_tensor *index, em_tensor *src);
/* Mean cross-entropy of logits (...,C) (classes on the LAST dim) against
 * EM_I32 targets (...); targets equal to ignore_index count for nothing.
 * Returns a 0-dim tensor, NaN when every target is ignored (as PyTorch).
 * Fused log-softmax, stable. em_cross_entropy_loss below has PyTorch's
 * conventions and options; this is em_cross_entropy_loss with class_dim -1
 * and the other fields at their defaults. */
em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *targets, int ignore_index);

/* The target value PyTorch and Hugging Face ignore by default (-100): the
 * default ignore_index of em_cross_entropy_loss, em_gpt_loss, ember train and
 * em_pad_defaults' label padding. */
#define EM_IGNORE_INDEX (-100)

/* How a loss of many elements becomes its result (torch's reduction=). */
typedef enum em_reduction {
    EM_REDUCTION_MEAN = 0, /* 'mean': weighted mean over the targets not ignored */
    EM_REDUCTION_SUM,      /* 'sum' */
    EM_REDUCTION_NONE      /* 'none': one loss per target, the targets' shape */
} em_reduction;

/* Options of em_cross_entropy_loss: torch.nn.functional.cross_entropy's
 * keyword arguments. Start from em_cross_entropy_defaults() (a zeroed
 * struct is NOT the defaults: its ignore_index 0 ignores class 0 and its
 * class_dim 0 is the batch dim). */
typedef struct em_cross_entropy_config {
    int ignore_index;       /* targets equal to it count for nothing; default EM_IGNORE_INDEX (-100) */
    double label_smoothing; /* in [0,1]; default 0. The target becomes (1-e) onehot + e/C uniform */
    em_reduction reduction; /* default EM_REDUCTION_MEAN */
    em_tensor *weight;      /* (C) float class weights (borrowed; any float dtype, on the logits'
                             * device; no gradient flows to it, as in PyTorch), or NULL (default) */
    int class_dim;          /* the dim of the C classes; negative counts from the end (-1: the last,
                             * em_cross_entropy's, what a GPT's (B,T,V) logits have). Default 1:
                             * PyTorch's (N,C,d1,...), and dim 0 of 1-D logits (C) */
} em_cross_entropy_config;
em_cross_entropy_config em_cross_entropy_defaults(void);

/* torch.nn.functional.cross_entropy(logits, targets, weight, ignore_index,
 * reduction, label_smoothing) for class-index targets. logits float (N,C) /
 * (N,C,d1,...) / (C) with the classes on cfg->class_dim; targets EM_I32 of
 * the logits' shape without that dim, each in [0,C) or ignore_index. cfg
 * NULL: the defaults. With e = label_smoothing, w_j the class weights (1
 * without) and lse the row's log-sum-exp, a target t's loss is
 *   (1-e) w_t (lse - x_t) + (e/C) sum_j w_j (lse - x_j),   0 when ignored;
 * MEAN divides their sum by the sum of w_t over the targets not ignored
 * (their count without weights: NaN when every target is ignored), SUM
 * returns the sum, NONE the losses (the targets' shape). Differentiable in
 * logits (fused backward, CPU and CUDA). Errors, before anything is
 * computed: EM_ERR_ARG for a bad reduction, label_smoothing, class_dim or a
 * weight that requires grad; EM_ERR_SHAPE / EM_ERR_DTYPE naming the shapes
 * for targets or a weight that do not fit; EM_ERR_INDEX naming the first
 * target out of range and its position. A class_dim other than the last is
 * a permuted view (the kernel reads rows with the classes last). */
em_tensor *em_cross_entropy_loss(em_tensor *logits, em_tensor *targets, const em_cross_entropy_config *cfg);
/* Zeroes each element with probability p and scales the rest by 1/(1-p); the
 * mask depends only on (rng seed, offset). Identity when !training or p == 0. */
em_tensor *em_dropout(em_tensor *t, double p, bool training, em_rng *rng);
/* Causal scaled-dot-product attention, one op: q, k, v (B,H,T,D) -> (B,H,T,D).
 * scale <= 0 means 1/sqrt(D). */
em_tensor *em_attention_causal(em_tensor *q, em_tensor *k, em_tensor *v, double scale);
/* em_attention_causal on the output of a fused QKV projection, split and
 * merged as GPT-2 does, with no copy: qkv (B,T,3C) holds q in channels
 * [0,C), k in [C,2C), v in [2C,3C); head h (of n_head, D = C/n_head) takes
 * channels h*D..(h+1)*D of each. Returns y (B,T,C), contiguous, in qkv's
 * dtype (f32 under autocast, whose policy for "attention_qkv" is F32 as
 * for "attention"): y[b,t,h*D+d] = head h's output at position t. Equal,
 * bit for bit, to narrowing q, k, v out of qkv, reshaping each to
 * (B,T,H,D) and transposing to (B,H,T,D), em_attention_causal, then
 * transposing back and reshaping to (B,T,C); so are the gradients. The
 * result is a new tensor of the current scope (persistent with none open,
 * the caller's to free); qkv is borrowed. scale <= 0 means 1/sqrt(D).
 * Errors (NULL): EM_ERR_SHAPE when qkv is not 3-D, its last dim not a
 * multiple of 3 or C not a multiple of n_head; EM_ERR_ARG for n_head < 1
 * or a scale that is NaN or infinite; EM_ERR_DTYPE for a non-float qkv;
 * EM_ERR_UNSUPPORTED for T or D beyond int range, or D > 128 on CUDA;
 * EM_ERR_SCOPE when recording a gradient with no scope open. */
em_tensor *em_attention_causal_qkv(em_tensor *qkv, int64_t n_head, double scale);
/* x (N,C,H,W), w (O,C,KH,KW), bias (O) or NULL -> (N,O,OH,OW). */
em_tensor *em_conv2d(em_tensor *x, em_tensor *w, em_tensor *bias, int stride, int padding);
/* x (N,C,H,W) -> (N,C,OH,OW). avg_pool2d counts padding zeros (PyTorch's
 * count_include_pad=True). */
em_tensor *em_max_pool2d(em_tensor *x, int kernel, int stride, int padding);
em_tensor *em_avg_pool2d(em_tensor *x, int kernel, int stride, int padding);

/* ---- runtime ---------------------------------------------------------------- */
/* Threads the CPU kernels use (default: online cores, or EMBER_NUM_THREADS). */
int em_num_threads(void);
em_status em_set_num_threads(int n);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
