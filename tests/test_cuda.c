/* test_cuda.c — the CUDA core: devices, em_to, the caching allocator, views
 * and casts on the device, the refusal of ops without CUDA kernels. Every
 * test here skips (and says so) where no CUDA device is visible. */
#include <math.h>
#include <string.h>

#include "cuda_test.h"

TEST(test_cuda_to_device_and_back_keeps_every_value)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(37, 41), &r);
    em_tensor *d = em_to(x, em_device_cuda(0));
    CHECK(d != NULL);
    CHECK(em_device_of(d).type == EM_CUDA);
    em_tensor *back = em_to(d, em_device_cpu());
    CHECK(back != NULL);
    CHECK(memcmp(em_data(back), em_data(x), 37 * 41 * sizeof(float)) == 0);
    em_scope_end(s);
}

TEST(test_cuda_views_and_casts_match_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(4);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(5, 6, 7), &r);
    const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int k = 0; k < 4; k++) {
        em_tensor *cpu = em_contiguous(em_cast(em_transpose(x, 0, 2), dts[k]));
        em_tensor *gpu = em_contiguous(em_cast(em_transpose(em_to(x, em_device_cuda(0)), 0, 2), dts[k]));
        em_tensor *got = em_to(gpu, em_device_cpu());
        CHECK(got && cpu);
        CHECK(memcmp(em_data(got), em_data(cpu), (size_t)em_numel(cpu) * em_dtype_size(dts[k])) == 0);
    }
    em_scope_end(s);
}

TEST(test_cuda_gradient_flows_back_through_to)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *x = em_full(EM_F32, EM_SHAPE(4, 3), 2.0);
    CHECK_OK(em_set_requires_grad(x, true));
    em_tensor *d = em_to(x, em_device_cuda(0));
    em_tensor *y = em_to(em_reshape(em_transpose(d, 0, 1), 2, (int64_t[]){2, 6}), em_device_cpu());
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    em_tensor *g = em_grad(x);
    CHECK(g && em_device_of(g).type == EM_CPU);
    for (int i = 0; i < 12; i++) CHECK(((float *)em_data(g))[i] == 1.0f);
    em_scope_end(s);
}

TEST(test_cuda_allocator_reuses_blocks_after_the_first_step)
{
    CUDA_OR_SKIP();
    em_cuda_memory m0, m1;
    for (int step = 0; step < 3; step++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_to(em_zeros(EM_F32, EM_SHAPE(1024, 1024)), em_device_cuda(0));
        CHECK(x != NULL);
        em_scope_end(s);
        CHECK_OK(em_cuda_memory_stats(0, step == 0 ? &m0 : &m1));
    }
    CHECK(m1.device_mallocs == m0.device_mallocs);
    CHECK(m1.allocated == m0.allocated);
}

TEST(test_an_op_without_a_cuda_kernel_names_itself)
{
    if (em_cuda_device_count() == 0) {
        /* without a device, asking for one is the error */
        em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2));
        CHECK(em_to(x, em_device_cuda(0)) == NULL);
        CHECK(em_last_status() == EM_ERR_DEVICE);
        CHECK(strstr(em_last_error(), "cuda:0") != NULL);
        em_clear_error();
        em_free(x);
        return;
    }
    em_scope s = em_scope_begin();
    em_tensor *x = em_to(em_zeros(EM_F32, EM_SHAPE(2, 2)), em_device_cuda(0));
    /* em_set writes one element through a host pointer: no device path */
    CHECK_ERR(em_set(x, (int64_t[]){0, 0}, 1.0), EM_ERR_DEVICE, "em_set");
    em_scope_end(s);
}

static const em_gpt_config tiny = {.vocab_size = 17, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16,
                                   .bias = true};

TEST(test_module_to_a_missing_device_fails_and_leaves_the_model_usable)
{
    int missing = em_cuda_device_count(); /* the first index past the devices there are */
    em_gpt *g = em_gpt_new(&tiny, 1);
    CHECK(g != NULL);
    CHECK(em_module_to(g->m, em_device_cuda(missing)) == EM_ERR_DEVICE);
    em_clear_error();
    CHECK_OK(em_module_flatten(g->m));
    em_tensor *fp = em_module_flat_params(g->m, EM_F32);
    CHECK(fp && em_device_of(fp).type == EM_CPU);
    em_gpt_free(g);
}

TEST(test_module_to_cuda_moves_every_parameter_and_the_flat_buffers_follow)
{
    CUDA_OR_SKIP();
    em_gpt *g = em_gpt_new(&tiny, 1);
    CHECK(g != NULL);
    int n = em_module_params(g->m, NULL, 0);
    em_named v[64];
    CHECK(n <= 64);
    em_module_params(g->m, v, n);
    em_scope s = em_scope_begin();
    em_tensor *before = em_contiguous(em_cast(v[0].t, EM_F32)); /* a CPU copy of the first parameter */
    CHECK_OK(em_module_to(g->m, em_device_cuda(0)));
    for (int i = 0; i < n; i++) CHECK(em_device_of(v[i].t).type == EM_CUDA);
    CHECK_OK(em_module_flatten(g->m));
    CHECK(em_device_of(em_module_flat_params(g->m, EM_F32)).type == EM_CUDA);
    CHECK(em_device_of(em_module_flat_grads(g->m, EM_F32)).type == EM_CUDA);
    em_tensor *after = em_to(v[0].t, em_device_cpu());
    CHECK(memcmp(em_data(after), em_data(before), (size_t)em_numel(before) * sizeof(float)) == 0);
    em_scope_end(s);
    em_gpt_free(g);
}

/* the loss after each of `steps` AdamW steps of the tiny GPT on `dev` */
static void gpt_losses(em_device dev, int steps, double *loss)
{
    em_gpt *g = em_gpt_new(&tiny, 5);
    CHECK(g != NULL);
    CHECK_OK(em_module_to(g->m, dev));
    CHECK_OK(em_module_flatten(g->m));
    int n = em_module_params(g->m, NULL, 0);
    em_named v[64];
    em_tensor *p[64];
    em_module_params(g->m, v, n);
    for (int i = 0; i < n; i++) p[i] = v[i].t;
    em_optimizer *opt = em_adamw_new(n, p, &(em_adam_config){.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                                              .weight_decay = 0.1});
    CHECK(opt != NULL);
    em_rng r = em_rng_new(9);
    for (int k = 0; k < steps; k++) {
        em_scope s = em_scope_begin();
        /* a learnable task: the next token is the current one plus one */
        em_tensor *xc = em_randint(0, tiny.vocab_size, EM_I32, EM_SHAPE(4, tiny.block_size), &r);
        em_tensor *yc = em_empty(EM_I32, EM_SHAPE(4, tiny.block_size));
        for (int64_t i = 0; i < em_numel(xc); i++)
            ((int32_t *)em_data(yc))[i] = (((int32_t *)em_data(xc))[i] + 1) % (int32_t)tiny.vocab_size;
        em_tensor *x = em_to(xc, dev), *y = em_to(yc, dev);
        em_tensor *l = em_gpt_loss(g, x, y);
        CHECK(l != NULL);
        CHECK_OK(em_backward(l, NULL));
        em_status st = EM_OK;
        em_clip_grad_norm(n, p, 1.0, &st);
        CHECK_OK(st);
        CHECK_OK(em_optim_step(opt));
        CHECK_OK(em_optim_zero_grad(opt));
        loss[k] = em_item(em_to(l, em_device_cpu()));
        em_scope_end(s);
    }
    em_optim_free(opt);
    em_gpt_free(g);
}

TEST(test_cuda_gpt_training_follows_the_cpu_loss_trajectory)
{
    CUDA_OR_SKIP();
    enum { STEPS = 20 };
    double cpu[STEPS], gpu[STEPS];
    gpt_losses(em_device_cpu(), STEPS, cpu);
    gpt_losses(em_device_cuda(0), STEPS, gpu);
    for (int k = 0; k < STEPS; k++)
        if (!(fabs(gpu[k] - cpu[k]) <= 1e-3 * fabs(cpu[k])))
            th_fail(__FILE__, __LINE__, "step %d: cuda loss %.6f, cpu %.6f", k, gpu[k], cpu[k]);
    CHECK(gpu[STEPS - 1] < gpu[0]);
}

/* A second device: ops run on cuda:1 (its own stream and allocator), a copy
 * between devices keeps every value, and mixing devices is refused by name. */
TEST(test_cuda_second_device_computes_and_copies_between_devices)
{
    if (em_cuda_device_count() < 2) SKIP("needs 2 CUDA devices (GPU test)");
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(21);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(9, 13), &r);
    em_tensor *d0 = em_to(x, em_device_cuda(0)), *d1 = em_to(d0, em_device_cuda(1));
    CHECK(d1 && em_device_of(d1).type == EM_CUDA && em_device_of(d1).index == 1);
    em_tensor *y1 = em_mul_scalar(em_exp(d1), 2.0);
    CHECK(y1 && em_device_of(y1).index == 1);
    em_tensor *want = em_mul_scalar(em_exp(x), 2.0), *got = em_to(y1, em_device_cpu());
    CHECK(th_max_abs_diff(got, want) <= 1e-5 * th_max_abs_diff(want, em_zeros_like(want)));
    em_tensor *back = em_to(em_to(d1, em_device_cuda(0)), em_device_cpu());
    CHECK(memcmp(em_data(back), em_data(x), 9 * 13 * sizeof(float)) == 0);
    CHECK_ERR(em_add(d0, d1), EM_ERR_DEVICE, "cuda:1");
    em_scope_end(s);
}
