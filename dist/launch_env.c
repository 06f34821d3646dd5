/* launch_env.c — the launcher's environment read in one place: which
 * launcher started this process (ember launch / torchrun, OpenMPI's mpirun,
 * a Slurm job step, or none), this process's rank, world, local rank and
 * local world, and where the group's store is, hosting it in rank 0 when no
 * launcher does. The order and every variable are in launch_env_impl.h. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dist/launch_env_impl.h"
#include "tensor/error_impl.h"

const char *launcher_name(launcher_kind k)
{
    switch (k) {
    case LAUNCHER_NONE: return "none";
    case LAUNCHER_TORCHRUN: return "ember launch/torchrun";
    case LAUNCHER_MPIRUN: return "mpirun";
    case LAUNCHER_SLURM: return "slurm";
    }
    return "?";
}

static const char *env(const char *var)
{
    const char *v = getenv(var);
    return v && *v ? v : NULL;
}

/* var as an integer in [lo, hi] into *out when set; EM_ERR_ARG naming it
 * when malformed, or when missing and required. */
static em_status env_long(const char *fn, const char *var, long lo, long hi, bool required, long *out)
{
    const char *v = env(var);
    if (!v) return required ? em_err(EM_ERR_ARG, "%s: %s is not set", fn, var) : EM_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return em_err(EM_ERR_ARG, "%s: %s='%s' is not an integer in [%ld, %ld]", fn, var, v, lo, hi);
    *out = x;
    return EM_OK;
}

static em_status env_int(const char *fn, const char *var, int lo, int hi, bool required, int *out)
{
    long x = *out;
    em_status s = env_long(fn, var, lo, hi, required, &x);
    if (!s) *out = (int)x;
    return s;
}

#define MAX_WORLD (1 << 20)

/* ---- Slurm's lists ------------------------------------------------------------------ */

em_status slurm_first_host(const char *list, char *out, size_t n)
{
    size_t k = 0;
    const char *p = list ? list : "";
    /* the first host: the text up to the first top-level comma, each [..] group replaced by its first number
     */
    for (; *p && *p != ','; p++) {
        if (*p == ']') return em_err(EM_ERR_ARG, "slurm host list '%s': ']' without '['", list);
        if (*p != '[') {
            if (isspace((unsigned char)*p))
                return em_err(EM_ERR_ARG, "slurm host list '%s' has a space", list);
            if (k + 1 >= n)
                return em_err(EM_ERR_ARG, "slurm host list '%s': the first name is too long", list);
            out[k++] = *p;
            continue;
        }
        const char *close = strchr(p, ']');
        if (!close) return em_err(EM_ERR_ARG, "slurm host list '%s': '[' without ']'", list);
        const char *d = p + 1;
        size_t digits = strspn(d, "0123456789");
        /* the group's first item: N or N-M, then ',' or ']' */
        const char *after = d + digits;
        if (digits && *after == '-') {
            size_t m = strspn(after + 1, "0123456789");
            if (!m) return em_err(EM_ERR_ARG, "slurm host list '%s': malformed range in [...]", list);
            after += 1 + m;
        }
        if (!digits || (after != close && *after != ','))
            return em_err(EM_ERR_ARG, "slurm host list '%s': [...] must hold numbers and ranges (N, N-M)",
                          list);
        if (k + digits >= n)
            return em_err(EM_ERR_ARG, "slurm host list '%s': the first name is too long", list);
        memcpy(out + k, d, digits);
        k += digits;
        p = close;
    }
    if (!k) return em_err(EM_ERR_ARG, "slurm host list '%s' names no host", list ? list : "");
    out[k] = '\0';
    return EM_OK;
}

em_status slurm_tasks_on_node(const char *spec, int node, int *out)
{
    const char *p = spec ? spec : "";
    long first = 0; /* the first node the current item covers */
    int found = 0;  /* the whole list is checked, not only up to the node */
    while (*p) {
        char *end;
        errno = 0;
        long tasks = strtol(p, &end, 10), reps = 1;
        if (errno || end == p || !isdigit((unsigned char)*p) || tasks < 1 || tasks > MAX_WORLD) break;
        p = end;
        if (!strncmp(p, "(x", 2)) {
            errno = 0;
            reps = strtol(p + 2, &end, 10);
            if (errno || end == p + 2 || !isdigit((unsigned char)p[2]) || *end != ')' || reps < 1 ||
                reps > MAX_WORLD)
                break;
            p = end + 1;
        }
        if (*p && (*p != ',' || !p[1])) break;
        if (*p) p++;
        if (node >= first && node < first + reps) found = (int)tasks;
        first += reps;
        if (!*p) {
            if (!found)
                return em_err(EM_ERR_ARG, "slurm tasks per node '%s' has %ld node%s, no node %d", spec, first,
                              first == 1 ? "" : "s", node);
            *out = found;
            return EM_OK;
        }
    }
    return em_err(EM_ERR_ARG, "slurm tasks per node '%s' is malformed (want e.g. 2(x3),1)", spec ? spec : "");
}

int launch_derived_port(unsigned long long job, unsigned long long step)
{
    return 20000 + (int)((job % 10000 * 100 + step % 100) % 10000);
}

/* ---- the ranks ----------------------------------------------------------------------- */

static em_status read_torchrun(const char *fn, launch_env *e)
{
    em_status s = env_int(fn, "WORLD_SIZE", 1, MAX_WORLD, true, &e->world);
    if (!s && e->world > 1) s = env_int(fn, "RANK", 0, e->world - 1, true, &e->rank); /* alone: rank 0 */
    return s;
}

static em_status read_mpirun(const char *fn, launch_env *e)
{
    em_status s = env_int(fn, "OMPI_COMM_WORLD_SIZE", 1, MAX_WORLD, true, &e->world);
    if (s) return s;
    const char *rv = env("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "PMIX_RANK";
    return env_int(fn, rv, 0, e->world - 1, true, &e->rank);
}

static em_status read_slurm(const char *fn, launch_env *e)
{
    em_status s = env_int(fn, "SLURM_NTASKS", 1, MAX_WORLD, false, &e->world);
    if (!s && !env("SLURM_NTASKS")) s = env_int(fn, "SLURM_NPROCS", 1, MAX_WORLD, true, &e->world);
    if (!s) s = env_int(fn, "SLURM_PROCID", 0, e->world - 1, true, &e->rank);
    if (s) return s;
    e->local_rank = 0;
    if ((s = env_int(fn, "SLURM_LOCALID", 0, e->world - 1, true, &e->local_rank))) return s;
    int node = 0;
    if ((s = env_int(fn, "SLURM_NODEID", 0, MAX_WORLD, false, &node))) return s;
    static const char *const per_node[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                           "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof per_node / sizeof per_node[0]; i++) {
        const char *v = env(per_node[i]);
        if (!v) continue;
        if (slurm_tasks_on_node(v, i == 2 ? 0 : node, &e->local_world))
            return em_err(EM_ERR_ARG, "%s: %s (SLURM_NODEID=%d): %s", fn, per_node[i], node, em_last_error());
        if (e->local_rank >= e->local_world)
            return em_err(EM_ERR_ARG, "%s: SLURM_LOCALID=%d is not below the %d tasks %s='%s' gives node %d",
                          fn, e->local_rank, e->local_world, per_node[i], v, node);
        return EM_OK;
    }
    e->local_world = e->world; /* no per-node count: assume one machine */
    return EM_OK;
}

em_status launch_env_read(const char *fn, launch_env *e)
{
    *e = (launch_env){.kind = LAUNCHER_NONE,
                      .world = 1,
                      .mpi = env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK")};
    em_status s = EM_OK;
    if (env("WORLD_SIZE"))
        e->kind = LAUNCHER_TORCHRUN;
    else if (env("OMPI_COMM_WORLD_SIZE"))
        e->kind = LAUNCHER_MPIRUN;
    else if (env("SLURM_STEP_ID") && env("SLURM_PROCID"))
        e->kind = LAUNCHER_SLURM;
    else if (env("PMIX_RANK"))
        return em_err(EM_ERR_ARG,
                      "%s: PMIX_RANK='%s' is set but no launcher says the world size (OMPI_COMM_WORLD_SIZE, "
                      "SLURM_NTASKS with SLURM_STEP_ID, or WORLD_SIZE)",
                      fn, env("PMIX_RANK"));
    switch (e->kind) {
    case LAUNCHER_TORCHRUN: s = read_torchrun(fn, e); break;
    case LAUNCHER_MPIRUN: s = read_mpirun(fn, e); break;
    case LAUNCHER_SLURM: s = read_slurm(fn, e); break;
    case LAUNCHER_NONE: break;
    }
    if (s) return s;
    if (e->kind != LAUNCHER_SLURM) {
        e->local_rank = e->rank;
        e->local_world = e->world;
    }
    if (e->kind == LAUNCHER_MPIRUN) {
        if ((s = env_int(fn, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, e->world, false, &e->local_world)) ||
            (s = env_int(fn, "OMPI_COMM_WORLD_LOCAL_RANK", 0, e->local_world - 1, false, &e->local_rank)))
            return s;
    } else if (e->kind != LAUNCHER_SLURM) { /* torchrun's names (also honoured for a group of one) */
        if ((s = env_int(fn, "LOCAL_WORLD_SIZE", 1, MAX_WORLD, false, &e->local_world)) ||
            (s = env_int(fn, "LOCAL_RANK", 0, MAX_WORLD, false, &e->local_rank)))
            return s;
    }
    return env_long(fn, "EMBER_RESTART_COUNT", 0, MAX_WORLD, false, &e->restart);
}

/* ---- where the store is --------------------------------------------------------------- */

/* host resolved to a numeric IPv4 address into ip (n bytes); false when it does not resolve */
static bool resolve4(const char *host, char *ip, size_t n)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) || !res) return false;
    bool ok = inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, (socklen_t)n) != NULL;
    freeaddrinfo(res);
    return ok;
}

/* The job's id and step under Slurm or mpirun (for the derived port and token). */
static em_status job_ids(const char *fn, launcher_kind k, unsigned long long *job, unsigned long long *step,
                         char *what, size_t n)
{
    long j = 0, st = 0;
    *job = *step = 0;
    if (k == LAUNCHER_SLURM) {
        em_status s = env_long(fn, "SLURM_JOB_ID", 0, 0x7fffffffL, true, &j);
        if (!s) s = env_long(fn, "SLURM_STEP_ID", 0, 0x7fffffffL, true, &st);
        if (s) return s;
        snprintf(what, n, "SLURM_JOB_ID=%ld, SLURM_STEP_ID=%ld", j, st);
        *job = (unsigned long long)j, *step = (unsigned long long)st;
        return EM_OK;
    }
    /* mpirun: its job id (a number in OpenMPI 4, a name in PMIx's namespace otherwise) */
    const char *v = env("OMPI_MCA_ess_base_jobid");
    const char *var = "OMPI_MCA_ess_base_jobid";
    if (!v) v = env("PMIX_NAMESPACE"), var = "PMIX_NAMESPACE";
    if (!v)
        return em_err(EM_ERR_ARG, "%s: mpirun set neither OMPI_MCA_ess_base_jobid nor PMIX_NAMESPACE", fn);
    unsigned long long h = 1469598103934665603ULL; /* FNV-1a of the text */
    for (const char *c = v; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    *job = h;
    snprintf(what, n, "%s=%s", var, v);
    return EM_OK;
}

em_status launch_store_settings(const char *fn, const launch_env *e, launch_store *s)
{
    *s = (launch_store){0};
    bool ours = e->kind == LAUNCHER_SLURM || e->kind == LAUNCHER_MPIRUN; /* no launcher hosts a store */
    const char *addr = env("MASTER_ADDR"), *token = env("EMBER_STORE_TOKEN");
    long port = 0;
    em_status st = env_long(fn, "MASTER_PORT", 1, 65535, !ours, &port);
    if (st) return st;
    if (!ours && !addr) return em_err(EM_ERR_ARG, "%s: MASTER_ADDR is not set", fn);
    if (!ours && !token)
        return em_err(EM_ERR_ARG, "%s: EMBER_STORE_TOKEN is not set (start the job with ember launch)", fn);
    char from[160] = "";
    unsigned long long job = 0, step = 0;
    if (ours && (!port || !token) && (st = job_ids(fn, e->kind, &job, &step, from, sizeof from))) return st;
    const char *addr_from = "MASTER_ADDR";
    char first[256];
    if (!addr && e->kind == LAUNCHER_SLURM) {
        addr_from = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
        const char *list = env(addr_from);
        if (!list)
            return em_err(EM_ERR_ARG,
                          "%s: under Slurm without MASTER_ADDR, SLURM_STEP_NODELIST or "
                          "SLURM_JOB_NODELIST must name the nodes",
                          fn);
        if (slurm_first_host(list, first, sizeof first))
            return em_err(EM_ERR_ARG, "%s: %s: %s", fn, addr_from, em_last_error());
        addr = first;
    } else if (!addr && e->local_world == e->world) {
        addr = "127.0.0.1", addr_from = "every rank on this machine"; /* mpirun on one machine */
    } else if (!addr) {
        return em_err(
            EM_ERR_ARG,
            "%s: started by mpirun with %d ranks on more than one machine (OMPI_COMM_WORLD_LOCAL_SIZE "
            "%d): the TCP/shm transports need MASTER_ADDR (rank 0's host) and MASTER_PORT (a free port "
            "there): mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=<port> ..., unless the MPI transport "
            "is used (EMBER_TRANSPORT=mpi)",
            fn, e->world, e->local_world);
    }
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    if (!resolve4(s->addr, s->ip, sizeof s->ip)) {
        s->ip[0] = '\0';
        if (ours)
            return em_err(EM_ERR_ARG,
                          "%s: the store's host '%s' (from %s) does not resolve to an IPv4 address", fn,
                          s->addr, addr_from);
    }
    if (port) {
        s->port = (int)port;
        snprintf(s->port_from, sizeof s->port_from, "MASTER_PORT");
    } else {
        s->port = launch_derived_port(job, step);
        snprintf(s->port_from, sizeof s->port_from, "derived from %.80s", from);
    }
    if (token) {
        if (strlen(token) >= sizeof s->token)
            return em_err(EM_ERR_ARG, "%s: EMBER_STORE_TOKEN has %zu characters; at most %zu", fn,
                          strlen(token), sizeof s->token - 1);
        snprintf(s->token, sizeof s->token, "%s", token);
    } else {
        snprintf(s->token, sizeof s->token, "ember-%s-job-%llx-step-%llu",
                 e->kind == LAUNCHER_SLURM ? "slurm" : "mpirun", job, step);
    }
    s->host = ours && e->rank == 0;
    return EM_OK;
}

/* The store rank 0 hosts, once per process. */
static pthread_mutex_t hosted_mu = PTHREAD_MUTEX_INITIALIZER;
static em_store_server *hosted;

static em_status host_store(const char *fn, const launch_store *s)
{
    pthread_mutex_lock(&hosted_mu);
    em_status st = EM_OK;
    if (!hosted) {
        /* a loopback address (127.0.1.1 is Debian's for the host's own name) only there */
        bool loop = s->ip[0] && !strncmp(s->ip, "127.", 4);
        hosted = em_store_server_start(loop ? s->ip : "0.0.0.0", s->port, s->token);
        if (!hosted)
            st =
                em_err(em_last_status(),
                       "%s: rank 0 cannot host the store on port %d (%s; set MASTER_PORT to a free port): %s",
                       fn, s->port, s->port_from, em_last_error());
    }
    pthread_mutex_unlock(&hosted_mu);
    return st;
}

em_store *launch_store_connect(const char *fn, const launch_store *s, double timeout_s)
{
    if (s->host && host_store(fn, s)) return NULL;
    return em_store_connect(s->ip[0] ? s->ip : s->addr, s->port, s->token, timeout_s);
}
