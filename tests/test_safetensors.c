/* test_safetensors.c — safetensors files: round trips of every dtype and of
 * strided tensors, metadata, files written byte by byte from the format's
 * description, header padding, every kind of corrupt file (an error naming
 * the path and the problem, never a crash), atomic saves, and module state
 * dicts (strict names, shape checks, nothing modified on failure). */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "st_hostile.h"
#include "st_util.h"

/* ---- round trips ---------------------------------------------------------------- */

TEST(test_safetensors_round_trips_every_dtype)
{
    st_tmpdir();
    em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_U8, EM_BOOL};
    const char *names[] = {"f32", "f64", "f16", "bf16", "i32", "u8", "bool"};
    em_tensor *t[9];
    em_named v[9];
    double vals[6] = {1.5, -2.25, 0, 3, 100, -0.5};
    for (int i = 0; i < 7; i++) {
        double x[6];
        for (int k = 0; k < 6; k++) x[k] = dts[i] == EM_U8 ? fabs(vals[k] + k) : dts[i] == EM_BOOL ? k % 2 : vals[k];
        t[i] = st_tensor(dts[i], EM_SHAPE(2, 3), x);
        v[i] = (em_named){names[i], t[i]};
    }
    t[7] = em_scalar(EM_F32, 7.0); /* 0-dim */
    t[8] = em_zeros(EM_F64, EM_SHAPE(0, 3));
    v[7] = (em_named){"scalar", t[7]};
    v[8] = (em_named){"empty", t[8]};
    const char *path = st_path("all.safetensors");
    CHECK_OK(em_safetensors_save(path, 9, v, NULL));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_count(f) == 9);
    for (int i = 0; i < 9; i++) {
        CHECK(!strcmp(em_safetensors_name(f, i), v[i].name)); /* in the order given */
        em_tensor *g = em_safetensors_get(f, v[i].name);
        CHECK_NOTNULL(g);
        CHECK(em_dtype_of(g) == em_dtype_of(t[i]));
        CHECK(em_ndim(g) == em_ndim(t[i]));
        for (int d = 0; d < em_ndim(g); d++) CHECK(em_size(g, d) == em_size(t[i], d));
        CHECK(th_max_abs_diff(g, t[i]) == 0);
        em_free(g);
    }
    CHECK(em_safetensors_metadata(f, "format") == NULL);
    em_safetensors_close(f);
    for (int i = 0; i < 9; i++) em_free(t[i]);
    CHECK(em_live_tensors() == 0);
}

TEST(test_safetensors_writes_strided_tensors_in_row_major_order)
{
    st_tmpdir();
    em_scope s = em_scope_begin();
    em_tensor *a = em_reshape(em_arange(0, 12, 1, EM_F32), EM_SHAPE(3, 4));
    em_tensor *v[3] = {em_transpose(a, 0, 1), th_noncontig(a), em_slice(a, 1, 1, 4, 2)};
    CHECK(!em_is_contiguous(v[0]) && !em_is_contiguous(v[1]) && !em_is_contiguous(v[2]));
    em_named nv[3] = {{"t", v[0]}, {"nc", v[1]}, {"sl", v[2]}};
    const char *path = st_path("strided.safetensors");
    CHECK_OK(em_safetensors_save(path, 3, nv, NULL));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    em_tensor *t = em_safetensors_get(f, "t"), *nc = em_safetensors_get(f, "nc"), *sl = em_safetensors_get(f, "sl");
    CHECK(em_size(t, 0) == 4 && em_size(t, 1) == 3);
    CHECK_VALUES(t, 0, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    CHECK(th_max_abs_diff(nc, a) == 0);
    CHECK(em_size(sl, 0) == 3 && em_size(sl, 1) == 2);
    CHECK_VALUES(sl, 0, 1, 3, 5, 7, 9, 11);
    em_free(t);
    em_free(nc);
    em_free(sl);
    em_safetensors_close(f);
    em_scope_end(s);
    CHECK(em_live_tensors() == 0);
}

TEST(test_safetensors_metadata_round_trips_with_escapes)
{
    st_tmpdir();
    em_tensor *t = em_ones(EM_F32, EM_SHAPE(2));
    const char *path = st_path("meta.safetensors");
    CHECK_OK(em_safetensors_save(path, 1, &(em_named){"w", t},
                                 "{\"format\": \"pt\", \"note\": \"a \\\"q\\\" \\\\ b\\n\\u00e9\\ud83d\\ude00\"}"));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(!strcmp(em_safetensors_metadata(f, "format"), "pt"));
    CHECK(!strcmp(em_safetensors_metadata(f, "note"), "a \"q\" \\ b\n\xc3\xa9\xf0\x9f\x98\x80"));
    CHECK(em_safetensors_metadata(f, "absent") == NULL);
    em_safetensors_close(f);
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", t}, "{\"n\": 3}"), EM_ERR_ARG,
              "flat JSON object of string values");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", t}, "[\"a\"]"), EM_ERR_ARG, "flat JSON object");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", t}, "{\"a\": \"b\""), EM_ERR_ARG,
              "metadata: expected ',' or '}' at byte 9");
    em_free(t);
}

/* ---- the format itself -------------------------------------------------------------- */

/* Written byte by byte from the format's description: no padding, tensors
 * listed out of data order, keys in any order, whitespace, an escaped name. */
TEST(test_safetensors_reads_a_file_written_by_hand_per_spec)
{
    st_tmpdir();
    const char *header = "{ \"b\": {\"shape\": [2], \"dtype\": \"I32\", \"data_offsets\": [0, 8]},\n"
                         "  \"a\\u00e9\": {\"dtype\": \"F32\", \"data_offsets\": [8, 24], \"shape\": [2, 2]},\n"
                         "  \"__metadata__\": {\"who\": \"hand\"},\n"
                         "  \"h\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [24, 28]},\n"
                         "  \"c\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [28, 30]},\n"
                         "  \"d\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [30, 33]},\n"
                         "  \"e\": {\"dtype\": \"U8\", \"shape\": [1, 1], \"data_offsets\": [33, 34]},\n"
                         "  \"g\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [34, 42]},\n"
                         "  \"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [42, 42]} }";
    unsigned char d[42];
    st_le(d + 0, (uint32_t)-1, 4); /* b = [-1, 7] */
    st_le(d + 4, 7, 4);
    float af[4] = {1, 2, -3, 0.5f};
    for (int k = 0; k < 4; k++) {
        uint32_t u;
        memcpy(&u, &af[k], 4);
        st_le(d + 8 + 4 * k, u, 4);
    }
    st_le(d + 24, 0x3c00, 2); /* f16 1.0 */
    st_le(d + 26, 0xc000, 2); /* f16 -2.0 */
    st_le(d + 28, 0x3fc0, 2); /* bf16 1.5 */
    d[30] = 1, d[31] = 0, d[32] = 1;
    d[33] = 200;
    double g = -0.125;
    uint64_t gu;
    memcpy(&gu, &g, 8);
    st_le(d + 34, gu, 8);
    const char *path = st_path("hand.safetensors");
    st_write_file(path, header, d, sizeof d);
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_count(f) == 8);
    CHECK(!strcmp(em_safetensors_metadata(f, "who"), "hand"));
    em_tensor *t[8] = {em_safetensors_get(f, "b"), em_safetensors_get(f, "a\xc3\xa9"), em_safetensors_get(f, "h"),
                       em_safetensors_get(f, "c"), em_safetensors_get(f, "d"),       em_safetensors_get(f, "e"),
                       em_safetensors_get(f, "g"), em_safetensors_get(f, "z")};
    em_dtype want[8] = {EM_I32, EM_F32, EM_F16, EM_BF16, EM_BOOL, EM_U8, EM_F64, EM_F32};
    for (int i = 0; i < 8; i++) {
        CHECK_NOTNULL(t[i]);
        CHECK(em_dtype_of(t[i]) == want[i]);
    }
    CHECK_VALUES(t[0], 0, -1, 7);
    CHECK(em_ndim(t[1]) == 2 && em_size(t[1], 0) == 2);
    CHECK_VALUES(t[1], 0, 1, 2, -3, 0.5);
    CHECK_VALUES(t[2], 0, 1, -2);
    CHECK(em_ndim(t[3]) == 0);
    CHECK_VALUES(t[3], 0, 1.5);
    CHECK_VALUES(t[4], 0, 1, 0, 1);
    CHECK_VALUES(t[5], 0, 200);
    CHECK_VALUES(t[6], 0, -0.125);
    CHECK(em_numel(t[7]) == 0 && em_size(t[7], 1) == 5);
    for (int i = 0; i < 8; i++) em_free(t[i]);
    em_safetensors_close(f);
    CHECK(em_live_tensors() == 0);
}

TEST(test_safetensors_header_is_space_padded_so_data_is_8_byte_aligned)
{
    st_tmpdir();
    em_tensor *t = st_tensor(EM_F64, EM_SHAPE(2), (double[]){1.25, -8});
    for (int len = 1; len <= 9; len++) { /* names of every length mod 8 */
        char name[16];
        memset(name, 'n', (size_t)len);
        name[len] = '\0';
        const char *path = st_path("pad.safetensors");
        CHECK_OK(em_safetensors_save(path, 1, &(em_named){name, t}, NULL));
        size_t size;
        unsigned char *b = st_read_file(path, &size);
        uint64_t n = st_get_le(b, 8);
        CHECK(n % 8 == 0);
        CHECK(size == 8 + n + 16);
        size_t end = 8 + n;
        while (end > 8 && b[end - 1] == ' ') end--;
        CHECK(b[end - 1] == '}');
        CHECK(end + 8 > 8 + n); /* at most 7 padding spaces */
        CHECK(strstr((char *)b + 8, "\"data_offsets\":[0,16]") != NULL);
        double x;
        uint64_t u = st_get_le(b + 8 + n, 8);
        memcpy(&x, &u, 8);
        CHECK(x == 1.25);
        free(b);
    }
    em_free(t);
}

/* ---- corrupt files ------------------------------------------------------------------ */

TEST(test_safetensors_truncated_file_fails_at_every_length)
{
    st_tmpdir();
    const char *good = st_path("good.safetensors"), *cut = st_path("cut.safetensors");
    st_write_sample(good);
    size_t size;
    unsigned char *b = st_read_file(good, &size);
    for (size_t len = 0; len < size; len++) {
        st_write_raw(cut, b, len);
        CHECK_ERR(em_safetensors_open(cut), EM_ERR_IO, cut);
    }
    st_write_raw(cut, b, size);
    em_safetensors *f = em_safetensors_open(cut);
    CHECK_NOTNULL(f);
    em_safetensors_close(f);
    free(b);
}

TEST(test_safetensors_flipped_header_bytes_give_errors_not_crashes)
{
    st_tmpdir();
    const char *good = st_path("good.safetensors"), *bad = st_path("bad.safetensors");
    st_write_sample(good);
    size_t size;
    unsigned char *b = st_read_file(good, &size);
    uint64_t n = st_get_le(b, 8);
    const unsigned char subs[] = {0, '"', '{', '}', '[', ']', ',', ':', '9', '-', ' ', 'x', 0xff, '\\', 0x80};
    int failed = 0, opened = 0;
    for (size_t pos = 0; pos < 8 + n; pos++) {
        for (size_t k = 0; k < sizeof subs; k++) {
            if (b[pos] == subs[k]) continue;
            unsigned char keep = b[pos];
            b[pos] = subs[k];
            st_write_raw(bad, b, size);
            b[pos] = keep;
            em_clear_error();
            em_safetensors *f = em_safetensors_open(bad);
            if (!f) {
                CHECK(em_last_status() == EM_ERR_IO);
                CHECK(strstr(em_last_error(), bad) != NULL);
                failed++;
                continue;
            }
            opened++; /* e.g. a changed letter in a name: still a valid file */
            for (int i = 0; i < em_safetensors_count(f); i++) {
                em_tensor *t = em_safetensors_get(f, em_safetensors_name(f, i));
                CHECK(t || em_last_status() == EM_ERR_DTYPE);
                em_free(t);
            }
            em_safetensors_close(f);
        }
    }
    CHECK(failed > 1000 && opened > 0);
    free(b);
    CHECK(em_live_tensors() == 0);
}

/* Every file ember writes carries "ember.crc32" (a string, as other readers
 * expect of metadata): a flipped bit anywhere, in the data or the header, is
 * an error naming the file. Only the letters of that key are exempt: a
 * change there leaves the contents intact (and the file unchecked). */
TEST(test_safetensors_checksum_catches_a_flipped_bit_anywhere_in_the_file)
{
    st_tmpdir();
    const char *good = st_path("good.safetensors"), *bad = st_path("bad.safetensors");
    st_write_sample(good);
    em_safetensors *f = em_safetensors_open(good);
    CHECK_NOTNULL(f);
    const char *crc = em_safetensors_metadata(f, "ember.crc32");
    CHECK(crc && strlen(crc) == 8);
    CHECK(!strcmp(em_safetensors_metadata(f, "format"), "pt"));
    em_safetensors_close(f);
    size_t size;
    unsigned char *b = st_read_file(good, &size);
    const unsigned char *key = memmem(b, size, "\"ember.crc32\"", 13);
    CHECK(key != NULL);
    size_t key_at = (size_t)(key - b) + 1;
    for (size_t pos = 0; pos < size; pos++) {
        if (pos >= key_at && pos < key_at + 11) continue;
        for (int bit = 0; bit < 8; bit += 3) {
            b[pos] ^= (unsigned char)(1u << bit);
            st_write_raw(bad, b, size);
            b[pos] ^= (unsigned char)(1u << bit);
            em_clear_error();
            em_safetensors *g = em_safetensors_open(bad);
            if (g) {
                em_safetensors_close(g);
                th_fail(__FILE__, __LINE__, "byte %zu bit %d flipped: the file opened", pos, bit);
            }
            CHECK(em_last_status() == EM_ERR_IO && strstr(em_last_error(), bad));
        }
    }
    b[8 + st_get_le(b, 8)] ^= 1; /* a data byte: the message says what is wrong */
    st_write_raw(bad, b, size);
    CHECK_ERR(em_safetensors_open(bad), EM_ERR_IO, "the checksum does not match");
    free(b);
}

/* Files from other writers have no "ember.crc32": they open and read as before. */
TEST(test_safetensors_file_without_a_checksum_opens_unchecked)
{
    st_tmpdir();
    const char *path = st_path("other.safetensors");
    float data[2] = {1.5f, -2};
    st_write_file(path,
                  "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_"
                  "offsets\":[0,8]}}",
                  data, 8);
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_metadata(f, "ember.crc32") == NULL);
    em_tensor *w = em_safetensors_get(f, "w");
    CHECK_VALUES(w, 0, 1.5, -2);
    em_free(w);
    em_safetensors_close(f);
}

/* The checksum is the writer's: one passed in the metadata is replaced. */
TEST(test_safetensors_save_writes_its_own_checksum_over_a_given_one)
{
    st_tmpdir();
    em_tensor *t = em_ones(EM_F32, EM_SHAPE(3));
    const char *path = st_path("m.safetensors");
    CHECK_OK(em_safetensors_save(path, 1, &(em_named){"w", t},
                                 "{\"ember.crc32\":\"deadbeef\",\"format\":\"pt\"}"));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(strcmp(em_safetensors_metadata(f, "ember.crc32"), "deadbeef") != 0);
    CHECK(!strcmp(em_safetensors_metadata(f, "format"), "pt"));
    em_safetensors_close(f);
    CHECK_OK(em_safetensors_save(path, 0, NULL, NULL)); /* no tensors: still checked, still opens */
    f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_count(f) == 0 && em_safetensors_metadata(f, "ember.crc32") != NULL);
    em_safetensors_close(f);
    em_free(t);
}

/* Each header is checked against the message it must produce. */
static void expect_bad(const char *header, size_t data_len, const char *sub)
{
    unsigned char data[64] = {0};
    const char *path = st_path("bad.safetensors");
    st_write_file(path, header, data, data_len);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, path);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, sub);
}

TEST(test_safetensors_rejects_malformed_json_saying_where)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
               "header JSON: expected ',' or '}' at byte 53 (end of input)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, "expected a string key at byte 53");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "numbers must be integers at byte 30");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero");
    expect_bad("{\"a\":{\"dtype\":true,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "expected a value at byte 14 ('t')");
    expect_bad("{\"a\":{\"dtype\":\"F32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "expected ',' or '}' at byte 20 ('s')");
    expect_bad("{\"a\" {}}", 0, "expected ':' at byte 5 ('{')");
    expect_bad("{\"a\tb\":{}}", 0, "control character in string at byte 3");
    expect_bad("{\"a\xff\":{}}", 0, "invalid UTF-8 in string at byte 3");
    expect_bad("{\"a\\q\":{}}", 0, "bad escape in string");
    expect_bad("{\"a\\ud800\":{}}", 0, "high surrogate without its low half");
    expect_bad("{\"a\\u0000\":{}}", 0, "\\u0000 is not allowed");
    expect_bad("{\"a\":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}", 0, "nesting deeper than 16");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
               "integer out of range");
    expect_bad("{} x", 0, "unexpected characters after the JSON value at byte 3");
    expect_bad("[]", 0, "header JSON is not an object");
    expect_bad("", 0, "expected a value at byte 0 (end of input)");
}

TEST(test_safetensors_rejects_bad_entries)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a': missing \"data_offsets\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown key 'x'");
    expect_bad("{\"a\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': unknown dtype 'F7'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape entry 0 is not a non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "shape is not an array");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "0 <= begin <= end");
    expect_bad("{\"a\":[]}", 0, "tensor 'a': entry is not an object");
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of 'k' is not a string");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
}

TEST(test_safetensors_rejects_offsets_beyond_the_buffer)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
               "tensor 'a': data_offsets [0, 8] go beyond the data buffer (4 bytes)");
}

TEST(test_safetensors_rejects_overlapping_offsets)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "overlap");
}

TEST(test_safetensors_rejects_bytes_no_tensor_covers)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
               "bytes [0, 4) of the data buffer belong to no tensor");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
               "the data buffer has 9 bytes but the tensors cover 4");
}

TEST(test_safetensors_rejects_dtype_shape_size_mismatch)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
               "tensor 'a': F64 (2,3) needs 48 bytes but data_offsets [0, 24] hold 24");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
               "needs 18446744073709551615 bytes");
}

TEST(test_safetensors_rejects_duplicate_names)
{
    st_tmpdir();
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate key 'a' (second value at byte 58)");
}

TEST(test_safetensors_rejects_duplicate_names_however_they_are_escaped)
{
    st_tmpdir();
    /* "\u0061" is "a": keys are compared decoded */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate key 'a' (second value at byte 63)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
               "duplicate key 'dtype' (second value at byte 40)");
    expect_bad("{\"__metadata__\":{\"k\\/\":\"1\",\"k/\":\"2\"}}", 0, "duplicate key 'k/'");
}

TEST(test_safetensors_tensor_with_more_dims_than_ember_opens_and_fails_on_get)
{
    st_tmpdir();
    const char *path = st_path("nine.safetensors");
    unsigned char data[4] = {0};
    st_write_file(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                  data, 4);
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_count(f) == 1 && !strcmp(em_safetensors_name(f, 0), "a"));
    CHECK_ERR(em_safetensors_get(f, "a"), EM_ERR_SHAPE, "tensor 'a' has 9 dims; ember supports at most 8");
    em_safetensors_close(f);
}

/* Opening costs memory in proportion to the header whatever its JSON holds:
 * each hostile kind of st_hostile.h (tiny values, nested arrays, short keys)
 * at 4 MB adds at most 4x its header at the peak (before the streaming
 * reader, 20x to 110x). */
/* A missing file 1,500 characters deep is named whole: the message is kept
 * across the handle's cleanup in a buffer as long as the thread's error
 * (it was cut at 600 characters) */
TEST(test_safetensors_open_names_a_long_missing_path_whole)
{
    char path[1700] = "/nonexistent", want[1800];
    while (strlen(path) < 1500) strcat(path, "/deeper");
    strcat(path, "/model.safetensors");
    snprintf(want, sizeof want, "cannot open %s: No such file or directory", path);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, want);
}

TEST(test_safetensors_open_memory_is_bounded_by_the_header)
{
    if (em_build().sanitizers)
        th_skip("resident memory means nothing under ASan's allocator (plain build only)");
    st_tmpdir();
    const char *path = st_path("hostile.safetensors");
    for (int k = 0; k < ST_HOSTILE_KINDS; k++) {
        size_t n = st_hostile_write(path, st_hostile_kinds[k], (size_t)4 << 20);
        CHECK(n > 0);
        bool opened = false;
        long long peak = st_hostile_open_peak(path, &opened);
        if (peak < 0)
            th_skip("this kernel cannot reset or report the peak resident size (/proc/self/clear_refs)");
        bool valid = !strcmp(st_hostile_kinds[k], "metadata") || !strcmp(st_hostile_kinds[k], "tensors") ||
                     !strcmp(st_hostile_kinds[k], "ints");
        if (opened != valid) th_fail(__FILE__, __LINE__, "%s: opened = %d", st_hostile_kinds[k], opened);
        if (peak > 4 * (long long)n + (2 << 20))
            th_fail(__FILE__, __LINE__, "%s: opening a %zu-byte header took %lld bytes at the peak (%.1fx)",
                    st_hostile_kinds[k], n, peak, (double)peak / (double)n);
    }
}

TEST(test_safetensors_rejects_a_header_length_beyond_the_file)
{
    st_tmpdir();
    const char *path = st_path("long.safetensors");
    unsigned char b[16] = {0};
    st_le(b, 1000, 8);
    memcpy(b + 8, "{}      ", 8);
    st_write_raw(path, b, 16);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, "header length 1000 is larger than the file (16 bytes)");
    st_le(b, UINT64_MAX, 8); /* no overflow in the size check */
    st_write_raw(path, b, 16);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, "header length 18446744073709551615 is larger than the file");
    st_write_raw(path, b, 5);
    CHECK_ERR(em_safetensors_open(path), EM_ERR_IO, "file is too short (5 bytes) for the 8-byte header length");
    CHECK_ERR(em_safetensors_open(st_path("absent.safetensors")), EM_ERR_IO, "cannot open");
    CHECK_ERR(em_safetensors_open(st_path("")), EM_ERR_IO, "not a regular file");
}

TEST(test_safetensors_dtypes_ember_lacks_fail_on_get_except_i64_that_fits)
{
    st_tmpdir();
    unsigned char d[26] = {0};
    st_le(d, 5, 8);
    st_le(d + 8, (uint64_t)-3, 8);
    st_le(d + 16, (uint64_t)1 << 40, 8);
    const char *path = st_path("i64.safetensors");
    st_write_file(path,
                  "{\"ok\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                  "\"big\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]},"
                  "\"u\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[24,26]}}",
                  d, sizeof d);
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    em_tensor *ok = em_safetensors_get(f, "ok");
    CHECK(em_dtype_of(ok) == EM_I32);
    CHECK_VALUES(ok, 0, 5, -3);
    em_free(ok);
    CHECK_ERR(em_safetensors_get(f, "big"), EM_ERR_DTYPE, "tensor 'big' is I64 and element 0 = 1099511627776 does not fit");
    CHECK_ERR(em_safetensors_get(f, "u"), EM_ERR_DTYPE, "tensor 'u' has dtype U16, which ember does not read");
    CHECK_ERR(em_safetensors_get(f, "nothing"), EM_ERR_ARG, "has no tensor named 'nothing'");
    CHECK_ERR(em_safetensors_name(f, 3), EM_ERR_INDEX, "index 3 out of range for 3 tensors");
    em_safetensors_close(f);
    CHECK(em_live_tensors() == 0);
}

/* ---- saving --------------------------------------------------------------------------- */

TEST(test_safetensors_save_into_a_missing_directory_fails_cleanly)
{
    st_tmpdir();
    em_tensor *t = em_ones(EM_F32, EM_SHAPE(3));
    const char *path = st_path("no/such/dir/x.safetensors");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", t}, NULL), EM_ERR_IO, "cannot create");
    CHECK(strstr(em_last_error(), "x.safetensors.tmp") && strstr(em_last_error(), "No such file or directory"));
    CHECK(access(st_path("no"), F_OK) != 0);
    em_free(t);
}

TEST(test_safetensors_failed_save_leaves_the_old_file_intact)
{
    st_tmpdir();
    em_tensor *old = st_tensor(EM_F32, EM_SHAPE(2), (double[]){1, 2}), *nw = em_zeros(EM_F32, EM_SHAPE(5));
    const char *path = st_path("model.safetensors");
    CHECK_OK(em_safetensors_save(path, 1, &(em_named){"w", old}, NULL));
    CHECK(access(st_path("model.safetensors.tmp"), F_OK) != 0); /* renamed away */
    CHECK(mkdir(st_path("model.safetensors.tmp"), 0755) == 0);    /* the next save cannot create it */
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", nw}, NULL), EM_ERR_IO, "model.safetensors.tmp");
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    em_tensor *w = em_safetensors_get(f, "w");
    CHECK_VALUES(w, 0, 1, 2);
    em_free(w);
    em_safetensors_close(f);
    rmdir(st_path("model.safetensors.tmp"));
    CHECK_OK(em_safetensors_save(path, 1, &(em_named){"w", nw}, NULL)); /* and a good save replaces it */
    f = em_safetensors_open(path);
    w = em_safetensors_get(f, "w");
    CHECK(em_numel(w) == 5);
    em_free(w);
    em_safetensors_close(f);
    em_free(old);
    em_free(nw);
}

TEST(test_safetensors_save_rejects_bad_names_before_writing)
{
    st_tmpdir();
    em_tensor *t = em_ones(EM_F32, EM_SHAPE(1));
    const char *path = st_path("x.safetensors");
    CHECK_ERR(em_safetensors_save(path, 2, (em_named[]){{"w", t}, {"w", t}}, NULL), EM_ERR_ARG,
              "two tensors are named 'w'");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"__metadata__", t}, NULL), EM_ERR_ARG, "reserved");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"", t}, NULL), EM_ERR_ARG, "tensor 0 has an empty name");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"\xff", t}, NULL), EM_ERR_ARG, "not valid UTF-8");
    CHECK_ERR(em_safetensors_save(path, 1, &(em_named){"w", NULL}, NULL), EM_ERR_ARG, "input tensor is NULL");
    CHECK_ERR(em_safetensors_save(NULL, 0, NULL, NULL), EM_ERR_ARG, "path is NULL");
    CHECK(access(path, F_OK) != 0 && access(st_path("x.safetensors.tmp"), F_OK) != 0);
    /* names that need escaping are written escaped and read back */
    CHECK_OK(em_safetensors_save(path, 1, &(em_named){"a\"b\\c\nd", t}, NULL));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(!strcmp(em_safetensors_name(f, 0), "a\"b\\c\nd"));
    em_safetensors_close(f);
    em_free(t);
}

/* ---- module state dicts ---------------------------------------------------------------- */

/* root { a { lin { weight (3,2), bias (3) } }, emb { weight (5,2) }, scale (buffer) },
 * values from seed. */
static em_module *tree(uint64_t seed)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *a = em_module_new(root, "a"), *lin = em_module_new(a, "lin"), *emb = em_module_new(root, "emb");
    em_rng r = em_rng_new(seed);
    em_module_add_param(lin, "weight", em_randn(EM_F32, EM_SHAPE(3, 2), &r));
    em_module_add_param(lin, "bias", em_randn(EM_F32, EM_SHAPE(3), &r));
    em_module_add_param(emb, "weight", em_randn(EM_F32, EM_SHAPE(5, 2), &r));
    em_module_add_buffer(root, "scale", em_full(EM_F32, EM_SHAPE(1), (double)seed));
    return root;
}

static const char *tree_names[] = {"a.lin.weight", "a.lin.bias", "emb.weight", "scale"};

/* max |x - y| over every tensor of two trees of the same structure */
static double tree_diff(em_module *x, em_module *y)
{
    double m = 0;
    for (int i = 0; i < 4; i++) {
        double d = th_max_abs_diff(em_module_find(x, tree_names[i]), em_module_find(y, tree_names[i]));
        if (d > m) m = d;
    }
    return m;
}

TEST(test_module_save_load_round_trips_params_and_buffers)
{
    st_tmpdir();
    em_module *src = tree(1), *dst = tree(2);
    CHECK(tree_diff(src, dst) > 0);
    const char *path = st_path("m.safetensors");
    CHECK_OK(em_module_save(src, path));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    CHECK(em_safetensors_count(f) == 4);
    for (int i = 0; i < 4; i++) CHECK(!strcmp(em_safetensors_name(f, i), tree_names[i]));
    CHECK(!strcmp(em_safetensors_metadata(f, "format"), "pt"));
    em_safetensors_close(f);
    CHECK_OK(em_module_flatten(dst)); /* loads into flat-buffer views too */
    CHECK_OK(em_module_load(dst, path, true));
    CHECK(tree_diff(src, dst) == 0);
    CHECK_ERR(em_module_save(NULL, path), EM_ERR_ARG, "em_module_save: module is NULL");
    em_module_free(src);
    em_module_free(dst);
    CHECK(em_live_tensors() == 0);
}

TEST(test_module_load_strict_names_missing_and_unexpected_tensors)
{
    st_tmpdir();
    em_module *m = tree(1);
    em_tensor *w = em_ones(EM_F32, EM_SHAPE(3, 2)), *x = em_ones(EM_F32, EM_SHAPE(1));
    const char *path = st_path("part.safetensors");
    CHECK_OK(em_safetensors_save(path, 2, (em_named[]){{"a.lin.weight", w}, {"extra", x}}, NULL));
    CHECK_ERR(em_module_load(m, path, true), EM_ERR_ARG,
              "3 missing tensor(s): 'a.lin.bias', 'emb.weight', 'scale'; 1 unexpected: 'extra'");
    CHECK(em_get(em_module_find(m, "a.lin.weight"), (int64_t[]){0, 0}) != 1.0); /* untouched */
    /* not strict: the tensors both have are loaded, the rest kept */
    double bias = em_get(em_module_find(m, "a.lin.bias"), (int64_t[]){0});
    CHECK_OK(em_module_load(m, path, false));
    CHECK_VALUES(em_module_find(m, "a.lin.weight"), 0, 1, 1, 1, 1, 1, 1);
    CHECK(em_get(em_module_find(m, "a.lin.bias"), (int64_t[]){0}) == bias);
    em_free(w);
    em_free(x);
    em_module_free(m);
}

TEST(test_module_load_shape_mismatch_modifies_nothing)
{
    st_tmpdir();
    em_module *m = tree(1), *before = tree(1);
    em_tensor *w = em_ones(EM_F32, EM_SHAPE(3, 2)), *b = em_ones(EM_F32, EM_SHAPE(3)),
              *e = em_ones(EM_F32, EM_SHAPE(4, 2)), *s = em_ones(EM_F32, EM_SHAPE(1));
    const char *path = st_path("shape.safetensors");
    em_named v[4] = {{"a.lin.weight", w}, {"a.lin.bias", b}, {"emb.weight", e}, {"scale", s}};
    CHECK_OK(em_safetensors_save(path, 4, v, NULL));
    CHECK_ERR(em_module_load(m, path, true), EM_ERR_SHAPE, "'emb.weight' is (4,2) in the file but (5,2) in the module");
    CHECK(strstr(em_last_error(), path) != NULL);
    CHECK(tree_diff(m, before) == 0);
    em_free(w);
    em_free(b);
    em_free(e);
    em_free(s);
    em_module_free(m);
    em_module_free(before);
    CHECK(em_live_tensors() == 0);
}

/* The last tensor fails only when its data is read (I64 out of i32 range):
 * the earlier ones must not have been written. */
TEST(test_module_load_read_failure_modifies_nothing)
{
    st_tmpdir();
    em_module *m = em_module_new(NULL, NULL);
    em_module_add_param(m, "w", em_zeros(EM_F32, EM_SHAPE(2)));
    em_module_add_buffer(m, "n", em_zeros(EM_I32, EM_SHAPE(1)));
    unsigned char d[16];
    float one = 1;
    uint32_t u;
    memcpy(&u, &one, 4);
    st_le(d, u, 4);
    st_le(d + 4, u, 4);
    st_le(d + 8, (uint64_t)1 << 35, 8);
    const char *path = st_path("i64.safetensors");
    st_write_file(path,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"n\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
                  d, sizeof d);
    CHECK_ERR(em_module_load(m, path, true), EM_ERR_DTYPE, "tensor 'n' is I64");
    CHECK_VALUES(em_module_find(m, "w"), 0, 0, 0);
    st_le(d + 8, 42, 8); /* fits: loads, converted to the module's i32 */
    st_write_file(path,
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"n\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
                  d, sizeof d);
    CHECK_OK(em_module_load(m, path, true));
    CHECK_VALUES(em_module_find(m, "w"), 0, 1, 1);
    CHECK_VALUES(em_module_find(m, "n"), 0, 42);
    em_module_free(m);
}

TEST(test_module_load_converts_dtypes)
{
    st_tmpdir();
    em_module *m = tree(1);
    em_tensor *w = st_tensor(EM_F64, EM_SHAPE(3, 2), (double[]){1, 2, 3, 4, 5, 6.5});
    em_tensor *b = st_tensor(EM_BF16, EM_SHAPE(3), (double[]){0.5, -1, 2});
    const char *path = st_path("dt.safetensors");
    CHECK_OK(em_safetensors_save(path, 2, (em_named[]){{"a.lin.weight", w}, {"a.lin.bias", b}}, NULL));
    CHECK_OK(em_module_load(m, path, false));
    CHECK(em_dtype_of(em_module_find(m, "a.lin.weight")) == EM_F32);
    CHECK_VALUES(em_module_find(m, "a.lin.weight"), 0, 1, 2, 3, 4, 5, 6.5);
    CHECK_VALUES(em_module_find(m, "a.lin.bias"), 0, 0.5, -1, 2);
    CHECK_ERR(em_module_load(m, st_path("none.safetensors"), false), EM_ERR_IO, "cannot open");
    CHECK_ERR(em_module_load(NULL, path, false), EM_ERR_ARG, "module is NULL");
    em_free(w);
    em_free(b);
    em_module_free(m);
}
