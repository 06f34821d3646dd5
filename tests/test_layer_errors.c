/* test_layer_errors.c — a failing layer forward names the user's layer (its
 * full dotted name in the module tree), not the op that failed inside it:
 * a forward outside any scope says which module and what to do about it,
 * and a shape error names the module and the shapes. Nested layers are
 * named once, innermost first. */
#include "harness.h"

/* The tree h.0.attn, as a GPT's blocks are named. */
static em_module *tree(em_module **attn)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *h = em_module_new(root, "h");
    em_module *h0 = em_module_new(h, "0");
    *attn = em_module_new(h0, "attn");
    CHECK(*attn != NULL);
    return root;
}

static const char *const WHAT_TO_DO = "call em_scope_begin() before the forward";

TEST(test_linear_forward_outside_a_scope_names_the_module_and_what_to_do)
{
    em_module *attn, *root = tree(&attn);
    em_rng rng = em_rng_new(1);
    em_nn_linear *qkv = em_nn_linear_new(attn, "qkv", 4, 3, true, &rng);
    CHECK_NOTNULL(qkv);
    em_tensor *x = em_ones(EM_F32, 2, (int64_t[]){2, 4}); /* persistent: no scope is open */
    CHECK_ERR(em_nn_linear_forward(qkv, x), EM_ERR_SCOPE, "linear 'h.0.attn.qkv'");
    CHECK(strstr(em_last_error(), WHAT_TO_DO) != NULL);
    em_free(x);
    em_module_free(root);
}

TEST(test_layer_norm_forward_outside_a_scope_names_the_module_and_what_to_do)
{
    em_module *attn, *root = tree(&attn);
    em_nn_layer_norm *ln = em_nn_layer_norm_new(attn, "ln", 4, true);
    CHECK_NOTNULL(ln);
    em_tensor *x = em_ones(EM_F32, 2, (int64_t[]){2, 4});
    CHECK_ERR(em_nn_layer_norm_forward(ln, x), EM_ERR_SCOPE, "layer_norm 'h.0.attn.ln'");
    CHECK(strstr(em_last_error(), WHAT_TO_DO) != NULL);
    em_free(x);
    em_module_free(root);
}

static em_gpt *tiny_gpt(void)
{
    em_gpt_config cfg = {.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
    em_gpt *g = em_gpt_new(&cfg, 3);
    CHECK_NOTNULL(g);
    return g;
}

TEST(test_gpt_forward_outside_a_scope_names_a_module_and_what_to_do)
{
    em_gpt *g = tiny_gpt();
    em_tensor *idx = em_zeros(EM_I32, 2, (int64_t[]){1, 4});
    CHECK_ERR(em_gpt_forward(g, idx), EM_ERR_SCOPE, "embedding 'wte'");
    CHECK(strstr(em_last_error(), WHAT_TO_DO) != NULL);
    em_free(idx);
    em_gpt_free(g);
}

TEST(test_a_shape_error_inside_a_gpt_block_names_the_innermost_module_and_shapes)
{
    em_gpt *g = tiny_gpt();
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, 3, (int64_t[]){1, 2, 5});
    CHECK_ERR(em_nn_block_forward(g->h[1], x), EM_ERR_SHAPE,
              "layer_norm 'h.1.ln_1': x is (1,2,5), its last dim must be 8");
    CHECK(strstr(em_last_error(), "'h.1'") == NULL); /* named once: the block does not add itself */
    em_scope_end(s);
    em_gpt_free(g);
}

TEST(test_gpt_forward_shape_error_names_the_call_and_the_shapes)
{
    em_gpt *g = tiny_gpt();
    em_scope s = em_scope_begin();
    CHECK_ERR(em_gpt_forward(g, em_zeros(EM_I32, 2, (int64_t[]){2, 9})), EM_ERR_SHAPE,
              "em_gpt_forward: idx is (2,9), expected (B,T) with 1 <= T <= block_size = 8");
    em_scope_end(s);
    em_gpt_free(g);
}

TEST(test_an_op_error_inside_a_layer_is_prefixed_with_the_module)
{
    em_module *attn, *root = tree(&attn);
    em_rng rng = em_rng_new(2);
    em_nn_conv2d *c = em_nn_conv2d_new(attn, "conv", 3, 2, 3, 1, 0, true, &rng);
    CHECK_NOTNULL(c);
    em_scope s = em_scope_begin();
    /* a 2x2 image is smaller than the 3x3 kernel: the conv op's own error */
    CHECK_ERR(em_nn_conv2d_forward(c, em_zeros(EM_F32, 4, (int64_t[]){1, 3, 2, 2})), EM_ERR_SHAPE,
              "conv2d 'h.0.attn.conv': ");
    CHECK(strstr(em_last_error(), "(1,3,2,2)") != NULL);
    em_scope_end(s);
    em_module_free(root);
}
