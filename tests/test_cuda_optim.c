/* test_cuda_optim.c — optimizers, clipping, the loss scaler and the NCCL
 * collectives on CUDA tensors, each against the CPU (skip without a device).
 *
 * Gradients reach a CUDA leaf through em_to: loss = sum(to_cpu(p) * c) gives
 * p the gradient c, on p's device. */
#include <math.h>
#include <string.h>

#include "cuda_test.h"

/* A persistent leaf on dev with x's values. */
static em_tensor *leaf_on(em_tensor *x, em_device dev)
{
    bool prev = em_set_grad_enabled(false); /* x may already be a CPU leaf requiring grad */
    em_tensor *p = em_device_equal(dev, em_device_cpu()) ? em_contiguous(x) : em_to(x, dev);
    em_set_grad_enabled(prev);
    if (p) em_set_requires_grad(p, true);
    return p;
}

/* p's gradient := c (backward through em_to to the CPU). */
static void give_grad(em_tensor *p, em_tensor *c)
{
    em_scope s = em_scope_begin();
    CHECK_OK(em_zero_grad(p));
    em_tensor *y = em_to(p, em_device_cpu());
    CHECK_OK(em_backward(em_sum(em_mul(y, c), 0, NULL, false), NULL));
    em_scope_end(s);
}

/* max |a - b| / (1 + |b|) over n f32 values of two tensors (a on any device) */
static double max_rel(em_tensor *a, em_tensor *b)
{
    bool prev = em_set_grad_enabled(false); /* a copy to read, not a step of a computation */
    em_tensor *ah = em_to(a, em_device_cpu());
    em_set_grad_enabled(prev);
    CHECK_NOTNULL(ah);
    const float *x = em_data(ah), *y = em_data(b);
    double m = 0;
    for (int64_t i = 0; i < em_numel(b); i++) {
        double d = fabs((double)x[i] - y[i]) / (1 + fabs((double)y[i]));
        if (d > m) m = d;
    }
    if (ah != a && !em_scope_depth()) em_free(ah);
    return m;
}

/* kind 0: SGD Nesterov; 1: AdamW; 2: AdamW with amsgrad and maximize */
static void optimizer_matches_cpu(int kind)
{
    em_rng r = em_rng_new(11);
    em_tensor *x0 = em_randn(EM_F32, EM_SHAPE(33, 17), &r), *x1 = em_randn(EM_F32, EM_SHAPE(1000), &r);
    em_tensor *pc[2] = {leaf_on(x0, em_device_cpu()), leaf_on(x1, em_device_cpu())};
    em_tensor *pd[2] = {leaf_on(x0, em_device_cuda(0)), leaf_on(x1, em_device_cuda(0))};
    em_optimizer *oc, *od;
    if (kind) {
        em_adam_config c = em_adamw_defaults();
        c.amsgrad = c.maximize = kind == 2;
        oc = em_adamw_new(2, pc, &c);
        od = em_adamw_new(2, pd, &c);
    } else {
        em_sgd_config c = em_sgd_defaults();
        c.lr = 0.1, c.momentum = 0.9, c.weight_decay = 0.01, c.nesterov = true;
        oc = em_sgd_new(2, pc, &c);
        od = em_sgd_new(2, pd, &c);
    }
    CHECK(oc && od);
    for (int step = 0; step < 5; step++) {
        for (int k = 0; k < 2; k++) {
            em_tensor *g = em_randn(EM_F32, em_ndim(pc[k]), em_shape(pc[k]), &r);
            if (kind == 2 && step >= 2) { /* smaller gradients: v falls, amsgrad's maximum holds */
                em_tensor *small = em_mul_scalar(g, 0.1);
                em_free(g);
                g = small;
            }
            give_grad(pc[k], g);
            give_grad(pd[k], g);
            em_free(g);
        }
        CHECK_OK(em_optim_step(oc));
        CHECK_OK(em_optim_step(od));
    }
    for (int k = 0; k < 2; k++) CHECK(max_rel(pd[k], pc[k]) < 1e-5);
    /* the state comes back to the host, and loads into a fresh optimizer */
    int n = em_optim_state(od, NULL, 0);
    em_named st[16];
    CHECK(n > 1 && n <= 16 && em_optim_state(od, st, n) == n);
    CHECK(n == (kind == 2 ? 9 : kind == 1 ? 7 : 3)); /* amsgrad: max_exp_avg_sq too */
    for (int k = 1; k < n; k++) CHECK(em_device_of(st[k].t).type == EM_CPU);
    CHECK_OK(em_optim_load_state(od, n, st));
    em_optim_free(oc);
    em_optim_free(od);
    for (int k = 0; k < 2; k++) {
        em_free(pc[k]);
        em_free(pd[k]);
    }
    em_free(x0);
    em_free(x1);
}

TEST(test_cuda_adamw_steps_match_the_cpu)
{
    CUDA_OR_SKIP();
    optimizer_matches_cpu(1);
}

TEST(test_cuda_adamw_amsgrad_maximize_steps_match_the_cpu)
{
    CUDA_OR_SKIP();
    optimizer_matches_cpu(2);
}

TEST(test_cuda_sgd_nesterov_steps_match_the_cpu)
{
    CUDA_OR_SKIP();
    optimizer_matches_cpu(0);
}

TEST(test_cuda_clip_grad_norm_matches_the_cpu)
{
    CUDA_OR_SKIP();
    em_rng r = em_rng_new(12);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(300, 70), &r), *c = em_randn(EM_F32, EM_SHAPE(300, 70), &r);
    em_tensor *pc = leaf_on(x, em_device_cpu()), *pd = leaf_on(x, em_device_cuda(0));
    double norms[] = {2, 1, 3, INFINITY};
    for (int k = 0; k < 4; k++) { /* each norm type clips the device's gradients as the CPU's */
        give_grad(pc, c);
        give_grad(pd, c);
        em_status sc, sd;
        em_clip_config cfg = {.max_norm = 1.0, .norm_type = norms[k]};
        double nc = em_clip_grad_norm_with(1, &pc, &cfg, &sc), nd = em_clip_grad_norm_with(1, &pd, &cfg, &sd);
        th_case("norm_type %g", norms[k]);
        CHECK_OK(sc);
        CHECK_OK(sd);
        CHECK_NEAR(nd, nc, 1e-9 * nc);
        CHECK(max_rel(em_grad(pd), em_grad(pc)) < 1e-6);
    }
    em_free(pc);
    em_free(pd);
    em_free(x);
    em_free(c);
}

TEST(test_cuda_scaler_finds_inf_in_device_gradients)
{
    CUDA_OR_SKIP();
    int64_t n = 4096;
    em_tensor *x = em_zeros(EM_F32, 1, &n), *c = em_full(EM_F32, 1, &n, 8.0);
    em_tensor *p = leaf_on(x, em_device_cuda(0));
    em_grad_scaler *s = em_grad_scaler_new(&(em_scaler_config){.init_scale = 4.0});
    give_grad(p, c);
    CHECK_OK(em_scaler_unscale(s, 1, &p, NULL));
    CHECK(!em_scaler_found_inf(s));
    em_tensor *g = em_to(em_grad(p), em_device_cpu());
    CHECK(((float *)em_data(g))[n - 1] == 2.0f);
    em_free(g);
    em_scaler_update(s);
    ((float *)em_data(c))[777] = INFINITY;
    give_grad(p, c);
    CHECK_OK(em_scaler_unscale(s, 1, &p, NULL));
    CHECK(em_scaler_found_inf(s));
    em_grad_scaler_free(s);
    em_free(p);
    em_free(x);
    em_free(c);
}

TEST(test_cuda_nccl_all_reduce_in_a_group_of_one)
{
    CUDA_OR_SKIP();
    em_pg *pg = em_pg_new(&(em_pg_config){.rank = 0, .world = 1});
    CHECK_NOTNULL(pg);
    em_rng r = em_rng_new(13);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(1000), &r), *d = em_to(x, em_device_cuda(0));
    CHECK_OK(em_all_reduce(pg, d, EM_RED_SUM, NULL));
    em_work *w = NULL;
    CHECK_OK(em_all_reduce(pg, d, EM_RED_AVG, &w));
    CHECK_OK(em_work_wait(w));
    CHECK(max_rel(d, x) == 0);
    /* one call, two devices */
    CHECK_ERR(em_all_gather(pg, x, d, NULL), EM_ERR_DEVICE, "out is on cpu");
    em_free(x);
    em_free(d);
    em_pg_free(pg);
}

TEST(test_cuda_nccl_gather_in_a_group_of_one_copies_to_the_root)
{
    CUDA_OR_SKIP();
    em_pg *pg = em_pg_new(&(em_pg_config){.rank = 0, .world = 1});
    CHECK_NOTNULL(pg);
    em_rng r = em_rng_new(14);
    em_tensor *x = em_randn(EM_BF16, EM_SHAPE(333), &r), *d = em_to(x, em_device_cuda(0));
    em_tensor *out = em_to(em_zeros(EM_BF16, EM_SHAPE(333)), em_device_cuda(0));
    em_work *w = NULL;
    CHECK_OK(em_gather(pg, out, d, 0, &w));
    CHECK_OK(em_work_wait(w));
    em_tensor *got = em_to(out, em_device_cpu());
    CHECK(got && memcmp(em_data(got), em_data(x), 333 * 2) == 0);
    CHECK_ERR(em_gather(pg, x, d, 0, NULL), EM_ERR_DEVICE, "out is on cpu");
    CHECK_ERR(em_gather(pg, em_to(em_zeros(EM_BF16, EM_SHAPE(5)), em_device_cuda(0)), d, 0, NULL), EM_ERR_SHAPE,
              "world 1");
    em_free(got);
    em_free(x);
    em_free(d);
    em_free(out);
    em_pg_free(pg);
}

TEST(test_cuda_ddp_step_in_a_group_of_one_matches_the_cpu)
{
    CUDA_OR_SKIP();
    em_pg *pg = em_pg_new(&(em_pg_config){.rank = 0, .world = 1});
    CHECK_NOTNULL(pg);
    em_module *m = em_module_new(NULL, NULL);
    CHECK_NOTNULL(m);
    CHECK_OK(em_module_add_param(m, "w", em_full(EM_F32, 1, (int64_t[]){5}, 1.0)));
    CHECK_OK(em_module_add_param(m, "v", em_full(EM_F32, 1, (int64_t[]){3}, 2.0)));
    CHECK_OK(em_module_to(m, em_device_cuda(0)));
    em_ddp *d = em_ddp_new(pg, m, &(em_ddp_config){.bucket_mb = 1e-5}); /* one parameter per bucket */
    CHECK_NOTNULL(d);
    em_tensor *w = em_module_find(m, "w"), *v = em_module_find(m, "v");
    em_tensor *ps[2] = {w, v};
    em_sgd_config c = em_sgd_defaults();
    c.lr = 0.5;
    em_optimizer *o = em_sgd_new(2, ps, &c);
    CHECK_NOTNULL(o);
    em_scope s = em_scope_begin();
    em_tensor *loss = em_add(em_sum(em_mul_scalar(em_to(w, em_device_cpu()), 3.0), 0, NULL, false),
                             em_sum(em_to(v, em_device_cpu()), 0, NULL, false));
    CHECK_OK(em_ddp_backward(d, loss, NULL));
    CHECK_OK(em_optim_step(o));
    em_tensor *wh = em_to(w, em_device_cpu()), *vh = em_to(v, em_device_cpu());
    for (int i = 0; i < 5; i++) CHECK(((float *)em_data(wh))[i] == 1.0f - 0.5f * 3.0f);
    for (int i = 0; i < 3; i++) CHECK(((float *)em_data(vh))[i] == 2.0f - 0.5f);
    em_scope_end(s);
    em_optim_free(o);
    em_ddp_free(d);
    em_module_free(m);
    em_pg_free(pg);
}
