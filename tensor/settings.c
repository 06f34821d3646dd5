/* settings.c — the one parser of boolean settings (see settings_impl.h). */
#include "settings_impl.h"

#include <stdlib.h>
#include <strings.h>

#include "error_impl.h"

bool setting_bool_parse(const char *v, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no", "off"};
    if (!v) return false;
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) return *out = true, true;
        if (!strcasecmp(v, no[i])) return *out = false, true;
    }
    return false;
}

em_status setting_bool(const char *setting, const char *v, bool *out)
{
    if (setting_bool_parse(v, out)) return EM_OK;
    return em_err(EM_ERR_ARG, "%s='%.64s' is not %s", setting, v ? v : "(null)", SETTING_BOOL_WANT);
}

em_status setting_env_bool(const char *var, bool *out)
{
    const char *v = getenv(var);
    if (!v || !v[0]) return EM_OK;
    return setting_bool(var, v, out);
}
