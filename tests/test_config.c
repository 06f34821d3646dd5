/* test_config.c — the config file (dist/config.c: em_config_read / write /
 * default_path, em_precision_*) and `ember config`, run as a user runs it:
 * with flags, with --default, and answering its questions through stdin. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

static char dir[PATH_MAX];

/* A fresh directory for this test (each test runs in its own process) and
 * the path of name inside it, in one of 4 rotating buffers. */
static void tmpdir(void) { th_tmpdir(dir, sizeof dir, "ember-cfg"); }

static const char *in_dir(const char *name)
{
    static char bufs[4][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 4];
    th_pathf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* This process's stdin becomes `text` (children started by th_run inherit it). */
static void stdin_from(const char *text)
{
    const char *p = in_dir("stdin.txt");
    write_text(p, text);
    int fd = open(p, O_RDONLY);
    if (fd < 0 || dup2(fd, 0) < 0) th_fail(__FILE__, __LINE__, "cannot redirect stdin");
    close(fd);
}

/* field by field (memcmp would compare padding) */
static bool same_config(const em_config *a, const em_config *b)
{
    return a->num_processes == b->num_processes && a->num_machines == b->num_machines &&
           a->machine_rank == b->machine_rank && !strcmp(a->main_process_ip, b->main_process_ip) &&
           a->main_process_port == b->main_process_port && a->mixed_precision == b->mixed_precision &&
           a->grad_accum == b->grad_accum && a->split_batches == b->split_batches &&
           a->even_batches == b->even_batches && a->timeout_s == b->timeout_s &&
           a->max_restarts == b->max_restarts;
}

/* ---- the library ------------------------------------------------------------ */

TEST(test_config_defaults_match_the_contract)
{
    em_config c = em_config_defaults();
    CHECK(c.num_processes == 1 && c.num_machines == 1 && c.machine_rank == 0);
    CHECK(!strcmp(c.main_process_ip, "127.0.0.1"));
    CHECK(c.main_process_port == 29500);
    CHECK(c.mixed_precision == EM_PREC_NO);
    CHECK(c.grad_accum == 1);
    CHECK(!c.split_batches && c.even_batches);
    CHECK(c.timeout_s == 300.0);
    CHECK(c.max_restarts == 0);
}

TEST(test_config_write_then_read_round_trips_every_field)
{
    tmpdir();
    em_config c = {.num_processes = 4,
                   .num_machines = 3,
                   .machine_rank = 2,
                   .main_process_ip = "node-7.cluster",
                   .main_process_port = 31234,
                   .mixed_precision = EM_PREC_BF16,
                   .grad_accum = 8,
                   .split_batches = true,
                   .even_batches = false,
                   .timeout_s = 12.5,
                   .max_restarts = 3};
    CHECK_OK(em_config_write(in_dir("a/b/c.yaml"), &c)); /* parents are created */
    em_config back = em_config_defaults();
    CHECK_OK(em_config_read(in_dir("a/b/c.yaml"), &back, false));
    CHECK(same_config(&back, &c));
}

TEST(test_config_read_keeps_fields_the_file_does_not_set)
{
    tmpdir();
    write_text(in_dir("c.yaml"), "# just one\nnum_processes: 6\n");
    em_config c = em_config_defaults();
    c.grad_accum = 5;
    CHECK_OK(em_config_read(in_dir("c.yaml"), &c, false));
    CHECK(c.num_processes == 6);
    CHECK(c.grad_accum == 5);
    CHECK(c.main_process_port == 29500);
}

TEST(test_config_read_accepts_plain_and_quoted_precision)
{
    tmpdir();
    write_text(in_dir("a.yaml"), "mixed_precision: fp16\n");
    write_text(in_dir("b.yaml"), "mixed_precision: \"no\"\n");
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(in_dir("a.yaml"), &c, false));
    CHECK(c.mixed_precision == EM_PREC_FP16);
    CHECK_OK(em_config_read(in_dir("b.yaml"), &c, false));
    CHECK(c.mixed_precision == EM_PREC_NO);
}

TEST(test_config_read_empty_file_changes_nothing)
{
    tmpdir();
    write_text(in_dir("c.yaml"), "# nothing here\n");
    em_config c = em_config_defaults(), before = c;
    CHECK_OK(em_config_read(in_dir("c.yaml"), &c, false));
    CHECK(same_config(&c, &before));
}

TEST(test_config_read_rejects_unknown_key_naming_file_line_key_value)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    write_text(p, "num_processes: 2\nnum_gpus: 8\n");
    em_config c = em_config_defaults(), before = c;
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, p);
    CHECK(strstr(em_last_error(), "line 2") != NULL);
    CHECK(strstr(em_last_error(), "unknown key 'num_gpus'") != NULL);
    CHECK(strstr(em_last_error(), "'8'") != NULL);
    CHECK(same_config(&c, &before)); /* untouched, though num_processes came first */
}

TEST(test_config_read_rejects_bad_values_naming_key_and_value)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    const char *cases[][3] = {
        {"num_processes: 0\n", "num_processes", "'0'"},
        {"num_machines: two\n", "num_machines", "'two'"},
        {"main_process_port: 70000\n", "main_process_port", "'70000'"},
        {"mixed_precision: fp8\n", "mixed_precision", "'fp8'"},
        {"gradient_accumulation_steps: 1.5\n", "gradient_accumulation_steps", "'1.5'"},
        {"split_batches: maybe\n", "split_batches", "'maybe'"},
        {"timeout: -1\n", "timeout", "'-1'"},
        {"max_restarts: -2\n", "max_restarts", "'-2'"},
        {"zero_stage: 4\n", "zero_stage", "'4'"},
        {"main_process_ip: a b\n", "main_process_ip", "'a b'"},
        {"num_processes:\n", "num_processes", "''"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(p, cases[i][0]);
        em_config c = em_config_defaults();
        CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, cases[i][1]);
        if (!strstr(em_last_error(), cases[i][2]) || !strstr(em_last_error(), "line 1") ||
            !strstr(em_last_error(), p))
            th_fail(__FILE__, __LINE__, "%s: message lacks value/line/path: %s", cases[i][0],
                    em_last_error());
    }
}

TEST(test_config_read_rejects_nested_duplicate_and_bad_yaml)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    em_config c = em_config_defaults();
    write_text(p, "num_processes:\n  - 1\n  - 2\n");
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, "num_processes");
    write_text(p, "num_processes: 2\nnum_processes: 3\n");
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, "appears twice");
    write_text(p, "num_processes: 2\nnum_machines: 'one\n");
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, "bad YAML");
    write_text(p, "- a\n- b\n");
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, "want a mapping");
}

TEST(test_config_read_rejects_rank_not_below_machines)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    write_text(p, "num_machines: 2\nmachine_rank: 2\n");
    em_config c = em_config_defaults();
    CHECK_ERR(em_config_read(p, &c, false), EM_ERR_ARG, "machine_rank is 2");
}

TEST(test_config_read_missing_file_is_io_error_unless_missing_ok)
{
    em_config c = em_config_defaults(), before = c;
    CHECK_ERR(em_config_read("/nonexistent/ember/c.yaml", &c, false), EM_ERR_IO, "/nonexistent/ember/c.yaml");
    CHECK_OK(em_config_read("/nonexistent/ember/c.yaml", &c, true));
    CHECK(same_config(&c, &before));
}

TEST(test_config_read_of_a_directory_is_io_error)
{
    tmpdir();
    em_config c = em_config_defaults();
    CHECK_ERR(em_config_read(dir, &c, true), EM_ERR_IO, "directory");
}

TEST(test_config_write_rejects_bad_values_naming_the_field)
{
    tmpdir();
    em_config c = em_config_defaults();
    c.grad_accum = 0;
    CHECK_ERR(em_config_write(in_dir("c.yaml"), &c), EM_ERR_ARG, "gradient_accumulation_steps");
    c = em_config_defaults();
    c.num_machines = 2, c.main_process_port = 0;
    CHECK_ERR(em_config_write(in_dir("c.yaml"), &c), EM_ERR_ARG, "main_process_port 0");
    c = em_config_defaults();
    c.mixed_precision = EM_PREC_DEFAULT;
    CHECK_ERR(em_config_write(in_dir("c.yaml"), &c), EM_ERR_ARG, "mixed_precision");
    CHECK(access(in_dir("c.yaml"), F_OK) != 0);
}

TEST(test_config_write_replaces_old_file_and_leaves_no_temp)
{
    tmpdir();
    em_config c = em_config_defaults();
    CHECK_OK(em_config_write(in_dir("c.yaml"), &c));
    c.num_processes = 3;
    CHECK_OK(em_config_write(in_dir("c.yaml"), &c));
    em_config back = em_config_defaults();
    CHECK_OK(em_config_read(in_dir("c.yaml"), &back, false));
    CHECK(back.num_processes == 3);
    CHECK(rmdir(dir) != 0); /* not empty: c.yaml is there */
    CHECK(remove(in_dir("c.yaml")) == 0);
    CHECK(rmdir(dir) == 0); /* and nothing else was */
}

TEST(test_config_default_path_prefers_env_file_then_xdg_then_home)
{
    char buf[256];
    setenv("HOME", "/home/someone", 1);
    setenv("XDG_CONFIG_HOME", "/xdg", 1);
    setenv("EMBER_CONFIG_FILE", "/etc/my.yaml", 1);
    CHECK(!strcmp(em_config_default_path(buf, sizeof buf), "/etc/my.yaml"));
    unsetenv("EMBER_CONFIG_FILE");
    CHECK(!strcmp(em_config_default_path(buf, sizeof buf), "/xdg/ember/default_config.yaml"));
    unsetenv("XDG_CONFIG_HOME");
    CHECK(
        !strcmp(em_config_default_path(buf, sizeof buf), "/home/someone/.config/ember/default_config.yaml"));
    unsetenv("HOME");
    CHECK_ERR(em_config_default_path(buf, sizeof buf), EM_ERR_ARG, "HOME");
    setenv("HOME", "/home/someone", 1);
    CHECK_ERR(em_config_default_path(buf, 8), EM_ERR_ARG, "buffer");
}

TEST(test_precision_names_round_trip_and_parse_rejects_others)
{
    em_precision_kind k[] = {EM_PREC_NO, EM_PREC_BF16, EM_PREC_FP16};
    for (int i = 0; i < 3; i++) {
        em_precision_kind back = EM_PREC_DEFAULT;
        CHECK_OK(em_precision_parse(em_precision_name(k[i]), &back));
        CHECK(back == k[i]);
    }
    em_precision_kind out;
    CHECK_ERR(em_precision_parse("fp32", &out), EM_ERR_ARG, "'fp32'");
}

/* ---- `ember config` ------------------------------------------------------------ */

TEST(test_cli_config_default_writes_defaults_under_xdg_config_home)
{
    tmpdir();
    setenv("XDG_CONFIG_HOME", dir, 1);
    unsetenv("EMBER_CONFIG_FILE");
    th_run_result *r = th_run(EMBER_BIN, "config", "--default", NULL);
    CHECK_EXIT(r, 0);
    const char *p = in_dir("ember/default_config.yaml");
    CHECK(strstr(r->out, p) != NULL);
    em_config c = {0};
    CHECK_OK(em_config_read(p, &c, false));
    em_config d = em_config_defaults();
    CHECK(same_config(&c, &d));
}

TEST(test_cli_config_falls_back_to_home_dot_config)
{
    tmpdir();
    unsetenv("XDG_CONFIG_HOME");
    unsetenv("EMBER_CONFIG_FILE");
    setenv("HOME", dir, 1);
    th_run_result *r = th_run(EMBER_BIN, "config", "--default", NULL);
    CHECK_EXIT(r, 0);
    CHECK(access(in_dir(".config/ember/default_config.yaml"), R_OK) == 0);
}

TEST(test_cli_config_flags_override_the_existing_file)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, "--num-processes", "4",
                              "--gradient-accumulation-steps=3", NULL);
    CHECK_EXIT(r, 0);
    r = th_run(EMBER_BIN, "config", "--config-file", p, "--mixed-precision", "bf16", "--split-batches",
               "--no-even-batches", "--timeout", "9", "--max-restarts", "2", NULL);
    CHECK_EXIT(r, 0);
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(c.num_processes == 4 && c.grad_accum == 3); /* kept from the first run */
    CHECK(c.mixed_precision == EM_PREC_BF16 && c.split_batches && !c.even_batches);
    CHECK(c.timeout_s == 9 && c.max_restarts == 2);
    r = th_run(EMBER_BIN, "config", "--config-file", p, "--default", "--num-machines", "2", "--machine-rank",
               "1", "--main-process-ip", "10.1.2.3", "--main-process-port", "4000", NULL);
    CHECK_EXIT(r, 0);
    c = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(c.num_processes == 1); /* --default started over */
    CHECK(c.num_machines == 2 && c.machine_rank == 1 && c.main_process_port == 4000);
    CHECK(!strcmp(c.main_process_ip, "10.1.2.3"));
}

TEST(test_cli_config_bad_flag_or_value_exits_2_naming_it)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, "--num-gpus", "2", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--num-gpus") != NULL);
    r = th_run(EMBER_BIN, "config", "--config-file", p, "--mixed-precision", "fp8", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--mixed-precision") && strstr(r->err, "fp8"));
    r = th_run(EMBER_BIN, "config", "--config-file", p, "--num-processes", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--num-processes") != NULL);
    r = th_run(EMBER_BIN, "config", "--config-file", p, "--machine-rank", "2", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--machine-rank 2") != NULL);
    CHECK(access(p, F_OK) != 0); /* nothing written */
}

TEST(test_cli_config_help_exits_0)
{
    th_run_result *r = th_run(EMBER_BIN, "config", "--help", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "usage: ember config") && strstr(r->out, "--mixed-precision"));
}

TEST(test_cli_config_asks_and_writes_the_answers)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    /* machines, rank, ip, port, processes, precision, accum, split, even, timeout, restarts, zero */
    stdin_from("2\n1\n10.0.0.5\n\n4\nbf16\n8\nyes\nno\n60\n1\n2\n");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "How many machines") && strstr(r->out, "rank of this machine"));
    CHECK(strstr(r->out, p) != NULL);
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(c.num_machines == 2 && c.machine_rank == 1 && !strcmp(c.main_process_ip, "10.0.0.5"));
    CHECK(c.main_process_port == 29500); /* Enter kept the default */
    CHECK(c.num_processes == 4 && c.mixed_precision == EM_PREC_BF16 && c.grad_accum == 8);
    CHECK(c.split_batches && !c.even_batches && c.timeout_s == 60 && c.max_restarts == 1);
    CHECK(c.zero_stage == 2);
}

TEST(test_cli_config_one_machine_skips_rank_ip_and_port_questions)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    stdin_from("\n\n\n\n\n\n\n\n\n");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "rank of this machine") == NULL);
    /* the questions' words, not just "port": the output names the file, under the test's directory */
    CHECK(strstr(r->out, "IP address") == NULL && strstr(r->out, "Which port") == NULL);
    em_config c = {0}, d = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(same_config(&c, &d));
}

TEST(test_cli_config_asks_again_after_an_invalid_answer)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    stdin_from("zero\n0\n1\n3\nfp8\nfp16\n\n\n\n\n\n\n");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "'zero' is not valid") && strstr(r->out, "'0' is not valid"));
    CHECK(strstr(r->out, "'fp8' is not valid: want no, bf16 or fp16"));
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(c.num_machines == 1 && c.num_processes == 3 && c.mixed_precision == EM_PREC_FP16);
}

TEST(test_cli_config_stdin_closing_early_exits_1_writing_nothing)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    stdin_from("1\n2\n");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "nothing written") != NULL);
    CHECK(access(p, F_OK) != 0);
}

TEST(test_cli_config_shows_the_existing_values_as_defaults)
{
    tmpdir();
    const char *p = in_dir("c.yaml");
    write_text(p, "num_processes: 7\ngradient_accumulation_steps: 2\n");
    stdin_from("\n\n\n\n\n\n\n\n\n");
    th_run_result *r = th_run(EMBER_BIN, "config", "--config-file", p, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "processes per machine? [7]") != NULL);
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(p, &c, false));
    CHECK(c.num_processes == 7 && c.grad_accum == 2);
}
