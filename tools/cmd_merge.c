/* cmd_merge.c — `ember merge-weights DIR OUT`: the model of a checkpoint
 * em_accel_save_state wrote (ZeRO stage 3: one shard per rank; otherwise
 * one whole file) as one standard safetensors file, the file em_module_save
 * writes for that model, which em_module_load, Python's safetensors and
 * Hugging Face loaders read directly. The checkpoint is verified first
 * (manifest, every file's checksum, the shards' save and coverage); the
 * output appears whole or not at all (dist/checkpoint_model.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "dist/checkpoint_model_impl.h"
#include "ember/ember.h"

static const char merge_usage[] =
    "usage: ember merge-weights DIR OUT [--model K]\n"
    "Joins the model of the checkpoint DIR (written by save_state, e.g. `ember train`'s\n"
    "checkpoints; under ZeRO stage 3 one shard per rank) into one safetensors file OUT\n"
    "with the model's names and shapes (\"format\": \"pt\"), loadable by em_module_load\n"
    "and Python's safetensors. DIR is verified first; OUT is written whole or not at all.\n"
    "  --model K   the K-th prepared model (default 0)\n";

static int bad(const char *what, const char *word)
{
    fprintf(stderr, "ember merge-weights: %s '%s'\n\n%s", what, word, merge_usage);
    return 2;
}

int cmd_merge_weights(int argc, char **argv)
{
    const char *pos[2] = {NULL, NULL};
    int npos = 0, k = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(merge_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--model")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (!end || *end || v < 0 || v > 15)
                return bad("--model wants a model number 0-15, got", i + 1 < argc ? argv[i + 1] : "");
            k = (int)v;
            i++;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return bad("unknown flag", argv[i]);
        } else if (npos == 2) {
            return bad("unexpected argument", argv[i]);
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos < 2) {
        fprintf(stderr, "ember merge-weights: %s\n\n%s",
                npos ? "no output file given" : "no checkpoint directory given", merge_usage);
        return 2;
    }
    struct stat st;
    if (stat(pos[1], &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "ember merge-weights: the output %s is a directory; give a file name (e.g. "
                "%s/model.safetensors)\n",
                pos[1], pos[1]);
        return 1;
    }
    int n = 0;
    int64_t bytes = 0;
    if (ckpt_merge_model(pos[0], k, pos[1], &n, &bytes, "ember merge-weights")) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    printf("merged %d tensors (%.1f MB) of model %d from %s into %s\n", n, (double)bytes / 1e6, k, pos[0],
           pos[1]);
    return 0;
}
