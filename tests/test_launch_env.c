/* test_launch_env.c — reading the launcher's environment (dist/launch_env.c):
 * Slurm's compressed host lists and tasks-per-node counts, which launcher's
 * variables win, malformed values named, the store's address, port and
 * token under Slurm and mpirun, and groups formed from a Slurm-like
 * environment with rank 0 hosting the store (the Accelerator taking its
 * local rank from SLURM_LOCALID). The real launchers run in test_slurm.c and
 * test_netns.c. Each test runs in its own process, so setenv stays local. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/launch_env_impl.h"
#include "harness.h"

/* Every variable a launcher sets, cleared so the test's own environment
 * (say, a suite run under srun) does not leak in. */
static void clear_launchers(void)
{
    static const char *const vars[] = {
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "EMBER_STORE_TOKEN",
        "EMBER_RESTART_COUNT",
        "EMBER_TRANSPORT",
        "EMBER_TIMEOUT",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_MCA_ess_base_jobid",
        "PMIX_RANK",
        "PMIX_NAMESPACE",
        "PMI_RANK",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_JOB_ID",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "SLURM_NTASKS_PER_NODE",
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* Sets each "NAME=value" of the NULL-terminated list. */
static void env_set(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (const char *kv = first; kv; kv = va_arg(ap, const char *)) {
        char name[64];
        size_t n = strcspn(kv, "=");
        snprintf(name, sizeof name, "%.*s", (int)n, kv);
        setenv(name, kv[n] ? kv + n + 1 : "", 1);
    }
    va_end(ap);
}

/* A 2-task Slurm step on nodes "node[01-02]" as task `rank` sees it, 1 task per node. */
static void slurm_task(int rank)
{
    char r[16];
    snprintf(r, sizeof r, "%d", rank);
    env_set("SLURM_JOB_ID=4711", "SLURM_STEP_ID=3", NULL);
    setenv("SLURM_PROCID", r, 1);
    env_set("SLURM_NTASKS=2", "SLURM_LOCALID=0", NULL);
    setenv("SLURM_NODEID", r, 1);
    env_set("SLURM_STEP_NODELIST=node[01-02]", "SLURM_JOB_NODELIST=node[01-02]",
            "SLURM_STEP_TASKS_PER_NODE=1(x2)", NULL);
}

/* ---- Slurm's lists -------------------------------------------------------------------- */

TEST(test_slurm_first_host_expands_the_first_bracket_item_of_a_compressed_list)
{
    static const struct {
        const char *list, *want;
    } cases[] = {
        {"node[01-04,07],gpu5", "node01"},
        {"a-[1-2]", "a-1"},
        {"x", "x"},
        {"gpu5,node[01-04]", "gpu5"},
        {"node[7,1-3]", "node7"},
        {"rack[2-3]-n[08-09]", "rack2-n08"},
        {"n[009]", "n009"},
        {"host.example.org", "host.example.org"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_case("%s", cases[i].list);
        char out[64];
        CHECK_OK(slurm_first_host(cases[i].list, out, sizeof out));
        if (strcmp(out, cases[i].want))
            th_fail(__FILE__, __LINE__, "first host of '%s' is '%s', want '%s'", cases[i].list, out,
                    cases[i].want);
    }
}

TEST(test_slurm_first_host_rejects_malformed_lists_naming_them)
{
    static const char *const bad[] = {"",          ",node1",   "node[01-04", "node]",    "node[]",
                                      "node[a-b]", "node[1-]", "node[1x]",   "two words"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        th_case("'%s'", bad[i]);
        char out[64];
        CHECK_ERR(slurm_first_host(bad[i], out, sizeof out), EM_ERR_ARG, "slurm host list");
        CHECK(strstr(em_last_error(), bad[i]) != NULL);
    }
    char tiny[4];
    CHECK_ERR(slurm_first_host("node[01-02]", tiny, sizeof tiny), EM_ERR_ARG, "too long");
}

TEST(test_slurm_tasks_on_node_reads_repeat_counts)
{
    static const struct {
        const char *spec;
        int node, want;
    } cases[] = {
        {"2", 0, 2},       {"2(x3),1", 0, 2},   {"2(x3),1", 2, 2},
        {"2(x3),1", 3, 1}, {"1,4(x2),3", 2, 4}, {"1,4(x2),3", 3, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_case("%s at node %d", cases[i].spec, cases[i].node);
        int got = -1;
        CHECK_OK(slurm_tasks_on_node(cases[i].spec, cases[i].node, &got));
        if (got != cases[i].want)
            th_fail(__FILE__, __LINE__, "'%s' at node %d: %d tasks, want %d", cases[i].spec, cases[i].node,
                    got, cases[i].want);
    }
}

TEST(test_slurm_tasks_on_node_rejects_malformed_specs_and_missing_nodes)
{
    static const char *const bad[] = {"", "x", "2(x)", "2(x3", "2(3)", "0", "2,,1", "2,", "-1", "2(x3)1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        th_case("'%s'", bad[i]);
        int got;
        CHECK_ERR(slurm_tasks_on_node(bad[i], 0, &got), EM_ERR_ARG, "slurm tasks per node");
    }
    int got;
    CHECK_ERR(slurm_tasks_on_node("2(x3),1", 4, &got), EM_ERR_ARG, "has 4 nodes, no node 4");
}

TEST(test_derived_port_lies_below_the_ephemeral_range_and_differs_per_step_and_job)
{
    for (unsigned long long job = 0; job < 3000; job += 7) {
        int p = launch_derived_port(job, 0);
        CHECK(p >= 20000 && p < 30000);
        CHECK(launch_derived_port(job, 1) != p);
        CHECK(launch_derived_port(job + 1, 0) != p);
    }
}

/* ---- which launcher --------------------------------------------------------------------- */

TEST(test_launch_env_with_nothing_set_is_a_group_of_one)
{
    clear_launchers();
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_NONE && e.rank == 0 && e.world == 1 && e.local_rank == 0 && e.local_world == 1);
}

TEST(test_launch_env_torchrun_variables_win_over_mpirun_and_slurm)
{
    clear_launchers();
    slurm_task(1);
    env_set("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=3", "WORLD_SIZE=8", "RANK=5", "LOCAL_RANK=1",
            "LOCAL_WORLD_SIZE=4", NULL);
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_TORCHRUN && e.rank == 5 && e.world == 8 && e.local_rank == 1 &&
          e.local_world == 4);
}

TEST(test_launch_env_mpirun_variables_win_over_slurm)
{
    clear_launchers();
    slurm_task(1);
    env_set("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_LOCAL_RANK=1",
            "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL);
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_MPIRUN && e.rank == 3 && e.world == 4 && e.local_rank == 1 &&
          e.local_world == 2);
}

TEST(test_launch_env_mpirun_takes_the_rank_from_pmix_rank_when_that_is_all_there_is)
{
    clear_launchers();
    env_set("OMPI_COMM_WORLD_SIZE=3", "PMIX_RANK=2", NULL);
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_MPIRUN && e.rank == 2 && e.world == 3);
}

TEST(test_launch_env_pmix_rank_without_a_world_size_is_an_error)
{
    clear_launchers();
    setenv("PMIX_RANK", "1", 1);
    launch_env e;
    CHECK_ERR(launch_env_read("t", &e), EM_ERR_ARG,
              "PMIX_RANK='1' is set but no launcher says the world size");
}

TEST(test_launch_env_slurm_step_gives_rank_world_and_local_world_of_this_node)
{
    clear_launchers();
    env_set("SLURM_JOB_ID=9", "SLURM_STEP_ID=0", "SLURM_PROCID=5", "SLURM_NTASKS=7", "SLURM_LOCALID=1",
            "SLURM_NODEID=2", NULL);
    setenv("SLURM_TASKS_PER_NODE", "4(x9)", 1);        /* the job's, overridden by the step's */
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),3", 1); /* nodes 0, 1: 2 tasks; node 2: 3 */
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_SLURM && e.rank == 5 && e.world == 7 && e.local_rank == 1 && e.local_world == 3);
}

TEST(test_launch_env_slurm_batch_script_without_a_step_is_a_group_of_one)
{
    clear_launchers();
    setenv("SLURM_JOB_ID", "9", 1); /* what sbatch's script itself sees: no SLURM_STEP_ID */
    env_set("SLURM_PROCID=0", "SLURM_NTASKS=4", NULL);
    launch_env e;
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_NONE && e.world == 1);
}

TEST(test_launch_env_malformed_slurm_values_fail_naming_variable_and_value)
{
    clear_launchers();
    slurm_task(0);
    setenv("SLURM_PROCID", "two", 1);
    launch_env e;
    CHECK_ERR(launch_env_read("em_pg_from_env", &e), EM_ERR_ARG, "em_pg_from_env: SLURM_PROCID='two'");
    setenv("SLURM_PROCID", "2", 1); /* outside [0, SLURM_NTASKS) */
    CHECK_ERR(launch_env_read("em_pg_from_env", &e), EM_ERR_ARG,
              "SLURM_PROCID='2' is not an integer in [0, 1]");
    env_set("SLURM_PROCID=0", "SLURM_STEP_TASKS_PER_NODE=1(x", NULL);
    CHECK_ERR(launch_env_read("em_pg_from_env", &e), EM_ERR_ARG, "SLURM_STEP_TASKS_PER_NODE");
    env_set("SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_LOCALID=1", NULL); /* local rank 1 of 1 */
    CHECK_ERR(launch_env_read("em_pg_from_env", &e), EM_ERR_ARG, "SLURM_LOCALID=1 is not below the 1 tasks");
}

TEST(test_launch_env_malformed_mpirun_values_fail_naming_variable_and_value)
{
    clear_launchers();
    env_set("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", NULL);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1); /* more than the world */
    launch_env e;
    CHECK_ERR(launch_env_read("t", &e), EM_ERR_ARG, "OMPI_COMM_WORLD_LOCAL_SIZE='3'");
}

/* ---- where the store is ------------------------------------------------------------------ */

TEST(test_store_settings_under_slurm_come_from_the_nodelist_and_the_job_id)
{
    clear_launchers();
    slurm_task(0);
    setenv("SLURM_STEP_NODELIST", "localhost,node[01-02]", 1); /* localhost resolves anywhere */
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_OK(launch_store_settings("t", &e, &s));
    CHECK(!strcmp(s.addr, "localhost"));
    CHECK(!strncmp(s.ip, "127.", 4));
    CHECK(s.port == launch_derived_port(4711, 3));
    CHECK(strstr(s.port_from, "SLURM_JOB_ID=4711") != NULL);
    CHECK(strlen(s.token) >= 16 && strstr(s.token, "slurm") != NULL);
    CHECK(s.host); /* rank 0 hosts it: no launcher does */
}

TEST(test_store_settings_under_slurm_give_way_to_master_addr_port_and_token)
{
    clear_launchers();
    slurm_task(1);
    env_set("MASTER_ADDR=127.0.0.1", "MASTER_PORT=23456", "EMBER_STORE_TOKEN=a-token-of-sixteen-or-more",
            NULL);
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_OK(launch_store_settings("t", &e, &s));
    CHECK(!strcmp(s.addr, "127.0.0.1") && s.port == 23456 && !strcmp(s.token, "a-token-of-sixteen-or-more"));
    CHECK(!s.host); /* rank 1 */
}

TEST(test_store_settings_under_slurm_fail_when_the_first_host_does_not_resolve)
{
    clear_launchers();
    slurm_task(0);
    setenv("SLURM_STEP_NODELIST", "no-such-host-ember-test[1-2].invalid", 1);
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_ERR(launch_store_settings("t", &e, &s), EM_ERR_ARG,
              "'no-such-host-ember-test1.invalid' (from SLURM_STEP_NODELIST) does not resolve");
}

TEST(test_store_settings_under_mpirun_on_one_machine_need_no_master_addr)
{
    clear_launchers();
    env_set("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
            "OMPI_MCA_ess_base_jobid=134348801", NULL);
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_OK(launch_store_settings("t", &e, &s));
    CHECK(!strcmp(s.addr, "127.0.0.1") && s.port >= 20000 && s.port < 30000 && s.host);
}

TEST(test_store_settings_under_mpirun_across_machines_say_how_to_pass_master_addr)
{
    clear_launchers();
    env_set("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
            "OMPI_MCA_ess_base_jobid=1", NULL);
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_ERR(launch_store_settings("t", &e, &s), EM_ERR_ARG,
              "mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=<port> ..., unless the MPI transport is used");
}

TEST(test_store_settings_under_ember_launch_still_require_its_variables)
{
    clear_launchers();
    env_set("WORLD_SIZE=2", "RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", NULL);
    launch_env e;
    launch_store s;
    CHECK_OK(launch_env_read("t", &e));
    CHECK_ERR(launch_store_settings("t", &e, &s), EM_ERR_ARG, "EMBER_STORE_TOKEN is not set");
}

/* ---- groups from a Slurm-like environment --------------------------------------------------- */

/* A port nothing listens on now (a moment ago the kernel gave it out). */
static int free_port(void)
{
    em_store_server *srv = em_store_server_start(NULL, 0, "probe-token-0123456789");
    CHECK_NOTNULL(srv);
    int port = em_store_server_port(srv);
    em_store_server_stop(srv);
    return port;
}

/* Runs body(rank) as both tasks of a 2-task Slurm step on this machine
 * (MASTER_PORT = a free port; the first host is localhost unless
 * master_addr is given as MASTER_ADDR); fails when a task fails. */
static void slurm_pair(void (*body)(int rank), const char *master_addr)
{
    clear_launchers();
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            slurm_task(r);
            setenv("SLURM_NODEID", "0", 1);
            setenv("SLURM_LOCALID", r ? "1" : "0", 1);
            env_set("SLURM_STEP_TASKS_PER_NODE=2", "SLURM_STEP_NODELIST=localhost", NULL);
            setenv("MASTER_PORT", port, 1);
            if (master_addr) setenv("MASTER_ADDR", master_addr, 1);
            setenv("EMBER_TIMEOUT", "20", 1);
            alarm(30);
            body(r);
            _exit(0);
        }
    }
    int bad = -1, st[2];
    for (int r = 0; r < 2; r++) {
        waitpid(pid[r], &st[r], 0);
        if ((!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0) && bad < 0) bad = r;
    }
    if (bad >= 0) th_fail(__FILE__, __LINE__, "task %d failed (status %d)", bad, st[bad]);
}

/* Two groups, one after another: the store rank 0 hosts outlives the first. */
static void two_groups_sum(int rank)
{
    for (int round = 0; round < 2; round++) {
        em_pg *pg = em_pg_from_env();
        CHECK_NOTNULL(pg);
        CHECK(em_pg_rank(pg) == rank && em_pg_world(pg) == 2);
        float v[3] = {1.0f + (float)rank, 2.0f, 3.0f * (float)rank};
        em_tensor *t = em_from_data(EM_F32, 1, (int64_t[]){3}, v);
        CHECK_NOTNULL(t);
        CHECK_OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
        const float *got = em_data(t);
        CHECK(got[0] == 3.0f && got[1] == 4.0f && got[2] == 3.0f);
        em_free(t);
        em_pg_free(pg);
    }
}

TEST(test_slurm_env_tasks_form_groups_with_rank_0_hosting_the_store) { slurm_pair(two_groups_sum, NULL); }

/* Debian maps the host's own name to 127.0.1.1: the store rank 0 hosts
 * listens where the others look for it. */
TEST(test_slurm_env_store_on_a_loopback_address_other_than_127_0_0_1_is_reached)
{
    slurm_pair(two_groups_sum, "127.0.1.1");
}

static void accel_local_rank(int rank)
{
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK(em_accel_rank(a) == rank && em_accel_world(a) == 2);
    CHECK(em_accel_local_rank(a) == rank && em_accel_local_world(a) == 2);
    em_accelerator_free(a);
}

TEST(test_slurm_env_accelerator_takes_local_rank_and_world_from_slurm) { slurm_pair(accel_local_rank, NULL); }

TEST(test_rank_0_hosting_the_store_on_a_port_in_use_names_the_port_and_master_port)
{
    clear_launchers();
    em_store_server *busy = em_store_server_start(NULL, 0, "busy-token-0123456789");
    CHECK_NOTNULL(busy);
    char port[16];
    snprintf(port, sizeof port, "%d", em_store_server_port(busy));
    slurm_task(0);
    setenv("SLURM_STEP_NODELIST", "localhost", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("EMBER_TIMEOUT", "5", 1);
    char want[96];
    snprintf(want, sizeof want, "rank 0 cannot host the store on port %s (MASTER_PORT", port);
    CHECK_ERR(em_pg_from_env(), EM_ERR_IO, want);
    em_store_server_stop(busy);
}

/* launch_env.mpi (em_pg_from_env's AUTO then picks the MPI transport): set by
 * OpenMPI's mpirun, by PMIx (srun --mpi=pmix) and by PMI (MPICH's hydra),
 * not by ember launch or a plain srun step. */
TEST(test_launch_env_says_an_mpi_launcher_started_the_process)
{
    launch_env e;
    clear_launchers();
    env_set("WORLD_SIZE=2", "RANK=1", NULL);
    CHECK_OK(launch_env_read("t", &e));
    CHECK(!e.mpi);
    clear_launchers();
    slurm_task(1);
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_SLURM && !e.mpi);
    env_set("PMIX_RANK=1", NULL); /* srun --mpi=pmix */
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_SLURM && e.mpi);
    clear_launchers();
    env_set("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", NULL);
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_MPIRUN && e.mpi);
    clear_launchers();
    env_set("PMI_RANK=0", NULL); /* MPICH: rank and world come from MPI itself */
    CHECK_OK(launch_env_read("t", &e));
    CHECK(e.kind == LAUNCHER_NONE && e.mpi);
}
