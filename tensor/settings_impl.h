/* settings_impl.h — how every boolean setting is read (tensor/settings.c):
 * config file keys (dist/config.c, the model config of tools/train_config.c),
 * EMBER_* environment variables, command-line flag values and `ember config`'s
 * answers all go through these, so "yes", "ON" and "0" mean the same
 * everywhere and anything else is an error naming the setting and the value. */
#ifndef EMBER_SETTINGS_IMPL_H
#define EMBER_SETTINGS_IMPL_H

#include <stdbool.h>

#include "ember/tensor.h"

/* What a boolean setting accepts, for messages. */
#define SETTING_BOOL_WANT "a boolean (true/false, 1/0, yes/no, on/off)"

/* true, 1, yes, on -> true; false, 0, no, off -> false; any letter case.
 * Returns false (and leaves *out) for anything else, NULL included. */
bool setting_bool_parse(const char *v, bool *out);
/* The same, failing with EM_ERR_ARG "SETTING='v' is not a boolean (...)"
 * (setting names where the text came from: "EMBER_NO_AMX", "--flag"). */
em_status setting_bool(const char *setting, const char *v, bool *out);
/* Environment variable var as a boolean: *out untouched when it is unset
 * or empty; EM_ERR_ARG naming it and its value when it is not a boolean. */
em_status setting_env_bool(const char *var, bool *out);

#endif
