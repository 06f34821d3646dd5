/* test_module.c — the module tree: dotted names, registration errors,
 * listing and lookup, train/eval, flattening into contiguous buffers, and
 * freeing everything with the root. */
#include "harness.h"

/* root { a { lin { weight (3,2), bias (3) } }, emb { weight (5,2) }, scale (buffer) } */
static em_module *small_tree(void)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *a = em_module_new(root, "a"), *lin = em_module_new(a, "lin"), *emb = em_module_new(root, "emb");
    em_rng r = em_rng_new(1);
    em_module_add_param(lin, "weight", em_randn(EM_F32, EM_SHAPE(3, 2), &r));
    em_module_add_param(lin, "bias", em_randn(EM_F32, EM_SHAPE(3), &r));
    em_module_add_param(emb, "weight", em_randn(EM_F32, EM_SHAPE(5, 2), &r));
    em_module_add_buffer(root, "scale", em_full(EM_F32, EM_SHAPE(1), 2.0));
    return root;
}

TEST(test_module_params_have_dotted_names_in_registration_order)
{
    em_module *root = small_tree();
    em_named v[8];
    CHECK(em_module_params(root, v, 8) == 3);
    CHECK(!strcmp(v[0].name, "a.lin.weight") && !strcmp(v[1].name, "a.lin.bias") && !strcmp(v[2].name, "emb.weight"));
    CHECK(em_requires_grad(v[0].t));
    CHECK(em_module_buffers(root, v, 8) == 1 && !strcmp(v[0].name, "scale") && !em_requires_grad(v[0].t));
    CHECK(em_module_num_params(root) == 6 + 3 + 10);
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_module_names_are_relative_to_the_module_asked)
{
    em_module *root = small_tree();
    em_named v[4];
    em_tensor *w = em_module_find(root, "a.lin.weight");
    CHECK_NOTNULL(w);
    CHECK(em_size(w, 0) == 3);
    CHECK(em_module_find(root, "a.lin.nothing") == NULL);
    CHECK(em_module_find(root, "scale") != NULL);
    CHECK(em_module_params(root, v, 1) == 3); /* the count, even when out is short */
    CHECK(!strcmp(v[0].name, "a.lin.weight"));
    em_module_free(root);
}

TEST(test_module_rejects_duplicate_and_dotted_names)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *a = em_module_new(root, "a");
    CHECK_NOTNULL(a);
    CHECK_ERR(em_module_new(root, "a"), EM_ERR_ARG, "already has a child named 'a'");
    CHECK_ERR(em_module_new(root, "x.y"), EM_ERR_ARG, "without '.'");
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(2));
    CHECK_OK(em_module_add_param(a, "w", w));
    em_tensor *w2 = em_zeros(EM_F32, EM_SHAPE(2));
    CHECK_ERR(em_module_add_param(a, "w", w2), EM_ERR_ARG, "'a' already has a member named 'w'");
    em_free(w2);
    em_scope s = em_scope_begin();
    CHECK_ERR(em_module_add_param(a, "s", em_zeros(EM_F32, EM_SHAPE(2))), EM_ERR_SCOPE, "must be persistent");
    em_scope_end(s);
    CHECK(!strcmp(em_module_name(a), "a"));
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_module_train_eval_reaches_the_whole_subtree)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *a = em_module_new(root, "a"), *b = em_module_new(a, "b");
    CHECK(em_module_is_training(b));
    em_module_train(root, false);
    CHECK(!em_module_is_training(root) && !em_module_is_training(a) && !em_module_is_training(b));
    em_module *c = em_module_new(a, "c"); /* a new child inherits its parent's mode */
    CHECK(!em_module_is_training(c));
    em_module_train(a, true);
    CHECK(!em_module_is_training(root) && em_module_is_training(c));
    em_module_free(root);
}

TEST(test_flatten_keeps_values_and_makes_params_views_of_one_buffer)
{
    em_module *root = small_tree();
    em_named v[3];
    em_module_params(root, v, 3);
    double before[3][10];
    for (int i = 0; i < 3; i++) em_to_array(v[i].t, EM_F64, before[i]);
    CHECK_OK(em_module_flatten(root));
    CHECK_OK(em_module_flatten(root)); /* idempotent */
    em_tensor *flat = em_module_flat_params(root, EM_F32), *gflat = em_module_flat_grads(root, EM_F32);
    CHECK_NOTNULL(flat);
    CHECK_NOTNULL(gflat);
    CHECK(em_module_flat_params(root, EM_F64) == NULL);
    for (int i = 0; i < 3; i++) {
        CHECK(em_shares_storage(v[i].t, flat));
        CHECK(em_is_contiguous(v[i].t));
        CHECK(em_offset(v[i].t) % 16 == 0); /* 64-byte aligned slots */
        double after[10];
        em_to_array(v[i].t, EM_F64, after);
        for (int j = 0; j < em_numel(v[i].t); j++) CHECK(after[j] == before[i][j]);
    }
    /* 6 + 3 + 10 elements in slots of 16 */
    CHECK(em_numel(flat) == 48);
    /* a backward lands in the flat gradient buffer */
    em_scope s = em_scope_begin();
    em_tensor *loss = em_sum(em_mul_scalar(em_module_find(root, "a.lin.bias"), 3.0), 0, NULL, false);
    CHECK_OK(em_backward(loss, NULL));
    em_scope_end(s);
    CHECK(em_shares_storage(em_grad(v[1].t), gflat));
    s = em_scope_begin();
    CHECK_NEAR(em_item(em_sum(gflat, 0, NULL, false)), 9.0, 0);
    em_scope_end(s);
    CHECK_NEAR(em_get(gflat, (int64_t[]){16}), 3.0, 0); /* bias is the second slot */
    /* writing through the flat buffer changes the parameter */
    CHECK_OK(em_set(flat, (int64_t[]){32}, 42.0));
    CHECK_NEAR(em_get(v[2].t, (int64_t[]){0, 0}), 42.0, 0);
    CHECK_OK(em_module_zero_grad(root));
    for (int64_t i = 0; i < em_numel(gflat); i++) CHECK(em_get(gflat, &i) == 0.0);
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_flatten_keeps_an_existing_gradient)
{
    em_module *root = small_tree();
    em_tensor *b = em_module_find(root, "a.lin.bias");
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(b, 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_OK(em_module_flatten(root));
    CHECK_VALUES(em_grad(b), 0, 1, 1, 1);
    CHECK(em_shares_storage(em_grad(b), em_module_flat_grads(root, EM_F32)));
    em_module_free(root);
    CHECK(em_live_tensors() == 0);
}

TEST(test_flatten_and_free_reject_non_root)
{
    em_module *root = em_module_new(NULL, NULL), *a = em_module_new(root, "a");
    CHECK_ERR(em_module_flatten(a), EM_ERR_ARG, "'a' is not a root");
    CHECK_ERR(em_module_free(a), EM_ERR_ARG, "is not a root");
    em_module_free(root);
}

TEST(test_module_lists_names_relative_to_a_child)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *h = em_module_new(root, "h"), *blk = em_module_new(h, "3"), *attn = em_module_new(blk, "attn");
    CHECK_OK(em_module_add_param(attn, "weight", em_zeros(EM_F32, EM_SHAPE(2))));
    em_named v[2];
    CHECK(em_module_params(root, v, 2) == 1 && !strcmp(v[0].name, "h.3.attn.weight"));
    CHECK(em_module_params(blk, v, 2) == 1 && !strcmp(v[0].name, "attn.weight"));
    CHECK(em_module_find(blk, "attn.weight") == v[0].t);
    CHECK(!strcmp(em_module_name(attn), "h.3.attn"));
    em_module_free(root);
}
