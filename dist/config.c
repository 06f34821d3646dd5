/* config.c — the config file `ember config` writes and `ember launch`, `ember
 * train` and the Accelerator read: a flat YAML mapping of the em_config
 * fields (see the "config file" section of ember/dist.h). Reading goes
 * through libyaml's event parser and is strict: every key must be known,
 * appear once, and hold a scalar of the right kind; the first problem is
 * reported with the file, line, key and value. Writing checks the values,
 * emits with libyaml into a temporary file beside the target, syncs it and
 * renames it over the target, so a failed write never leaves half a file. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "../tensor/error_impl.h"
#include "ember/dist.h"
#include "tensor/fileio_impl.h"
#include "tensor/settings_impl.h"

em_config em_config_defaults(void)
{
    em_config c = {
        .num_processes = 1,
        .num_machines = 1,
        .machine_rank = 0,
        .main_process_port = 29500,
        .mixed_precision = EM_PREC_NO,
        .grad_accum = 1,
        .split_batches = false,
        .even_batches = true,
        .timeout_s = EM_DIST_DEFAULT_TIMEOUT,
        .max_restarts = 0,
        .zero_stage = 0,
    };
    snprintf(c.main_process_ip, sizeof c.main_process_ip, "127.0.0.1");
    return c;
}

const char *em_precision_name(em_precision_kind p)
{
    switch (p) {
    case EM_PREC_DEFAULT: return "default";
    case EM_PREC_NO: return "no";
    case EM_PREC_BF16: return "bf16";
    case EM_PREC_FP16: return "fp16";
    }
    return "?";
}

em_status em_precision_parse(const char *s, em_precision_kind *out)
{
    if (!s || !out) return em_err(EM_ERR_ARG, "em_precision_parse: %s is NULL", s ? "out" : "s");
    if (!strcmp(s, "no"))
        *out = EM_PREC_NO;
    else if (!strcmp(s, "bf16"))
        *out = EM_PREC_BF16;
    else if (!strcmp(s, "fp16"))
        *out = EM_PREC_FP16;
    else
        return em_err(EM_ERR_ARG, "em_precision_parse: '%.64s' is not a precision (no, bf16 or fp16)", s);
    return EM_OK;
}

const char *em_config_default_path(char *buf, size_t n)
{
    if (!buf || n == 0) return em_fail(EM_ERR_ARG, "em_config_default_path: no buffer");
    const char *explicit_path = getenv("EMBER_CONFIG_FILE");
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int len;
    /* The XDG spec says a relative XDG_CONFIG_HOME is invalid and ignored. */
    if (explicit_path && explicit_path[0])
        len = snprintf(buf, n, "%s", explicit_path);
    else if (xdg && xdg[0] == '/')
        len = snprintf(buf, n, "%s/ember/default_config.yaml", xdg);
    else if (home && home[0])
        len = snprintf(buf, n, "%s/.config/ember/default_config.yaml", home);
    else
        return em_fail(EM_ERR_ARG,
                       "em_config_default_path: neither XDG_CONFIG_HOME nor HOME is set (set one, or "
                       "EMBER_CONFIG_FILE)");
    if (len < 0 || (size_t)len >= n)
        return em_fail(EM_ERR_ARG, "em_config_default_path: the path needs %d bytes, the buffer has %zu", len,
                       n);
    return buf;
}

em_status em_config_load(const char *path, em_config *c)
{
    if (!c) return em_err(EM_ERR_ARG, "em_config_load: c is NULL");
    if (path) return em_config_read(path, c, false);
    const char *env = getenv("EMBER_CONFIG_FILE");
    if (env && env[0]) { /* named on purpose: it must be there */
        struct stat st;
        if (stat(env, &st) != 0 && errno == ENOENT)
            return em_err(EM_ERR_IO,
                          "em_config_load: EMBER_CONFIG_FILE names %s, which does not exist (write it with "
                          "`ember config`, or unset EMBER_CONFIG_FILE)",
                          env);
        return em_config_read(env, c, false);
    }
    char buf[4096];
    path = em_config_default_path(buf, sizeof buf);
    if (!path) {
        em_clear_error(); /* neither HOME nor XDG_CONFIG_HOME: no file, the defaults stand */
        return EM_OK;
    }
    return em_config_read(path, c, true);
}

/* ---- values ----------------------------------------------------------------- */

static bool parse_int_range(const char *s, long lo, long hi, int *out)
{
    if (!s[0]) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static bool parse_seconds(const char *s, double *out)
{
    if (!s[0]) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0) || isinf(v)) return false;
    *out = v;
    return true;
}

/* A host name or address: 1..255 characters of letters, digits and . - _ :
 * (no spaces, no shell or URL syntax). */
static bool valid_host(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == 0 || n >= cap) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '-' || ch == '_' || ch == ':';
        if (!ok) return false;
    }
    return true;
}

/* One key of the file: its name, what it wants (for messages), and how to
 * store a value into an em_config. */
typedef struct config_key {
    const char *name, *want;
    bool (*set)(em_config *c, const char *v);
} config_key;

static bool set_num_processes(em_config *c, const char *v)
{
    return parse_int_range(v, 1, 1 << 20, &c->num_processes);
}
static bool set_num_machines(em_config *c, const char *v)
{
    return parse_int_range(v, 1, 1 << 20, &c->num_machines);
}
static bool set_machine_rank(em_config *c, const char *v)
{
    return parse_int_range(v, 0, 1 << 20, &c->machine_rank);
}
static bool set_port(em_config *c, const char *v)
{
    return parse_int_range(v, 0, 65535, &c->main_process_port);
}
static bool set_accum(em_config *c, const char *v) { return parse_int_range(v, 1, INT_MAX, &c->grad_accum); }
static bool set_restarts(em_config *c, const char *v)
{
    return parse_int_range(v, 0, 1000000, &c->max_restarts);
}
static bool set_zero(em_config *c, const char *v) { return parse_int_range(v, 0, 3, &c->zero_stage); }
static bool set_split(em_config *c, const char *v) { return setting_bool_parse(v, &c->split_batches); }
static bool set_even(em_config *c, const char *v) { return setting_bool_parse(v, &c->even_batches); }
static bool set_timeout(em_config *c, const char *v) { return parse_seconds(v, &c->timeout_s); }

static bool set_ip(em_config *c, const char *v)
{
    if (!valid_host(v, sizeof c->main_process_ip)) return false;
    snprintf(c->main_process_ip, sizeof c->main_process_ip, "%s", v);
    return true;
}

static bool set_precision(em_config *c, const char *v)
{
    if (strcmp(v, "no") && strcmp(v, "bf16") && strcmp(v, "fp16")) return false;
    return em_precision_parse(v, &c->mixed_precision) == EM_OK;
}

static const config_key keys[] = {
    {"num_processes", "an integer >= 1", set_num_processes},
    {"num_machines", "an integer >= 1", set_num_machines},
    {"machine_rank", "an integer >= 0", set_machine_rank},
    {"main_process_ip", "a host name or address", set_ip},
    {"main_process_port", "a port 0..65535", set_port},
    {"mixed_precision", "no, bf16 or fp16", set_precision},
    {"gradient_accumulation_steps", "an integer >= 1", set_accum},
    {"split_batches", SETTING_BOOL_WANT, set_split},
    {"even_batches", SETTING_BOOL_WANT, set_even},
    {"timeout", "seconds > 0", set_timeout},
    {"max_restarts", "an integer >= 0", set_restarts},
    {"zero_stage", "a ZeRO stage 0..3", set_zero},
};
enum { NKEYS = sizeof keys / sizeof keys[0] };

em_status config_set(em_config *c, const char *key, const char *value, const char *source)
{
    int k = 0;
    while (k < NKEYS && strcmp(keys[k].name, key)) k++;
    if (k == NKEYS) return em_err(EM_ERR_ARG, "%s: unknown setting '%s'", source, key);
    em_config t = *c;
    if (!keys[k].set(&t, value))
        return em_err(EM_ERR_ARG, "%s='%s' is not %s", source, value, keys[k].want);
    *c = t;
    return EM_OK;
}

/* The checks that involve more than one field (or that a caller filling the
 * struct in code could break): NULL when c is consistent, else what is
 * wrong, written into msg. */
static const char *check_config(const em_config *c, char *msg, size_t n)
{
    if (c->num_processes < 1)
        snprintf(msg, n, "num_processes is %d, want >= 1", c->num_processes);
    else if (c->num_machines < 1)
        snprintf(msg, n, "num_machines is %d, want >= 1", c->num_machines);
    else if (c->machine_rank < 0 || c->machine_rank >= c->num_machines)
        snprintf(msg, n, "machine_rank is %d, want 0..%d (num_machines is %d)", c->machine_rank,
                 c->num_machines - 1, c->num_machines);
    else if (!valid_host(c->main_process_ip, sizeof c->main_process_ip))
        snprintf(msg, n, "main_process_ip '%.64s' is not a host name or address", c->main_process_ip);
    else if (c->main_process_port < 0 || c->main_process_port > 65535)
        snprintf(msg, n, "main_process_port is %d, want 0..65535", c->main_process_port);
    else if (c->main_process_port == 0 && c->num_machines > 1)
        snprintf(msg, n, "main_process_port 0 (a free port) works on one machine only, num_machines is %d",
                 c->num_machines);
    else if (c->mixed_precision != EM_PREC_NO && c->mixed_precision != EM_PREC_BF16 &&
             c->mixed_precision != EM_PREC_FP16)
        snprintf(msg, n, "mixed_precision is %d (%s), want no, bf16 or fp16", (int)c->mixed_precision,
                 em_precision_name(c->mixed_precision));
    else if (c->grad_accum < 1)
        snprintf(msg, n, "gradient_accumulation_steps is %d, want >= 1", c->grad_accum);
    else if (!(c->timeout_s > 0) || isinf(c->timeout_s))
        snprintf(msg, n, "timeout is %g, want seconds > 0", c->timeout_s);
    else if (c->max_restarts < 0)
        snprintf(msg, n, "max_restarts is %d, want >= 0", c->max_restarts);
    else if (c->zero_stage < 0 || c->zero_stage > 3)
        snprintf(msg, n, "zero_stage is %d, want 0..3", c->zero_stage);
    else
        return NULL;
    return msg;
}

/* ---- reading ---------------------------------------------------------------- */

static const char *event_what(yaml_event_type_t t)
{
    switch (t) {
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "not a scalar";
    }
}

/* Reads the next event into *ev; on a parse error sets the message and
 * returns false. */
static bool next_event(yaml_parser_t *p, yaml_event_t *ev, const char *path)
{
    if (yaml_parser_parse(p, ev)) return true;
    em_err(EM_ERR_ARG, "em_config_read: %s line %zu: bad YAML: %s", path, p->problem_mark.line + 1,
           p->problem ? p->problem : "parse error");
    return false;
}

/* Walks the event stream: stream start, at most one document holding one
 * mapping of scalar keys to scalar values. Stores into *c (a scratch copy). */
static em_status parse_events(yaml_parser_t *p, const char *path, em_config *c)
{
    yaml_event_t ev;
    bool seen[NKEYS] = {false};
    int key_line[NKEYS] = {0};
    int state = 0; /* 0 before the document, 1 in the mapping, 2 after it */
    for (;;) {
        if (!next_event(p, &ev, path)) return EM_ERR_ARG;
        int line = (int)ev.start_mark.line + 1;
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_START_EVENT || t == YAML_DOCUMENT_END_EVENT) {
            yaml_event_delete(&ev);
            continue;
        }
        if (state == 2) {
            yaml_event_delete(&ev);
            return em_err(EM_ERR_ARG,
                          "em_config_read: %s line %d: more than one document (want one mapping "
                          "of key: value)",
                          path, line);
        }
        if (state == 0) {
            bool empty = t == YAML_SCALAR_EVENT && ev.data.scalar.length == 0; /* a document of comments */
            yaml_event_delete(&ev);
            if (empty) {
                state = 2;
                continue;
            }
            if (t != YAML_MAPPING_START_EVENT)
                return em_err(EM_ERR_ARG,
                              "em_config_read: %s line %d: the file holds %s, want a mapping of "
                              "key: value",
                              path, line, event_what(t));
            state = 1;
            continue;
        }
        if (t == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            state = 2;
            continue;
        }
        if (t != YAML_SCALAR_EVENT) {
            yaml_event_delete(&ev);
            return em_err(EM_ERR_ARG, "em_config_read: %s line %d: a key is %s, want a name", path, line,
                          event_what(t));
        }
        char key[128];
        snprintf(key, sizeof key, "%s", (const char *)ev.data.scalar.value);
        yaml_event_delete(&ev);
        int k = 0;
        while (k < NKEYS && strcmp(keys[k].name, key)) k++;
        if (!next_event(p, &ev, path)) return EM_ERR_ARG;
        if (ev.type != YAML_SCALAR_EVENT) {
            const char *what = event_what(ev.type);
            yaml_event_delete(&ev);
            return em_err(EM_ERR_ARG, "em_config_read: %s line %d: key '%s' holds %s, want a single value",
                          path, line, key, what);
        }
        char val[300];
        snprintf(val, sizeof val, "%s", (const char *)ev.data.scalar.value);
        bool fits = ev.data.scalar.length < sizeof val;
        yaml_event_delete(&ev);
        if (k == NKEYS)
            return em_err(
                EM_ERR_ARG,
                "em_config_read: %s line %d: unknown key '%s' (value '%.64s'); keys are num_processes, "
                "num_machines, machine_rank, main_process_ip, main_process_port, mixed_precision, "
                "gradient_accumulation_steps, split_batches, even_batches, timeout, max_restarts, zero_stage",
                path, line, key, val);
        if (seen[k])
            return em_err(EM_ERR_ARG, "em_config_read: %s line %d: key '%s' appears twice (first on line %d)",
                          path, line, key, key_line[k]);
        seen[k] = true;
        key_line[k] = line;
        if (!fits || !keys[k].set(c, val))
            return em_err(EM_ERR_ARG, "em_config_read: %s line %d: %s: bad value '%.64s' (want %s)", path,
                          line, key, val, keys[k].want);
    }
    char why[200];
    if (check_config(c, why, sizeof why)) return em_err(EM_ERR_ARG, "em_config_read: %s: %s", path, why);
    return EM_OK;
}

em_status em_config_read(const char *path, em_config *c, bool missing_ok)
{
    if (!path || !c) return em_err(EM_ERR_ARG, "em_config_read: %s is NULL", path ? "c" : "path");
    struct stat pre;
    if (missing_ok && stat(path, &pre) != 0 && errno == ENOENT) return EM_OK;
    FILE *f = file_fopen_regular(path, "em_config_read"); /* a FIFO is refused, not waited on */
    if (!f) return em_last_status();
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return em_err(EM_ERR_OOM, "em_config_read: cannot start the YAML parser for %s", path);
    }
    yaml_parser_set_input_file(&p, f);
    em_config scratch = *c; /* *c changes only when the whole file is good */
    em_status s = parse_events(&p, path, &scratch);
    yaml_parser_delete(&p);
    bool read_err = ferror(f);
    fclose(f);
    if (!s && read_err) s = em_err(EM_ERR_IO, "em_config_read: error reading %s", path);
    if (!s) *c = scratch;
    return s;
}

/* ---- writing ---------------------------------------------------------------- */

/* mkdir -p of the directory part of path. */
static em_status make_parent(const char *path)
{
    char dir[PATH_MAX];
    if (strlen(path) >= sizeof dir)
        return em_err(EM_ERR_ARG, "em_config_write: path too long: %.64s...", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return EM_OK;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return em_err(EM_ERR_IO, "em_config_write: cannot create %s: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return em_err(EM_ERR_IO, "em_config_write: cannot create %s: %s", dir, strerror(errno));
    return EM_OK;
}

static bool emit_scalar(yaml_emitter_t *e, const char *s, yaml_scalar_style_t style)
{
    yaml_event_t ev;
    return yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1, style) &&
           yaml_emitter_emit(e, &ev);
}

static bool emit_pair(yaml_emitter_t *e, const char *key, const char *val, yaml_scalar_style_t style)
{
    return emit_scalar(e, key, YAML_PLAIN_SCALAR_STYLE) && emit_scalar(e, val, style);
}

/* The whole document: a block mapping in the order of dist.h. */
static bool emit_config(yaml_emitter_t *e, const em_config *c)
{
    char n[11][64];
    snprintf(n[0], 64, "%d", c->num_processes);
    snprintf(n[1], 64, "%d", c->num_machines);
    snprintf(n[2], 64, "%d", c->machine_rank);
    snprintf(n[3], 64, "%d", c->main_process_port);
    snprintf(n[4], 64, "%d", c->grad_accum);
    snprintf(n[5], 64, "%.17g", c->timeout_s);
    snprintf(n[6], 64, "%d", c->max_restarts);
    snprintf(n[7], 64, "%d", c->zero_stage);
    yaml_event_t ev;
    const yaml_scalar_style_t plain = YAML_PLAIN_SCALAR_STYLE;
    /* mixed_precision is quoted: a YAML 1.1 reader would take a bare `no` for false. */
    return yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(e, &ev) &&
           yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(e, &ev) &&
           yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) &&
           yaml_emitter_emit(e, &ev) && emit_pair(e, "num_processes", n[0], plain) &&
           emit_pair(e, "num_machines", n[1], plain) && emit_pair(e, "machine_rank", n[2], plain) &&
           emit_pair(e, "main_process_ip", c->main_process_ip, plain) &&
           emit_pair(e, "main_process_port", n[3], plain) &&
           emit_pair(e, "mixed_precision", em_precision_name(c->mixed_precision),
                     YAML_SINGLE_QUOTED_SCALAR_STYLE) &&
           emit_pair(e, "gradient_accumulation_steps", n[4], plain) &&
           emit_pair(e, "split_batches", c->split_batches ? "true" : "false", plain) &&
           emit_pair(e, "even_batches", c->even_batches ? "true" : "false", plain) &&
           emit_pair(e, "timeout", n[5], plain) && emit_pair(e, "max_restarts", n[6], plain) &&
           emit_pair(e, "zero_stage", n[7], plain) &&
           yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(e, &ev) &&
           yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(e, &ev) &&
           yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(e, &ev);
}

em_status em_config_write(const char *path, const em_config *c)
{
    if (!path || !c) return em_err(EM_ERR_ARG, "em_config_write: %s is NULL", path ? "c" : "path");
    if (!path[0]) return em_err(EM_ERR_ARG, "em_config_write: empty path");
    char why[200];
    if (check_config(c, why, sizeof why)) return em_err(EM_ERR_ARG, "em_config_write: %s", why);
    em_status s = make_parent(path);
    if (s) return s;
    /* the YAML goes to memory first, then to the file in one crash-safe write */
    static const char head[] =
        "# ember config: written by `ember config`, read by `ember launch`, `ember train` and the\n"
        "# Accelerator; flags and EMBER_* environment variables override it.\n";
    unsigned char text[8192];
    size_t len = sizeof head - 1, written = 0;
    memcpy(text, head, len);
    yaml_emitter_t e;
    bool ok = yaml_emitter_initialize(&e);
    if (ok) {
        yaml_emitter_set_output_string(&e, text + len, sizeof text - len, &written);
        yaml_emitter_set_unicode(&e, 1);
        ok = emit_config(&e, c) && yaml_emitter_flush(&e);
        yaml_emitter_delete(&e);
    }
    if (!ok) return em_err(EM_ERR_IO, "em_config_write: cannot write %s: the YAML emitter failed", path);
    return file_write_atomic(path, text, len + written, "em_config_write");
}
