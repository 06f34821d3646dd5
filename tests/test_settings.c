/* test_settings.c — configuration consistency: every boolean setting (config
 * file keys, EMBER_* variables) reads true/false, 1/0, yes/no, on/off in any
 * letter case through one parser and rejects anything else naming the
 * setting and the value; EMBER_CONFIG_FILE naming a missing file is an
 * error naming the file and the variable. */
#include <stdlib.h>
#include <unistd.h>

#include "dist/accel_impl.h"
#include "harness.h"
#include "tensor/settings_impl.h"

static const char *write_tmp(const char *text)
{
    static char path[PATH_MAX];
    int fd = th_tmpfile(path, sizeof path, "ember-settings");
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    return path;
}

TEST(test_boolean_parser_takes_every_spelling_in_any_case_and_nothing_else)
{
    const char *yes[] = {"true", "TRUE", "True", "1", "yes", "YES", "Yes", "on", "ON", "On"};
    const char *no[] = {"false", "FALSE", "0", "no", "No", "off", "OFF", "oFf"};
    const char *bad[] = {"", "2", "maybe", "tru", "yess", "o", " true", "y", "-1"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        bool b = false;
        CHECK(setting_bool_parse(yes[i], &b) && b);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        bool b = true;
        CHECK(setting_bool_parse(no[i], &b) && !b);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bool b = true;
        CHECK(!setting_bool_parse(bad[i], &b) && b);
    }
    bool b;
    CHECK_ERR(setting_bool("--flag", "maybe", &b), EM_ERR_ARG, "--flag='maybe' is not a boolean");
}

TEST(test_config_file_booleans_take_yes_no_on_off)
{
    const char *path = write_tmp("split_batches: Yes\neven_batches: off\n");
    em_config c = em_config_defaults();
    CHECK_OK(em_config_read(path, &c, false));
    CHECK(c.split_batches && !c.even_batches);
    unlink(path);
}

TEST(test_config_file_boolean_of_another_word_names_the_key_and_value)
{
    const char *path = write_tmp("even_batches: maybe\n");
    em_config c = em_config_defaults();
    CHECK_ERR(em_config_read(path, &c, false), EM_ERR_ARG, "even_batches: bad value 'maybe' (want a boolean");
    unlink(path);
}

TEST(test_boolean_environment_settings_take_on_off_and_reject_other_words)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    setenv("EMBER_SPLIT_BATCHES", "ON", 1);
    setenv("EMBER_EVEN_BATCHES", "no", 1);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK(a->split_batches && !a->even_batches);
    em_accelerator_free(a);
    setenv("EMBER_EVEN_BATCHES", "2", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_EVEN_BATCHES='2' is not a boolean");
    unsetenv("EMBER_SPLIT_BATCHES");
    unsetenv("EMBER_EVEN_BATCHES");
}

TEST(test_ember_no_amx_is_read_as_a_boolean)
{
    em_scope s = em_scope_begin();
    unsetenv("EMBER_NO_AMX");
    em_tensor *a = em_ones(EM_BF16, 2, (int64_t[]){2, 2});
    CHECK_NOTNULL(em_matmul(a, a)); /* the first bf16 product probes AMX with the variable unset */
    setenv("EMBER_NO_AMX", "maybe", 1);
    CHECK_ERR(em_matmul(a, a), EM_ERR_ARG, "EMBER_NO_AMX='maybe' is not a boolean");
    setenv("EMBER_NO_AMX", "0", 1);
    CHECK_NOTNULL(em_matmul(a, a));
    unsetenv("EMBER_NO_AMX");
    em_scope_end(s);
}

TEST(test_ember_no_rename_exchange_is_read_as_a_boolean)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *acc = em_accelerator_new(NULL);
    CHECK_NOTNULL(acc);
    em_rng rng = em_rng_new(1);
    em_nn_linear *l = em_nn_linear_new(NULL, NULL, 2, 2, true, &rng);
    CHECK_NOTNULL(l);
    CHECK_OK(em_accel_prepare(acc, l->m, NULL, NULL, NULL));
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-settings-ckpt");
    char sub[PATH_MAX];
    th_pathf(sub, sizeof sub, "%s/state", dir);
    setenv("EMBER_NO_RENAME_EXCHANGE", "perhaps", 1);
    CHECK_ERR(em_accel_save_state(acc, sub), EM_ERR_ARG,
              "EMBER_NO_RENAME_EXCHANGE='perhaps' is not a boolean");
    setenv("EMBER_NO_RENAME_EXCHANGE", "off", 1);
    CHECK_OK(em_accel_save_state(acc, sub));
    unsetenv("EMBER_NO_RENAME_EXCHANGE");
    em_accelerator_free(acc);
    em_module_free(l->m);
}

TEST(test_config_file_variable_naming_a_missing_file_is_an_error_naming_both)
{
    setenv("EMBER_CONFIG_FILE", "/nonexistent/ember-missing.yaml", 1);
    em_config c = em_config_defaults();
    CHECK_ERR(em_config_load(NULL, &c), EM_ERR_IO, "EMBER_CONFIG_FILE names /nonexistent/ember-missing.yaml");
    unsetenv("WORLD_SIZE");
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_IO, "EMBER_CONFIG_FILE names /nonexistent/ember-missing.yaml");
    th_no_user_config();
    CHECK_OK(em_config_load(NULL, &c)); /* no file named, none by default: the defaults stand */
}
