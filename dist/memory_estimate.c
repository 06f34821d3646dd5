/* memory_estimate.c — bytes per rank of training a GPT: parameters,
 * gradients, optimizer state, activations, communication buffers and the
 * runtime, for a world size, a ZeRO stage, a precision, a micro-batch and a
 * context (em_estimate_memory; `ember estimate-memory` prints it and `ember
 * train` refuses a run whose estimate exceeds the memory it has).
 *
 * Two parts, each in one place:
 *   - the stage arithmetic (zero_split): how parameters, gradients and
 *     optimizer state divide over W ranks at ZeRO stages 0..3;
 *   - the activations (step_scope_bytes): what one training step leaves in
 *     the step scope's arena. Scope memory is only given back when the step
 *     ends, so this is everything forward makes (each op's output and what
 *     it saves for backward: the tape keeps them) plus everything backward
 *     makes (each gradient of a non-leaf tensor, the copies and casts it
 *     takes), op by op as nn/gpt.c's forward runs them. tests/test_memory_
 *     estimate.c checks the sum against the arena's measured use.
 * docs/distributed.md ("Memory per rank") has the tables. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dist/pg_impl.h"
#include "ember/dist.h"
#include "ember/runtime.h"
#include "tensor/error_impl.h"

em_mem_config em_mem_config_defaults(void)
{
    return (em_mem_config){
        .model = {.vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true},
        .world = 1,
        .zero_stage = 0,
        .precision = EM_PREC_NO,
        .batch = 12,
        .context = 0,
        .optimizer = EM_MEM_ADAMW,
        .momentum = false,
        .bucket_mb = 0,
        .threads = 0,
        .data_bytes = 0};
}

const char *em_mem_category_name(em_mem_category c)
{
    switch (c) {
    case EM_MEM_PARAMS: return "parameters";
    case EM_MEM_GRADS: return "gradients";
    case EM_MEM_OPTIMIZER: return "optimizer state";
    case EM_MEM_ACTIVATIONS: return "activations";
    case EM_MEM_COMM: return "communication";
    case EM_MEM_RUNTIME: return "runtime";
    case EM_MEM_NCATEGORIES: break;
    }
    return "?";
}

/* The parameter count of em_gpt_new's model: tied token embedding (V,C),
 * positions (block,C), per layer ln_1, c_attn (3C,C), c_proj (C,C), ln_2,
 * c_fc (4C,C), c_proj (C,4C) (biases and LayerNorm biases when bias), ln_f. */
static double gpt_params(const em_gpt_config *m, double *largest_unit)
{
    double C = (double)m->n_embd, V = (double)m->vocab_size, bias = m->bias ? 1 : 0;
    double ln = C + bias * C;
    double block = 2 * ln + 12 * C * C + bias * 9 * C;
    double embed = (V + (double)m->block_size) * C + ln; /* wte (also the head), wpe, ln_f */
    /* the largest parameter: a bucket of stage 3 holds at least it */
    *largest_unit = V * C > 4 * C * C ? V * C : 4 * C * C;
    return embed + (double)m->n_layer * block;
}

/* The stage arithmetic, P parameters in f32 (masters under autocast), opt
 * bytes of optimizer state per parameter, over W ranks; a bucket of B bytes
 * (DDP's size; a parameter larger than that, the token embedding of a big
 * vocabulary, is a bucket of its own: L bytes, the largest parameter):
 *   stage 0: params 4P,  grads 4P,  optimizer opt*P
 *   stage 1: params 4P,  grads 4P,  optimizer opt*P / W
 *   stage 2: params 4P,  grads 4P/W (the shard) + what backward holds of the
 *            full buffer: the largest parameter's bucket (a tied embedding's
 *            gradient is begun first and finished last) and 2 more buckets
 *            in flight (dist/zero.c INFLIGHT): L + 2B, at most 4P;
 *            optimizer / W; on a CUDA device grads 4P + 4P/W (the full
 *            buffer stays allocated: device pages cannot be given back)
 *   stage 3: params 4P/W + the 3 buckets kept whole (dist/zero.c KEEP): the
 *            largest and 2 more, L + 2B, never more than 4P in all; grads
 *            and optimizer as stage 2. On a CUDA device the parameters are
 *            mapped in granules of 2 MiB (tensor/cuda_vmm.c): the two ends
 *            of each bucket's chunk may share a granule with other ranks'
 *            elements, up to 2 granules per bucket (about 4P/B buckets)
 *            beyond 4P/W, within 4P rounded up to whole granules in all.
 * The ZeRO engine (dist/zero.c) behaves like this; change both together. */
static void zero_split(int stage, bool cuda, double W, double P, double opt, double bucket, double unit,
                       double out[3])
{
    double params = 4 * P, grads = 4 * P, optim = opt * P;
    double held = 4 * unit > bucket ? 4 * unit + 2 * bucket : 3 * bucket; /* L + 2B */
    if (stage >= 1) optim /= W;
    if (stage >= 2) grads = cuda ? 4 * P + 4 * P / W : 4 * P / W + (held < 4 * P ? held : 4 * P);
    if (stage >= 3) {
        double g = 2 << 20, granules = cuda ? 2 * ceil(4 * P / bucket) * g : 0;
        double whole = cuda ? ceil(4 * P / g) * g : 4 * P; /* a device maps whole granules */
        params = 4 * P / W + granules + held;
        if (params > whole) params = whole;
    }
    out[0] = params, out[1] = grads, out[2] = optim;
}

/* What one training step of the GPT (forward + loss + backward) allocates in
 * the step scope, for B sequences of T tokens; a bytes per element of the
 * autocast dtype (4 in f32, 2 under bf16/fp16). Counts are per row (one of
 * the B*T positions) unless said otherwise. A Linear's output takes o bytes
 * an element: 4 with a bias (the bias is added to the rounded product as it
 * is stored, in f32), else a (the product's dtype).
 *
 * forward, one block (nn/layers.c block_forward):
 *   ln_1                       out 4C, mean and rstd as f64 (16)
 *   c_attn (3C)                one linear op (tensor/ops_matmul.c): o*3C;
 *                              on a CUDA device under autocast with a bias
 *                              also the product a*3C (the bias is added by
 *                              a second kernel). Every Linear is like this.
 *   attention                  one op on qkv as it lies (tensor/ops_attention.c,
 *                              attention_qkv): out (B,T,C) 4C, P (B,H,T,T):
 *                              4*H*T per row; a low qkv (o = a) is cast up
 *                              first (its autocast policy is f32): 4*3C
 *   c_proj (C), + x            Linear, 4C
 *   ln_2                       4C + 16
 *   c_fc (4C), gelu, c_proj (C) Linear, gelu's output in c_fc's dtype o*4C,
 *                              Linear; + x 4C; on the CPU gelu also keeps
 *                              its slope f'(x) for backward
 *                              (tensor/ops_unary.c), f32: 4*4C
 *   dropout (p > 0), 3 places  out + mask 1C each: one on the embedding (4C),
 *                              one on each c_proj's output (o*C)
 * backward, one block (autograd/tape.c: a gradient is adopted when it is a
 * tensor's only one, copied when a second arrives); each gradient in its
 * tensor's dtype:
 *   mlp c_proj, gelu           dX o*4C, o*4C; c_fc dX 4C
 *   ln_2                       dX 4C + the copy of x1's second gradient 4C
 *   attn c_proj                dX 4C
 *   attention                  d(qkv) 4*3C, the heads' dq, dk, dv written
 *                              where they lie in it
 *   c_attn, ln_1               dX 4C; dX 4C + the copy 4C
 *   dropout (p > 0)            dX in its input's dtype; on a low c_proj
 *                              output the f32 gradient from the residual
 *                              add is cast down first (a*C)
 * casts (amp, unless the product reads f32 (rf)): each f32 input of a
 *   Linear is cast down (a*in; mlp c_proj's input is already low without a
 *   bias), and backward's product makes its dX low (a*in) before the cast's
 *   backward widens it (4*in, counted above); each gradient that arrives in
 *   f32 at a low product is cast down: a*(3C + C + C), and c_fc's a*4C when
 *   gelu ran in f32 (o = 4). Per Linear the weight is cast down (a per
 *   weight) and its gradient made low (a) before the cast's backward adds
 *   it to the flat gradient buffer where it lies. With rf there is none of
 *   this: the product reads f32 and adds dW where it lies.
 * outside the blocks: embedding + positions 4C + 4C (backward: the position
 * gradient, T*C f32), ln_f 4C + 16 (backward 4C), logits a*V (+ 4V cast up
 * under autocast), cross-entropy's saved log-sum-exp and targets (12);
 * backward: dlogits 4V, dX 4C, the embedding's 4C; with casts ln_f's output
 * cast down a*C, dlogits cast down a*V, dX made low a*C, and the tied
 * weight cast down (a*VC), its gradient made low (a*VC) and then in f32
 * (4*VC: the embedding adds a second gradient to it). Each op also costs a
 * tape node and headers (about 380 bytes; 35 ops a block, 8 casts more).
 * On a CUDA device (measured on the emulator against em_cuda_memory's
 * requested bytes): layer norm's statistics are f32 (8), attention keeps
 * its log-sum-exp (4*H a row) instead of P, and its copies of the strided
 * heads are given back as soon as the kernel is queued (t_drop_now); no
 * gelu slope; cross-entropy keeps 4 f64 statistics and an i32 copy of the
 * targets (36); every dW is made (4 a weight in f32) before it is added,
 * as is the embedding's gradient (4*VC), and the positions' gradient once
 * more (4*TC); without a bias the adds cast the low c_proj outputs up
 * (2 * 4C a row).
 * rf: the low product reads f32 operands (on the CPU: f16 always, bf16 on
 * its f32 path; em_matmul_path says "f32"), so autocast makes no cast
 * around it (tensor/dispatch.c). Measured against em_arena_in_use by
 * tests/test_memory_estimate.c on both kinds of bf16 path. */
static double step_scope_bytes(const em_gpt_config *m, double B, double T, double a, bool rf, bool cuda)
{
    double C = (double)m->n_embd, V = (double)m->vocab_size, H = (double)m->n_head, L = (double)m->n_layer;
    bool amp = a < 4, bias = m->bias, drop = m->dropout > 0, casts = amp && !rf;
    double o = bias ? 4 : a;                        /* a Linear's output, bytes per element */
    double lin = o + (bias && amp && cuda ? a : 0); /* what it keeps: output (+ a device's product) */
    double lin_out = 3 * C + C + 4 * C + C;         /* the block's Linear outputs per row */
    /* layer norm's mean and rstd: f64 on the CPU, f32 on a device; attention
     * keeps P (H*T a row) on the CPU, the log-sum-exp (H) on a device */
    double stats = cuda ? 8 : 16, att = cuda ? 4 * H : 4 * H * T;
    double fwd = 2 * (4 * C + stats) + lin * lin_out + (4 * C + att) + 2 * 4 * C + o * 4 * C;
    double bwd = 2 * o * 4 * C + 4 * C + 2 * 2 * 4 * C + 4 * C + 4 * 3 * C + 4 * C;
    if (drop) { /* the block's two dropouts, on the c_proj outputs */
        fwd += 2 * (o * C + C), bwd += 2 * o * C;
        if (o < 4 && !casts) bwd += 2 * a * C; /* add's f32 gradient cast down for them */
    }
    if (!cuda) fwd += 4 * 4 * C;                  /* gelu's slope, kept by the CPU's forward */
    if (o < 4) fwd += 4 * 3 * C;                  /* attention casts a low qkv up */
    if (o < 4 && cuda) fwd += 2 * 4 * C;          /* a device's adds cast the low c_proj outputs up */
    if (casts) {
        double in_f32 = 3 * C + (o == 4 ? 4 * C : 0); /* Linear inputs cast down */
        fwd += a * in_f32;
        bwd += a * in_f32;                                 /* their dX made low first */
        bwd += a * (3 * C + C + C + (o == 4 ? 4 * C : 0)); /* f32 gradients cast down */
    }
    double per_block_rows = fwd + bwd;
    double block_fixed = (casts ? 2 * a * 12 * C * C : 0) + (35 + (casts ? 8 : 0)) * 380.0;
    if (cuda && !casts) block_fixed += 4 * 12 * C * C; /* a device's dW is made, then added */
    /* cross-entropy keeps the log-sum-exp and targets (12 a row); on a
     * device 4 f64 statistics and its own i32 copy of the targets (36) */
    double head_rows = 4 * C + 4 * C + (drop ? 5 * C + 4 * C : 0) + (4 * C + stats) + 4 * V +
                       (amp ? a * V : 0) + (cuda ? 36 : 12) + 4 * V + 4 * C + 4 * C +
                       (casts ? a * C + a * V + a * C : 0);
    double head_fixed = 4 * T * C + (casts ? (2 * a + 4) * V * C : 0) + (12 + (casts ? 2 : 0)) * 380.0;
    /* on a device the embedding's gradient (and the tied weight's dW in f32)
     * are made before they are added, and the positions' gradient once more */
    if (cuda) head_fixed += 4 * V * C + (casts ? 0 : 4 * V * C) + 4 * T * C;
    return B * T * (L * per_block_rows + head_rows) + L * block_fixed + head_fixed;
}

/* The runtime: what an ember process holds before and beside the training
 * step, measured (release build, OpenBLAS, on x86-64): the binary, its
 * libraries and the first arena chunks, about 8 MiB; each thread of the pool
 * its stack and temp-arena scratch (GEMM packing, attention's (T,T) rows),
 * about 2 MiB; plus what the caller's data keeps resident. */
static double runtime_bytes(int threads, size_t base_bytes, size_t data_bytes)
{
    double base = base_bytes ? (double)base_bytes : 8.0 * (1 << 20) + 2.0 * (1 << 20) * threads;
    return base + (double)data_bytes;
}

static em_status check(const em_mem_config *c)
{
    static const char fn[] = "em_estimate_memory";
    if (!c) return em_err(EM_ERR_ARG, "%s: config is NULL", fn);
    const em_gpt_config *m = &c->model;
    const struct {
        const char *name;
        int64_t v;
    } pos[] = {{"model.vocab_size", m->vocab_size},
               {"model.block_size", m->block_size},
               {"model.n_layer", m->n_layer},
               {"model.n_head", m->n_head},
               {"model.n_embd", m->n_embd},
               {"world", c->world},
               {"batch", c->batch}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v < 1)
            return em_err(EM_ERR_ARG, "%s: %s = %lld must be >= 1", fn, pos[i].name, (long long)pos[i].v);
    if (m->n_embd % m->n_head)
        return em_err(EM_ERR_ARG, "%s: model.n_embd = %lld is not a multiple of model.n_head = %lld", fn,
                      (long long)m->n_embd, (long long)m->n_head);
    if (!(m->dropout >= 0 && m->dropout < 1))
        return em_err(EM_ERR_ARG, "%s: model.dropout = %g is not in [0, 1)", fn, m->dropout);
    if (c->context < 0 || c->context > m->block_size)
        return em_err(EM_ERR_ARG, "%s: context = %lld is not in 1..model.block_size = %lld (0: block_size)",
                      fn, (long long)c->context, (long long)m->block_size);
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return em_err(EM_ERR_ARG, "%s: zero_stage = %d is not 0, 1, 2 or 3", fn, c->zero_stage);
    if (c->precision < EM_PREC_DEFAULT || c->precision > EM_PREC_FP16)
        return em_err(EM_ERR_ARG, "%s: precision = %d is not an em_precision_kind", fn, (int)c->precision);
    if (c->optimizer < EM_MEM_ADAMW || c->optimizer > EM_MEM_SGD)
        return em_err(EM_ERR_ARG, "%s: optimizer = %d is not an em_mem_optimizer", fn, (int)c->optimizer);
    if (c->momentum && c->optimizer != EM_MEM_SGD)
        return em_err(EM_ERR_ARG, "%s: momentum is for optimizer SGD only", fn);
    if (!(c->bucket_mb >= 0) || c->bucket_mb > 1e6)
        return em_err(EM_ERR_ARG, "%s: bucket_mb = %g is not in 0..1e6 (0: 25)", fn, c->bucket_mb);
    if (c->threads < 0 || c->threads > 4096)
        return em_err(EM_ERR_ARG, "%s: threads = %d is not in 0..4096 (0: this process's pool)", fn,
                      c->threads);
    return EM_OK;
}

em_status em_estimate_memory(const em_mem_config *c, em_mem_estimate *out)
{
    if (!out) return em_err(EM_ERR_ARG, "em_estimate_memory: out is NULL");
    memset(out, 0, sizeof *out);
    em_status s = check(c);
    if (s) return s;
    double unit, P = gpt_params(&c->model, &unit);
    double opt = c->optimizer == EM_MEM_SGD ? (c->momentum ? 4 : 0) : 8;
    double bucket = (c->bucket_mb > 0 ? c->bucket_mb : 25) * (1 << 20);
    double split[3];
    zero_split(c->zero_stage, c->cuda, (double)c->world, P, opt, bucket, unit, split);
    double a = c->precision == EM_PREC_BF16 || c->precision == EM_PREC_FP16 ? 2 : 4;
    /* whether the low product reads f32 here (no casts around it) */
    const char *path = a < 4 ? em_matmul_path(c->precision == EM_PREC_BF16 ? EM_BF16 : EM_F16) : NULL;
    bool rf = !c->cuda && path && !strcmp(path, "f32");
    double T = (double)(c->context ? c->context : c->model.block_size);
    double v[EM_MEM_NCATEGORIES] = {
        [EM_MEM_PARAMS] = split[0],
        [EM_MEM_GRADS] = split[1],
        [EM_MEM_OPTIMIZER] = split[2],
        [EM_MEM_ACTIVATIONS] = step_scope_bytes(&c->model, (double)c->batch, T, a, rf, c->cuda),
        /* the shared-memory segment of a group on one host (dist/shm.c) */
        [EM_MEM_COMM] =
            c->world > 1 ? (double)shm_bytes(c->world < SHM_MAX_WORLD ? c->world : SHM_MAX_WORLD) : 0,
        [EM_MEM_RUNTIME] =
            runtime_bytes(c->threads ? c->threads : em_num_threads(), c->base_bytes, c->data_bytes)};
    out->n_params = (int64_t)P;
    double total = 0;
    for (int i = 0; i < EM_MEM_NCATEGORIES; i++) {
        if (!(v[i] < 0x1p62))
            return em_err(EM_ERR_ARG, "em_estimate_memory: %s overflow 2^62 bytes", em_mem_category_name(i));
        out->bytes[i] = (uint64_t)v[i];
        total += v[i];
    }
    if (!(total < 0x1p62)) return em_err(EM_ERR_ARG, "em_estimate_memory: the total overflows 2^62 bytes");
    out->total = (uint64_t)total;
    return EM_OK;
}

em_mem_category em_mem_biggest(const em_mem_estimate *e)
{
    em_mem_category best = EM_MEM_PARAMS;
    for (int i = 1; e && i < EM_MEM_NCATEGORIES; i++)
        if (e->bytes[i] > e->bytes[best]) best = (em_mem_category)i;
    return best;
}
