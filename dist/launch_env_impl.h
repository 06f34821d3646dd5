/* launch_env_impl.h — who started this process, read from the launcher's
 * environment in one place (dist/launch_env.c): rank, world size, local rank
 * and local world, and how the group's ranks meet (the store's address,
 * port, token, and whether this process must host the store). Used by
 * em_pg_from_env_with, the Accelerator (its local rank) and `ember train`
 * (through em_accel_local_world). Never included by users.
 *
 * Launchers, first match wins:
 *   torchrun  WORLD_SIZE is set (ember launch, torchrun, or by hand): RANK,
 *             LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 *             EMBER_STORE_TOKEN; the launcher hosts the store.
 *   mpirun    OMPI_COMM_WORLD_SIZE is set (OpenMPI's mpirun): the rank from
 *             OMPI_COMM_WORLD_RANK (else PMIX_RANK), OMPI_COMM_WORLD_LOCAL_RANK
 *             and _LOCAL_SIZE; rank 0 hosts the store.
 *   slurm     SLURM_STEP_ID and SLURM_PROCID are set (a task of a job step,
 *             i.e. started by srun; a batch script itself has no step id and
 *             is a group of one): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
 *             the local world from SLURM_STEP_TASKS_PER_NODE (else
 *             SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE) at
 *             SLURM_NODEID; rank 0 hosts the store.
 *   none      a group of one (LOCAL_RANK / LOCAL_WORLD_SIZE still honoured).
 * PMIX_RANK alone, with no world size from any launcher, is an error (a
 * group of one per process would train N separate models). */
#ifndef EMBER_LAUNCH_ENV_IMPL_H
#define EMBER_LAUNCH_ENV_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "ember/dist.h"

typedef enum launcher_kind {
    LAUNCHER_NONE = 0,
    LAUNCHER_TORCHRUN,
    LAUNCHER_MPIRUN,
    LAUNCHER_SLURM
} launcher_kind;

typedef struct launch_env {
    launcher_kind kind;
    int rank, world;             /* 0 <= rank < world */
    int local_rank, local_world; /* on this machine; default rank and world */
    long restart;                /* EMBER_RESTART_COUNT (0 when unset) */
    bool mpi; /* an MPI launcher started the process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK
               * set: mpirun, srun --mpi): em_pg_from_env's AUTO picks the MPI transport */
} launch_env;

/* "ember launch/torchrun", "mpirun", "slurm" or "none". */
const char *launcher_name(launcher_kind k);

/* Reads the ranks from the environment (see above). EM_ERR_ARG, prefixed
 * with fn, naming the variable and its value when one is malformed or out of
 * range, or when a launcher's required variable is missing. */
em_status launch_env_read(const char *fn, launch_env *e);

/* How the ranks of a group of more than one meet. */
typedef struct launch_store {
    char addr[256];  /* the store's host as given (name or address) */
    char ip[64];     /* addr resolved to a numeric IPv4 address ("" when it did not resolve) */
    int port;        /* 1..65535 */
    char token[256]; /* at least 16 characters */
    bool host;       /* this process (rank 0 of a job no launcher hosts a store for) starts the server */
    char
        port_from[96]; /* where port came from, for messages ("MASTER_PORT", "derived from SLURM_JOB_ID=7") */
} launch_store;

/* The store's settings for e (world > 1):
 *   addr   MASTER_ADDR; else under Slurm the first host of
 *          SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST); else under mpirun
 *          127.0.0.1 when every rank is on this machine.
 *   port   MASTER_PORT; else under Slurm or mpirun launch_derived_port of
 *          the job (and step) id.
 *   token  EMBER_STORE_TOKEN; else under Slurm / mpirun one made from the
 *          job (and step) id: not a secret (anyone who can read the job id
 *          can join), so a job on a shared network exports a random one.
 * EM_ERR_ARG prefixed with fn naming what is missing and how to give it
 * (under mpirun across machines: `mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`
 * unless the MPI transport is used), or a host that does not resolve. */
em_status launch_store_settings(const char *fn, const launch_env *e, launch_store *s);

/* Connects to the store s describes, presenting its token (timeout_s as
 * em_store_connect's). When s->host, first starts the server in this
 * process (on 0.0.0.0, or on s->ip when that is loopback) unless an
 * earlier call did: the server lives until the process exits, so it
 * outlives every group made from the environment. A port already in use is
 * EM_ERR_IO naming the port and where it came from. NULL + error. */
em_store *launch_store_connect(const char *fn, const launch_store *s, double timeout_s);

/* The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01",
 * "a-[1-2]" -> "a-1", "x" -> "x") into out (n bytes). EM_ERR_ARG naming the
 * list when it is empty, malformed or the name does not fit. */
em_status slurm_first_host(const char *list, char *out, size_t n);

/* The number of tasks on node `node` (0-based) of a Slurm tasks-per-node
 * list ("2(x3),1": nodes 0..2 have 2, node 3 has 1). EM_ERR_ARG naming the
 * list when it is malformed or has fewer nodes. */
em_status slurm_tasks_on_node(const char *spec, int node, int *out);

/* The store's port when no MASTER_PORT is given: 20000 + (job * 100 + step)
 * mod 10000, in [20000, 30000) (below Linux's ephemeral ports), distinct
 * for the first 100 steps of a job and for consecutive jobs. */
int launch_derived_port(unsigned long long job, unsigned long long step);

#endif
