/* ember.c — the `ember` command: reads the subcommand and hands the rest of
 * the arguments to it (tools/commands.h). Bad usage exits 2 with a message
 * naming the offending word, then the usage text, on stderr. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "ember/ember.h"

static const char usage_text[] =
    "usage: ember <command> [args]\n"
    "\n"
    "commands:\n"
    "  env [--json]         describe this build and machine (CPU features, threads, BLAS, CUDA)\n"
    "  test [--suite]       2-process self-check of collectives and DDP (--suite: this build's unit tests)\n"
    "  train --data FILE    train a character-level GPT on a text file (ember train --help)\n"
    "  sample --ckpt DIR    generate text from a model `ember train` wrote (ember sample --help)\n"
    "  plot METRICS.jsonl   draw the losses and learning rate of a run as an SVG (ember plot --help)\n"
    "  estimate-memory      memory per rank of training a GPT, by category and ZeRO stage (--help)\n"
    "  merge-weights        join a checkpoint's model (ZeRO-3 shards) into one safetensors file (--help)\n"
    "  launch -n N PROG     run PROG as N processes of one distributed job (ember launch --help)\n"
    "  config               write the default distributed/training config file (ember config --help)\n"
    "  demo                 train a small MLP with the autograd engine and print its falling loss\n"
    "  version              print ember's version\n"
    "  help                 print this text (also --help, -h)\n";

static void usage(FILE *to) { fputs(usage_text, to); }

/* "ember: <what> '<word>'", then the usage; exit status 2 */
static int bad_usage(const char *what, const char *word)
{
    fprintf(stderr, "ember: %s '%s'\n\n", what, word);
    usage(stderr);
    return 2;
}

static bool is_help(const char *s) { return !strcmp(s, "help") || !strcmp(s, "--help") || !strcmp(s, "-h"); }

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    if (is_help(cmd)) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (argc > 2) return bad_usage("version: unexpected argument", argv[2]);
        printf("ember %s\n", em_version());
        return 0;
    }
    if (em_profile_env()) { /* EMBER_PROFILE that is not a boolean */
        fprintf(stderr, "ember %s: %s\n", cmd, em_last_error());
        return 1;
    }
    if (!strcmp(cmd, "env")) return cmd_env(sub_argc, sub_argv);
    if (!strcmp(cmd, "test")) return cmd_test(sub_argc, sub_argv);
    if (!strcmp(cmd, "demo")) return cmd_demo(sub_argc, sub_argv);
    if (!strcmp(cmd, "train")) return cmd_train(sub_argc, sub_argv);
    if (!strcmp(cmd, "sample")) return cmd_sample(sub_argc, sub_argv);
    if (!strcmp(cmd, "plot")) return cmd_plot(sub_argc, sub_argv);
    if (!strcmp(cmd, "estimate-memory")) return cmd_estimate_memory(sub_argc, sub_argv);
    if (!strcmp(cmd, "merge-weights")) return cmd_merge_weights(sub_argc, sub_argv);
    if (!strcmp(cmd, "launch")) return cmd_launch(sub_argc, sub_argv);
    if (!strcmp(cmd, "config")) return cmd_config(sub_argc, sub_argv);
    if (cmd[0] == '-') return bad_usage("unknown flag", cmd);
    return bad_usage("unknown command", cmd);
}
