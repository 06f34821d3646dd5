/* train_config.h — DIR/config, the file `ember train` writes beside the
 * weights and `ember sample` reads: the model's shape and its vocabulary,
 * as a small YAML document (keys vocab_size, block_size, n_layer, n_head,
 * n_embd, dropout, bias, gelu (exact|tanh), vocab) (one `key: value` per line; the vocabulary is a
 * double-quoted YAML string holding em_vocab_to_string's text). The last
 * line, "# ember.crc32: XXXXXXXX", is the crc32 of every byte above it. */
#ifndef EMBER_TOOLS_TRAIN_CONFIG_H
#define EMBER_TOOLS_TRAIN_CONFIG_H

#include "ember/ember.h"

/* Writes path (atomically: a temporary, fsync, rename), checksum line last. */
em_status run_config_write(const char *path, const em_gpt_config *model, const em_vocab *vocab);
/* Reads what run_config_write wrote. Unknown keys, missing keys, bad
 * numbers or a bad vocabulary give EM_ERR_IO naming the path, line and key;
 * a checksum line that does not match, EM_ERR_IO naming the path (a config
 * written by hand, without that line, is not checked). */
em_status run_config_read(const char *path, em_gpt_config *model, em_vocab *vocab);

#endif
