/* test_layers.c — the layers of nn/layers.c: parameter names, shapes and
 * initialisation, forward values against hand-computed cases and against
 * the ops they are made of, gradients (finite differences in f64), dropout
 * in train and eval mode, the MSE loss, and errors naming the module. */
#include <stdlib.h>

#include "harness.h"

/* ---- helpers ------------------------------------------------------------------ */

static void set_values(em_tensor *t, const double *v)
{
    em_tensor *src = em_from_data(EM_F64, em_ndim(t), em_shape(t), v);
    CHECK_OK(em_copy_into(t, src));
    if (!em_scope_depth()) em_free(src);
}

/* mean and standard deviation of t's elements */
static void stats(em_tensor *t, double *mean, double *sd, double *maxabs)
{
    int64_t n = em_numel(t);
    double *v = malloc(sizeof *v * (size_t)n), s = 0, s2 = 0, m = 0;
    em_to_array(t, EM_F64, v);
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        m = fmax(m, fabs(v[i]));
    }
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - s / n) * (v[i] - s / n);
    free(v);
    *mean = s / n;
    *sd = sqrt(s2 / n);
    *maxabs = m;
}

/* ---- Linear -------------------------------------------------------------------- */

TEST(test_linear_registers_weight_out_by_in_and_bias)
{
    em_module *root = em_module_new(NULL, NULL);
    em_nn_linear *l = em_nn_linear_new(root, "fc", 4, 3, true, NULL);
    CHECK_NOTNULL(l);
    em_named v[4];
    CHECK(em_module_params(root, v, 4) == 2);
    CHECK(!strcmp(v[0].name, "fc.weight") && v[0].t == l->weight);
    CHECK(!strcmp(v[1].name, "fc.bias") && v[1].t == l->bias);
    CHECK(em_size(l->weight, 0) == 3 && em_size(l->weight, 1) == 4 && em_size(l->bias, 0) == 3);
    CHECK(em_requires_grad(l->weight) && em_dtype_of(l->weight) == EM_F32);
    em_nn_linear *nb = em_nn_linear_new(root, "nb", 4, 3, false, NULL);
    CHECK(nb->bias == NULL && em_module_params(nb->m, NULL, 0) == 1);
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_linear_computes_x_times_weight_transposed_plus_bias)
{
    em_nn_linear *l = em_nn_linear_new(NULL, NULL, 2, 3, true, NULL);
    set_values(l->weight, (double[]){1, 2, 3, 4, 5, 6});
    set_values(l->bias, (double[]){1, 0, -1});
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 1, 2), (double[]){1, 2, -1, 0.5});
    em_tensor *y = em_nn_linear_forward(l, x); /* (2,1,2) -> (2,1,3) */
    CHECK(em_ndim(y) == 3 && em_size(y, 0) == 2 && em_size(y, 1) == 1 && em_size(y, 2) == 3);
    CHECK_VALUES(y, 1e-6, 6, 11, 16, 1, -1, -3);
    em_tensor *y1 = em_nn_linear_forward(l, th_tensor(EM_F32, EM_SHAPE(2), (double[]){1, 2})); /* 1-D */
    CHECK(em_ndim(y1) == 1 && em_size(y1, 0) == 3);
    CHECK_VALUES(y1, 1e-6, 6, 11, 16);
    em_tensor *ync = em_nn_linear_forward(l, th_noncontig(x));
    CHECK(th_max_abs_diff(ync, y) == 0);
    em_scope_end(s);
    em_module_free(l->m);
}

TEST(test_linear_init_is_uniform_within_one_over_sqrt_in)
{
    em_rng r = em_rng_new(5);
    em_nn_linear *l = em_nn_linear_new(NULL, NULL, 100, 300, true, &r);
    double mean, sd, mx, bound = 0.1;
    stats(l->weight, &mean, &sd, &mx);
    CHECK(mx <= bound && mx > 0.099);
    CHECK_NEAR(mean, 0, 0.003);
    CHECK_NEAR(sd, bound / sqrt(3.0), 0.002); /* U(-b,b) has sd b/sqrt(3) */
    stats(l->bias, &mean, &sd, &mx);
    CHECK(mx <= bound && mx > 0.09);
    em_module_free(l->m);
    /* the same seed gives the same weights */
    em_rng r1 = em_rng_new(9), r2 = em_rng_new(9);
    em_nn_linear *a = em_nn_linear_new(NULL, NULL, 5, 4, true, &r1),
                 *b = em_nn_linear_new(NULL, NULL, 5, 4, true, &r2);
    CHECK(th_max_abs_diff(a->weight, b->weight) == 0 && th_max_abs_diff(a->bias, b->bias) == 0);
    em_module_free(a->m);
    em_module_free(b->m);
}

/* the layer with its parameters replaced by inputs[1], inputs[2] */
static em_tensor *f_linear(em_tensor **in, void *ctx)
{
    em_nn_linear l = *(em_nn_linear *)ctx;
    l.weight = in[1];
    l.bias = in[2];
    return em_nn_linear_forward(&l, in[0]);
}

TEST(test_linear_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(2);
    em_nn_linear *l = em_nn_linear_new(NULL, NULL, 3, 4, true, &r);
    em_tensor *in[3] = {em_randn(EM_F64, EM_SHAPE(2, 5, 3), &r), em_randn(EM_F64, EM_SHAPE(4, 3), &r),
                        em_randn(EM_F64, EM_SHAPE(4), &r)};
    GRADCHECK("linear", f_linear, l, 3, in);
    F32_MATCHES_F64("linear", f_linear, l, 3, in, 1e-6);
    GRAD_F32_MATCHES_F64(f_linear, l, 3, in, 1e-5);
    for (int i = 0; i < 3; i++) em_free(in[i]);
    em_module_free(l->m);
}

static em_tensor *f_linear_module(em_tensor **in, void *ctx) { return em_nn_linear_forward(ctx, in[0]); }

TEST(test_linear_module_params_get_gradients_in_f64)
{
    em_dtype prev = em_nn_set_param_dtype(EM_F64);
    CHECK(prev == EM_F32);
    em_rng r = em_rng_new(3);
    em_nn_linear *l = em_nn_linear_new(NULL, NULL, 3, 2, true, &r);
    em_nn_set_param_dtype(prev);
    CHECK(em_dtype_of(l->weight) == EM_F64 && em_dtype_of(l->bias) == EM_F64);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(4, 3), &r);
    em_tensor *in[3] = {x, l->weight, l->bias};
    GRADCHECK("linear module", f_linear_module, l, 3, in);
    em_free(x);
    em_module_free(l->m);
    CHECK(em_nn_set_param_dtype(EM_I32) == EM_F32); /* a non-float dtype is ignored */
    CHECK(em_nn_set_param_dtype(EM_F32) == EM_F32);
}

TEST(test_linear_rejects_wrong_input_dim_naming_module_and_shapes)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *blk = em_module_new(root, "blk");
    em_nn_linear *l = em_nn_linear_new(blk, "fc", 4, 3, true, NULL);
    em_scope s = em_scope_begin();
    CHECK_ERR(em_nn_linear_forward(l, em_zeros(EM_F32, EM_SHAPE(2, 5))), EM_ERR_SHAPE,
              "linear 'blk.fc': x is (2,5), its last dim must be 4 (parameter is (3,4))");
    CHECK_ERR(em_nn_linear_forward(l, em_zeros(EM_F64, EM_SHAPE(2, 4))), EM_ERR_DTYPE,
              "linear 'blk.fc': x is f64(2,4) but the parameters are f32");
    CHECK_ERR(em_nn_linear_forward(l, NULL), EM_ERR_ARG, "linear");
    CHECK_ERR(em_nn_linear_forward(NULL, em_zeros(EM_F32, EM_SHAPE(4))), EM_ERR_ARG, "layer is NULL");
    em_scope_end(s);
    CHECK_ERR(em_nn_linear_new(root, "bad", 0, 3, true, NULL), EM_ERR_ARG, "in = 0 and out = 3 must be >= 1");
    CHECK_ERR(em_nn_linear_new(blk, "fc", 4, 3, true, NULL), EM_ERR_ARG, "already has a child named 'fc'");
    CHECK(em_module_params(root, NULL, 0) == 2); /* the failures made nothing */
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

/* ---- Embedding ------------------------------------------------------------------ */

TEST(test_embedding_picks_rows_and_starts_standard_normal)
{
    em_rng r = em_rng_new(4);
    em_nn_embedding *e = em_nn_embedding_new(NULL, NULL, 500, 64, &r);
    double mean, sd, mx;
    stats(e->weight, &mean, &sd, &mx);
    CHECK_NEAR(mean, 0, 0.01);
    CHECK_NEAR(sd, 1, 0.01);
    em_scope s = em_scope_begin();
    int32_t ids[] = {3, 0, 3, 499};
    em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(2, 2), ids);
    em_tensor *y = em_nn_embedding_forward(e, idx);
    CHECK(em_ndim(y) == 3 && em_size(y, 2) == 64);
    for (int i = 0; i < 4; i++)
        CHECK(th_max_abs_diff(em_narrow(em_reshape(y, EM_SHAPE(4, 64)), 0, i, 1),
                              em_narrow(e->weight, 0, ids[i], 1)) == 0);
    CHECK_ERR(em_nn_embedding_forward(e, em_zeros(EM_F32, EM_SHAPE(2))), EM_ERR_DTYPE,
              "embedding '(root)': indices must be i32, got f32(2,)");
    CHECK_ERR(em_nn_embedding_forward(e, em_full(EM_I32, EM_SHAPE(1), 500)), EM_ERR_INDEX, "500");
    em_scope_end(s);
    em_module_free(e->m);
}

/* ---- LayerNorm, RMSNorm ------------------------------------------------------------ */

TEST(test_layer_norm_module_starts_as_plain_normalisation)
{
    em_module *root = em_module_new(NULL, NULL);
    em_nn_layer_norm *ln = em_nn_layer_norm_new(root, "ln", 3, true);
    em_nn_layer_norm *nb = em_nn_layer_norm_new(root, "nb", 3, false);
    em_named v[4];
    CHECK(em_module_params(root, v, 4) == 3);
    CHECK(!strcmp(v[0].name, "ln.weight") && !strcmp(v[1].name, "ln.bias") &&
          !strcmp(v[2].name, "nb.weight"));
    CHECK_VALUES(ln->weight, 0, 1, 1, 1);
    CHECK_VALUES(ln->bias, 0, 0, 0, 0);
    CHECK(nb->bias == NULL && ln->eps == 1e-5);
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(1, 3), (double[]){1, 2, 3});
    double k = 1 / sqrt(2.0 / 3 + 1e-5); /* var = 2/3 */
    CHECK_VALUES(em_nn_layer_norm_forward(ln, x), 1e-5, -k, 0, k);
    set_values(ln->weight, (double[]){2, 1, 1});
    set_values(ln->bias, (double[]){0, 1, 0});
    CHECK_VALUES(em_nn_layer_norm_forward(ln, x), 1e-5, -2 * k, 1, k);
    CHECK_VALUES(em_nn_layer_norm_forward(nb, x), 1e-5, -k, 0, k);
    CHECK_ERR(em_nn_layer_norm_forward(ln, em_zeros(EM_F32, EM_SHAPE(2, 4))), EM_ERR_SHAPE,
              "layer_norm 'ln': x is (2,4), its last dim must be 3");
    em_scope_end(s);
    em_module_free(root);
}

static em_tensor *f_ln_module(em_tensor **in, void *ctx) { return em_nn_layer_norm_forward(ctx, in[0]); }

TEST(test_layer_norm_module_gradient_matches_finite_difference)
{
    em_dtype prev = em_nn_set_param_dtype(EM_F64);
    em_nn_layer_norm *ln = em_nn_layer_norm_new(NULL, NULL, 5, true);
    em_nn_set_param_dtype(prev);
    em_rng r = em_rng_new(6);
    em_tensor *w = em_randn(EM_F64, EM_SHAPE(5), &r), *b = em_randn(EM_F64, EM_SHAPE(5), &r);
    CHECK_OK(em_copy_into(ln->weight, w));
    CHECK_OK(em_copy_into(ln->bias, b));
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(3, 5), &r);
    em_tensor *in[3] = {x, ln->weight, ln->bias};
    GRADCHECK("layer_norm module", f_ln_module, ln, 3, in);
    em_free(x);
    em_free(w);
    em_free(b);
    em_module_free(ln->m);
}

TEST(test_rms_norm_module_scales_by_root_mean_square)
{
    em_nn_rms_norm *l = em_nn_rms_norm_new(NULL, NULL, 2);
    CHECK_VALUES(l->weight, 0, 1, 1);
    l->eps = 0;
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2), (double[]){3, 4}); /* rms = sqrt(12.5) */
    double k = 1 / sqrt(12.5);
    CHECK_VALUES(em_nn_rms_norm_forward(l, x), 1e-6, 3 * k, 4 * k);
    set_values(l->weight, (double[]){2, -1});
    CHECK_VALUES(em_nn_rms_norm_forward(l, x), 1e-6, 6 * k, -4 * k);
    CHECK_ERR(em_nn_rms_norm_forward(l, em_zeros(EM_F32, EM_SHAPE(3))), EM_ERR_SHAPE, "rms_norm '(root)'");
    em_scope_end(s);
    em_module_free(l->m);
}

/* ---- Dropout ---------------------------------------------------------------------- */

TEST(test_dropout_masks_in_training_and_is_identity_in_eval)
{
    em_rng r = em_rng_new(7);
    em_nn_dropout *d = em_nn_dropout_new(NULL, NULL, 0.25, &r);
    CHECK(r.offset == 1); /* one draw seeded the layer */
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(4000));
    em_tensor *y1 = em_nn_dropout_forward(d, x), *y2 = em_nn_dropout_forward(d, x);
    int64_t zeros = 0;
    float *p = em_data(y1);
    for (int i = 0; i < 4000; i++) {
        CHECK(p[i] == 0 || fabs(p[i] - 1 / 0.75) < 1e-6);
        zeros += p[i] == 0;
    }
    CHECK(zeros > 900 && zeros < 1100);
    CHECK(th_max_abs_diff(y1, y2) > 0); /* the layer's generator moved on */
    em_module_train(d->m, false);
    CHECK(em_nn_dropout_forward(d, x) == x);
    em_scope_end(s);
    em_module_free(d->m);
    CHECK_ERR(em_nn_dropout_new(NULL, NULL, 1.0, NULL), EM_ERR_ARG, "p = 1 is not in [0, 1)");
}

TEST(test_dropout_masks_repeat_for_the_same_seed)
{
    em_rng r1 = em_rng_new(11), r2 = em_rng_new(11);
    em_nn_dropout *a = em_nn_dropout_new(NULL, NULL, 0.5, &r1), *b = em_nn_dropout_new(NULL, NULL, 0.5, &r2);
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(64));
    CHECK(th_max_abs_diff(em_nn_dropout_forward(a, x), em_nn_dropout_forward(b, x)) == 0);
    em_scope_end(s);
    em_module_free(a->m);
    em_module_free(b->m);
}

/* ---- Conv2d, pooling, flatten --------------------------------------------------------- */

TEST(test_conv2d_layer_matches_the_op_and_uses_pytorch_init)
{
    em_rng r = em_rng_new(8);
    em_nn_conv2d *c = em_nn_conv2d_new(NULL, NULL, 3, 20, 3, 1, 1, true, &r);
    CHECK(em_ndim(c->weight) == 4 && em_size(c->weight, 0) == 20 && em_size(c->weight, 1) == 3 &&
          em_size(c->weight, 2) == 3 && em_size(c->bias, 0) == 20);
    double mean, sd, mx, bound = 1 / sqrt(27.0);
    stats(c->weight, &mean, &sd, &mx);
    CHECK(mx <= bound && mx > 0.95 * bound);
    stats(c->bias, &mean, &sd, &mx);
    CHECK(mx <= bound);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 3, 5, 5), &r);
    em_tensor *y = em_nn_conv2d_forward(c, x);
    CHECK(em_size(y, 0) == 2 && em_size(y, 1) == 20 && em_size(y, 2) == 5 && em_size(y, 3) == 5);
    CHECK(th_max_abs_diff(y, em_conv2d(x, c->weight, c->bias, 1, 1)) == 0);
    CHECK_ERR(em_nn_conv2d_forward(c, em_zeros(EM_F32, EM_SHAPE(2, 4, 5, 5))), EM_ERR_SHAPE,
              "conv2d '(root)': x is (2,4,5,5), expected (N,3,H,W)");
    em_scope_end(s);
    em_module_free(c->m);
    CHECK_ERR(em_nn_conv2d_new(NULL, NULL, 3, 4, 0, 1, 0, true, NULL), EM_ERR_ARG, "kernel = 0");
}

TEST(test_max_pool2d_and_flatten_reshape_a_feature_map)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_reshape(em_arange(0, 16, 1, EM_F32), EM_SHAPE(1, 1, 4, 4));
    em_nn_max_pool2d pool = {2, 0, 0}; /* stride 0: stride = kernel */
    em_tensor *y = em_nn_max_pool2d_forward(&pool, x);
    CHECK(em_size(y, 2) == 2 && em_size(y, 3) == 2);
    CHECK_VALUES(y, 0, 5, 7, 13, 15);
    em_tensor *f = em_nn_flatten(em_zeros(EM_F32, EM_SHAPE(2, 3, 4, 5)), 1);
    CHECK(em_ndim(f) == 2 && em_size(f, 0) == 2 && em_size(f, 1) == 60);
    f = em_nn_flatten(em_zeros(EM_F32, EM_SHAPE(2, 3, 4, 5)), -2);
    CHECK(em_ndim(f) == 3 && em_size(f, 2) == 20);
    CHECK_VALUES(em_nn_flatten(y, 0), 0, 5, 7, 13, 15);
    CHECK_ERR(em_nn_flatten(y, 4), EM_ERR_ARG, "flatten");
    em_scope_end(s);
}

/* ---- MSE loss ---------------------------------------------------------------------- */

TEST(test_mse_loss_is_the_mean_of_squared_differences)
{
    em_scope s = em_scope_begin();
    em_tensor *p = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *t = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){0, 2, 5, 3});
    em_tensor *l = em_mse_loss(p, t);
    CHECK(em_ndim(l) == 0);
    CHECK_NEAR(em_item(l), (1 + 0 + 4 + 1) / 4.0, 1e-7);
    CHECK_NEAR(em_item(em_mse_loss(th_noncontig(p), t)), 1.5, 1e-7);
    CHECK_ERR(em_mse_loss(p, em_zeros(EM_F32, EM_SHAPE(4))), EM_ERR_SHAPE,
              "mse_loss: pred is (2,2) but target is (4,)");
    CHECK_ERR(em_mse_loss(p, em_zeros(EM_F64, EM_SHAPE(2, 2))), EM_ERR_DTYPE, "mse_loss");
    em_scope_end(s);
}

static em_tensor *f_mse(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_mse_loss(in[0], in[1]);
}

TEST(test_mse_loss_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(12);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(3, 4), &r), em_randn(EM_F64, EM_SHAPE(3, 4), &r)};
    GRADCHECK("mse_loss", f_mse, NULL, 2, in);
    F32_MATCHES_F64("mse_loss", f_mse, NULL, 2, in, 1e-6);
    em_free(in[0]);
    em_free(in[1]);
    /* outside a scope with grad off only the result remains */
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(5)), *b = em_zeros(EM_F32, EM_SHAPE(5));
    int64_t live = em_live_tensors();
    em_tensor *l = em_mse_loss(a, b);
    CHECK_NEAR(em_item(l), 1, 0);
    CHECK(em_live_tensors() == live + 1);
    em_free(l);
    em_free(a);
    em_free(b);
}

/* ---- MLP, attention, block ------------------------------------------------------------ */

/* c_fc, GELU (exact by default; the tanh form when asked), c_proj */
TEST(test_mlp_is_fc_gelu_proj)
{
    em_rng r = em_rng_new(13);
    em_module *root = em_module_new(NULL, NULL);
    em_nn_mlp *mlp = em_nn_mlp_new(root, "mlp", 8, true, 0.0, &r);
    em_named v[8];
    CHECK(em_module_params(root, v, 8) == 4);
    CHECK(!strcmp(v[0].name, "mlp.c_fc.weight") && !strcmp(v[2].name, "mlp.c_proj.weight"));
    CHECK(em_size(v[0].t, 0) == 32 && em_size(v[0].t, 1) == 8 && em_size(v[2].t, 0) == 8 &&
          em_size(v[2].t, 1) == 32);
    CHECK(!mlp->gelu_tanh);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 3, 8), &r);
    em_tensor *h = em_add(em_matmul(x, em_transpose(mlp->c_fc->weight, 0, 1)), mlp->c_fc->bias);
    em_tensor *wt = em_transpose(mlp->c_proj->weight, 0, 1);
    em_tensor *exact = em_add(em_matmul(em_gelu(h), wt), mlp->c_proj->bias);
    em_tensor *approx = em_add(em_matmul(em_gelu_tanh(h), wt), mlp->c_proj->bias);
    CHECK(th_max_abs_diff(em_nn_mlp_forward(mlp, x), exact) < 1e-6);
    mlp->gelu_tanh = true;
    CHECK(th_max_abs_diff(em_nn_mlp_forward(mlp, x), approx) < 1e-6);
    CHECK(th_max_abs_diff(exact, approx) > 1e-6); /* the two forms do differ */
    em_scope_end(s);
    em_module_free(root);
}

static em_tensor *f_mlp(em_tensor **in, void *ctx) { return em_nn_mlp_forward(ctx, in[0]); }

TEST(test_mlp_gradient_matches_finite_difference)
{
    em_dtype prev = em_nn_set_param_dtype(EM_F64);
    em_rng r = em_rng_new(14);
    em_nn_mlp *mlp = em_nn_mlp_new(NULL, NULL, 3, true, 0.0, &r);
    em_nn_set_param_dtype(prev);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(2, 3), &r);
    em_tensor *in[5] = {x, mlp->c_fc->weight, mlp->c_fc->bias, mlp->c_proj->weight, mlp->c_proj->bias};
    GRADCHECK("mlp", f_mlp, mlp, 5, in);
    em_free(x);
    em_module_free(mlp->m);
}

/* reference attention from ops: per-head softmax(q k^T/sqrt(D) + causal mask) v */
static em_tensor *attention_reference(em_nn_attention *a, em_tensor *x)
{
    int64_t B = em_size(x, 0), T = em_size(x, 1), C = a->n_embd, H = a->n_head, D = C / H;
    em_tensor *qkv = em_add(em_matmul(x, em_transpose(a->c_attn->weight, 0, 1)), a->c_attn->bias);
    em_tensor *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = em_permute(em_reshape(em_narrow(qkv, 2, i * C, C), EM_SHAPE(B, T, H, D)), (int[]){0, 2, 1, 3});
    em_tensor *att = em_mul_scalar(em_matmul(p[0], em_transpose(p[1], 2, 3)), 1 / sqrt((double)D));
    em_tensor *mask = em_gt(em_reshape(em_arange(0, T, 1, EM_I32), EM_SHAPE(1, T)),
                            em_reshape(em_arange(0, T, 1, EM_I32), EM_SHAPE(T, 1)));
    em_tensor *y = em_matmul(em_softmax(em_masked_fill(att, mask, -INFINITY), -1), p[2]);
    y = em_reshape(em_permute(y, (int[]){0, 2, 1, 3}), EM_SHAPE(B, T, C));
    return em_add(em_matmul(y, em_transpose(a->c_proj->weight, 0, 1)), a->c_proj->bias);
}

TEST(test_attention_matches_masked_softmax_reference)
{
    em_rng r = em_rng_new(15);
    em_nn_attention *a = em_nn_attention_new(NULL, NULL, 8, 2, true, 0.0, &r);
    em_named v[4];
    CHECK(em_module_params(a->m, v, 4) == 4);
    CHECK(!strcmp(v[0].name, "c_attn.weight") && em_size(v[0].t, 0) == 24 &&
          !strcmp(v[2].name, "c_proj.weight"));
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 5, 8), &r);
    em_tensor *y = em_nn_attention_forward(a, x);
    CHECK(em_ndim(y) == 3 && em_size(y, 0) == 2 && em_size(y, 1) == 5 && em_size(y, 2) == 8);
    CHECK(th_max_abs_diff(y, attention_reference(a, x)) < 1e-5);
    /* causal: changing the last position leaves the earlier outputs alone */
    em_tensor *x2 = em_copy(x);
    CHECK_OK(em_copy_into(em_narrow(x2, 1, 4, 1), em_ones(EM_F32, EM_SHAPE(2, 1, 8))));
    em_tensor *y2 = em_nn_attention_forward(a, x2);
    CHECK(th_max_abs_diff(em_narrow(y2, 1, 0, 4), em_narrow(y, 1, 0, 4)) == 0);
    CHECK(th_max_abs_diff(em_narrow(y2, 1, 4, 1), em_narrow(y, 1, 4, 1)) > 1e-3);
    CHECK_ERR(em_nn_attention_forward(a, em_zeros(EM_F32, EM_SHAPE(5, 8))), EM_ERR_SHAPE,
              "attention '(root)': x is (5,8), expected (B,T,8)");
    em_scope_end(s);
    em_module_free(a->m);
    CHECK_ERR(em_nn_attention_new(NULL, NULL, 10, 3, true, 0, NULL), EM_ERR_ARG,
              "n_embd = 10 must be a positive multiple of n_head = 3");
}

static em_tensor *f_block(em_tensor **in, void *ctx) { return em_nn_block_forward(ctx, in[0]); }

TEST(test_block_is_pre_ln_residual_and_differentiable)
{
    em_dtype prev = em_nn_set_param_dtype(EM_F64);
    em_rng r = em_rng_new(16);
    em_module *root = em_module_new(NULL, NULL);
    em_nn_block *b = em_nn_block_new(root, "blk", 4, 2, true, 0.0, &r);
    em_nn_set_param_dtype(prev);
    const char *names[] = {"blk.ln_1.weight",      "blk.ln_1.bias",          "blk.attn.c_attn.weight",
                           "blk.attn.c_attn.bias", "blk.attn.c_proj.weight", "blk.attn.c_proj.bias",
                           "blk.ln_2.weight",      "blk.ln_2.bias",          "blk.mlp.c_fc.weight",
                           "blk.mlp.c_fc.bias",    "blk.mlp.c_proj.weight",  "blk.mlp.c_proj.bias"};
    em_named v[16];
    CHECK(em_module_params(root, v, 16) == 12);
    for (int i = 0; i < 12; i++) CHECK(!strcmp(v[i].name, names[i]));
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(1, 3, 4), &r);
    em_scope s = em_scope_begin();
    em_tensor *h = em_add(x, em_nn_attention_forward(b->attn, em_nn_layer_norm_forward(b->ln_1, x)));
    em_tensor *want = em_add(h, em_nn_mlp_forward(b->mlp, em_nn_layer_norm_forward(b->ln_2, h)));
    CHECK(th_max_abs_diff(em_nn_block_forward(b, x), want) < 1e-12);
    em_scope_end(s);
    em_tensor *in[13] = {x};
    for (int i = 0; i < 12; i++) in[i + 1] = v[i].t;
    GRADCHECK("block", f_block, b, 13, in);
    em_free(x);
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_block_forward_outside_a_scope_leaves_only_its_result)
{
    em_rng r = em_rng_new(17);
    em_nn_block *b = em_nn_block_new(NULL, NULL, 8, 2, true, 0.1, &r);
    em_module_train(b->m, false);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 4, 8), &r);
    bool prev = em_set_grad_enabled(false);
    int64_t live = em_live_tensors();
    em_tensor *y = em_nn_block_forward(b, x);
    CHECK_NOTNULL(y);
    CHECK(em_live_tensors() == live + 1);
    em_set_grad_enabled(prev);
    /* with grad on, recording needs a scope: the error says so */
    CHECK_ERR(em_nn_block_forward(b, x), EM_ERR_SCOPE, "scope");
    CHECK(em_live_tensors() == live + 1);
    em_free(y);
    em_free(x);
    em_module_free(b->m);
    CHECK(em_live_tensors() == 0);
}
