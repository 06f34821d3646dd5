/* traj_dump.c — helper for tests/fixtures/gen_trajectory.py (not a test):
 * trains the small trajectory GPT of test_gpt_trajectory.c for its steps and
 * writes its initial weights (init.safetensors) and every batch (batches.bin,
 * int32 x then y per step) into the directory given, so PyTorch can replay
 * the same run. */
#include <stdio.h>

#include "traj_impl.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: traj_dump DIR\n");
        return 2;
    }
    double loss[TRAJ_STEPS];
    if (traj_run(argv[1], loss)) {
        fprintf(stderr, "traj_dump: %s\n", em_last_error());
        return 1;
    }
    for (int s = 0; s < TRAJ_STEPS; s++) printf("%d %.7f\n", s, loss[s]);
    return 0;
}
