/* ember/data.h — datasets, token data, the batch loader and the random-window
 * sampler (torch.utils.data, shrunk).
 *
 * A dataset is a table of functions {len, get, free} over a user pointer.
 * get writes one example into plain C buffers (never tensors), so the
 * loader's background thread can call it; the loader stacks B examples into
 * x (B,...) and y (B,...) tensors made by the CALLING thread in its current
 * scope, so a batch dies with the step that used it.
 *
 * Built in:
 *   - text:   a text file as character-level tokens (vocabulary = the sorted
 *             distinct bytes of the file) or raw bytes (vocabulary 256),
 *             with a 90/10 train/validation split;
 *   - tokens: a flat file of little-endian uint16 tokens (format below);
 *   - IDX:    MNIST-style image/label files, read straight from .gz;
 *   - a sequence dataset (non-overlapping blocks of a token array) and a
 *     random-window sampler for language models.
 *
 * Errors follow tensor.h: NULL or a status, with the thread's last error
 * naming the function and the values.
 */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* ---- datasets --------------------------------------------------------------- */

/* The dtype and shape of one example's x or y (ndim 0 = a scalar, e.g. a
 * class label; at most EM_MAX_DIMS-1 dims, the loader adds the batch dim). */
typedef struct em_field {
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
} em_field;

/* A dataset: examples 0 .. len-1, each an (x, y) pair of fixed em_fields.
 *
 *   len(user)          number of examples (>= 0).
 *   get(user, i, x, y) writes example i (0 <= i < len) as contiguous row-major
 *                      elements of x_field / y_field into x and y (buffers of
 *                      em_field_bytes bytes each). It may run on the loader's
 *                      prefetch thread, so it must not make or touch tensors,
 *                      and must not depend on the calling thread. On failure
 *                      it returns a status and sets a message (em_set_error).
 *   free(user)         releases user (may be NULL: nothing to release).
 *
 * Users write their own datasets by filling this struct and passing it to
 * em_dataset_new; built-in constructors return one made the same way. */
typedef struct em_dataset {
    int64_t (*len)(void *user);
    em_status (*get)(void *user, int64_t i, void *x, void *y);
    void (*free)(void *user);
    void *user;
    em_field x_field, y_field;
    /* Variable-length examples (tokenised text): optional, NULL = every
     * example has the fields' full shapes.
     *   lengths(user, i, x_len, y_len)  example i's length along dim 0 of x
     *                      and of y. Both start at the field's shape[0] (0
     *                      for a 0-dim field, which has no length), so a
     *                      dataset writes only the ones that vary. A field's
     *                      shape[0] is then the largest length an example
     *                      may have (0 <= length <= shape[0], checked: an
     *                      error naming i and the values), and get still
     *                      receives buffers of em_field_bytes bytes but
     *                      writes only the first `length` rows; the rest is
     *                      unspecified. Same thread rules as get.
     * A loader over such a dataset needs a collate (em_loader_config), which
     * receives each example's lengths (em_collate_pad pads to the batch's
     * longest); em_dataset_get returns x and y at the example's lengths. */
    em_status (*lengths)(void *user, int64_t i, int64_t *x_len, int64_t *y_len);
} em_dataset;

/* Bytes of one example of f (numel * dtype size); 0 for an invalid field. */
size_t em_field_bytes(const em_field *f);

/* A heap copy of *def. Checks that len and get are set and both fields are
 * valid (dtype, 0 <= ndim < EM_MAX_DIMS, dims >= 0); EM_ERR_ARG naming the
 * problem otherwise (and def->free is NOT called). On success the dataset
 * owns def->user: em_dataset_free calls def->free(user). */
em_dataset *em_dataset_new(const em_dataset *def);
/* Calls ds->free(ds->user) (if set) and frees ds. NULL is a no-op. */
void em_dataset_free(em_dataset *ds);
/* Number of examples; -1 + error on NULL. */
int64_t em_dataset_len(const em_dataset *ds);
/* Example i as tensors x (x_field shape) and y (y_field shape) made in the
 * caller's current scope (persistent if none is open: caller em_frees).
 * With lengths set, dim 0 of each is the example's length (x_len, ...).
 * EM_ERR_INDEX when i is out of range; EM_ERR_ARG for a length outside [0,
 * shape[0]]; whatever get or lengths returns if it fails (no tensor is left
 * behind; *x and *y are set to NULL). */
em_status em_dataset_get(const em_dataset *ds, int64_t i, em_tensor **x, em_tensor **y);

/* ---- token arrays ------------------------------------------------------------
 * Token file format (".bin", as nanoGPT's prepare scripts write it): a flat
 * array of tokens, each an unsigned 16-bit integer stored little-endian (2
 * bytes, low byte first), no header, no padding. The file size must be even;
 * the token count is size / 2. Token values 0..65535. */

typedef enum em_token_type { EM_TOK_I32 = 0, EM_TOK_U16 } em_token_type;

/* n tokens of `type` at data. A view (owned == NULL) borrows its memory; an
 * array from em_tokens_load owns it (owned != NULL; release with
 * em_tokens_free). Views into an owned array live as long as it does. */
typedef struct em_tokens {
    const void *data;
    int64_t n;
    em_token_type type;
    void *owned;
} em_tokens;

/* A borrowed view of n tokens (i32 or u16) at data (kept, not copied). */
em_tokens em_tokens_view(const void *data, int64_t n, em_token_type type);
/* Token i as int64 (no bounds check: 0 <= i < t->n). */
int64_t em_tokens_at(const em_tokens *t, int64_t i);
/* Reads a token file (format above) into a new owned u16 array. EM_ERR_IO
 * if it cannot be opened or read; EM_ERR_ARG if its size is odd (naming the
 * path and size). *out is zeroed on failure. */
em_status em_tokens_load(const char *path, em_tokens *out);
/* Writes tokens in the token file format. EM_ERR_ARG if a token is outside
 * 0..65535 (naming its position and value; nothing is written), EM_ERR_IO if
 * the file cannot be written. */
em_status em_tokens_save(const char *path, const em_tokens *t);
/* Frees an owned array (a view: nothing) and zeroes *t. NULL is a no-op. */
void em_tokens_free(em_tokens *t);
/* A view of tokens [start, start+n) of t; EM_ERR_INDEX (and an empty view)
 * if the range does not fit in t. */
em_tokens em_tokens_slice(const em_tokens *t, int64_t start, int64_t n);
/* Tokens [start, start+n) as a 1-D (n) EM_I32 tensor in the caller's scope.
 * EM_ERR_INDEX if the range does not fit. */
em_tensor *em_tokens_tensor(const em_tokens *t, int64_t start, int64_t n);

/* A dataset over non-overlapping blocks of a token array: example i is x =
 * tokens[i*T .. i*T+T) and y = tokens[i*T+1 .. i*T+T+1) (y is x shifted by
 * one), both (T) EM_I32; len = (n - 1) / T. The dataset borrows tokens->data,
 * which must outlive it. EM_ERR_ARG if T < 1 or n < T + 1. */
em_dataset *em_sequence_dataset(const em_tokens *tokens, int64_t T);

/* ---- text: vocabulary and tokens -------------------------------------------- */

/* A byte-level vocabulary: token k stands for byte chars[k], k < size; index
 * maps a byte back to its token (-1: not in the vocabulary). `bytes` marks
 * the raw-byte vocabulary (size 256, token = byte value). A plain value: no
 * free needed. */
typedef struct em_vocab {
    int size;
    bool bytes;
    uint8_t chars[256];
    int16_t index[256];
} em_vocab;

/* The character vocabulary of n bytes of text: its distinct bytes, sorted by
 * value (as nanoGPT's shakespeare_char). */
em_vocab em_vocab_from_text(const char *text, size_t n);
/* The raw-byte vocabulary (256 tokens, token = byte value). */
em_vocab em_vocab_bytes(void);
/* Encodes n bytes of s into out (n tokens). EM_ERR_ARG naming the character
 * (printed and as hex) and its position when a byte is not in the
 * vocabulary; out is then partly written. */
em_status em_vocab_encode(const em_vocab *v, const char *s, size_t n, int32_t *out);
/* s (NUL-terminated) encoded as a 1-D (strlen(s)) EM_I32 tensor in the
 * caller's scope (e.g. a prompt). Errors as em_vocab_encode; nothing made. */
em_tensor *em_vocab_encode_tensor(const em_vocab *v, const char *s);
/* Decodes n tokens into out (n bytes + a NUL; out must hold n + 1).
 * EM_ERR_INDEX naming the position and value of a token outside [0, size). */
em_status em_vocab_decode(const em_vocab *v, const int32_t *tokens, size_t n, char *out);
/* The vocabulary as a printable ASCII string, for saving with a model:
 *   "bytes"            the raw-byte vocabulary;
 *   "chars:" + CHARS   a character vocabulary, CHARS its bytes in token order
 *                      with '\\' written "\\\\", newline "\\n", tab "\\t",
 *                      carriage return "\\r", and '"' and every other byte
 *                      outside 0x20..0x7e written "\\xHH" (two lowercase hex
 *                      digits); so the string holds no '"' and no control
 *                      byte and drops into JSON after escaping backslashes.
 * Returns a malloc'd NUL-terminated string the caller free()s; NULL + EM_ERR_OOM. */
char *em_vocab_to_string(const em_vocab *v);
/* Parses em_vocab_to_string's format into *v. EM_ERR_ARG naming the problem
 * (unknown prefix, bad escape, bytes not strictly increasing, empty). */
em_status em_vocab_from_string(const char *s, em_vocab *v);

typedef enum em_text_mode { EM_TEXT_CHARS = 0, EM_TEXT_BYTES } em_text_mode;

/* A text encoded to tokens: vocab (from the text for EM_TEXT_CHARS, the
 * 256 bytes for EM_TEXT_BYTES) and its tokens (one per byte, owned i32). */
typedef struct em_text {
    em_vocab vocab;
    em_tokens tokens;
} em_text;

/* Reads the whole file at path and encodes it. EM_ERR_IO if it cannot be
 * read, EM_ERR_ARG if it is empty; NULL then. Free with em_text_free. */
em_text *em_text_open(const char *path, em_text_mode mode);
/* The same from n bytes in memory (copied). */
em_text *em_text_from_memory(const char *data, size_t n, em_text_mode mode);
/* Frees text and its tokens; NULL is a no-op. Views and datasets made from
 * its tokens must not be used afterwards. */
void em_text_free(em_text *text);
/* Splits tokens into the first floor(train_frac * n) (train) and the rest
 * (validation), as nanoGPT's n = int(0.9 * len(data)); use train_frac 0.9.
 * train and val are views into tokens. EM_ERR_ARG unless 0 < train_frac < 1
 * and both parts are non-empty. */
em_status em_tokens_split(const em_tokens *tokens, double train_frac, em_tokens *train, em_tokens *val);

/* ---- IDX images (MNIST) -----------------------------------------------------
 * Reads an IDX image file (magic 0x00000803, u8 (N,H,W)) and an IDX label
 * file (magic 0x00000801, u8 (N)), gzip-compressed or not (zlib reads
 * both); all header integers are big-endian. Example i: x = image i as f32
 * (1,H,W) scaled to [0,1] (byte / 255), y = its label as a 0-dim EM_I32.
 * Everything is loaded into memory (u8) at open. Fails with EM_ERR_IO (cannot
 * open, read error, truncated file: header sizes larger than the data) or
 * EM_ERR_ARG (bad magic, zero-sized dims, image and label counts differ),
 * naming the file and the values. */
em_dataset *em_idx_dataset_open(const char *images_path, const char *labels_path);

/* ---- the loader -------------------------------------------------------------- */

typedef struct em_loader em_loader;

/* One batch: x (B,...) and y (B,...) stacked from the examples' fields, made
 * in the scope that was current when em_loader_next was called. B is
 * batch_size except for a ragged last batch (drop_last false). With a
 * collate, x, y and mask are what it made (em_collate_pad: x (B,L,...),
 * y, and mask (B,L) marking real positions); mask is NULL otherwise. */
typedef struct em_batch {
    em_tensor *x, *y;
    int64_t size;
    em_tensor *mask;
} em_batch;

/* One example as a collate sees it: get's buffers (x_field / y_field
 * layout, only the first x_len / y_len rows meaningful when the dataset has
 * lengths), its lengths along dim 0 (the fields' shape[0] without lengths; 0
 * for a 0-dim field) and its index in the dataset. Borrowed by the loader:
 * valid during the collate call only. */
typedef struct em_example {
    const void *x, *y;
    int64_t x_len, y_len;
    int64_t index;
} em_example;

/* A collate builds one batch from its n >= 1 examples (in batch order):
 * tensors in the caller's current scope into out->x (required), out->y and
 * out->mask (optional; out arrives zeroed and the loader sets out->size = n
 * afterwards). It runs on the thread that calls em_loader_next, never on
 * the prefetch thread (only that thread may make tensors); the prefetch
 * thread still runs get and lengths ahead. ds gives the fields. On failure
 * it returns a status with a message (em_set_error): em_loader_next then
 * fails with it, the position does not move, and the tensors left in *out
 * are freed when no scope is open (in a scope they die with it). */
typedef em_status (*em_collate_fn)(void *ctx, const em_dataset *ds, int64_t n, const em_example *ex,
                                   em_batch *out);

typedef struct em_loader_config {
    int64_t batch_size; /* examples per batch, >= 1 */
    bool shuffle;       /* a new permutation each epoch, from (seed, epoch) only */
    uint64_t seed;
    bool drop_last; /* drop a last batch smaller than batch_size */
    int prefetch;   /* batches a background thread prepares ahead; 0 = none */
    /* How a batch is built: NULL = stack the examples (B, field...); else
     * collate(collate_ctx, ...) builds it (required for a dataset with
     * lengths). collate_ctx is borrowed and must outlive the loader. */
    em_collate_fn collate;
    void *collate_ctx;
} em_loader_config;

/* ---- padding collate (data/collate.c) ------------------------------------------
 * em_collate_pad with ctx = a const em_pad_config * (NULL = em_pad_defaults())
 * pads variable-length examples (em_dataset.lengths) to the longest in the
 * batch: L = max over the batch of x_len (and of y_len with pad_y), rounded
 * up to a multiple of `multiple`, and makes
 *   x     (B, L, x_field.shape[1..]) x_field.dtype: example b's x_len rows,
 *         then x_pad;
 *   y     pad_y: (B, L, y_field.shape[1..]): its y_len rows, then y_pad
 *         (em_pad_defaults: -100, the loss's default ignore_index, so padded
 *         labels count for nothing); otherwise y stacked at
 *         its full field shape (B, y_field...), which needs every y_len equal
 *         to y_field.shape[0] (EM_ERR_SHAPE naming the example otherwise);
 *   mask  (B, L) mask_dtype: 1 at positions t < x_len, 0 after.
 * x_field needs ndim >= 1 (and y_field with pad_y): EM_ERR_SHAPE otherwise.
 * Pad values are converted to the dtype as em_full converts. Sharded, each
 * rank pads its own batch: L may differ between ranks (pad across processes
 * before gathering). */
typedef struct em_pad_config {
    double x_pad;        /* value of x's padding (e.g. the pad token id); default 0 */
    double y_pad;        /* value of y's padding with pad_y; default EM_IGNORE_INDEX (-100), but 0 in a
                          * zeroed struct: start from em_pad_defaults() */
    bool pad_y;          /* pad y along dim 0 to L too (labels aligned with x) */
    int64_t multiple;    /* round L up to a multiple of this; 0 or 1 = no rounding; >= 0 */
    em_dtype mask_dtype; /* default EM_F32 (1.0 / 0.0) */
} em_pad_config;

/* The defaults: y_pad EM_IGNORE_INDEX (-100, as transformers' label_pad_token_id),
 * everything else 0 / false, mask_dtype EM_F32. */
em_pad_config em_pad_defaults(void);
em_status em_collate_pad(void *ctx, const em_dataset *ds, int64_t n, const em_example *ex, em_batch *out);

/* Where a loader is: the next call of em_loader_next returns batch `batch` of
 * epoch `epoch` (or 0, ending the epoch, when batch equals the number of
 * batches). Saving this is saving the loader. */
typedef struct em_loader_pos {
    int64_t epoch, batch;
} em_loader_pos;

/* A loader over ds (borrowed: ds must outlive it), at epoch 0 batch 0.
 * A dataset with lengths needs cfg->collate (EM_ERR_ARG otherwise).
 * Epoch e visits the examples in order 0..n-1, or when shuffling in a
 * Fisher-Yates permutation drawn from Philox keyed by seed with counters
 * (e, i), so the order depends only on (seed, epoch). With prefetch > 0 a
 * thread fills a ring of `prefetch` batches ahead in plain buffers; the
 * batches are identical to those without it. EM_ERR_ARG on NULL, batch_size
 * < 1, prefetch < 0 or an invalid dataset; EM_ERR_OOM / EM_ERR_UNSUPPORTED
 * (thread) otherwise. Free with em_loader_free. */
em_loader *em_loader_new(em_dataset *ds, const em_loader_config *cfg);
/* Stops the prefetch thread (even mid-epoch; it is joined, nothing is left
 * running) and frees the loader and its buffers. NULL is a no-op. Batches
 * already returned belong to their scopes and are not touched. */
void em_loader_free(em_loader *l);
/* The next batch into *b, its tensors made in the caller's current scope
 * (persistent if none is open: the caller em_frees them). Returns, like
 * read(2):
 *    1  b holds a batch;
 *    0  the epoch has ended: b is zeroed and the last error cleared (EM_OK);
 *       the next call starts the next epoch;
 *   -1  failure, with the error set and b zeroed: the dataset's get or
 *       lengths or the collate failed (its message; the position does not
 *       move, so a call retries the same batch) or an argument is NULL (EM_ERR_ARG).
 * A loop reads
 *     int r;
 *     while ((r = em_loader_next(l, &b)) > 0) { ... }
 *     if (r < 0) ...the error... */
int em_loader_next(em_loader *l, em_batch *b);
/* Whether the batch em_loader_next last returned was the last of its epoch
 * (Accelerate's end_of_dataloader): so with even_batches its global batch
 * holds em_loader_padding duplicates. It stays true through the call that
 * returns 0, until the next batch; false before any batch and after
 * em_loader_seek / em_loader_set_shard (and for NULL). */
bool em_loader_last_was_final(const em_loader *l);
/* Batches per epoch: ceil(n / B), or floor(n / B) with drop_last; when
 * sharded, this rank's batches (see em_loader_set_shard). */
int64_t em_loader_num_batches(const em_loader *l);
/* The current position (see em_loader_pos); {-1,-1} + error on NULL. */
em_loader_pos em_loader_position(const em_loader *l);
/* Shards the loader over `world` ranks (a distributed sampler), from the
 * current epoch on: call it at the start of an epoch (position batch 0,
 * e.g. before the first batch; positions and seeks afterwards count this
 * rank's batches). Each epoch's order (the same on every rank: it depends
 * only on seed and epoch) is cut into global batches of G = batch_size *
 * world examples, or G = batch_size with split_batches (batch_size % world
 * == 0 then), and rank r gets chunk r of each global batch, so the ranks'
 * chunks concatenated in rank order are the global batch. A last global
 * batch shorter than G is, with even_batches, filled up to G by wrapping
 * around to the start of the epoch's order (the duplicates are at its end:
 * see em_loader_padding) — so every rank gets the same number of equal
 * batches; without it, ranks get what is left (possibly nothing); with
 * drop_last it is dropped. world 1 restores the plain loader (split_batches
 * and even_batches then change nothing). EM_ERR_ARG, naming the values and
 * changing nothing, on rank outside [0, world), an indivisible split, or a
 * position other than batch 0. */
em_status em_loader_set_shard(em_loader *l, int rank, int world, bool split_batches, bool even_batches);
/* How many examples of the current epoch's last global batch are even_batches
 * padding (0 when none): gathering that batch from every rank in rank order
 * and dropping this many rows at the end leaves each example once. The same
 * on every rank and in every epoch; -1 + error on NULL. */
int64_t em_loader_padding(const em_loader *l);
/* Examples in one global batch: batch_size x world once sharded, batch_size
 * with split_batches or unsharded (see em_loader_set_shard). The ranks'
 * batches at one position together hold this many (fewer at a ragged end),
 * so position {e, b} means b x this many examples of epoch e's order are
 * consumed. -1 + error on NULL. */
int64_t em_loader_global_batch(const em_loader *l);

/* Moves to pos, so the following batches are exactly those an uninterrupted
 * loader yields from pos. Restarts the prefetch thread there. EM_ERR_ARG if
 * pos.epoch < 0 or pos.batch is outside [0, num_batches]. */
em_status em_loader_seek(em_loader *l, em_loader_pos pos);

/* ---- random windows for language models --------------------------------------
 * Each call draws B window starts uniformly in [0, n - T - 1] and returns x
 * (B,T) = tokens[s .. s+T) and y (B,T) = tokens[s+1 .. s+T+1), both EM_I32,
 * in the caller's scope. Start b of a call uses Philox keyed by rng.seed at
 * counter rng.offset + b; rng.offset then advances by B, so the samples
 * depend only on (seed, offset) and saving rng is saving the sampler. */
typedef struct em_window_sampler {
    em_tokens tokens; /* borrowed; must outlive the sampler */
    int64_t batch, block;
    em_rng rng;
    int rank, world; /* sharding; init sets 0, 1 */
} em_window_sampler;

/* Sets up *s over tokens (i32 or u16) for B windows of T (+1) tokens with
 * rng {seed, 0}. EM_ERR_ARG if B < 1, T < 1, or tokens has fewer than T + 1
 * tokens (naming n and T). */
em_status em_window_sampler_init(em_window_sampler *s, const em_tokens *tokens, int64_t B, int64_t T,
                                 uint64_t seed);
/* The next B windows into *b (b->size = B). Errors as init (b zeroed).
 * Sharded (em_window_sampler_shard), rank r gets windows r*B/world ..
 * (r+1)*B/world - 1 of the global draw (b->size = B/world) and rng.offset
 * still advances by B: the ranks together draw exactly the windows one
 * unsharded sampler draws. EM_ERR_ARG if rank and world (set by hand)
 * are not a valid shard of batch. */
em_status em_window_sampler_next(em_window_sampler *s, em_batch *b);
/* Shards s over world ranks. EM_ERR_ARG if rank is outside [0, world) or
 * batch % world != 0 (naming both). */
em_status em_window_sampler_shard(em_window_sampler *s, int rank, int world);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
