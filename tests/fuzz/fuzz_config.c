/* fuzz_config.c — libFuzzer target for the two YAML config readers: the
 * config file `ember config` writes (dist/config.c, libyaml's parser,
 * em_config_read) and DIR/config `ember train` writes (tools/train_config.c,
 * read line by line, with the vocabulary's own escapes).
 *
 * Input: the file. Invariants: no crash, leak or undefined behaviour; a
 * refused file fails with a message naming it and, for em_config_read,
 * leaves the config it was given unchanged. */
#include <string.h>

#include "ember/ember.h"
#include "fuzz_util.h"
#include "tools/train_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size, NULL, 0);

    em_config c = em_config_defaults(), before = c;
    em_clear_error();
    if (em_config_read(path, &c, false) != EM_OK) {
        FUZZ_CHECK(strstr(em_last_error(), path), "%s", em_last_error());
        FUZZ_CHECK(!memcmp(&c, &before, sizeof c), "a refused file changed the config");
    }

    em_gpt_config m;
    em_vocab vocab;
    em_clear_error();
    if (run_config_read(path, &m, &vocab) != EM_OK)
        FUZZ_CHECK(strstr(em_last_error(), path), "%s", em_last_error());
    return 0;
}
