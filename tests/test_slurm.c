/* test_slurm.c — `ember train` under Slurm's own launcher, no `ember launch`:
 * a 2-task `srun` job trains with both tasks in one group of 2 and prints
 * the losses and gradient norms `ember launch -n 2` does, and the sbatch example
 * (examples/slurm/train.sbatch) runs as a batch job.
 *
 * The cluster is one node (this host, 4 CPUs declared) that
 * scripts/slurm_setup.sh installs (Debian's slurm-wlm and munge), configures
 * and starts as root; scripts/run_tests.sh starts it before the suites and
 * stops it after. A test run on its own starts it too and then stops it
 * (when it was not running before). Where it cannot start (not root, no
 * package, a daemon that fails) the tests skip with the script's reason.
 *
 * `srun --mpi=pmix` starts MPI programs itself (Slurm's PMIx plugin, no
 * mpirun): ember then picks its MPI transport by itself (PMIX_RANK in the
 * environment); those tests skip where ember has no MPI transport or this
 * Slurm has no pmix plugin. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember_config.h"
#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define SETUP EMBER_SOURCE_DIR "/scripts/slurm_setup.sh"

/* The cluster's directory (scripts/slurm_setup.sh's default unless EMBER_SLURM_DIR says). */
static const char *slurm_dir(void)
{
    const char *d = getenv("EMBER_SLURM_DIR");
    return d && *d ? d : "/tmp/ember-slurm";
}

static bool exists(const char *dir, const char *name)
{
    char p[512];
    th_pathf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* The tiny run both launchers do: 1 layer, 16 wide, 6 steps, every loss printed. */
#define TRAIN_FLAGS                                                                                          \
    "--layers", "1", "--heads", "1", "--embd", "16", "--block", "16", "--batch", "4", "--iters", "6",        \
        "--log-every", "1", "--eval-every", "100000000", "--eval-iters", "1"

/* Runs scenario(corpus dir, corpus file) in a child on a running cluster,
 * starting the cluster first (skipping with the reason when it cannot) and
 * stopping it afterwards when this test started it. */
static void with_cluster(void (*scenario)(const char *dir, const char *txt))
{
    const char *d = slurm_dir();
    bool was_up = exists(d, "ready");
    th_run_result *r = th_run("/bin/bash", SETUP, "start", NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "%s start exited %d: %s", SETUP, r->status, r->err);
    if (!exists(d, "ready")) {
        char why[600] = "scripts/slurm_setup.sh gave no reason", p[512];
        th_pathf(p, sizeof p, "%s/unavailable", d);
        FILE *f = fopen(p, "r");
        if (f) {
            if (!fgets(why, sizeof why, f)) snprintf(why, sizeof why, "%s is empty", p);
            fclose(f);
        }
        why[strcspn(why, "\n")] = '\0';
        char msg[700];
        snprintf(msg, sizeof msg, "no Slurm cluster: %s", why);
        th_skip(msg);
    }
    char conf[512];
    th_pathf(conf, sizeof conf, "%s/slurm.conf", d);
    setenv("SLURM_CONF", conf, 1);
    setenv("EMBER_NUM_THREADS", "1", 1);
    const char *clear[] = {"WORLD_SIZE",          "RANK",
                           "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR",         "MASTER_PORT",
                           "EMBER_STORE_TOKEN",   "EMBER_TRANSPORT",
                           "EMBER_CONFIG_FILE",   "EMBER_TIMEOUT",
                           "EMBER_GRAD_ACCUM",    "EMBER_MIXED_PRECISION",
                           "EMBER_SPLIT_BATCHES", "EMBER_EVEN_BATCHES"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
    char dir[PATH_MAX], txt[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    setenv("XDG_CONFIG_HOME", dir, 1); /* no config file: the flags say everything */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(120);
        scenario(dir, txt);
        _exit(0);
    }
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    if (!was_up) th_run("/bin/bash", SETUP, "stop", NULL);
    if (pid < 0) th_fail(__FILE__, __LINE__, "fork failed");
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st)); /* the child's th_fail / th_skip said why */
    th_fail(__FILE__, __LINE__, "the scenario died of signal %d", WTERMSIG(st));
}

/* A 2-task srun of ember train (mpi: under --mpi=pmix) trains to ember
 * launch -n 2's losses and gradient norms. */
static void srun_train_like_launch(const char *dir, const char *txt, const char *mpi)
{
    char out_launch[PATH_MAX], out_srun[PATH_MAX], want[4096], got[4096];
    th_pathf(out_launch, sizeof out_launch, "%s/launch", dir);
    th_pathf(out_srun, sizeof out_srun, "%s/srun", dir);
    th_run_result *r = th_run(EMBER_BIN, "launch", "-n", "2", EMBER_BIN, "train", "--data", txt, "--out",
                              out_launch, TRAIN_FLAGS, NULL);
    CHECK_EXIT(r, 0);
    th_train_steps(out_launch, want, sizeof want);
    CHECK(strstr(want, "\n6 ") != NULL);
    /* -l: each line says which task wrote it; --kill-on-bad-exit: a failed task ends the step */
    r = th_run("/usr/bin/timeout", "60", "srun", mpi, "-n", "2", "-l", "--kill-on-bad-exit=1", EMBER_BIN,
               "train", "--data", txt, "--out", out_srun, TRAIN_FLAGS, NULL);
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "srun %s exited %d\nstdout: %s\nstderr: %s", mpi, r->status, r->out,
                r->err);
    /* both tasks joined one group of 2: rank 0 says so, and every step is rank 0's */
    if (!strstr(r->out, "0: ember train:") || !strstr(r->out, "(2 on each of 2 processes)"))
        th_fail(__FILE__, __LINE__, "rank 0 did not train as one of 2 processes:\n%s", r->out);
    CHECK(strstr(r->out, "0: ember train: done") != NULL);
    th_train_steps(out_srun, got, sizeof got);
    if (strcmp(got, want))
        th_fail(__FILE__, __LINE__,
                "srun %s's losses differ from ember launch's:\nsrun:\n%sember launch:\n%s", mpi, got, want);
}

static void srun_matches_launch(const char *dir, const char *txt)
{
    srun_train_like_launch(dir, txt, "--mpi=none");
}

TEST(test_slurm_srun_two_tasks_of_ember_train_match_ember_launch_losses)
{
    with_cluster(srun_matches_launch);
}

static void sbatch_example(const char *dir, const char *txt)
{
    char out[PATH_MAX], log[PATH_MAX];
    th_pathf(out, sizeof out, "%s/run", dir);
    snprintf(log, sizeof log, "--output=%s/job.out", dir);
    setenv("EMBER", EMBER_BIN, 1);
    setenv("DATA", txt, 1);
    setenv("OUT", out, 1);
    /* one node here: the command line overrides the script's --nodes=2 */
    th_run_result *r = th_run("/usr/bin/timeout", "20", "sbatch", "--parsable", "--nodes=1", "--ntasks=2",
                              "--ntasks-per-node=2", log, EMBER_SOURCE_DIR "/examples/slurm/train.sbatch",
                              TRAIN_FLAGS, NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "sbatch exited %d: %s", r->status, r->err);
    char job[32];
    snprintf(job, sizeof job, "%.*s", (int)strcspn(r->out, ";\n"), r->out);
    /* its end, looked for every 0.1 s (sbatch --wait looks every few seconds) */
    char state[64] = "";
    for (int i = 0; i < 600; i++, usleep(100000)) {
        r = th_run("/bin/sh", "-c", "scontrol -o show job \"$0\" | grep -o 'JobState=[A-Z_]*'", job, NULL);
        snprintf(state, sizeof state, "%.*s", (int)strcspn(r->out, "\n"), r->out);
        if (state[0] && !strstr(state, "PENDING") && !strstr(state, "RUNNING") &&
            !strstr(state, "CONFIGURING") && !strstr(state, "COMPLETING"))
            break;
    }
    char path[PATH_MAX], text[8192] = "";
    th_pathf(path, sizeof path, "%s/job.out", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = '\0';
        fclose(f);
    }
    if (strcmp(state, "JobState=COMPLETED")) {
        th_run("/bin/sh", "-c", "scancel \"$0\"", job, NULL);
        th_fail(__FILE__, __LINE__, "job %s ended %s\njob output:\n%s", job,
                state[0] ? state : "(not in 60 s)", text);
    }
    if (!strstr(text, "(2 on each of 2 processes)") || !strstr(text, "step 6/6 loss") ||
        !strstr(text, "ember train: done"))
        th_fail(__FILE__, __LINE__, "the job did not train as 2 processes to the end:\n%s", text);
    th_pathf(path, sizeof path, "%s/model.safetensors", out);
    CHECK(access(path, R_OK) == 0);
}

TEST(test_slurm_sbatch_example_trains_two_tasks_to_the_end) { with_cluster(sbatch_example); }

/* ---- srun --mpi=pmix: the MPI transport without mpirun ---------------------------------- */

/* Skips unless ember has the MPI transport and srun the pmix plugin; under
 * ASan the tasks run without LeakSanitizer (OpenMPI leaks by design, see
 * tests/test_mpi.c). */
static void need_srun_pmix(void)
{
#if !EM_HAVE_MPI
    th_skip("ember was built without MPI (install openmpi-bin and libopenmpi-dev, then reconfigure)");
#endif
    th_run_result *r = th_run("/bin/sh", "-c", "srun --mpi=list 2>&1", NULL);
    if (!strstr(r->out, "pmix")) th_skip("this Slurm's srun has no pmix plugin (srun --mpi=list)");
    setenv("ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1", 1);
    setenv("LSAN_OPTIONS", "detect_leaks=0", 1);
}

/* Two tasks of mpi_worker: every collective, dtype and op over the MPI
 * transport, which the worker checks it is (em_pg_transport). */
static void srun_pmix_collectives(const char *dir, const char *txt)
{
    (void)dir, (void)txt;
    need_srun_pmix();
    th_run_result *r =
        th_run("/usr/bin/timeout", "60", "srun", "--mpi=pmix", "-n", "2", "-l", "--kill-on-bad-exit=1",
               EMBER_BUILD_DIR "/tests/mpi_worker", "collectives", NULL);
    if (r->status != 0 || !strstr(r->out, "rank 0 ok") || !strstr(r->out, "rank 1 ok"))
        th_fail(__FILE__, __LINE__, "srun --mpi=pmix exited %d\nstdout: %s\nstderr: %s", r->status, r->out,
                r->err);
}

TEST(test_slurm_srun_mpi_pmix_runs_every_collective_over_the_mpi_transport)
{
    with_cluster(srun_pmix_collectives);
}

/* ember train in two tasks started by srun --mpi=pmix: the MPI transport,
 * chosen by itself, trains to ember launch -n 2's losses. */
static void srun_pmix_train(const char *dir, const char *txt)
{
    need_srun_pmix();
    srun_train_like_launch(dir, txt, "--mpi=pmix");
}

TEST(test_slurm_srun_mpi_pmix_ember_train_matches_ember_launch_losses) { with_cluster(srun_pmix_train); }
