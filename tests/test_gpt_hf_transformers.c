/* test_gpt_hf_transformers.c — a GPT-2 made by Hugging Face transformers
 * (tests/fixtures/gen_gpt_hf.py): its weights loaded with em_gpt_load_hf
 * from one file and from two shards under the index transformers'
 * save_pretrained wrote; em_gpt_loss_labels against
 * GPT2LMHeadModel(input_ids, labels=labels).loss; the sharded checkpoint's
 * errors (a missing shard, a tensor in no shard, a name listed twice, a
 * malformed index), each naming what is wrong and leaving the model as it
 * was. */
#include <math.h>
#include <sys/stat.h>

#include "fixtures/gpt_hf_ref.h"
#include "harness.h"
#include "st_util.h"

static em_gpt *hf_gpt(void)
{
    em_gpt_config c = {.vocab_size = HF_REF_V,
                       .block_size = HF_REF_BLOCK,
                       .n_layer = HF_REF_LAYERS,
                       .n_head = HF_REF_HEADS,
                       .n_embd = HF_REF_C,
                       .bias = true,
                       .gelu_tanh = true}; /* GPT-2's gelu_new */
    em_gpt *g = em_gpt_new(&c, 1);
    CHECK_NOTNULL(g);
    em_module_train(g->m, false);
    return g;
}

/* The fixture's tensors whose shard is `shard` (-1: all) into path; `skip`
 * (a name, or NULL) left out, `extra` (a name, or NULL) added as a copy of
 * the first tensor. */
static void write_tensors(const char *path, int shard, const char *skip, const char *extra)
{
    em_named v[HF_REF_NTENSORS + 1];
    int n = 0;
    int64_t off = 0;
    for (int i = 0; i < HF_REF_NTENSORS; i++) {
        int nd = 0;
        int64_t numel = 1;
        while (nd < 3 && hf_ref_shapes[i][nd]) numel *= hf_ref_shapes[i][nd++];
        const float *vals = hf_ref_values + off;
        off += numel;
        if ((shard >= 0 && hf_ref_shard_of[i] != shard) || (skip && !strcmp(skip, hf_ref_names[i]))) continue;
        v[n++] = (em_named){hf_ref_names[i], em_from_data(EM_F32, nd, hf_ref_shapes[i], vals)};
    }
    if (extra) v[n++] = (em_named){extra, em_from_data(EM_F32, 2, hf_ref_shapes[0], hf_ref_values)};
    CHECK_OK(em_safetensors_save(path, n, v, "{\"format\":\"pt\"}"));
    for (int i = 0; i < n; i++) em_free(v[i].t);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* transformers' two shards and its index, in the test's directory */
static void write_sharded(void)
{
    for (int k = 0; k < 2; k++) write_tensors(st_path(hf_ref_shard_files[k]), k, NULL, NULL);
    write_text(st_path("model.safetensors.index.json"), hf_ref_index_json);
}

static em_tensor *batch(const int32_t *v) { return em_from_data(EM_I32, EM_SHAPE(HF_REF_B, HF_REF_T), v); }

/* the model's logits on the fixture's ids against transformers' */
static void check_logits(em_gpt *g)
{
    em_scope s = em_scope_begin();
    em_tensor *logits = em_gpt_forward(g, batch(hf_ref_ids));
    CHECK_NOTNULL(logits);
    th_check_values(__FILE__, __LINE__, logits, hf_ref_logits, 2e-5);
    em_scope_end(s);
}

/* and em_gpt_loss_labels against GPT2LMHeadModel(input_ids, labels=labels).loss */
static void check_logits_and_loss(em_gpt *g)
{
    check_logits(g);
    em_scope s = em_scope_begin();
    CHECK_NEAR(em_item(em_gpt_loss_labels(g, batch(hf_ref_ids), batch(hf_ref_labels))), hf_ref_loss, 2e-6);
    em_scope_end(s);
}

TEST(test_gpt_loss_labels_matches_transformers_gpt2_loss)
{
    st_tmpdir();
    write_tensors(st_path("model.safetensors"), -1, NULL, NULL);
    em_gpt *g = hf_gpt();
    CHECK_OK(em_gpt_load_hf(g->m, st_path("model.safetensors")));
    check_logits_and_loss(g);
    em_gpt_free(g);
}

/* labels[:, 1:] are the targets of positions 0..T-2: em_gpt_loss on the
 * sequence without its last token, value and gradient */
TEST(test_gpt_loss_labels_equals_the_pre_shifted_loss)
{
    em_gpt *g = hf_gpt();
    em_tensor *wte = g->wte->weight;
    enum { B = HF_REF_B, T = HF_REF_T };
    int32_t x[B * (T - 1)], y[B * (T - 1)];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T - 1; t++)
            x[b * (T - 1) + t] = hf_ref_ids[b * T + t], y[b * (T - 1) + t] = hf_ref_labels[b * T + t + 1];
    em_scope s = em_scope_begin();
    em_tensor *l1 = em_gpt_loss_labels(g, batch(hf_ref_ids), batch(hf_ref_labels));
    CHECK_OK(em_backward(l1, NULL));
    em_tensor *g1 = em_keep(em_grad(wte));
    CHECK_OK(em_zero_grad(wte));
    em_tensor *l2 = em_gpt_loss(g, em_from_data(EM_I32, EM_SHAPE(B, T - 1), x),
                                em_from_data(EM_I32, EM_SHAPE(B, T - 1), y));
    CHECK_NEAR(em_item(l1), em_item(l2), 1e-6);
    CHECK_OK(em_backward(l2, NULL));
    CHECK(th_max_abs_diff(g1, em_grad(wte)) < 1e-7);
    CHECK(em_item(em_sum(em_abs(g1), 0, NULL, false)) > 0);
    em_scope_end(s);
    em_free(g1);
    em_gpt_free(g);
}

TEST(test_gpt_loss_labels_of_one_position_is_nan_and_checks_the_labels)
{
    em_gpt *g = hf_gpt();
    em_scope s = em_scope_begin();
    em_tensor *one = em_from_data(EM_I32, EM_SHAPE(2, 1), (int32_t[]){3, 4});
    CHECK(isnan(em_item(em_gpt_loss_labels(g, one, one)))); /* nothing left to predict, as transformers */
    CHECK_ERR(em_gpt_loss_labels(g, batch(hf_ref_ids), one), EM_ERR_SHAPE,
              "em_gpt_loss_labels: labels are i32(2,1), expected i32 of idx's shape (2,8)");
    em_scope_end(s);
    em_gpt_free(g);
}

/* -1, ember's old ignore value, is an error that says what changed */
TEST(test_gpt_loss_names_minus_one_as_the_old_ignore_value)
{
    em_gpt *g = hf_gpt();
    em_scope s = em_scope_begin();
    int32_t y[HF_REF_B * HF_REF_T];
    memcpy(y, hf_ref_ids, sizeof y);
    y[5] = -1;
    CHECK_ERR(em_gpt_loss(g, batch(hf_ref_ids), batch(y)), EM_ERR_INDEX,
              "em_gpt_loss: cross_entropy: target -1 at position (0,5)");
    CHECK(strstr(em_last_error(),
                 "marked -100 (EM_IGNORE_INDEX, as in PyTorch and Hugging Face), no longer -1"));
    y[5] = -100;
    CHECK(isfinite(em_item(em_gpt_loss(g, batch(hf_ref_ids), batch(y)))));
    em_scope_end(s);
    em_gpt_free(g);
}

/* ---- sharded checkpoints ----------------------------------------------------------- */

TEST(test_gpt_load_hf_reads_two_shards_by_directory_and_by_index)
{
    st_tmpdir();
    write_sharded();
    em_gpt *g = hf_gpt();
    CHECK_OK(em_gpt_load_hf(g->m, st_dir));
    check_logits(g);
    em_gpt_free(g);
    g = hf_gpt();
    CHECK_OK(em_gpt_load_hf(g->m, st_path("model.safetensors.index.json")));
    check_logits_and_loss(g);
    em_gpt_free(g);
}

/* Loading path fails with want naming sub (and path), the model unchanged. */
static void expect_fail(const char *path, em_status want, const char *sub)
{
    em_gpt *g = hf_gpt();
    em_scope s = em_scope_begin();
    em_tensor *before = em_keep(em_gpt_forward(g, batch(hf_ref_ids)));
    em_scope_end(s);
    CHECK_ERR(em_gpt_load_hf(g->m, path), want, sub);
    CHECK(strstr(em_last_error(), "em_gpt_load_hf: ") == em_last_error());
    s = em_scope_begin();
    CHECK(th_max_abs_diff(before, em_gpt_forward(g, batch(hf_ref_ids))) == 0);
    em_scope_end(s);
    em_free(before);
    em_gpt_free(g);
}

/* the misleading "the file has 1 layers, the model 2" of a shard passed alone */
TEST(test_gpt_load_hf_refuses_one_shard_naming_the_index_to_pass)
{
    st_tmpdir();
    write_sharded();
    expect_fail(
        st_path("model-00001-of-00002.safetensors"), EM_ERR_ARG,
        "model-00001-of-00002.safetensors' is shard 1 of 2 of a sharded checkpoint: pass its directory or "
        "its model.safetensors.index.json");
}

TEST(test_gpt_load_hf_names_a_missing_shard_file)
{
    st_tmpdir();
    write_sharded();
    CHECK(remove(st_path("model-00002-of-00002.safetensors")) == 0);
    expect_fail(st_dir, EM_ERR_IO, "em_gpt_load_hf: shard 'model-00002-of-00002.safetensors' of '");
    CHECK(strstr(em_last_error(), "model-00002-of-00002.safetensors: No such file"));
}

TEST(test_gpt_load_hf_names_a_tensor_no_shard_holds)
{
    st_tmpdir();
    write_sharded();
    /* listed in the index, in neither shard */
    const char *t = "transformer.h.1.mlp.c_fc.bias";
    write_tensors(st_path(hf_ref_shard_files[1]), 1, t, NULL);
    expect_fail(st_dir, EM_ERR_ARG, "maps tensor 'transformer.h.1.mlp.c_fc.bias' to '");
    CHECK(
        strstr(em_last_error(), "model-00002-of-00002.safetensors', which does not hold it (no shard does)"));
    /* and missing from the index too: the model's missing parameter, named */
    char ix[sizeof hf_ref_index_json], key[96];
    snprintf(key, sizeof key, "    \"%s\": \"%s\",\n", t, hf_ref_shard_files[1]);
    char *at = strstr(strcpy(ix, hf_ref_index_json), key);
    CHECK(at != NULL);
    memmove(at, at + strlen(key), strlen(at + strlen(key)) + 1);
    write_text(st_path("model.safetensors.index.json"), ix);
    expect_fail(
        st_dir, EM_ERR_ARG,
        "missing tensor 'transformer.h.1.mlp.c_fc.bias' (for the model's 'h.1.mlp.c_fc.bias', expected "
        "(32,)); none of its 2 shards has it");
}

TEST(test_gpt_load_hf_refuses_a_tensor_in_two_shards_or_not_in_the_index)
{
    st_tmpdir();
    write_sharded();
    write_tensors(st_path(hf_ref_shard_files[1]), 1, NULL, "transformer.wte.weight"); /* also in shard 1 */
    expect_fail(st_dir, EM_ERR_ARG, "tensor 'transformer.wte.weight' is in two shards, '");
    write_tensors(st_path(hf_ref_shard_files[1]), 1, NULL, "transformer.h.0.attn.rotary");
    expect_fail(st_dir, EM_ERR_ARG, "holds tensor 'transformer.h.0.attn.rotary', which '");
}

TEST(test_gpt_load_hf_refuses_an_index_naming_a_tensor_twice)
{
    st_tmpdir();
    write_sharded();
    char ix[sizeof hf_ref_index_json + 128];
    const char *map = strstr(hf_ref_index_json, "\"weight_map\": {\n") + strlen("\"weight_map\": {\n");
    snprintf(ix, sizeof ix, "%.*s    \"transformer.ln_f.bias\": \"%s\",\n%s", (int)(map - hf_ref_index_json),
             hf_ref_index_json, hf_ref_shard_files[0], map);
    write_text(st_path("model.safetensors.index.json"), ix);
    expect_fail(st_dir, EM_ERR_IO, "model.safetensors.index.json' is not a safetensors index: duplicate key");
}

TEST(test_gpt_load_hf_refuses_a_malformed_index)
{
    st_tmpdir();
    write_sharded();
    const char *index = st_path("model.safetensors.index.json");
    write_text(index, "{\"weight_map\": {\"transformer.wte.weight\": ");
    expect_fail(index, EM_ERR_IO, "model.safetensors.index.json' is not a safetensors index: ");
    write_text(index, "{\"metadata\": {\"total_size\": 7648}}");
    expect_fail(index, EM_ERR_IO, "is not a safetensors index: no \"weight_map\" object naming tensors");
    write_text(index, "{\"weight_map\": {\"transformer.wte.weight\": 1}}");
    expect_fail(index, EM_ERR_IO, "weight_map's \"transformer.wte.weight\" is not a file name");
    CHECK(remove(index) == 0 && remove(st_path(hf_ref_shard_files[0])) == 0 &&
          remove(st_path(hf_ref_shard_files[1])) == 0);
    expect_fail(st_dir, EM_ERR_IO, "holds neither model.safetensors.index.json nor model.safetensors");
}
