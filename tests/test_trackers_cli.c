/* test_trackers_cli.c — `ember plot` and `ember train --log-with` as a user
 * meets them: runs the built binary (EMBER_BUILD_DIR/ember) and checks exit
 * codes, messages and the files written. The SVG is checked for its
 * structure: one <path class="series" data-tag=TAG> per series with a point
 * per record, tick labels, a legend, the scale. (That the event files of
 * --log-with tensorboard read back is test_trackers.c's round trip;
 * scripts/check_tensorboard.sh reads them with TensorBoard itself.) */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define run_ember(...) th_run(EMBER_BIN, __VA_ARGS__)

static char *tmpdir(void)
{
    static char dir[PATH_MAX];
    return th_tmpdir(dir, sizeof dir, "ember-plot");
}

static void write_text(const char *path, const char *text) { th_write_file(path, text, strlen(text)); }

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The d="..." of the path whose data-tag is tag (malloc'd), NULL if none. */
static char *path_of(const char *svg, const char *tag)
{
    char want[128];
    snprintf(want, sizeof want, "class=\"series\" data-tag=\"%s\"", tag);
    const char *p = strstr(svg, want);
    if (!p) return NULL;
    const char *d = strstr(p, " d=\"");
    const char *end = d ? strchr(d + 4, '"') : NULL;
    if (!d || !end || memchr(p, '>', (size_t)(d - p))) return NULL;
    return strndup(d + 4, (size_t)(end - d - 4));
}

static bool has_path(const char *svg, const char *tag)
{
    char *d = path_of(svg, tag);
    free(d);
    return d != NULL;
}

/* points of a path's data: one "x,y" pair after each M or L; *moves counts the M */
static int points_in(const char *d, int *moves)
{
    int n = 0, m = 0;
    for (const char *p = d; *p; p++) {
        if (*p == 'M' || *p == 'L') {
            double x, y;
            if (sscanf(p + 1, "%lf,%lf", &x, &y) != 2) return -1;
            n++;
            m += *p == 'M';
        }
    }
    if (moves) *moves = m;
    return n;
}

static int count(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

/* A well-formed picture: the XML prolog, one <svg> closed at the end, as
 * many opening as closing <g>. */
static void check_svg_shape(const char *svg)
{
    CHECK(!strncmp(svg, "<?xml", 5));
    CHECK(count(svg, "<svg ") == 1);
    size_t n = strlen(svg);
    CHECK(n > 8 && !strcmp(svg + n - 7, "</svg>\n"));
    CHECK(count(svg, "<g") == count(svg, "</g>"));
    CHECK(count(svg, "<text") == count(svg, "</text>"));
}

static const char metrics[] = "{\"step\": 0, \"train_loss\": 4.2, \"val_loss\": 4.25}\n"
                              "{\"step\": 10, \"loss\": 3.9, \"lr\": 0.0005, \"grad_norm\": 1.5, "
                              "\"ms_per_step\": 2.1, \"tokens_per_s\": 900}\n"
                              "{\"step\": 20, \"loss\": 3.5, \"lr\": 0.001, \"grad_norm\": 1.2, "
                              "\"ms_per_step\": 2.0, \"tokens_per_s\": 950}\n"
                              "{\"step\": 20, \"train_loss\": 3.4, \"val_loss\": 3.6}\n"
                              "{\"step\": 30, \"loss\": 3.1, \"lr\": 0.0009, \"grad_norm\": 1.1, "
                              "\"ms_per_step\": 2.0, \"tokens_per_s\": 950}\n"
                              "{\"step\": 40, \"loss\": 2.9, \"lr\": 0.0007, \"grad_norm\": 1.0, "
                              "\"ms_per_step\": 2.0, \"tokens_per_s\": 950}\n"
                              "{\"step\": 40, \"train_loss\": 2.8, \"val_loss\": 3.0}\n";

TEST(test_cli_plot_draws_a_path_per_series_with_a_point_per_record)
{
    char *dir = tmpdir();
    char in[PATH_MAX], out[PATH_MAX];
    th_pathf(in, sizeof in, "%s/metrics.jsonl", dir);
    th_pathf(out, sizeof out, "%s/loss.svg", dir);
    write_text(in, metrics);
    th_run_result *r = run_ember("plot", in, "-o", out, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, out) != NULL);
    size_t n;
    char *svg = th_slurp(out, &n);
    check_svg_shape(svg);
    const struct {
        const char *tag;
        int points;
    } want[] = {{"loss", 4}, {"train_loss", 3}, {"val_loss", 3}, {"lr", 4}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char *d = path_of(svg, want[i].tag);
        if (!d) th_fail(__FILE__, __LINE__, "no path for %s", want[i].tag);
        int moves = 0, got = points_in(d, &moves);
        if (got != want[i].points || moves != 1)
            th_fail(__FILE__, __LINE__, "%s: %d points in %d pieces, want %d in 1: %s", want[i].tag, got,
                    moves, want[i].points, d);
        free(d);
    }
    CHECK(!has_path(svg, "grad_norm")); /* neither a loss nor a learning rate */
    CHECK(count(svg, "class=\"tick\"") >= 10);
    CHECK(strstr(svg, "val loss (evaluation)") && strstr(svg, "learning rate") && strstr(svg, ">step<"));
    CHECK(strstr(svg, "(log scale)") == NULL); /* 2.8 .. 4.25: within a decade */
    free(svg);
}

TEST(test_cli_plot_uses_a_log_scale_when_the_loss_spans_more_than_a_decade)
{
    char *dir = tmpdir();
    char in[PATH_MAX];
    th_pathf(in, sizeof in, "%s/m.jsonl", dir);
    write_text(in,
               "{\"step\": 0, \"loss\": 9.0}\n{\"step\": 1, \"loss\": 0.5}\n{\"step\": 2, \"loss\": 0.2}\n");
    th_run_result *r = run_ember("plot", in, "--title", "a <run> & more", NULL);
    CHECK_EXIT(r, 0);
    size_t n;
    char *svg = th_slurp(th_path(dir, "m.svg"), &n); /* the default output: beside it */
    check_svg_shape(svg);
    CHECK(strstr(svg, "loss (log scale)") != NULL);
    CHECK(strstr(svg, "a &lt;run&gt; &amp; more") != NULL);
    CHECK(strstr(svg, "data-tag=\"lr\"") == NULL); /* no learning rate: one panel */
    free(svg);
}

TEST(test_cli_plot_breaks_the_line_at_a_null_value)
{
    char *dir = tmpdir();
    char in[PATH_MAX];
    th_pathf(in, sizeof in, "%s/m.jsonl", dir);
    write_text(in, "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2.5}\n{\"step\": 3, \"loss\": null}\n"
                   "{\"step\": 4, \"loss\": 2}\n{\"step\": 5, \"loss\": 1.9}\n");
    CHECK_EXIT(run_ember("plot", in, NULL), 0);
    size_t n;
    char *svg = th_slurp(th_path(dir, "m.svg"), &n);
    char *d = path_of(svg, "loss");
    CHECK_NOTNULL(d);
    int moves = 0;
    CHECK(points_in(d, &moves) == 4 && moves == 2);
    free(d);
    free(svg);
}

TEST(test_cli_plot_tags_chooses_the_upper_panels_series)
{
    char *dir = tmpdir();
    char in[PATH_MAX];
    th_pathf(in, sizeof in, "%s/m.jsonl", dir);
    write_text(in, metrics);
    CHECK_EXIT(run_ember("plot", in, "--tags", "grad_norm,ms_per_step", NULL), 0);
    size_t n;
    char *svg = th_slurp(th_path(dir, "m.svg"), &n);
    char *d = path_of(svg, "grad_norm");
    CHECK(d && points_in(d, NULL) == 4);
    free(d);
    CHECK(has_path(svg, "ms_per_step"));
    CHECK(!has_path(svg, "val_loss"));
    free(svg);
}

TEST(test_cli_plot_fails_cleanly_on_a_missing_file)
{
    char *dir = tmpdir();
    const char *in = th_path(dir, "nope.jsonl");
    th_run_result *r = run_ember("plot", in, "-o", th_path(dir, "x.svg"), NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, in) != NULL);
    CHECK(!exists(th_path(dir, "x.svg")));
}

TEST(test_cli_plot_fails_on_a_file_without_numbers_to_draw)
{
    char *dir = tmpdir();
    char in[PATH_MAX];
    th_pathf(in, sizeof in, "%s/m.jsonl", dir);
    write_text(in, "{\"step\": 1, \"note\": \"hello\"}\n{\"step\": 2, \"accuracy\": 0.5}\n");
    th_run_result *r = run_ember("plot", in, NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "has no numbers to draw") != NULL);
    CHECK(!exists(th_path(dir, "m.svg")));
    write_text(in, "");
    CHECK_EXIT(run_ember("plot", in, NULL), 1);
    write_text(in, "{\"step\": 1, \"loss\": null}\n");
    CHECK_EXIT(run_ember("plot", in, NULL), 1);
}

TEST(test_cli_plot_names_the_line_that_is_not_a_record)
{
    char *dir = tmpdir();
    char in[PATH_MAX];
    th_pathf(in, sizeof in, "%s/m.jsonl", dir);
    const char *bad[] = {
        "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": }\n",    /* no value */
        "{\"step\": 1, \"loss\": 2}\n{\"loss\": 2}\n",                /* no step */
        "{\"step\": 1, \"loss\": 2}\n{\"step\": 1.5, \"loss\": 2}\n", /* a fractional step */
        "{\"step\": 1, \"loss\": 2}\n[1, 2]\n",                       /* not an object */
        "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2} x\n", /* text after it */
        "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2\n",    /* cut short */
        "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": inf}\n", /* not JSON */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(in, bad[i]);
        th_run_result *r = run_ember("plot", in, NULL);
        if (r->status != 1 || !strstr(r->err, "line 2"))
            th_fail(__FILE__, __LINE__, "case %zu: exit %d, stderr %s", i, r->status, r->err);
    }
}

TEST(test_cli_plot_rejects_bad_usage)
{
    th_run_result *r = run_ember("plot", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "usage:") != NULL);
    r = run_ember("plot", "m.jsonl", "--bogus", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--bogus") != NULL);
    r = run_ember("plot", "m.jsonl", "-o", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "-o needs a value") != NULL);
    r = run_ember("plot", "a.jsonl", "b.jsonl", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "'a.jsonl' and 'b.jsonl'") != NULL);
    r = run_ember("plot", "--help", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "usage: ember plot") != NULL);
}

/* ---- ember train --log-with ----------------------------------------------------------- */

static void make_corpus(const char *dir, char *txt, size_t n)
{
    th_pathf(txt, n, "%s/corpus.txt", dir);
    FILE *f = fopen(txt, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 300; i++) fputs("the cat sat on the mat. the dog sat on the log.\n", f);
    CHECK(fclose(f) == 0);
}

#define TINY_RUN                                                                                             \
    "--layers", "1", "--heads", "2", "--embd", "16", "--block", "8", "--batch", "4", "--iters", "20",        \
        "--eval-every", "10", "--eval-iters", "2", "--log-every", "5"

static int event_files(const char *dir)
{
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null | grep -c '^events.out.tfevents\\.'", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

TEST(test_cli_train_log_with_tensorboard_writes_event_files_under_logging_dir)
{
    char *dir = tmpdir();
    char txt[PATH_MAX], out[PATH_MAX], logs[PATH_MAX];
    make_corpus(dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/myrun", dir);
    th_pathf(logs, sizeof logs, "%s/logs", dir);
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, TINY_RUN, "--log-with", "tensorboard",
                                 "--logging-dir", logs, NULL);
    CHECK_EXIT(r, 0);
    CHECK(event_files(th_path(logs, "myrun")) == 1);
    CHECK(strstr(r->out, "tensorboard --logdir") != NULL);
    /* metrics.jsonl as always, and `ember plot` draws it */
    size_t n;
    char *m = th_slurp(th_path(out, "metrics.jsonl"), &n);
    CHECK(count(m, "\n") == 7 && count(m, "\"val_loss\": ") == 3 && count(m, "\"tokens_per_s\": ") == 4);
    free(m);
    CHECK_EXIT(run_ember("plot", th_path(out, "metrics.jsonl"), NULL), 0);
    char *svg = th_slurp(th_path(out, "metrics.svg"), &n);
    char *d = path_of(svg, "val_loss");
    CHECK(d && points_in(d, NULL) == 3);
    free(d);
    d = path_of(svg, "loss");
    CHECK(d && points_in(d, NULL) == 4);
    free(d);
    free(svg);
}

TEST(test_cli_train_default_writes_no_event_files)
{
    char *dir = tmpdir();
    char txt[PATH_MAX], out[PATH_MAX];
    make_corpus(dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    unsetenv("EMBER_LOG_WITH");
    CHECK_EXIT(run_ember("train", "--data", txt, "--out", out, TINY_RUN, NULL), 0);
    CHECK(!exists(th_path(out, "runs")));
    setenv("EMBER_LOG_WITH", "tensorboard", 1); /* the environment's choice */
    CHECK_EXIT(run_ember("train", "--data", txt, "--out", out, TINY_RUN, NULL), 0);
    CHECK(event_files(th_path(out, "runs/run")) == 1);
    unsetenv("EMBER_LOG_WITH");
}

TEST(test_cli_train_rejects_a_bad_log_with)
{
    th_run_result *r = run_ember("train", "--data", "x.txt", "--log-with", "wandb", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--log-with needs tensorboard, jsonl, all or none, got 'wandb'") != NULL);
}
