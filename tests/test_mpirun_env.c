/* test_mpirun_env.c — `ember train` started by OpenMPI's mpirun on one
 * machine, with ember's own transports (shared memory or TCP, not MPI): the
 * ranks read OMPI_COMM_WORLD_*, rank 0 hosts the store on 127.0.0.1 at a
 * port derived from the job id, and nothing else is given. The losses and
 * gradient norms equal `ember launch -n 2`'s. Skips where mpirun is not
 * installed. (mpirun across machines: test_netns.c.) */
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define TRAIN_FLAGS                                                                                          \
    "--layers", "1", "--heads", "1", "--embd", "16", "--block", "16", "--batch", "4", "--iters", "6",        \
        "--log-every", "1", "--eval-every", "100000000", "--eval-iters", "1"

static void mpirun_matches_launch(const char *transport)
{
    if (th_run("/bin/sh", "-c", "command -v mpirun", NULL)->status != 0) th_skip("needs OpenMPI's mpirun");
    const char *clear[] = {"WORLD_SIZE",           "RANK",
                           "LOCAL_RANK",           "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR",          "MASTER_PORT",
                           "EMBER_STORE_TOKEN",    "EMBER_CONFIG_FILE",
                           "EMBER_TIMEOUT",        "EMBER_GRAD_ACCUM",
                           "EMBER_MIXED_PRECISION"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
    setenv("EMBER_TRANSPORT", transport, 1);
    setenv("EMBER_NUM_THREADS", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1); /* CI runs as root */
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char dir[PATH_MAX], txt[PATH_MAX], ref[PATH_MAX], run[PATH_MAX], want[4096], got[4096];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    setenv("XDG_CONFIG_HOME", dir, 1);
    th_pathf(ref, sizeof ref, "%s/launch", dir);
    th_pathf(run, sizeof run, "%s/mpirun", dir);
    th_run_result *r = th_run(EMBER_BIN, "launch", "-n", "2", EMBER_BIN, "train", "--data", txt, "--out", ref,
                              TRAIN_FLAGS, NULL);
    CHECK_EXIT(r, 0);
    th_train_steps(ref, want, sizeof want);
    r = th_run("/usr/bin/timeout", "60", "mpirun", "--oversubscribe", "-n", "2", EMBER_BIN, "train", "--data",
               txt, "--out", run, TRAIN_FLAGS, NULL);
    th_train_steps(run, got, sizeof got);
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "mpirun exited %d\nstdout: %s\nstderr: %s", r->status, r->out, r->err);
    CHECK(strstr(want, "\n6 ") != NULL);
    if (strcmp(got, want))
        th_fail(__FILE__, __LINE__,
                "mpirun's steps differ from ember launch's:\nmpirun:\n%sember launch:\n%s", got, want);
}

TEST(test_mpirun_two_ranks_over_shm_train_like_ember_launch_with_nothing_given)
{
    mpirun_matches_launch("shm");
}

TEST(test_mpirun_two_ranks_over_tcp_train_like_ember_launch_with_nothing_given)
{
    mpirun_matches_launch("tcp");
}
