/* test_examples.c — the programs in examples/ run as a user runs them: the
 * built binaries (EMBER_BUILD_DIR/examples/...) are started with a few short
 * runs, and their exit status and printed numbers are checked: the loss goes
 * down, the accuracy ends above chance, and a bad flag exits 2 naming it;
 * ddp_from_scratch's printed losses are compared with the library's DDP run
 * on the same job and between its two parts. A binary that was not built
 * is a skip, not a failure. */
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

#define GPT_BIN EMBER_BUILD_DIR "/examples/gpt"
#define CLASSIFIER_BIN EMBER_BUILD_DIR "/examples/classifier"

/* Runs `bin` with the NULL-terminated arguments; skips the test if the
 * binary is missing. */
static th_run_result *run_example(const char *bin, ...)
{
    if (access(bin, X_OK) != 0) SKIP("example binary not built (ninja -C <build> builds examples/)");
    va_list ap;
    va_start(ap, bin);
    th_run_result *r = th_vrun(bin, ap);
    va_end(ap);
    return r;
}

/* The numbers after `key` on every line that has it, in order; returns how
 * many (at most max). */
static int numbers_after(const char *text, const char *key, double *out, int max)
{
    int n = 0;
    for (const char *p = strstr(text, key); p && n < max; p = strstr(p, key)) {
        p += strlen(key);
        char *end;
        double v = strtod(p, &end);
        if (end != p) out[n++] = v;
    }
    return n;
}

/* ---- gpt ---------------------------------------------------------------------- */

TEST(test_example_gpt_trains_and_loss_goes_down)
{
    th_run_result *r = run_example(GPT_BIN, "--steps", "40", "--every", "10", "--sample", "20", NULL);
    CHECK_EXIT(r, 0);
    double loss[16];
    int n = numbers_after(r->out, "| loss ", loss, 16);
    if (n != 5)
        th_fail(__FILE__, __LINE__, "want 5 loss lines (steps 0,10,20,30,39), got %d:\n%s", n, r->out);
    /* step 0 starts near log(vocab) (35 characters: 3.56); 40 steps take it well below */
    CHECK(loss[0] > 3.0 && loss[0] < 4.0);
    if (!(loss[n - 1] < loss[0] - 0.5))
        th_fail(__FILE__, __LINE__, "loss %.4f -> %.4f did not go down:\n%s", loss[0], loss[n - 1], r->out);
}

TEST(test_example_gpt_prints_a_sample_of_the_asked_length)
{
    th_run_result *r = run_example(GPT_BIN, "--steps", "2", "--sample", "20", "--prompt", "An", NULL);
    CHECK_EXIT(r, 0);
    const char *s = strstr(r->out, "sample (temperature 0.8):\n");
    CHECK(s != NULL);
    s = strchr(s, '\n') + 1;
    CHECK(!strncmp(s, "An", 2));
    CHECK(strlen(s) == 2 + 20 + 1); /* the prompt, 20 new characters, the newline */
}

TEST(test_example_gpt_trains_on_a_data_file)
{
    char path[PATH_MAX];
    FILE *f = fdopen(th_tmpfile(path, sizeof path, "ember_gpt_data"), "w");
    for (int i = 0; i < 40; i++) fprintf(f, "the cat sat on the mat. the dog sat on the log.\n");
    fclose(f);
    th_run_result *r =
        run_example(GPT_BIN, "--data", path, "--steps", "30", "--every", "29", "--sample", "0", NULL);
    unlink(path);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "1920 characters, vocabulary of 15") != NULL);
    double loss[4];
    CHECK(numbers_after(r->out, "| loss ", loss, 4) == 2);
    CHECK(loss[1] < loss[0] - 0.5);
}

TEST(test_example_gpt_rejects_unknown_flag_naming_it)
{
    th_run_result *r = run_example(GPT_BIN, "--bogus", "3", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--bogus") != NULL);
    CHECK(strstr(r->err, "usage:") != NULL);
}

TEST(test_example_gpt_rejects_bad_steps_value)
{
    th_run_result *r = run_example(GPT_BIN, "--steps", "zero", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--steps must be an integer >= 1, got 'zero'") != NULL);
}

TEST(test_example_gpt_missing_data_file_fails_naming_it)
{
    th_run_result *r = run_example(GPT_BIN, "--data", "/nonexistent/ember.txt", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "/nonexistent/ember.txt") != NULL);
}

/* ---- classifier ------------------------------------------------------------------ */

/* Runs the classifier for 2 epochs and checks the loss falls and the last test
 * accuracy is far above chance (3 classes: 33%). */
static void check_classifier_learns(const char *model)
{
    th_run_result *r = run_example(CLASSIFIER_BIN, "--model", model, "--epochs", "2", NULL);
    CHECK_EXIT(r, 0);
    double loss[8], acc[8];
    int nl = numbers_after(r->out, "train loss ", loss, 8),
        na = numbers_after(r->out, "test accuracy ", acc, 8);
    if (nl != 2 || na != 3) th_fail(__FILE__, __LINE__, "want 2 losses and 3 accuracies:\n%s", r->out);
    if (!(loss[1] < loss[0])) th_fail(__FILE__, __LINE__, "loss did not go down:\n%s", r->out);
    if (!(acc[2] > 70))
        th_fail(__FILE__, __LINE__, "final accuracy %.1f%% not above chance:\n%s", acc[2], r->out);
}

TEST(test_example_classifier_mlp_learns_the_bars) { check_classifier_learns("mlp"); }

TEST(test_example_classifier_cnn_learns_the_bars) { check_classifier_learns("cnn"); }

TEST(test_example_classifier_rejects_unknown_model)
{
    th_run_result *r = run_example(CLASSIFIER_BIN, "--model", "rnn", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--model must be mlp or cnn, got 'rnn'") != NULL);
}

TEST(test_example_classifier_rejects_unknown_flag_naming_it)
{
    th_run_result *r = run_example(CLASSIFIER_BIN, "--layers", "3", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--layers") != NULL);
}

TEST(test_example_classifier_missing_mnist_says_which_file)
{
    th_run_result *r = run_example(CLASSIFIER_BIN, "--mnist", "/nonexistent/mnist", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "/nonexistent/mnist/train-images-idx3-ubyte") != NULL);
    CHECK(strstr(r->err, "t10k-labels-idx1-ubyte") != NULL); /* the hint lists all four */
}

/* An IDX file: magic, big-endian dims, then the u8 data. */
static void write_idx(const char *dir, const char *name, uint32_t magic, int ndim, const uint32_t *dims,
                      const uint8_t *data, size_t n)
{
    char path[PATH_MAX];
    th_pathf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write %s", path);
    uint32_t words[4] = {magic, dims[0], ndim > 1 ? dims[1] : 0, ndim > 2 ? dims[2] : 0};
    for (int i = 0; i < 1 + ndim; i++) {
        uint8_t be[4] = {(uint8_t)(words[i] >> 24), (uint8_t)(words[i] >> 16), (uint8_t)(words[i] >> 8),
                         (uint8_t)words[i]};
        fwrite(be, 1, 4, f);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

TEST(test_example_classifier_reads_mnist_files)
{
    /* a tiny stand-in for MNIST: 40 training and 10 test 8x8 images, labels
     * 0..9 (uncompressed names: the example also takes files without .gz) */
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember_mnist");
    uint8_t images[40 * 64], labels[40];
    for (int i = 0; i < 40; i++) {
        labels[i] = (uint8_t)(i % 10);
        for (int p = 0; p < 64; p++)
            images[i * 64 + p] = (uint8_t)(p == labels[i] * 6 ? 255 : (p * 7 + i) % 50);
    }
    write_idx(dir, "train-images-idx3-ubyte", 0x803, 3, (uint32_t[]){40, 8, 8}, images, sizeof images);
    write_idx(dir, "train-labels-idx1-ubyte", 0x801, 1, (uint32_t[]){40}, labels, 40);
    write_idx(dir, "t10k-images-idx3-ubyte", 0x803, 3, (uint32_t[]){10, 8, 8}, images, 10 * 64);
    write_idx(dir, "t10k-labels-idx1-ubyte", 0x801, 1, (uint32_t[]){10}, labels, 10);
    th_run_result *r = run_example(CLASSIFIER_BIN, "--mnist", dir, "--model", "cnn", "--epochs", "1", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "40 training and 10 test images of 8x8, 10 classes") != NULL);
    double acc[4];
    CHECK(numbers_after(r->out, "test accuracy ", acc, 4) == 2);
}

/* ---- accelerate ------------------------------------------------------------------ */

#define ACCELERATE_BIN EMBER_BUILD_DIR "/examples/accelerate"
#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* `ember launch -n 2 accelerate --out dir` plus the NULL-terminated extra
 * arguments (at most 3). */
static th_run_result *run_accelerate2(const char *dir, const char *a1, const char *a2)
{
    if (access(ACCELERATE_BIN, X_OK) != 0 || access(EMBER_BIN, X_OK) != 0)
        SKIP("example binary not built (ninja -C <build> builds examples/)");
    return th_run(EMBER_BIN, "launch", "-n", "2", "--master-port", "0", ACCELERATE_BIN, "--out", dir, a1, a2,
                  NULL);
}

/* Two processes, 6 epochs straight; and 2 epochs, stopped, then --resume:
 * every epoch's evaluation counts the 250 points exactly once (the last
 * batch is padded on one rank), only the last two checkpoints remain, the
 * model is written as shards with an index, and the resumed run ends with
 * bitwise the weights and metrics of the straight one (dropout generators
 * restored without being registered). */
TEST(test_example_accelerate_on_two_processes_counts_every_point_and_resumes_bitwise)
{
    char a[PATH_MAX], b[PATH_MAX];
    th_tmpdir(a, sizeof a, "ember-accelerate");
    th_tmpdir(b, sizeof b, "ember-accelerate");
    char out_a[PATH_MAX], out_b[PATH_MAX];
    th_pathf(out_a, sizeof out_a, "%s/out", a);
    th_pathf(out_b, sizeof out_b, "%s/out", b);

    th_run_result *r = run_accelerate2(out_a, NULL, NULL);
    CHECK_EXIT(r, 0);
    double mse[8], count[8];
    int nm = numbers_after(r->out, "eval mse ", mse, 8), nc = numbers_after(r->out, " over ", count, 8);
    if (nm != 6 || nc != 6) th_fail(__FILE__, __LINE__, "want 6 evaluations:\n%s", r->out);
    for (int i = 0; i < 6; i++) CHECK(count[i] == 250);
    if (!(mse[5] < 0.01 && mse[5] < mse[0] / 10))
        th_fail(__FILE__, __LINE__, "eval mse %.4f -> %.4f did not fall tenfold below 0.01:\n%s", mse[0],
                mse[5], r->out);
    struct stat st;
    CHECK(stat(th_path(out_a, "checkpoints/checkpoint_4/manifest.json"), &st) == 0);
    CHECK(stat(th_path(out_a, "checkpoints/checkpoint_5/manifest.json"), &st) == 0);
    CHECK(stat(th_path(out_a, "checkpoints/checkpoint_3"), &st) != 0);
    CHECK(stat(th_path(out_a, "model/model.safetensors.index.json"), &st) == 0);

    r = run_accelerate2(out_b, "--stop-after", "2");
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "stopping after epoch 1") != NULL);
    CHECK(stat(th_path(out_b, "model"), &st) != 0);
    r = run_accelerate2(out_b, "--resume", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "resumed from") != NULL && strstr(r->out, "checkpoint_1 at step 32") != NULL);

    const char *same[] = {"model/model-00001-of-00003.safetensors", "model/model-00002-of-00003.safetensors",
                          "model/model-00003-of-00003.safetensors", "model/model.safetensors.index.json",
                          "runs/fit/metrics.jsonl"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char pa[PATH_MAX], pb[PATH_MAX];
        th_pathf(pa, sizeof pa, "%s/%s", out_a, same[i]);
        th_pathf(pb, sizeof pb, "%s/%s", out_b, same[i]);
        size_t na, nb;
        char *da = th_read_file(pa, &na), *db = th_read_file(pb, &nb);
        if (!da || !db || na != nb || memcmp(da, db, na))
            th_fail(__FILE__, __LINE__, "%s differs between the straight and the resumed run", same[i]);
        free(da);
        free(db);
    }
}

TEST(test_example_accelerate_rejects_unknown_flag_naming_it)
{
    th_run_result *r = run_example(ACCELERATE_BIN, "--lr", "3", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "'--lr'") != NULL);
}

/* ---- ddp_from_scratch ------------------------------------------------------------ */

#define DDP_SCRATCH_BIN EMBER_BUILD_DIR "/examples/ddp_from_scratch"
enum { SCRATCH_STEPS = 20 };

/* The SCRATCH_STEPS losses rank 0 prints for `ember launch -n world
 * ddp_from_scratch part` (world 1: the binary alone). Each is an f32 printed
 * with %.9g, so the float read back is the very value the run computed.
 * Every launch in this file puts its store on a free port (--master-port 0):
 * tests running at once must not meet on the default one. */
static void scratch_losses(const char *part, int world, float *out)
{
    if (access(DDP_SCRATCH_BIN, X_OK) != 0 || access(EMBER_BIN, X_OK) != 0)
        SKIP("example binary not built (ninja -C <build> builds examples/)");
    char n[8];
    snprintf(n, sizeof n, "%d", world);
    th_run_result *r =
        world == 1 ? th_run(DDP_SCRATCH_BIN, part, NULL)
                   : th_run(EMBER_BIN, "launch", "-n", n, "--master-port", "0", DDP_SCRATCH_BIN, part, NULL);
    CHECK_EXIT(r, 0);
    double loss[SCRATCH_STEPS + 1];
    int got = numbers_after(r->out, "| loss ", loss, SCRATCH_STEPS + 1);
    if (got != SCRATCH_STEPS)
        th_fail(__FILE__, __LINE__, "%s on %d: want %d losses, got %d:\n%s", part, world, SCRATCH_STEPS, got,
                r->out);
    for (int i = 0; i < SCRATCH_STEPS; i++) out[i] = (float)loss[i];
}

/* Fails unless a[i] and b[i] agree for every step: bitwise when rel is 0,
 * else within rel relative. The one place every comparison goes through. */
static void check_same_losses(const char *what, const float *a, const float *b, int n, double rel)
{
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
        if (rel == 0 ? a[i] != b[i] : !(d <= rel * m))
            th_fail(__FILE__, __LINE__,
                    "%s: step %d: loss %.9g vs %.9g (relative difference %.3g, allowed %g)", what, i,
                    (double)a[i], (double)b[i], m > 0 ? d / m : d, rel);
    }
}

/* ddp_from_scratch's training through the library instead of by hand: the
 * same data, model, per-rank initial weights, batch split and AdamW, with
 * the Accelerator (cfg) doing the broadcast, the gradient averaging and the
 * step. Must stay the example's set-up line for line (its setup and
 * local_loss); any drift shows as a failed comparison. */
typedef struct scratch_ref {
    em_accel_config cfg;
    float *losses; /* shared with the parent: SCRATCH_STEPS of them */
} scratch_ref;

static void scratch_reference_rank(int rank, int world, void *ctx)
{
    enum { IN = 8, HIDDEN = 32, CLASSES = 3, N_DATA = 480, BATCH = 24 };
    scratch_ref *ref = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(&ref->cfg);
    CHECK_NOTNULL(acc);
    em_rng data_rng = em_rng_new(42);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(N_DATA, IN), &data_rng);
    em_tensor *teacher = em_randn(EM_F32, EM_SHAPE(IN, CLASSES), &data_rng);
    em_scope s = em_scope_begin();
    em_tensor *y = em_keep(em_argmax(em_matmul(x, teacher), 1, false));
    em_scope_end(s);
    em_rng init_rng = em_rng_new(1000 + (uint64_t)rank);
    em_module *model = em_module_new(NULL, "");
    em_nn_linear *fc1 = em_nn_linear_new(model, "fc1", IN, HIDDEN, true, &init_rng);
    em_nn_linear *fc2 = em_nn_linear_new(model, "fc2", HIDDEN, CLASSES, true, &init_rng);
    CHECK(y && fc2);
    em_named named[4];
    em_tensor *params[4];
    int n = em_module_params(model, named, 4);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-2;
    em_optimizer *opt = em_adamw_new(n, params, &ac);
    CHECK_OK(em_accel_prepare(acc, model, opt, NULL, NULL));
    CHECK(em_accel_zero_stage(acc) ==
          (ref->cfg.zero_stage > 0 ? ref->cfg.zero_stage : 0)); /* the asked run */
    int64_t per_rank = BATCH / world;
    for (int step = 0; step < SCRATCH_STEPS; step++) {
        s = em_scope_begin();
        int64_t first = (int64_t)step * BATCH % N_DATA + rank * per_rank;
        em_tensor *h = em_relu(em_nn_linear_forward(fc1, em_narrow(x, 0, first, per_rank)));
        em_tensor *loss =
            em_cross_entropy(em_nn_linear_forward(fc2, h), em_narrow(y, 0, first, per_rank), EM_IGNORE_INDEX);
        CHECK_NOTNULL(loss);
        CHECK_OK(em_accel_backward(acc, loss));
        CHECK_OK(em_accel_step(acc));
        CHECK_OK(em_accel_zero_grad(acc));
        em_tensor *mean = em_accel_reduce(acc, em_scalar(EM_F32, em_item(loss)), EM_RED_AVG);
        CHECK_NOTNULL(mean);
        if (rank == 0) ref->losses[step] = (float)em_item(mean);
        em_scope_end(s);
    }
    em_accelerator_free(acc);
    em_optim_free(opt);
    em_module_free(model);
    em_free(x);
    em_free(y);
}

/* The losses rank 0 of the library's run prints, on `world` forked ranks
 * with the Accelerator configured by cfg (zero_stage picks DDP or ZeRO). */
static void library_losses(int world, const em_accel_config *cfg, float *out)
{
    scratch_ref *ref = mmap(NULL, sizeof *ref + sizeof(float) * SCRATCH_STEPS, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(ref != MAP_FAILED);
    *ref = (scratch_ref){.cfg = *cfg, .losses = (float *)(ref + 1)};
    TH_RANKS_ENV(world, scratch_reference_rank, ref);
    memcpy(out, ref->losses, sizeof(float) * SCRATCH_STEPS);
    munmap(ref, sizeof *ref + sizeof(float) * SCRATCH_STEPS);
}

/* Part 1 against em_ddp (through the Accelerator) on 2 processes: bitwise.
 * Every gradient element is the same a+b then /2 whichever way the sum is
 * cut into messages (two addends commute exactly), and the forward, the
 * backward and AdamW are the same calls on the same numbers. */
TEST(test_example_ddp_from_scratch_ddp_matches_the_library_ddp_bitwise_on_two_processes)
{
    float ex[SCRATCH_STEPS], lib[SCRATCH_STEPS];
    scratch_losses("ddp", 2, ex);
    library_losses(2, &(em_accel_config){0}, lib);
    check_same_losses("by-hand DDP vs the Accelerator's DDP", ex, lib, SCRATCH_STEPS, 0);
    /* and it learns: the last loss well below the first */
    CHECK(ex[SCRATCH_STEPS - 1] < 0.8f * ex[0]);
}

/* Part 2 against part 1 on 2 processes: bitwise. AdamW is elementwise, so a
 * chunk's update is the same arithmetic as the whole model's, and the
 * reduce-scatter's average of two addends is the all-reduce's. */
TEST(test_example_ddp_from_scratch_zero1_matches_its_ddp_bitwise_on_two_processes)
{
    float ddp[SCRATCH_STEPS], zero1[SCRATCH_STEPS];
    scratch_losses("ddp", 2, ddp);
    scratch_losses("zero1", 2, zero1);
    check_same_losses("by-hand ZeRO-1 vs by-hand DDP", zero1, ddp, SCRATCH_STEPS, 0);
}

/* Part 2 against the library's ZeRO-1 (the Accelerator with zero_stage 1)
 * on 2 processes: bitwise. The library cuts each DDP bucket rather than the
 * whole buffer, and all-reduces where the example reduce-scatters, but
 * every element still takes the same average and the same AdamW step. */
TEST(test_example_ddp_from_scratch_zero1_matches_the_library_zero1_bitwise_on_two_processes)
{
    float ex[SCRATCH_STEPS], lib[SCRATCH_STEPS];
    scratch_losses("zero1", 2, ex);
    library_losses(2, &(em_accel_config){.zero_stage = 1}, lib);
    check_same_losses("by-hand ZeRO-1 vs the Accelerator's ZeRO-1", ex, lib, SCRATCH_STEPS, 0);
}

/* On 3 processes the flat buffer (400 elements) does not split evenly: the
 * last chunk carries 2 elements of padding. ZeRO-1 still follows DDP, within
 * 1e-6: with three addends the sum's order matters, and the library promises
 * no common order to the all-reduce and the reduce-scatter (today both sum
 * messages this small in rank order, and the losses come out bitwise). */
TEST(test_example_ddp_from_scratch_zero1_pads_the_last_chunk_and_follows_ddp_on_three_processes)
{
    float ddp[SCRATCH_STEPS], zero1[SCRATCH_STEPS];
    scratch_losses("ddp", 3, ddp);
    scratch_losses("zero1", 3, zero1);
    check_same_losses("by-hand ZeRO-1 vs by-hand DDP, 3 processes", zero1, ddp, SCRATCH_STEPS, 1e-6);
}

/* Alone, both parts run as a group of one (every collective returns its
 * input), agree bitwise with each other, and follow the 2-process run within
 * rounding (a mean over 24 rows vs the average of two means over 12). */
TEST(test_example_ddp_from_scratch_runs_alone_and_follows_the_two_process_run)
{
    float one_ddp[SCRATCH_STEPS], one_zero1[SCRATCH_STEPS], two[SCRATCH_STEPS];
    scratch_losses("ddp", 1, one_ddp);
    scratch_losses("zero1", 1, one_zero1);
    scratch_losses("ddp", 2, two);
    check_same_losses("ZeRO-1 vs DDP, one process", one_zero1, one_ddp, SCRATCH_STEPS, 0);
    check_same_losses("one process vs two", one_ddp, two, SCRATCH_STEPS, 1e-5);
}

TEST(test_example_ddp_from_scratch_rejects_an_unknown_part)
{
    th_run_result *r = run_example(DDP_SCRATCH_BIN, "zero3", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "'zero3'") != NULL);
    CHECK(strstr(r->err, "usage: ddp_from_scratch ddp|zero1") != NULL);
}

TEST(test_example_ddp_from_scratch_refuses_a_world_that_does_not_split_the_batch)
{
    if (access(DDP_SCRATCH_BIN, X_OK) != 0 || access(EMBER_BIN, X_OK) != 0)
        SKIP("example binary not built (ninja -C <build> builds examples/)");
    th_run_result *r =
        th_run(EMBER_BIN, "launch", "-n", "5", "--master-port", "0", DDP_SCRATCH_BIN, "ddp", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "a batch of 24 rows does not split evenly over 5 ranks") != NULL);
}
