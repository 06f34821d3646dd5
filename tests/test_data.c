/* test_data.c — datasets: the user-dataset interface, character/byte
 * vocabularies and text, the 90/10 split, token files, the sequence dataset
 * and IDX images read from .gz. Every file a test reads it first writes
 * itself in its temporary directory (th_tmpfile). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A fresh temporary path (the file exists, empty) in buf. */
static const char *tmp_path(char buf[PATH_MAX])
{
    close(th_tmpfile(buf, PATH_MAX, "ember-data"));
    return buf;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Writes a gzip'd IDX file: magic, ndim big-endian sizes, then the first
 * `keep` of the n data bytes (keep < n makes a truncated file). */
static void write_idx_gz(const char *path, uint32_t magic, int ndim, const uint32_t *dims,
                         const uint8_t *data, size_t keep)
{
    gzFile f = gzopen(path, "wb");
    if (!f) th_fail(__FILE__, __LINE__, "gzopen %s failed", path);
    uint8_t hdr[16];
    put_be32(hdr, magic);
    for (int k = 0; k < ndim; k++) put_be32(hdr + 4 * (k + 1), dims[k]);
    gzwrite(f, hdr, (unsigned)(4 * (ndim + 1)));
    if (keep) gzwrite(f, data, (unsigned)keep);
    gzclose(f);
}

/* 3 images of 2x3 (pixel = 40*i + j) and labels 7, 0, 9. */
static const uint8_t IMG[3 * 6] = {0, 1, 2, 3, 4, 255, 40, 41, 42, 43, 44, 45, 80, 81, 82, 83, 84, 85};
static const uint8_t LAB[3] = {7, 0, 9};

/* ---- the dataset interface ----------------------------------------------------------
 * A user dataset: example i is x = (i, i*i) f32, y = i % 3 as a 0-dim i32. */

static int frees;

static int64_t sq_len(void *user) { return *(int64_t *)user; }

static em_status sq_get(void *user, int64_t i, void *x, void *y)
{
    (void)user;
    if (i == 4) return em_set_error(EM_ERR_IO, "squares: example 4 is unreadable");
    float *px = x;
    px[0] = (float)i;
    px[1] = (float)(i * i);
    *(int32_t *)y = (int32_t)(i % 3);
    return EM_OK;
}

static void sq_free(void *user)
{
    (void)user;
    frees++;
}

static em_dataset squares_def(int64_t *n)
{
    return (em_dataset){sq_len, sq_get, sq_free, n, {EM_F32, 1, {2}}, {EM_I32, 0, {0}}, NULL};
}

TEST(test_dataset_get_makes_example_tensors_of_its_fields)
{
    int64_t n = 6;
    em_dataset def = squares_def(&n);
    em_dataset *ds = em_dataset_new(&def);
    CHECK_NOTNULL(ds);
    CHECK(em_dataset_len(ds) == 6);
    em_scope s = em_scope_begin();
    em_tensor *x, *y;
    CHECK_OK(em_dataset_get(ds, 3, &x, &y));
    CHECK(em_ndim(x) == 1 && em_size(x, 0) == 2 && em_dtype_of(x) == EM_F32);
    CHECK(em_ndim(y) == 0 && em_dtype_of(y) == EM_I32);
    CHECK_VALUES(x, 0, 3, 9);
    CHECK_VALUES(y, 0, 0);
    em_scope_end(s);
    frees = 0;
    em_dataset_free(ds);
    CHECK(frees == 1);
}

TEST(test_dataset_new_rejects_missing_get)
{
    int64_t n = 6;
    em_dataset def = squares_def(&n);
    def.get = NULL;
    CHECK_ERR(em_dataset_new(&def), EM_ERR_ARG, "em_dataset_new: len and get must be set");
    def = squares_def(&n);
    def.x_field.ndim = EM_MAX_DIMS;
    CHECK_ERR(em_dataset_new(&def), EM_ERR_ARG, "bad x field");
}

TEST(test_dataset_get_rejects_out_of_range_index)
{
    int64_t n = 6;
    em_dataset def = squares_def(&n);
    em_dataset *ds = em_dataset_new(&def);
    em_tensor *x, *y;
    CHECK_ERR(em_dataset_get(ds, 6, &x, &y), EM_ERR_INDEX, "index 6 out of range [0, 6)");
    CHECK_ERR(em_dataset_get(ds, -1, &x, &y), EM_ERR_INDEX, "index -1");
    em_dataset_free(ds);
}

TEST(test_dataset_get_passes_on_the_datasets_error_and_leaks_nothing)
{
    int64_t n = 6, live = em_live_tensors();
    em_dataset def = squares_def(&n);
    em_dataset *ds = em_dataset_new(&def);
    em_tensor *x = NULL, *y = NULL;
    CHECK_ERR(em_dataset_get(ds, 4, &x, &y), EM_ERR_IO, "example 4 is unreadable");
    CHECK(x == NULL && y == NULL);
    CHECK(em_live_tensors() == live); /* no scope open: the would-be outputs were freed */
    em_dataset_free(ds);
}

/* ---- vocabulary -------------------------------------------------------------------- */

TEST(test_vocab_of_text_is_its_sorted_distinct_bytes)
{
    const char *text = "hello world\n";
    em_vocab v = em_vocab_from_text(text, strlen(text));
    CHECK(v.size == 9 && !v.bytes);
    CHECK(memcmp(v.chars, "\n dehlorw", 9) == 0);
    CHECK(v.index['\n'] == 0 && v.index['w'] == 8 && v.index['z'] == -1);
}

TEST(test_vocab_encode_decode_round_trips)
{
    const char *text = "hello world\n";
    em_vocab v = em_vocab_from_text(text, strlen(text));
    int32_t ids[12];
    CHECK_OK(em_vocab_encode(&v, "lower", 5, ids));
    CHECK(ids[0] == 5 && ids[1] == 6 && ids[2] == 8 && ids[3] == 3 && ids[4] == 7);
    char back[13];
    CHECK_OK(em_vocab_encode(&v, text, 12, ids));
    CHECK_OK(em_vocab_decode(&v, ids, 12, back));
    CHECK(strcmp(back, text) == 0);
}

TEST(test_vocab_encode_tensor_gives_i32_tokens)
{
    em_vocab v = em_vocab_from_text("abc", 3);
    em_scope s = em_scope_begin();
    em_tensor *t = em_vocab_encode_tensor(&v, "cab");
    CHECK(em_dtype_of(t) == EM_I32 && em_ndim(t) == 1);
    CHECK_VALUES(t, 0, 2, 0, 1);
    em_scope_end(s);
}

TEST(test_vocab_encode_rejects_unknown_character_naming_it)
{
    em_vocab v = em_vocab_from_text("abc", 3);
    int32_t ids[4];
    CHECK_ERR(em_vocab_encode(&v, "abzc", 4, ids), EM_ERR_ARG, "character 'z' (0x7a) at position 2");
    CHECK_ERR(em_vocab_encode_tensor(&v, "a\n"), EM_ERR_ARG, "'\\n'");
}

TEST(test_vocab_decode_rejects_out_of_range_token)
{
    em_vocab v = em_vocab_from_text("abc", 3);
    char out[4];
    CHECK_ERR(em_vocab_decode(&v, (const int32_t[]){0, 3}, 2, out), EM_ERR_INDEX, "token 3 at position 1");
}

TEST(test_bytes_vocab_maps_each_byte_to_itself)
{
    em_vocab v = em_vocab_bytes();
    CHECK(v.size == 256 && v.bytes);
    int32_t ids[3];
    CHECK_OK(em_vocab_encode(&v, "A\xff\x01", 3, ids));
    CHECK(ids[0] == 65 && ids[1] == 255 && ids[2] == 1);
}

TEST(test_vocab_string_escapes_and_round_trips)
{
    const char text[] = "b\\a\n\t\"\x01\xff\r ";
    em_vocab v = em_vocab_from_text(text, sizeof text - 1);
    char *s = em_vocab_to_string(&v);
    CHECK_NOTNULL(s);
    /* byte order: 0x01 \t \n \r ' ' '"' '\\' 'a' 'b' 0xff */
    CHECK(strcmp(s, "chars:\\x01\\t\\n\\r \\x22\\\\ab\\xff") == 0);
    em_vocab back;
    CHECK_OK(em_vocab_from_string(s, &back));
    CHECK(back.size == v.size && !back.bytes && memcmp(back.chars, v.chars, (size_t)v.size) == 0);
    free(s);
    em_vocab b = em_vocab_bytes();
    s = em_vocab_to_string(&b);
    CHECK(strcmp(s, "bytes") == 0);
    CHECK_OK(em_vocab_from_string(s, &back));
    CHECK(back.bytes && back.size == 256);
    free(s);
}

TEST(test_vocab_from_string_rejects_malformed_strings)
{
    em_vocab v;
    CHECK_ERR(em_vocab_from_string("letters:abc", &v), EM_ERR_ARG, "want \"bytes\" or \"chars:...\"");
    CHECK_ERR(em_vocab_from_string("chars:ab\\q", &v), EM_ERR_ARG, "bad escape at offset 8");
    CHECK_ERR(em_vocab_from_string("chars:ba", &v), EM_ERR_ARG, "distinct and sorted");
    CHECK_ERR(em_vocab_from_string("chars:", &v), EM_ERR_ARG, "empty");
}

/* ---- text ---------------------------------------------------------------------------- */

TEST(test_text_open_encodes_file_at_character_level)
{
    char path[PATH_MAX];
    const char *text = "to be or not to be\n";
    th_write_file(tmp_path(path), text, strlen(text));
    em_text *t = em_text_open(path, EM_TEXT_CHARS);
    unlink(path);
    CHECK_NOTNULL(t);
    CHECK(t->vocab.size == 8); /* \n, space, b, e, n, o, r, t */
    CHECK(t->tokens.n == (int64_t)strlen(text) && t->tokens.type == EM_TOK_I32);
    char back[64];
    CHECK_OK(em_vocab_decode(&t->vocab, t->tokens.data, (size_t)t->tokens.n, back));
    CHECK(strcmp(back, text) == 0);
    em_text_free(t);
}

TEST(test_text_open_bytes_mode_tokens_are_the_bytes)
{
    char path[PATH_MAX];
    const char text[] = "ab\xc3\xa9";
    th_write_file(tmp_path(path), text, 4);
    em_text *t = em_text_open(path, EM_TEXT_BYTES);
    unlink(path);
    CHECK_NOTNULL(t);
    CHECK(t->vocab.size == 256 && t->vocab.bytes);
    const int32_t *tok = t->tokens.data;
    CHECK(tok[0] == 'a' && tok[1] == 'b' && tok[2] == 0xc3 && tok[3] == 0xa9);
    em_text_free(t);
}

TEST(test_text_open_rejects_missing_and_empty_files)
{
    char path[PATH_MAX];
    tmp_path(path);
    CHECK_ERR(em_text_open(path, EM_TEXT_CHARS), EM_ERR_ARG, "is empty");
    unlink(path);
    CHECK_ERR(em_text_open(path, EM_TEXT_CHARS), EM_ERR_IO, "em_text_open: cannot open");
}

TEST(test_tokens_split_puts_first_90_percent_in_train)
{
    int32_t data[100];
    for (int i = 0; i < 100; i++) data[i] = i;
    em_tokens all = em_tokens_view(data, 100, EM_TOK_I32), tr, va;
    CHECK_OK(em_tokens_split(&all, 0.9, &tr, &va));
    CHECK(tr.n == 90 && va.n == 10);
    CHECK(em_tokens_at(&tr, 0) == 0 && em_tokens_at(&tr, 89) == 89);
    CHECK(em_tokens_at(&va, 0) == 90 && em_tokens_at(&va, 9) == 99);
    all.n = 11; /* int(0.9 * 11) = 9 */
    CHECK_OK(em_tokens_split(&all, 0.9, &tr, &va));
    CHECK(tr.n == 9 && va.n == 2 && em_tokens_at(&va, 0) == 9);
    all.n = 1115394; /* tinyshakespeare's length: nanoGPT's 1003854 / 111540 */
    CHECK_OK(em_tokens_split(&all, 0.9, &tr, &va));
    CHECK(tr.n == 1003854 && va.n == 111540);
}

TEST(test_tokens_split_rejects_bad_fraction_and_tiny_arrays)
{
    int32_t data[4] = {0};
    em_tokens all = em_tokens_view(data, 4, EM_TOK_I32), tr, va;
    CHECK_ERR(em_tokens_split(&all, 1.0, &tr, &va), EM_ERR_ARG, "train_frac must be in (0, 1), got 1");
    all.n = 1;
    CHECK_ERR(em_tokens_split(&all, 0.9, &tr, &va), EM_ERR_ARG, "leave 0 for train and 1 for validation");
}

/* ---- token files ----------------------------------------------------------------------- */

TEST(test_token_file_round_trips_little_endian_u16)
{
    char path[PATH_MAX];
    int32_t src[5] = {0, 1, 0x1234, 255, 65535};
    em_tokens t = em_tokens_view(src, 5, EM_TOK_I32);
    CHECK_OK(em_tokens_save(tmp_path(path), &t));
    uint8_t raw[16];
    FILE *f = fopen(path, "rb");
    size_t got = fread(raw, 1, sizeof raw, f);
    fclose(f);
    CHECK(got == 10 && raw[4] == 0x34 && raw[5] == 0x12 && raw[8] == 0xff && raw[9] == 0xff);
    em_tokens back;
    CHECK_OK(em_tokens_load(path, &back));
    unlink(path);
    CHECK(back.n == 5 && back.type == EM_TOK_U16 && back.owned);
    for (int i = 0; i < 5; i++) CHECK(em_tokens_at(&back, i) == src[i]);
    em_scope s = em_scope_begin();
    em_tensor *x = em_tokens_tensor(&back, 1, 3);
    CHECK(em_dtype_of(x) == EM_I32);
    CHECK_VALUES(x, 0, 1, 0x1234, 255);
    em_scope_end(s);
    em_tokens_free(&back);
    CHECK(back.data == NULL && back.n == 0);
}

TEST(test_token_file_rejects_odd_size)
{
    char path[PATH_MAX];
    th_write_file(tmp_path(path), "\x01\x00\x02", 3);
    em_tokens t;
    CHECK_ERR(em_tokens_load(path, &t), EM_ERR_ARG, "odd size 3 bytes");
    CHECK(t.data == NULL);
    unlink(path);
    CHECK_ERR(em_tokens_load(path, &t), EM_ERR_IO, "cannot open");
}

TEST(test_tokens_save_rejects_tokens_outside_u16)
{
    char path[PATH_MAX];
    int32_t src[3] = {1, 65536, 2};
    em_tokens t = em_tokens_view(src, 3, EM_TOK_I32);
    CHECK_ERR(em_tokens_save(tmp_path(path), &t), EM_ERR_ARG, "token 1 is 65536");
    unlink(path);
}

TEST(test_tokens_tensor_rejects_range_outside_tokens)
{
    int32_t src[3] = {1, 2, 3};
    em_tokens t = em_tokens_view(src, 3, EM_TOK_I32);
    CHECK_ERR(em_tokens_tensor(&t, 2, 2), EM_ERR_INDEX, "range [2, 4) outside 3 tokens");
    em_tokens v = em_tokens_slice(&t, 1, 2);
    CHECK(v.n == 2 && em_tokens_at(&v, 0) == 2);
}

/* ---- the sequence dataset -------------------------------------------------------------- */

TEST(test_sequence_dataset_cuts_blocks_with_y_shifted_by_one)
{
    uint16_t data[11];
    for (int i = 0; i < 11; i++) data[i] = (uint16_t)(100 + i);
    em_tokens t = em_tokens_view(data, 11, EM_TOK_U16);
    em_dataset *ds = em_sequence_dataset(&t, 4);
    CHECK_NOTNULL(ds);
    CHECK(em_dataset_len(ds) == 2); /* (11 - 1) / 4 */
    em_scope s = em_scope_begin();
    em_tensor *x, *y;
    CHECK_OK(em_dataset_get(ds, 1, &x, &y));
    CHECK(em_dtype_of(x) == EM_I32 && em_size(x, 0) == 4);
    CHECK_VALUES(x, 0, 104, 105, 106, 107);
    CHECK_VALUES(y, 0, 105, 106, 107, 108);
    em_scope_end(s);
    em_dataset_free(ds);
}

TEST(test_sequence_dataset_rejects_data_shorter_than_block_plus_one)
{
    int32_t data[4] = {0};
    em_tokens t = em_tokens_view(data, 4, EM_TOK_I32);
    CHECK_ERR(em_sequence_dataset(&t, 4), EM_ERR_ARG, "4 tokens, need at least T + 1 = 5");
    CHECK_ERR(em_sequence_dataset(&t, 0), EM_ERR_ARG, "T must be >= 1");
}

/* ---- IDX images -------------------------------------------------------------------------- */

TEST(test_idx_gz_round_trips_images_and_labels)
{
    char ip[PATH_MAX], lp[PATH_MAX];
    write_idx_gz(tmp_path(ip), 0x803, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG);
    write_idx_gz(tmp_path(lp), 0x801, 1, (const uint32_t[]){3}, LAB, sizeof LAB);
    em_dataset *ds = em_idx_dataset_open(ip, lp);
    unlink(ip);
    unlink(lp);
    CHECK_NOTNULL(ds);
    CHECK(em_dataset_len(ds) == 3);
    em_scope s = em_scope_begin();
    em_tensor *x, *y;
    CHECK_OK(em_dataset_get(ds, 0, &x, &y));
    CHECK(em_ndim(x) == 3 && em_size(x, 0) == 1 && em_size(x, 1) == 2 && em_size(x, 2) == 3);
    CHECK(em_dtype_of(x) == EM_F32 && em_dtype_of(y) == EM_I32 && em_ndim(y) == 0);
    CHECK_VALUES(x, 1e-7, 0, 1 / 255.0, 2 / 255.0, 3 / 255.0, 4 / 255.0, 1);
    CHECK_VALUES(y, 0, 7);
    CHECK_OK(em_dataset_get(ds, 2, &x, &y));
    CHECK_VALUES(x, 1e-7, 80 / 255.0, 81 / 255.0, 82 / 255.0, 83 / 255.0, 84 / 255.0, 85 / 255.0);
    CHECK_VALUES(y, 0, 9);
    em_scope_end(s);
    em_dataset_free(ds);
}

TEST(test_idx_rejects_bad_magic)
{
    char ip[PATH_MAX], lp[PATH_MAX];
    write_idx_gz(tmp_path(ip), 0x801, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG);
    write_idx_gz(tmp_path(lp), 0x801, 1, (const uint32_t[]){3}, LAB, sizeof LAB);
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_ARG, "bad magic 0x00000801, want 0x00000803");
    write_idx_gz(ip, 0x803, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG);
    write_idx_gz(lp, 0x803, 1, (const uint32_t[]){3}, LAB, sizeof LAB);
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_ARG, "want 0x00000801 (u8 labels");
    unlink(ip);
    unlink(lp);
}

TEST(test_idx_rejects_truncated_files)
{
    char ip[PATH_MAX], lp[PATH_MAX];
    write_idx_gz(tmp_path(ip), 0x803, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG - 1);
    write_idx_gz(tmp_path(lp), 0x801, 1, (const uint32_t[]){3}, LAB, sizeof LAB);
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_IO,
              "truncated: the images needs 18 bytes, the file has 17");
    write_idx_gz(ip, 0x803, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG);
    write_idx_gz(lp, 0x801, 1, (const uint32_t[]){3}, LAB, 2);
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_IO, "truncated: the labels needs 3 bytes");
    th_write_file(lp, "\x00\x00\x08", 3); /* not even a header (read as plain data by zlib) */
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_IO, "truncated: the header");
    unlink(ip);
    unlink(lp);
}

TEST(test_idx_rejects_image_label_count_mismatch)
{
    char ip[PATH_MAX], lp[PATH_MAX];
    write_idx_gz(tmp_path(ip), 0x803, 3, (const uint32_t[]){3, 2, 3}, IMG, sizeof IMG);
    write_idx_gz(tmp_path(lp), 0x801, 1, (const uint32_t[]){2}, LAB, 2);
    CHECK_ERR(em_idx_dataset_open(ip, lp), EM_ERR_ARG, "has 3 images but");
    CHECK(strstr(em_last_error(), "has 2 labels"));
    unlink(ip);
    unlink(lp);
}

TEST(test_idx_rejects_missing_file)
{
    CHECK_ERR(em_idx_dataset_open("/nonexistent/ember/images.gz", "/nonexistent/ember/labels.gz"), EM_ERR_IO,
              "cannot open /nonexistent/ember/images.gz");
}

/* ---- the real corpus, when the shared folder has it -------------------------------------- */

TEST(test_tinyshakespeare_has_nanogpt_vocabulary_and_split)
{
    char path[512];
    const char *dir = getenv("EMBER_DATA_DIR");
    th_pathf(path, sizeof path, "%s/tinyshakespeare.txt", dir ? dir : EMBER_BUILD_DIR "/../../shared/data");
    if (access(path, R_OK) != 0) SKIP("tinyshakespeare.txt not in ../shared/data (set EMBER_DATA_DIR)");
    em_text *t = em_text_open(path, EM_TEXT_CHARS);
    CHECK_NOTNULL(t);
    CHECK(t->vocab.size == 65 && t->tokens.n == 1115394);
    em_tokens tr, va;
    CHECK_OK(em_tokens_split(&t->tokens, 0.9, &tr, &va));
    CHECK(tr.n == 1003854 && va.n == 111540);
    em_text_free(t);
}

/* ---- files that are not regular files ------------------------------------------- */

/* A FIFO where a file is expected: refused by type at once, never waited on
 * (opening a FIFO for reading blocks until a writer comes). */
TEST(test_fifo_given_as_a_file_is_refused_by_type_without_waiting)
{
    char dir[PATH_MAX], fifo[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-fifo");
    th_pathf(fifo, sizeof fifo, "%s/pipe", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_ERR(em_text_open(fifo, EM_TEXT_CHARS), EM_ERR_IO, "is a FIFO, not a regular file");
    CHECK_ERR(em_safetensors_open(fifo), EM_ERR_IO, "is a FIFO, not a regular file");
    em_config c = em_config_defaults();
    CHECK_ERR(em_config_read(fifo, &c, true), EM_ERR_IO, "is a FIFO, not a regular file");
    em_module *m = em_module_new(NULL, NULL);
    CHECK_NOTNULL(m);
    CHECK_ERR(em_module_load(m, fifo, false), EM_ERR_IO, "is a FIFO");
    em_module_free(m);
    CHECK_ERR(em_text_open(dir, EM_TEXT_CHARS), EM_ERR_IO, "is a directory");
}
