/* test_checkpoint_cli.c — `ember train`'s files survive kill -9 and refuse
 * damage: a run killed at every write, fsync and rename of a save (the
 * EMBER_FAULT points, tensor/fault_impl.h) resumes from a whole checkpoint
 * (the previous or the new, never a mix) and ends with the uninterrupted
 * run's weights bitwise, on 1 and 2 processes; a flipped byte in the
 * weights, config or any checkpoint file is an error naming the file. */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* A tiny run: saves (evaluation) at steps 0, 2 and 4. */
#define TRAIN(txt, out)                                                                                      \
    "train", "--data", txt, "--out", out, "--layers", "1", "--heads", "2", "--embd", "16", "--block", "8",   \
        "--batch", "4", "--iters", "4", "--eval-every", "2", "--eval-iters", "1", "--cpu"

/* `ember train` (nproc 1) or `ember launch -n 2 ember train` into out,
 * resuming from resume when not NULL, with EMBER_FAULT=fault when not NULL. */
static th_run_result *train(int nproc, const char *txt, const char *out, const char *resume,
                            const char *fault)
{
    if (fault)
        setenv("EMBER_FAULT", fault, 1);
    else
        unsetenv("EMBER_FAULT");
    th_run_result *r;
    if (nproc == 1)
        r = resume ? th_run(EMBER_BIN, TRAIN(txt, out), "--resume", resume, NULL)
                   : th_run(EMBER_BIN, TRAIN(txt, out), NULL);
    else
        r = resume ? th_run(EMBER_BIN, "launch", "-n", "2", "--master-port", "0", EMBER_BIN, TRAIN(txt, out),
                            "--resume", resume, NULL)
                   : th_run(EMBER_BIN, "launch", "-n", "2", "--master-port", "0", EMBER_BIN, TRAIN(txt, out),
                            NULL);
    unsetenv("EMBER_FAULT");
    return r;
}

/* True when a/name and b/name hold the same bytes. */
static bool same_file(const char *a, const char *b, const char *name)
{
    size_t na = 0, nb = 0;
    char *x = th_read_file(th_path(a, name), &na), *y = th_read_file(th_path(b, name), &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* The point a killed run died at ("?" if it did not say). */
static const char *killed_at(const th_run_result *r, char *buf, size_t n)
{
    const char *p = strstr(r->err, "EMBER_FAULT: killed at ");
    snprintf(buf, n, "%s", p ? p + strlen("EMBER_FAULT: killed at ") : "?");
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

static int entries_like(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* The reference run (never stopped) and a run killed right after its step-2
 * checkpoint was published, which each kill below resumes from. */
static void reference_and_base(int nproc, const char *txt, const char *ref, const char *base)
{
    th_run_result *r = train(nproc, txt, ref, NULL, NULL);
    CHECK_EXIT(r, 0);
    r = train(nproc, txt, base, NULL, nproc == 1 ? "save.published:1" : "save.published:1:0");
    CHECK(r->status != 0 && strstr(r->err, "killed at save.published"));
    size_t n;
    char *m = th_read_file(th_path(base, "state/manifest.json"), &n);
    CHECK(m && strstr(m, "\"steps\": \"2\""));
    free(m);
}

/* The run killed in w is resumed there: it continues from step 2 (the
 * previous checkpoint) or 4 (the new one), and ends with ref's weights and
 * optimizer state, bitwise. */
static void check_recovers(int nproc, const char *txt, const char *ref, const char *w, const char *point)
{
    char state[PATH_MAX];
    th_pathf(state, sizeof state, "%s/state", w);
    th_run_result *r = train(nproc, txt, w, state, NULL);
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "killed at %s: the resumed run failed (%d): %s", point, r->status,
                r->err);
    const char *at = strstr(r->out, "resuming at step ");
    long long step = -1;
    CHECK(at && sscanf(at, "resuming at step %lld", &step) == 1);
    if (step != 2 && step != 4)
        th_fail(__FILE__, __LINE__, "killed at %s: resumed at step %lld", point, step);
    const char *files[] = {"model.safetensors", "state/model.safetensors", "state/optimizer.safetensors"};
    for (int i = 0; i < 3; i++)
        if (!same_file(ref, w, files[i]))
            th_fail(__FILE__, __LINE__,
                    "killed at %s, resumed at step %lld: %s differs from the uninterrupted run's", point,
                    step, files[i]);
    if (step == 2) /* it saved again: nothing of the killed save is left beside the checkpoint */
        CHECK(entries_like(w, "state.tmp-") == 0 && entries_like(w, "state.old-") == 0);
}

/* Kills a copy of the base run at its Nth fault point (fault_fmt with N),
 * for N = 1, 2, ... until a run gets through, and checks each recovers. */
static int kill_everywhere(int nproc, const char *dir, const char *txt, const char *ref, const char *base,
                           const char *fault_fmt, bool no_exchange)
{
    static int runs;
    int kills = 0;
    if (no_exchange) setenv("EMBER_NO_RENAME_EXCHANGE", "1", 1);
    for (int n = 1; n < 100; n++) {
        char w[PATH_MAX], fault[64], state[PATH_MAX], point[160];
        th_pathf(w, sizeof w, "%s/w%d", dir, ++runs);
        th_pathf(state, sizeof state, "%s/state", w);
        snprintf(fault, sizeof fault, fault_fmt, n);
        th_run_result *r = th_run("/bin/cp", "-a", base, w, NULL);
        CHECK_EXIT(r, 0);
        r = train(nproc, txt, w, state, fault);
        if (r->status == 0) { /* past the last point: an ordinary resumed run */
            CHECK(same_file(ref, w, "model.safetensors"));
            break;
        }
        if (!strstr(r->err, "EMBER_FAULT: killed at"))
            th_fail(__FILE__, __LINE__, "%s: the run failed without being killed (%d): %s", fault, r->status,
                    r->err);
        killed_at(r, point, sizeof point);
        snprintf(point + strlen(point), sizeof point - strlen(point), " (EMBER_FAULT=%s)", fault);
        unsetenv("EMBER_NO_RENAME_EXCHANGE"); /* the resumed run may be on any file system */
        check_recovers(nproc, txt, ref, w, point);
        if (no_exchange) setenv("EMBER_NO_RENAME_EXCHANGE", "1", 1);
        kills++;
        th_run("/bin/rm", "-rf", w, NULL);
    }
    unsetenv("EMBER_NO_RENAME_EXCHANGE");
    return kills;
}

/* One save of ember train is the weights (3 points: write, fsync, rename),
 * the config (3) and the state: model, optimizer, rank file, manifest (3
 * each) and the publishing rename (2): 20 points on rank 0, after the
 * run's own train.step (2) and train.save: 23 kills, then a run that lives. */
TEST(test_train_killed_at_any_point_of_a_save_resumes_to_the_uninterrupted_weights)
{
    char dir[PATH_MAX], txt[PATH_MAX], ref[PATH_MAX], base[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(ref, sizeof ref, "%s/ref", dir);
    th_pathf(base, sizeof base, "%s/base", dir);
    reference_and_base(1, txt, ref, base);
    int kills = kill_everywhere(1, dir, txt, ref, base, "*:%d", false);
    if (kills < 20) th_fail(__FILE__, __LINE__, "only %d fault points in a save", kills);
}

/* Without RENAME_EXCHANGE the publish is two renames, with DIR missing
 * between them ("save.old"): a resume then takes DIR.old-*. */
TEST(test_train_killed_at_any_point_of_a_save_without_rename_exchange_resumes_to_the_same_weights)
{
    char dir[PATH_MAX], txt[PATH_MAX], ref[PATH_MAX], base[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(ref, sizeof ref, "%s/ref", dir);
    th_pathf(base, sizeof base, "%s/base", dir);
    reference_and_base(1, txt, ref, base);
    int kills = kill_everywhere(1, dir, txt, ref, base, "save.old:%d", true);
    CHECK(kills == 1);
    kills = kill_everywhere(1, dir, txt, ref, base, "save.published:%d", true);
    CHECK(kills == 1);
}

/* Two processes: rank 1 killed at each of its points (its rank file's 3,
 * after train.step and train.save), rank 0 at each of its. */
TEST(test_launch_two_ranks_killed_at_any_point_of_a_save_resume_to_the_uninterrupted_weights)
{
    char dir[PATH_MAX], txt[PATH_MAX], ref[PATH_MAX], base[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(ref, sizeof ref, "%s/ref", dir);
    th_pathf(base, sizeof base, "%s/base", dir);
    reference_and_base(2, txt, ref, base);
    int kills = kill_everywhere(2, dir, txt, ref, base, "*:%d:1", false);
    if (kills < 3) th_fail(__FILE__, __LINE__, "only %d fault points on rank 1", kills);
    kills = kill_everywhere(2, dir, txt, ref, base, "*:%d:0", false);
    if (kills < 20) th_fail(__FILE__, __LINE__, "only %d fault points on rank 0", kills);
}

/* ---- damaged files ---------------------------------------------------------------- */

static void flip_byte(const char *path, size_t pos, unsigned char mask, unsigned char *old)
{
    size_t n;
    char *b = th_read_file(path, &n);
    CHECK(b && pos < n);
    *old = (unsigned char)b[pos];
    b[pos] = (char)(*old ^ mask);
    th_write_file(path, b, n);
    free(b);
}

static void put_byte(const char *path, size_t pos, unsigned char v)
{
    size_t n;
    char *b = th_read_file(path, &n);
    CHECK(b != NULL);
    b[pos] = (char)v;
    th_write_file(path, b, n);
    free(b);
}

/* Positions to flip in a file of n bytes: the first, the last, and random
 * ones (a fixed sequence). */
static size_t pick(int k, size_t n, uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return k == 0 ? 0 : k == 1 ? n - 1 : (size_t)(*x >> 33) % n;
}

/* The weights `ember sample` and `--init` read: a flipped byte anywhere
 * (except in the name of the checksum's own key, which leaves the contents
 * intact and the file unchecked) is an error naming the file. */
TEST(test_sample_and_init_refuse_weights_or_config_with_a_flipped_byte_naming_the_file)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], model[PATH_MAX], config[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_pathf(model, sizeof model, "%s/model.safetensors", out);
    th_pathf(config, sizeof config, "%s/config", out);
    CHECK_EXIT(train(1, txt, out, NULL, NULL), 0);
    th_run_result *r = th_run(EMBER_BIN, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "5", NULL);
    CHECK_EXIT(r, 0);
    size_t n;
    char *b = th_read_file(model, &n);
    CHECK(b != NULL);
    const char *key = memmem(b, n, "\"ember.crc32\"", 13);
    CHECK(key != NULL);
    size_t key_at = (size_t)(key - b) + 1; /* the 11 letters of the key */
    uint64_t x = 7;
    int tried = 0;
    for (int k = 0; tried < 12; k++) {
        size_t pos = k == 2 ? key_at + 20 : pick(k, n, &x); /* k == 2: in the checksum's digits */
        if (pos >= key_at && pos < key_at + 11) continue;
        unsigned char old, mask = (unsigned char)(1u << (k % 8));
        flip_byte(model, pos, mask, &old);
        r = th_run(EMBER_BIN, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "5", NULL);
        if (r->status != 1 || !strstr(r->err, model))
            th_fail(__FILE__, __LINE__, "byte %zu of model.safetensors flipped: sample exited %d: %s", pos,
                    r->status, r->err);
        if (k == 3) {
            r = th_run(EMBER_BIN, TRAIN(txt, out), "--init", model, NULL);
            CHECK(r->status == 1 && strstr(r->err, model));
        }
        put_byte(model, pos, old);
        tried++;
    }
    free(b);
    /* the config: a changed letter of the vocabulary would sample other text */
    b = th_read_file(config, &n);
    const char *vocab = strstr(b, "vocab: \"");
    CHECK(vocab != NULL);
    size_t positions[] = {0, (size_t)(vocab - b) + 12, n - 3}; /* n - 3: a digit of its checksum */
    for (int k = 0; k < 3; k++) {
        unsigned char old;
        flip_byte(config, positions[k], 0x04, &old);
        r = th_run(EMBER_BIN, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "5", NULL);
        if (r->status != 1 || !strstr(r->err, config))
            th_fail(__FILE__, __LINE__, "byte %zu of config flipped: sample exited %d: %s", positions[k],
                    r->status, r->err);
        put_byte(config, positions[k], old);
    }
    free(b);
    CHECK_EXIT(th_run(EMBER_BIN, "sample", "--ckpt", out, "--prompt", "the ", "--tokens", "5", NULL), 0);
}

/* `ember train --resume` on a checkpoint with one flipped byte in any of
 * its files exits 1 naming the file (two processes: each rank's file). */
TEST(test_train_resume_refuses_a_checkpoint_with_a_flipped_byte_naming_the_file)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], state[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_pathf(state, sizeof state, "%s/state", out);
    CHECK_EXIT(train(2, txt, out, NULL, NULL), 0);
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "rank_0.json", "rank_1.json",
                           "manifest.json"};
    uint64_t x = 11;
    for (int i = 0; i < 5; i++) {
        char path[PATH_MAX];
        th_pathf(path, sizeof path, "%s/%s", state, files[i]);
        struct stat st;
        CHECK(stat(path, &st) == 0);
        size_t pos = pick(2 + i, (size_t)st.st_size, &x);
        unsigned char old;
        flip_byte(path, pos, 0x20, &old);
        th_run_result *r = train(2, txt, out, state, NULL);
        if (r->status == 0 || !strstr(r->err, path))
            th_fail(__FILE__, __LINE__, "byte %zu of %s flipped: resume exited %d: %s", pos, files[i],
                    r->status, r->err);
        put_byte(path, pos, old);
    }
}
