/* device.c — devices as the rest of the engine sees them: naming, moving a
 * tensor between devices (em_to, differentiable), the same-device check ops
 * run on their inputs, and which functions take CUDA tensors.
 *
 * That last answer is the safety net: the CPU kernels read memory through
 * host pointers, so a CUDA tensor reaching an op without a CUDA path would
 * crash the process. t_resolve asks cuda_op_ok for every CUDA tensor, and a
 * name it refuses fails with EM_ERR_DEVICE naming it. For an op the op list
 * answers (tensor/ops.def: CPU_CUDA once its forward and backward both have
 * CUDA paths, and tests); the few API functions that are not ops but take
 * CUDA tensors are listed here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/runtime.h"
#include "ops.h"
#include "dispatch.h"

em_device em_device_cpu(void) { return (em_device){EM_CPU, 0}; }
em_device em_device_cuda(int index) { return (em_device){EM_CUDA, index}; }
bool em_device_equal(em_device a, em_device b) { return a.type == b.type && (a.type == EM_CPU || a.index == b.index); }

const char *em_device_str(em_device d, char *buf, size_t size)
{
    if (!buf || size == 0) return buf;
    if (d.type == EM_CPU)
        snprintf(buf, size, "cpu");
    else
        snprintf(buf, size, "cuda:%d", d.index);
    return buf;
}

em_status em_device_parse(const char *s, int cuda_default, em_device *out)
{
    if (!s || !out) return em_err(EM_ERR_ARG, "em_device_parse: %s is NULL", s ? "out" : "the text");
    if (!strcmp(s, "cpu")) {
        *out = em_device_cpu();
        return EM_OK;
    }
    if (!strcmp(s, "cuda")) {
        *out = em_device_cuda(cuda_default);
        return EM_OK;
    }
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long i = strtol(s + 5, &end, 10);
        if (!*end && i >= 0 && i < 1 << 20) {
            *out = em_device_cuda((int)i);
            return EM_OK;
        }
    }
    return em_err(EM_ERR_ARG, "device '%s' is not cpu, cuda or cuda:N", s);
}

em_status t_same_device(const char *op, int n, tensor *const *in, em_device *dev)
{
    const tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (!first) {
            first = in[i];
            continue;
        }
        if (!em_device_equal(first->device, in[i]->device)) {
            char a[16], b[16];
            return em_err(EM_ERR_DEVICE, "%s: inputs on different devices: %s is on %s, %s is on %s (move one with em_to)",
                          op, shp(first), em_device_str(first->device, a, sizeof a), shp(in[i]),
                          em_device_str(in[i]->device, b, sizeof b));
        }
    }
    if (dev) *dev = first ? first->device : em_device_cpu();
    return EM_OK;
}

/* ---- which functions take CUDA tensors ----------------------------------------------------
 * Ops: the op list's backends (tensor/ops.def). Below, the API functions that
 * are not ops (names as they pass them to t_resolve) but handle a CUDA
 * tensor correctly: they never read its data through a host pointer. A name
 * is an op or an entry here, never both (tests/test_cuda_ops.c checks). */
/* clang-format off */
static const char *const cuda_entry_points[] = {
    /* metadata, lifetime, autograd plumbing: never touch the data */
    "em_device_of", "em_is_contiguous", "em_ndim", "em_size", "em_shape", "em_strides", "em_offset", "em_numel",
    "em_dtype_of", "em_free", "em_keep", "em_data", "em_shares_storage", "em_requires_grad", "em_set_requires_grad",
    "em_grad", "em_has_grad", "em_zero_grad", "em_backward", "em_detach", "em_register_grad_hook", "em_clear_grad_hooks",
    "em_is_leaf", "em_to", "em_set_grad_buffer", "em_module_to", "em_module_flatten", "em_describe",
    /* values in and out: a device tensor's values are copied off the device */
    "em_copy_into", "em_to_array", "em_item", "em_zeros_like", "em_ones_like", "em_safetensors_save", "em_module_load",
    /* layers and the GPT: composites of ops (nn/layers.c, nn/gpt.c, the
     * KV-cache sampler included: views, copies, matmul, softmax, norms) */
    "drop", "gpt", "em_gpt_forward", "em_gpt_loss", "em_gpt_loss_labels",
    "em_gpt_forward_cached",
    /* optimizers, clipping, scaler, collectives (optim/optim.cu, dist/nccl.c;
     * collectives without NCCL fail in dist/collectives.c, naming why) */
    "em_sgd_new", "em_adam_new", "em_adamw_new", "em_optim_add_group", "em_optim_step", "em_optim_zero_grad",
    "em_optim_load_state", "em_clip_grad_norm", "em_scaler_unscale", "all_reduce", "broadcast", "all_gather",
    "reduce_scatter", "gather", "send", "recv",
    /* ZeRO (dist/zero.c): device copies, NCCL, the optimizer's pieces on the device; stage 3's
     * shares (metadata) and their checkpoints (dist/accel_state.c, checkpoint_model.c: device
     * values pass through host copies) */
    "em_zero_new", "em_zero", "em_zero_clip_grad_norm", "optim_set_piece", "zero_param_share",
    "em_accel_save_state", "em_accel_load_state",
};
/* clang-format on */

size_t cuda_entry_count(void) { return sizeof cuda_entry_points / sizeof cuda_entry_points[0]; }
const char *cuda_entry_name(size_t i) { return i < cuda_entry_count() ? cuda_entry_points[i] : NULL; }

bool cuda_op_ok(const char *name)
{
    if (!name) return false;
    int op = op_find(name);
    if (op >= 0) return (op_table[op].backends & OPB_CUDA) != 0;
    for (size_t i = 0; i < cuda_entry_count(); i++)
        if (!strcmp(cuda_entry_points[i], name)) return true;
    return false;
}

/* ---- em_to ------------------------------------------------------------------------------ */

static tensor *t_to(tensor *t, em_device dev);

#if EM_HAVE_CUDA
static em_status to_backward(node *n, tensor *g)
{
    tensor *gx = t_to(g, n->in[0]->device);
    return gx ? op_grad(n->in[0], gx) : em_last_status();
}
#endif

tensor *t_copy_to(tensor *t, em_device dev)
{
    if (!t) return NULL;
    if (em_device_equal(t->device, dev)) return t;
    if (dev.type == EM_CUDA && (dev.index < 0 || dev.index >= em_cuda_device_count())) {
        int n = em_cuda_device_count();
        return em_fail(EM_ERR_DEVICE, "em_to: cuda:%d does not exist (%d CUDA device%s visible%s)", dev.index, n,
                       n == 1 ? "" : "s", EM_HAVE_CUDA ? "" : "; this ember was built without CUDA");
    }
#if EM_HAVE_CUDA
    tensor *src = t_contig(t); /* on t's own device */
    tensor *out = src ? t_new_on(dev, t->dtype, t->ndim, t->shape) : NULL;
    em_status s = out ? cu_memcpy(t_ptr(out), dev, t_ptr(src), src->device, (size_t)t_numel(t) * t_esize(t))
                      : em_last_status();
    if (src && src != t) t_drop(src);
    if (s) {
        if (out) t_drop(out);
        return NULL;
    }
    return out;
#else
    return em_fail(EM_ERR_DEVICE, "em_to: this ember was built without CUDA");
#endif
}

/* The op "to" (ops.def): op_begin on the input (whose device c.dev is), the
 * copy on `dev` made by t_copy_to, op_end recording it (only a copy between
 * devices: t itself is returned as it is, and without CUDA there is none). */
static tensor *t_to(tensor *t, em_device dev)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_TO, 1, &t)) return NULL;
    tensor *out = t_copy_to(t, dev);
    if (!out || out == t) {
        op_done(&c, out != NULL);
        return out;
    }
#if EM_HAVE_CUDA
    return op_end(&c, out, to_backward);
#else
    op_done(&c, true);
    return out;
#endif
}

em_tensor *em_to(em_tensor *h, em_device dev)
{
    tensor *t = t_resolve(h, "em_to");
    return t ? t_handle(t_to(t, dev)) : NULL;
}

/* ---- the runtime API without CUDA ---------------------------------------------------- */
#if !EM_HAVE_CUDA
em_status em_cuda_device_info_of(int index, em_cuda_device_info *out)
{
    (void)out;
    return em_err(EM_ERR_DEVICE, "em_cuda_device_info_of: cuda:%d: this ember was built without CUDA", index);
}
void em_cuda_versions(int *driver, int *runtime, int *nccl)
{
    if (driver) *driver = 0;
    if (runtime) *runtime = 0;
    if (nccl) *nccl = 0;
}
em_status em_cuda_synchronize(int index)
{
    (void)index;
    return EM_OK;
}
em_status em_cuda_memory_stats(int index, em_cuda_memory *out)
{
    (void)out;
    return em_err(EM_ERR_DEVICE, "em_cuda_memory_stats: cuda:%d: this ember was built without CUDA", index);
}
void em_cuda_reset_peak(int index) { (void)index; }
void em_cuda_empty_cache(int index) { (void)index; }
static bool tf32;
void em_cuda_set_tf32(bool on) { tf32 = on; }
bool em_cuda_tf32(void) { return tf32; }
#endif
