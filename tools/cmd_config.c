/* cmd_config.c — `ember config`: writes the config file that `ember launch`,
 * `ember train` and the Accelerator read (dist/config.c holds the format).
 *
 * With no flags it asks one question per setting on stdout and reads the
 * answers from stdin (Enter keeps the value shown in brackets; a bad answer
 * is asked again with the reason; stdin closing first writes nothing and
 * exits 1). With flags it asks nothing: the flags' values over the file's
 * current values (or over the defaults with --default). Prints the path it
 * wrote. Exit status: 0 written, 1 failure, 2 bad usage. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "commands.h"
#include "ember/ember.h"
#include "tensor/settings_impl.h"

static int usage(FILE *f)
{
    fprintf(
        f, "usage: ember config [options]\n"
           "Writes the config file read by `ember launch`, `ember train` and the Accelerator:\n"
           "$EMBER_CONFIG_FILE, else $XDG_CONFIG_HOME/ember/default_config.yaml, else\n"
           "~/.config/ember/default_config.yaml. With no options it asks each question (Enter keeps\n"
           "the value in brackets). With options it asks nothing: the options' values replace those\n"
           "of the existing file (or of the defaults, with --default).\n"
           "  --default                          start from the defaults, ask nothing\n"
           "  --config-file PATH                 write PATH instead of the default path\n"
           "  --num-processes N                  processes per machine (default 1)\n"
           "  --num-machines M                   machines in the job (default 1)\n"
           "  --machine-rank R                   this machine's rank, 0..M-1 (default 0)\n"
           "  --main-process-ip A                address of the machine of rank 0 (default 127.0.0.1)\n"
           "  --main-process-port P              its store's port; 0 = a free one, one machine only\n"
           "                                     (default 29500)\n"
           "  --mixed-precision no|bf16|fp16     (default no)\n"
           "  --gradient-accumulation-steps K    micro-batches per optimizer step (default 1)\n"
           "  --split-batches | --no-split-batches  a loader's batch is the global one (default off)\n"
           "  --even-batches | --no-even-batches    pad the last batch so every rank gets one (default on)\n"
           "  --timeout S                        seconds any collective may wait (default 300)\n"
           "  --max-restarts K                   times `ember launch` restarts a failed group (default 0)\n"
           "  --zero-stage S                     ZeRO: 0 DDP, 1 optimizer state, 2 +gradients, 3 +parameters\n");
    return f == stderr ? 2 : 0;
}

/* ---- values ------------------------------------------------------------------
 * Each parser returns NULL when s is good (storing it) or the reason. */

static const char *int_value(const char *s, int lo, int hi, int *out)
{
    static char why[96];
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !s[0] || *end || v < lo || v > hi) {
        if (hi == INT_MAX)
            snprintf(why, sizeof why, "want an integer >= %d", lo);
        else
            snprintf(why, sizeof why, "want an integer from %d to %d", lo, hi);
        return why;
    }
    *out = (int)v;
    return NULL;
}

static const char *seconds_value(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !s[0] || *end || !(v > 0) || isinf(v)) return "want a number of seconds > 0";
    *out = v;
    return NULL;
}

static const char *precision_value(const char *s, em_precision_kind *out)
{
    if (strcmp(s, "no") && strcmp(s, "bf16") && strcmp(s, "fp16")) return "want no, bf16 or fp16";
    return em_precision_parse(s, out) ? "want no, bf16 or fp16" : NULL;
}

static const char *host_value(const char *s, char *out, size_t n)
{
    size_t len = strlen(s);
    if (len == 0 || len >= n) return "want a host name or address";
    for (const char *p = s; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:", *p))
            return "want a host name or address (letters, digits, . - _ :)";
    memcpy(out, s, len + 1);
    return NULL;
}

/* An answer to a yes/no question: y or n (the prompt's shorthand), or any
 * spelling a boolean setting takes (tensor/settings.c). */
static const char *yes_no_value(const char *s, bool *out)
{
    if (!strcasecmp(s, "y"))
        *out = true;
    else if (!strcasecmp(s, "n"))
        *out = false;
    else if (!setting_bool_parse(s, out))
        return "want yes or no (or true/false, 1/0, on/off)";
    return NULL;
}

/* What no single value can show: NULL when c is consistent, else why. */
static const char *cross_check(const em_config *c)
{
    static char why[160];
    if (c->machine_rank >= c->num_machines)
        snprintf(why, sizeof why, "--machine-rank %d needs --num-machines above it (it is %d)",
                 c->machine_rank, c->num_machines);
    else if (c->main_process_port == 0 && c->num_machines > 1)
        snprintf(why, sizeof why, "--main-process-port 0 (a free port) works on one machine only, not %d",
                 c->num_machines);
    else
        return NULL;
    return why;
}

/* ---- the questions ------------------------------------------------------------ */

typedef enum { ASK_OK, ASK_EOF } ask_result;

/* Reads one line of stdin into buf (without its newline). false at EOF. */
static bool read_answer(char *buf, size_t n)
{
    if (!fgets(buf, (int)n, stdin)) return false;
    size_t len = strlen(buf);
    bool whole = len > 0 && buf[len - 1] == '\n';
    if (!whole && !feof(stdin)) { /* a line longer than buf: drop the rest, keep it invalid */
        int ch;
        while ((ch = getchar()) != EOF && ch != '\n') {
        }
        snprintf(buf, n, "?");
        return true;
    }
    buf[strcspn(buf, "\r\n")] = '\0';
    /* trim spaces on both ends */
    char *s = buf;
    while (*s == ' ' || *s == '\t') s++;
    memmove(buf, s, strlen(s) + 1);
    len = strlen(buf);
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t')) buf[--len] = '\0';
    return true;
}

/* Asks `question [shown]: ` until check() accepts the answer (an empty
 * answer is the shown default, itself always accepted). */
typedef const char *(*check_fn)(const char *answer, void *ctx);

static ask_result ask(const char *question, const char *shown, check_fn check, void *ctx)
{
    char line[512];
    for (;;) {
        printf("%s [%s]: ", question, shown);
        fflush(stdout);
        if (!read_answer(line, sizeof line)) {
            printf("\n");
            return ASK_EOF;
        }
        if (!isatty(STDIN_FILENO)) printf("%s\n", line); /* answers piped in: show them like typed ones */
        const char *why = check(line[0] ? line : shown, ctx);
        if (!why) return ASK_OK;
        printf("  '%s' is not valid: %s\n", line, why);
    }
}

typedef struct int_ctx {
    int lo, hi, *out;
} int_ctx;
static const char *check_int(const char *a, void *ctx)
{
    int_ctx *c = ctx;
    return int_value(a, c->lo, c->hi, c->out);
}
static const char *check_seconds(const char *a, void *ctx) { return seconds_value(a, ctx); }
static const char *check_precision(const char *a, void *ctx) { return precision_value(a, ctx); }
static const char *check_yes_no(const char *a, void *ctx) { return yes_no_value(a, ctx); }
static const char *check_host(const char *a, void *ctx)
{
    em_config *c = ctx;
    return host_value(a, c->main_process_ip, sizeof c->main_process_ip);
}

static ask_result ask_int(const char *q, int lo, int hi, int *v)
{
    char shown[32];
    snprintf(shown, sizeof shown, "%d", *v);
    return ask(q, shown, check_int, &(int_ctx){lo, hi, v});
}

/* The questions of `accelerate config` that apply to ember, in its order. */
static ask_result interview(em_config *c)
{
    char shown[300];
    if (ask_int("How many machines will the job use?", 1, 1 << 20, &c->num_machines)) return ASK_EOF;
    if (c->num_machines > 1) {
        if (c->machine_rank >= c->num_machines) c->machine_rank = 0;
        char q[96];
        snprintf(q, sizeof q, "What is the rank of this machine (0..%d)?", c->num_machines - 1);
        if (ask_int(q, 0, c->num_machines - 1, &c->machine_rank)) return ASK_EOF;
        snprintf(shown, sizeof shown, "%s", c->main_process_ip);
        if (ask("What is the IP address or host name of the machine of rank 0?", shown, check_host, c))
            return ASK_EOF;
        if (c->main_process_port == 0) c->main_process_port = 29500;
        if (ask_int("Which port will the machine of rank 0 listen on?", 1, 65535, &c->main_process_port))
            return ASK_EOF;
    } else {
        c->machine_rank = 0;
    }
    if (ask_int("How many processes per machine?", 1, 1 << 20, &c->num_processes)) return ASK_EOF;
    if (ask("Mixed precision (no, bf16, fp16)?", em_precision_name(c->mixed_precision), check_precision,
            &c->mixed_precision))
        return ASK_EOF;
    if (ask_int("How many gradient accumulation steps?", 1, INT_MAX, &c->grad_accum)) return ASK_EOF;
    if (ask("Split batches (a loader's batch is the global batch, divided over the processes)? (yes/no)",
            c->split_batches ? "yes" : "no", check_yes_no, &c->split_batches))
        return ASK_EOF;
    if (ask("Even batches (repeat samples so every process gets the last batch)? (yes/no)",
            c->even_batches ? "yes" : "no", check_yes_no, &c->even_batches))
        return ASK_EOF;
    snprintf(shown, sizeof shown, "%.15g", c->timeout_s);
    if (ask("How many seconds may a collective wait before it fails?", shown, check_seconds, &c->timeout_s))
        return ASK_EOF;
    if (ask_int("How many times should `ember launch` restart a failed group?", 0, 1000000, &c->max_restarts))
        return ASK_EOF;
    if (ask_int("ZeRO stage (0 DDP, 1 shard the optimizer state, 2 and the gradients, 3 and the parameters)?", 0,
                3, &c->zero_stage))
        return ASK_EOF;
    return ASK_OK;
}

/* ---- flags -------------------------------------------------------------------- */

/* Applies one flag that takes a value; NULL or the reason the value is bad. */
static const char *apply_flag(em_config *c, const char *flag, const char *v, bool *known)
{
    *known = true;
    if (!strcmp(flag, "--num-processes")) return int_value(v, 1, 1 << 20, &c->num_processes);
    if (!strcmp(flag, "--num-machines")) return int_value(v, 1, 1 << 20, &c->num_machines);
    if (!strcmp(flag, "--machine-rank")) return int_value(v, 0, 1 << 20, &c->machine_rank);
    if (!strcmp(flag, "--main-process-ip"))
        return host_value(v, c->main_process_ip, sizeof c->main_process_ip);
    if (!strcmp(flag, "--main-process-port")) return int_value(v, 0, 65535, &c->main_process_port);
    if (!strcmp(flag, "--mixed-precision")) return precision_value(v, &c->mixed_precision);
    if (!strcmp(flag, "--gradient-accumulation-steps")) return int_value(v, 1, INT_MAX, &c->grad_accum);
    if (!strcmp(flag, "--timeout")) return seconds_value(v, &c->timeout_s);
    if (!strcmp(flag, "--max-restarts")) return int_value(v, 0, 1000000, &c->max_restarts);
    if (!strcmp(flag, "--zero-stage")) return int_value(v, 0, 3, &c->zero_stage);
    *known = false;
    return NULL;
}

static bool takes_value(const char *flag)
{
    static const char *const with_value[] = {"--num-processes",
                                             "--num-machines",
                                             "--machine-rank",
                                             "--main-process-ip",
                                             "--main-process-port",
                                             "--mixed-precision",
                                             "--gradient-accumulation-steps",
                                             "--timeout",
                                             "--max-restarts",
                                             "--zero-stage",
                                             "--config-file"};
    for (size_t i = 0; i < sizeof with_value / sizeof with_value[0]; i++)
        if (!strcmp(flag, with_value[i])) return true;
    return false;
}

int cmd_config(int argc, char **argv)
{
    /* First pass: the path, --default and --help, and the shape of every flag,
     * so the values apply over the right base config. */
    const char *path = NULL;
    bool use_defaults = false, any_flag = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        if (!strcmp(a, "--default")) {
            use_defaults = any_flag = true;
            continue;
        }
        if (!strcmp(a, "--split-batches") || !strcmp(a, "--no-split-batches") ||
            !strcmp(a, "--even-batches") || !strcmp(a, "--no-even-batches")) {
            any_flag = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "ember config: unexpected argument '%s' (see ember config --help)\n", a);
            return 2;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        if (!takes_value(name)) {
            fprintf(stderr, "ember config: unknown flag '%s' (see ember config --help)\n", a);
            return 2;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "ember config: %s needs a value\n", name);
            return 2;
        }
        if (!strcmp(name, "--config-file")) {
            if (!v[0]) {
                fprintf(stderr, "ember config: --config-file needs a path\n");
                return 2;
            }
            path = v;
        } else {
            any_flag = true;
        }
    }
    char buf[PATH_MAX];
    if (!path && !(path = em_config_default_path(buf, sizeof buf))) {
        fprintf(stderr, "ember config: %s\n", em_last_error());
        return 1;
    }

    em_config c = em_config_defaults();
    if (!use_defaults && em_config_read(path, &c, true) != EM_OK) {
        if (any_flag) {
            fprintf(stderr, "ember config: %s\n(fix it, or start over with --default)\n", em_last_error());
            return 1;
        }
        fprintf(stderr, "ember config: %s; starting from the defaults\n", em_last_error());
        c = em_config_defaults();
    }

    if (any_flag) { /* second pass: the values, in order, over the base */
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            if (!strcmp(a, "--default")) continue;
            if (!strcmp(a, "--split-batches") || !strcmp(a, "--no-split-batches")) {
                c.split_batches = a[2] != 'n';
                continue;
            }
            if (!strcmp(a, "--even-batches") || !strcmp(a, "--no-even-batches")) {
                c.even_batches = a[2] != 'n';
                continue;
            }
            char name[64];
            const char *eq = strchr(a, '=');
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
            const char *v = eq ? eq + 1 : argv[++i];
            bool known;
            const char *why = apply_flag(&c, name, v, &known);
            if (why) {
                fprintf(stderr, "ember config: %s: bad value '%s' (%s)\n", name, v, why);
                return 2;
            }
        }
        const char *why = cross_check(&c);
        if (why) {
            fprintf(stderr, "ember config: %s\n", why);
            return 2;
        }
    } else {
        printf("ember config: answer each question, or press Enter to keep the value in brackets.\n");
        if (interview(&c) == ASK_EOF) {
            fprintf(stderr,
                    "ember config: stdin closed before every question was answered; nothing written\n");
            return 1;
        }
    }

    if (em_config_write(path, &c) != EM_OK) {
        fprintf(stderr, "ember config: %s\n", em_last_error());
        return 1;
    }
    printf("ember config: wrote %s\n", path);
    return 0;
}
