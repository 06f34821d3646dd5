/* ember/dist.h — distribution: the rendezvous store, process groups and their
 * collectives (CPU backend), DDP, and the Accelerator that ties prepare /
 * backward / accumulate / step / save together.
 *
 * The same program runs alone or under a launcher, whose environment says
 * its rank, the world size, its local rank and local world, and where the
 * store is (the first launcher whose variables are set wins):
 *   `ember launch -n N` (or torchrun): RANK, LOCAL_RANK, WORLD_SIZE,
 *     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's names) plus
 *     EMBER_STORE_TOKEN (the job's secret) and EMBER_RESTART_COUNT; the
 *     launcher hosts the store at MASTER_ADDR:MASTER_PORT.
 *   OpenMPI's mpirun: OMPI_COMM_WORLD_RANK (else PMIX_RANK), _SIZE,
 *     _LOCAL_RANK, _LOCAL_SIZE. Rank 0 hosts the store in-process at
 *     MASTER_ADDR:MASTER_PORT; on one machine they default to 127.0.0.1 and
 *     a port derived from the job id, across machines MASTER_ADDR is needed
 *     (`mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`).
 *   A Slurm job step (srun; SLURM_STEP_ID set): SLURM_PROCID, SLURM_NTASKS,
 *     SLURM_LOCALID, the local world from SLURM_STEP_TASKS_PER_NODE (else
 *     SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE) at SLURM_NODEID. Rank 0
 *     hosts the store in-process at MASTER_ADDR, else the first host of
 *     SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), port MASTER_PORT, else
 *     20000 + (SLURM_JOB_ID * 100 + SLURM_STEP_ID) mod 10000.
 * Under mpirun and Slurm without EMBER_STORE_TOKEN the token is made from
 * the job (and step) id: not a secret. The store rank 0 hosts lives until
 * its process exits (it outlives every group made from the environment).
 * With none of these a program is a group of one and needs no store.
 *
 * Under an MPI launcher (`mpirun -n N`, `srun --mpi`: OMPI_COMM_WORLD_SIZE,
 * PMIX_RANK or PMI_RANK in the environment) em_pg_from_env uses the MPI
 * transport when ember is built with MPI: rank and world are
 * MPI_COMM_WORLD's, and rank 0 hosts the store itself (its address and a
 * random token go to the others with MPI), so none of the variables above
 * is needed.
 *
 * Failure is never a hang: every blocking call has a timeout, a dead peer is
 * noticed (its sockets close), and every collective first checks that all
 * ranks called the same operation with the same dtype, count and root; a
 * mismatch fails on every rank with EM_ERR_DIST and a message naming both
 * ranks and both calls. After a collective fails the group is broken: every
 * later call fails fast with EM_ERR_DIST (free it and start over). */
#ifndef EMBER_DIST_H
#define EMBER_DIST_H

#include "amp.h"
#include "data.h"
#include "nn.h"
#include "optim.h"
#include "tensor.h"
#include "tracker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* Seconds a blocking call waits when a config says 0 (EMBER_TIMEOUT in the
 * environment overrides it for em_pg_from_env and the Accelerator, whose
 * em_accel_config.timeout_s overrides both). */
#define EM_DIST_DEFAULT_TIMEOUT 300.0

/* ---- the rendezvous store (dist/store.c) --------------------------------------
 * A TCP key-value store. The server runs in a thread of the process that
 * starts it (ember launch); clients connect and must first present the job's
 * token, or are disconnected. Values are byte strings (at most 64 MiB), keys
 * NUL-terminated strings (at most 1023 bytes). */
typedef struct em_store_server em_store_server;
typedef struct em_store em_store;

/* Starts a server listening on host:port (host NULL = "127.0.0.1", loopback
 * only; "0.0.0.0" for a job spanning machines; port 0 = a free port, see
 * em_store_server_port) that accepts clients presenting token (copied; at
 * least 16 characters). NULL + EM_ERR_ARG / EM_ERR_IO (naming host:port and
 * the system's reason) on failure. */
em_store_server *em_store_server_start(const char *host, int port, const char *token);
int em_store_server_port(const em_store_server *s);
/* Stops the thread, closes every connection, frees. NULL is a no-op. */
void em_store_server_stop(em_store_server *s);

/* Connects to host:port presenting token, retrying until timeout_s (0 =
 * EM_DIST_DEFAULT_TIMEOUT) while nothing listens yet. The timeout is also the
 * one every later call on this client uses. NULL + EM_ERR_ARG / EM_ERR_DIST
 * (refused token, naming host:port) / EM_ERR_TIMEOUT. A client is used by one
 * thread at a time. */
em_store *em_store_connect(const char *host, int port, const char *token, double timeout_s);
void em_store_close(em_store *s); /* NULL is a no-op */
/* key := value[0..n) (overwrites). */
em_status em_store_set(em_store *s, const char *key, const void *value, size_t n);
/* Waits (up to the client's timeout) until key exists, then returns a copy of
 * its value in *value (malloc'd, NUL-terminated after n bytes; the caller
 * frees) and its length in *n (n may be NULL). EM_ERR_TIMEOUT names the key. */
em_status em_store_get(em_store *s, const char *key, void **value, size_t *n);
/* Atomically adds delta to the integer at key (0 when absent; the value is
 * stored as decimal text) and returns the new value in *result (may be NULL). */
em_status em_store_add(em_store *s, const char *key, int64_t delta, int64_t *result);
/* Waits until every one of the n keys exists, or timeout_s (0 = the client's
 * timeout) passes: EM_ERR_TIMEOUT naming the first missing key. */
em_status em_store_wait(em_store *s, int n, const char *const *keys, double timeout_s);
/* Returns once `world` clients have called it with the same name (a name
 * may be reused: the store counts rounds), or EM_ERR_TIMEOUT saying how many
 * of how many arrived. */
em_status em_store_barrier(em_store *s, const char *name, int world, double timeout_s);

/* ---- process groups and collectives (dist/pg.c, dist/collectives.c) ----------- */
typedef enum em_reduce_op { EM_RED_SUM = 0, EM_RED_AVG, EM_RED_MAX, EM_RED_MIN } em_reduce_op;

typedef enum em_transport {
    EM_TRANSPORT_AUTO = 0, /* shared memory between ranks on one host, TCP otherwise */
    EM_TRANSPORT_TCP,      /* TCP only (what a multi-machine job uses) */
    EM_TRANSPORT_SHM,      /* shared memory only: every rank must be on this host */
    EM_TRANSPORT_MPI       /* MPI (when ember is built with it): rank and world are MPI_COMM_WORLD's */
} em_transport;

typedef struct em_pg em_pg;

typedef struct em_pg_config {
    int rank, world; /* 0 <= rank < world; MPI: MPI_COMM_WORLD's (EM_ERR_ARG naming both otherwise) */
    em_store
        *store; /* borrowed; NULL only when world == 1 or the transport is MPI (then NCCL cannot be used) */
    /* Key prefix in the store; NULL = "pg". The store counts the groups
     * joined under a name, so one name serves any number of groups, one
     * after another or alive at once, as long as every rank makes them in
     * the same order (each join meets under "NAME/G", G = 0, 1, ...). */
    const char *name;
    double timeout_s;  /* every collective's limit; 0 = EM_DIST_DEFAULT_TIMEOUT */
    em_transport transport;
} em_pg_config;

/* Joins a group: publishes this rank's address in the store, connects to
 * every other rank, maps the shared segment for local ranks. With
 * EM_TRANSPORT_MPI instead: initialises MPI unless the program did
 * (MPI_Init_thread asking MPI_THREAD_MULTIPLE; a program's own
 * initialisation needs MPI_THREAD_SERIALIZED at least; what ember
 * initialised it finalizes at exit) and duplicates MPI_COMM_WORLD for the
 * group (every rank makes its groups in the same order); EM_ERR_UNSUPPORTED
 * saying how to get MPI when ember was built without it. Blocks until all
 * `world` ranks joined or the timeout. NULL + EM_ERR_ARG / EM_ERR_DIST /
 * EM_ERR_TIMEOUT with a message naming the rank(s) missing. A join that
 * cannot complete fails as soon as the store knows it, not at the timeout:
 * EM_ERR_DIST naming the rank when that rank's store connection closed
 * after it began to join (its process exited or died), when a launcher
 * noted its process's exit (em_pg_from_env's groups, see below), or when it
 * joins as one of a different number of ranks. */
em_pg *em_pg_new(const em_pg_config *cfg);
/* The group the environment describes (see the top of this file), owning
 * its store connection: a group of one when no launcher says otherwise.
 * EMBER_TRANSPORT=tcp|shm|mpi|auto and EMBER_TIMEOUT (seconds) are
 * honoured; auto means mpi under an MPI launcher when ember is built with
 * MPI (see the top of this file: rank and world are then MPI's, and a
 * launcher's world size that disagrees is EM_ERR_ARG). NULL + error when the
 * variables are malformed (EM_ERR_ARG naming the variable and its value), a
 * launcher's required one is missing, rank 0 cannot host the store
 * (EM_ERR_IO naming the port), or joining fails. Call it again for another
 * group (after freeing the first, or with both alive: every rank in the same
 * order). A launcher that watches the
 * workers sets "r<EMBER_RESTART_COUNT>/exited/<RANK>" in the store (any
 * text: "exited with status 0") when one ends; a rank waiting to join with
 * it then fails at once naming it (`ember launch` does this). */
em_pg *em_pg_from_env(void);
/* What the code gives em_pg_from_env_with over the environment. */
typedef struct em_pg_env_config {
    double timeout_s; /* > 0: this timeout (EMBER_TIMEOUT is not read); 0 = EMBER_TIMEOUT, else the default */
} em_pg_env_config;
/* em_pg_from_env with settings from code (cfg NULL = em_pg_from_env()).
 * EM_ERR_ARG for a negative or non-finite timeout_s. The environment is
 * only read, never changed. */
em_pg *em_pg_from_env_with(const em_pg_env_config *cfg);
/* Waits for queued asynchronous work, leaves the group, frees. NULL no-op.
 * What this rank sent is delivered first: a send is done once its data is
 * handed over, so bytes of a last send may still be queued; em_pg_free
 * waits until the peers' machines have them (a peer not receiving a large
 * message keeps it waiting up to the group's timeout). A broken group is
 * left at once. */
void em_pg_free(em_pg *pg);
int em_pg_rank(const em_pg *pg);
int em_pg_world(const em_pg *pg);
/* The seconds every blocking call of the group may wait (0 for NULL). */
double em_pg_timeout(const em_pg *pg);
/* The data path the group's collectives use: EM_TRANSPORT_MPI for a group
 * made with it (all its calls go through MPI); EM_TRANSPORT_SHM when every
 * rank is on this machine and mapped the shared segment (AUTO or SHM asked
 * for), else EM_TRANSPORT_TCP (also for a group of one, and for send/recv,
 * which always go over TCP outside MPI).
 *
 * Failure under MPI: the same checks and messages as TCP (every call's
 * headers go to every rank as MPI messages; the waits poll to the
 * deadline), and a failed call sends its note to every rank. Once every
 * rank's call is checked, MPI's blocking collective moves the data (as fast
 * as MPI itself): a rank that dies then ends the job through mpirun (as
 * OpenMPI's mpirun does for any rank that dies). CUDA tensors: checked through
 * MPI, moved by NCCL, which needs the group's store. */
em_transport em_pg_transport(const em_pg *pg);
/* The store the group uses (NULL for a group of one); borrowed. */
em_store *em_pg_store(const em_pg *pg);

/* Asynchronous work. Every collective below takes `em_work **work`: NULL runs
 * it synchronously; otherwise it is queued on the group's communication
 * thread (queued work runs in call order, on every rank the same order) and
 * *work receives a handle. The tensors must stay alive and untouched until
 * the handle is waited on. em_work_wait returns the work's status (setting
 * the thread's error from it) and frees the handle. A call on CUDA tensors
 * is checked against the other ranks' calls before it returns (so it waits
 * until every rank made it), then NCCL runs it on its stream. */
typedef struct em_work em_work;
em_status em_work_wait(em_work *w);
/* true once the work finished (successfully or not); the handle stays valid. */
bool em_work_done(const em_work *w);

/* Collectives. Tensors are CPU, contiguous, of dtype f32, f64, f16, bf16 or
 * i32, the same dtype and element count on every rank (checked: a mismatch
 * is EM_ERR_DIST naming both ranks and both calls). f16/bf16 reduce in f32
 * and round once. AVG of i32 divides with truncation toward zero. Large
 * messages use a ring (reduce-scatter + all-gather), small ones a
 * latency-bound algorithm; results are bitwise identical on every rank. */

/* t := op over ranks of t (in place). */
em_status em_all_reduce(em_pg *pg, em_tensor *t, em_reduce_op op, em_work **work);
/* t := root's t. */
em_status em_broadcast(em_pg *pg, em_tensor *t, int root, em_work **work);
/* out := concat over ranks r of in_r; numel(out) == world * numel(in). */
em_status em_all_gather(em_pg *pg, em_tensor *out, em_tensor *in, em_work **work);
/* out := chunk `rank` of (op over ranks of in); numel(in) == world * numel(out). */
em_status em_reduce_scatter(em_pg *pg, em_tensor *out, em_tensor *in, em_reduce_op op, em_work **work);
/* On root, out := concat over ranks of in (numel(out) == world * numel(in));
 * out is ignored (may be NULL) elsewhere. */
em_status em_gather(em_pg *pg, em_tensor *out, em_tensor *in, int root, em_work **work);
em_status em_barrier(em_pg *pg, em_work **work);
/* Point to point: t is sent to dst / received from src; a send and its recv
 * have the same dtype, element count and device type (CPU or CUDA). Messages
 * between two ranks are received in the order sent. A send of CPU tensors
 * is eager: it returns once the data is handed over, without waiting for
 * the recv (so two ranks may each send, then receive); a send of CUDA
 * tensors waits until the recv is posted (NCCL's would hang otherwise).
 * Every send/recv is checked against the peer's call: a send or recv that
 * meets a different call (a collective, a recv facing a recv, a recv of
 * another dtype or count) fails with EM_ERR_DIST naming both calls, on both
 * ranks; a message must be received before the receiver's next collective,
 * or that collective fails on every rank naming the send (the sender of an
 * eager send learns of a mismatch at its next call at the latest). */
em_status em_send(em_pg *pg, em_tensor *t, int dst, em_work **work);
em_status em_recv(em_pg *pg, em_tensor *t, int src, em_work **work);

/* ---- DDP (dist/ddp.c) ----------------------------------------------------------
 * Wraps a model for data-parallel training. Creation flattens the model (if
 * it is not already), checks that every rank has the same parameter names
 * and shapes (EM_ERR_DIST naming the first difference and the ranks), and
 * broadcasts parameters and buffers from rank 0. Gradients live in buckets:
 * slices of the flat gradient buffer of about bucket_mb, filled in reverse
 * parameter order; a bucket's asynchronous all-reduce (average) starts as
 * soon as the last of its gradients is final during backward, so it overlaps
 * the rest of backward. Buckets are started in index order on every rank. */
typedef struct em_ddp em_ddp;

typedef struct em_ddp_config {
    double bucket_mb; /* 0 = 25 */
    /* false: a parameter that got no gradient in a synced backward is an
     * error naming it (and saying to set this, or to use it in the loss);
     * true: its (zero or accumulated) gradient is averaged like the rest,
     * and whether it has a gradient (em_has_grad, which the optimizer
     * skips a parameter without) is agreed across ranks after the synced
     * backward (one small all-reduce): it has one on every rank when it
     * got one on any rank since the last set-to-none zero_grad (the
     * average, the other ranks' zeros included), and none on any rank when
     * no rank used it, so every rank skips the same parameters (torch DDP's
     * rule with find_unused_parameters: a parameter no rank used keeps
     * .grad None). */
    bool find_unused_parameters;
} em_ddp_config;

/* model is borrowed and must outlive the DDP; pg likewise. NULL + error. */
em_ddp *em_ddp_new(em_pg *pg, em_module *model, const em_ddp_config *cfg);
void em_ddp_free(em_ddp *d);
/* no_sync: while sync is false, backward accumulates gradients locally and
 * communicates nothing; the next synced backward averages the sum. */
void em_ddp_set_sync(em_ddp *d, bool sync);
bool em_ddp_sync(const em_ddp *d);
/* em_backward(loss, grad_output) with the buckets' all-reduces overlapping
 * it, then waits for them: on return (synced) every rank holds the averaged
 * gradients. Errors of backward or of any collective. */
em_status em_ddp_backward(em_ddp *d, em_tensor *loss, em_tensor *grad_output);
int em_ddp_num_buckets(const em_ddp *d);

/* ---- ZeRO (dist/zero.c) ---------------------------------------------------------
 * Data parallelism in which each rank keeps the optimizer state of only its
 * share of the parameters (stage 1), also only its share of the averaged
 * gradients (stage 2), and also holds the parameters whole only while an
 * op uses them (stage 3), so per-rank memory falls with the world size
 * (docs/distributed.md, "ZeRO"). The share: DDP's buckets, each cut into
 * `world` chunks of ceil(n / world) elements, rank r owning chunk r of each.
 * A training step is
 *     em_zero_backward(z, loss, sync);      stage 1: all-reduce, 2-3: reduce-scatter
 *     em_zero_clip_grad_norm(z, 1.0, NULL); optional; global norm over ranks
 *     em_zero_step(z);                      update my chunks; 1-2: all-gather params
 *     em_zero_zero_grad(z);
 * and gives the parameters DDP with the same optimizer gives (stage 1
 * bitwise; stages 2-3 to reassociation of the gradient average: the
 * reduce-scatter may add the ranks in another order than the all-reduce).
 * After a stage 2-3 backward only this rank's chunks of the gradients are
 * kept (em_grad of a parameter reads zeros elsewhere). Stage 3: any op
 * reading a parameter (forward, or a backward kernel reading a saved
 * weight) first all-gathers the bucket it lies in (tensor/dispatch.h,
 * op_set_fetch), at most 3 buckets are kept whole, and the next bucket in
 * the direction of use is prefetched; so every rank must run the same
 * forwards and backwards in the same order (as DDP's collectives need), and
 * code that reads parameter memory directly (saving the model) calls
 * em_zero_gather_params first. Models with f32 or f64 parameters (stage
 * 3: f32), on the CPU or a CUDA device, collectives through NCCL; on a
 * device stages 2-3 keep the full gradient buffer allocated beside the
 * shard (a cudaMalloc block is not given back in part), and stage 3 keeps
 * the flat parameters in an address range whose 2 MiB granules are mapped
 * only while needed (CUDA virtual memory management): between uses this
 * rank's chunks, plus up to 2 granules per bucket their ends share with
 * other ranks (em_cuda_memory_stats' mapped counts it). */
typedef struct em_zero em_zero;

typedef struct em_zero_config {
    int stage;        /* 1, 2 or 3 (0 is plain DDP: em_ddp) */
    double bucket_mb; /* 0 = 25 */
    bool find_unused_parameters; /* as em_ddp_config's */
    /* A CUDA model (any stage): the optimizer state in host memory. Each
     * step copies this rank's chunks of the parameters and averaged
     * gradients to the host, updates them there (the CPU's optimizer, the
     * same per-element maths as the device's), and copies the parameters
     * back before the all-gather (stage 3: before their next use): the
     * device keeps no optimizer state. EM_ERR_ARG for a CPU model. */
    bool offload;
} em_zero_config;

/* Wraps model in DDP (em_ddp_new: flattens, checks every rank's parameters,
 * broadcasts rank 0's) and shards opt over the ranks: from now on opt
 * keeps state, and updates elements, only for this rank's chunks (its state
 * so far is dropped; em_optim_state lists each parameter's chunk, shape
 * (n)). Every parameter of opt must be one of model's. pg, model and opt
 * are borrowed and must outlive z; opt must be stepped only through
 * em_zero_step while z lives. cfg NULL = stage 1, 25 MB buckets. Stage 3
 * gives back the memory of every parameter element outside this rank's
 * chunks at once (on a CUDA device the model's flat parameters move into a
 * reserved address range first: their tensors keep their offsets, and
 * em_zero_free moves them back). NULL + error: EM_ERR_ARG (NULL argument,
 * stage out of 1..3, a parameter of opt not in model, offload of a CPU
 * model), EM_ERR_UNSUPPORTED (parameters other than f32/f64, stages 2-3 or
 * offload with both, stage 3 with no f32 parameter or while another stage
 * 3 engine lives, stage 3 on a device whose driver lacks virtual memory
 * management), EM_ERR_DEVICE (parameters on two devices, a driver call
 * that failed), EM_ERR_OOM, em_ddp_new's errors. */
em_zero *em_zero_new(em_pg *pg, em_module *model, em_optimizer *opt, const em_zero_config *cfg);
/* Frees z and its DDP (not the model or the optimizer: the optimizer keeps
 * its sharded state). After stage 3, parameter elements outside this
 * rank's chunks are undefined unless em_zero_gather_params ran since the
 * last step. NULL is a no-op. */
void em_zero_free(em_zero *z);
int em_zero_stage(const em_zero *z); /* -1 for NULL */
/* The DDP inside z (borrowed), for em_ddp_num_buckets and the like. */
em_ddp *em_zero_ddp(const em_zero *z);
/* em_ddp_backward with sync (false: accumulate locally, communicate
 * nothing, as em_ddp_set_sync). Synced: stage 1 leaves every averaged
 * gradient on every rank; stage 2 leaves this rank's chunks in its shard and
 * gives the full gradient buffer's memory back bucket by bucket. */
em_status em_zero_backward(em_zero *z, em_tensor *loss, bool sync);
/* Clips by the global norm of all the gradients (em_clip_grad_norm_with's
 * rule, options and return value; em_zero_clip_grad_norm: the 2-norm):
 * stage 1 over the full gradients on each rank, stage 2 from each rank's
 * chunks, their |g|^p summed over ranks (inf: their max |g|, a max
 * all-reduce), then the p-th root: one all-reduce, every rank gets the same
 * total, so under error_if_nonfinite every rank refuses together. NAN and
 * *status set on error (status may be NULL). */
double em_zero_clip_grad_norm(em_zero *z, double max_norm, em_status *status);
double em_zero_clip_grad_norm_with(em_zero *z, const em_clip_config *cfg, em_status *status);
/* em_optim_step on this rank's chunks, then (stages 1-2) every bucket's
 * parameters all-gathered, so every rank holds the whole updated model;
 * stage 3 gives back all but its chunks instead. Errors of the step
 * (nothing sent) or of the collectives. */
em_status em_zero_step(em_zero *z);
/* Stage 3: makes every parameter whole on this rank (an all-gather per
 * bucket not whole yet; collective), until the next em_zero_step: for code
 * that reads parameter memory without an op, such as em_module_save.
 * Stages 1-2: nothing to do. EM_ERR_ARG for NULL; the collectives' errors. */
em_status em_zero_gather_params(em_zero *z);
/* Zeroes the gradients (stage 2: the full buffer's pages are given back to
 * the system and read as zeros), in the optimizer's zero_grad mode
 * (em_optim_set_zero_grad_mode: by default the parameters then have no
 * gradient, em_has_grad). */
em_status em_zero_zero_grad(em_zero *z);

/* Mixed precision (the amp/ layer; bf16 and fp16 arrive with issue 5).
 * DEFAULT means "not set here: take it from the config file / environment". */
typedef enum em_precision_kind { EM_PREC_DEFAULT = 0, EM_PREC_NO, EM_PREC_BF16, EM_PREC_FP16 } em_precision_kind;

/* ---- the config file (dist/config.c) -------------------------------------------
 * What `ember config` asks and writes as YAML (libyaml), and what `ember
 * launch`, `ember train` and the Accelerator read. Boolean values, here and
 * in EMBER_* variables, are true/false, 1/0, yes/no or on/off in any letter
 * case; anything else is an error naming the setting. Keys, one per field:
 *   num_processes: 2        # per machine
 *   num_machines: 1
 *   machine_rank: 0
 *   main_process_ip: 127.0.0.1
 *   main_process_port: 29500   # 0 = pick a free one (single machine)
 *   mixed_precision: no     # no | bf16 | fp16
 *   gradient_accumulation_steps: 1
 *   split_batches: false
 *   even_batches: true
 *   timeout: 300            # seconds, every collective
 *   max_restarts: 0
 *   zero_stage: 0           # 0 DDP | 1 shard optimizer state | 2 and gradients | 3 and parameters
 * A field the file does not set keeps the value it had (so a caller fills
 * defaults first, then reads). */
typedef struct em_config {
    int num_processes, num_machines, machine_rank;
    char main_process_ip[256];
    int main_process_port;
    em_precision_kind mixed_precision;
    int grad_accum;
    bool split_batches, even_batches;
    double timeout_s;
    int max_restarts;
    int zero_stage; /* 0..3 */
} em_config;

/* The defaults: 1 process, 1 machine, rank 0, 127.0.0.1, port 29500, no
 * mixed precision, accumulation 1, split off, even on, 300 s, 0 restarts,
 * ZeRO stage 0. */
em_config em_config_defaults(void);
/* The default path into buf (size n): $EMBER_CONFIG_FILE if set, else
 * $XDG_CONFIG_HOME/ember/default_config.yaml, else
 * $HOME/.config/ember/default_config.yaml. NULL + EM_ERR_ARG if it does not
 * fit or neither HOME nor XDG_CONFIG_HOME is set. */
const char *em_config_default_path(char *buf, size_t n);
/* The configuration every ember reader uses, read over *c: path when given
 * (missing: EM_ERR_IO); else $EMBER_CONFIG_FILE when set (missing: EM_ERR_IO
 * naming the file and the variable: a file named on purpose must exist);
 * else the default file of em_config_default_path, when there is one (an
 * absent default file, or no HOME, leaves *c as it is). Other errors as
 * em_config_read. */
em_status em_config_load(const char *path, em_config *c);
/* Reads path over *c. A missing file is EM_ERR_IO unless missing_ok (then
 * *c is untouched, EM_OK). Bad YAML, an unknown key or a bad value is
 * EM_ERR_ARG naming the file, line, key and value; *c is then untouched. */
em_status em_config_read(const char *path, em_config *c, bool missing_ok);
/* Writes c to path as YAML (creating the parent directory; temp file +
 * rename, so a failure leaves any old file whole). Values are checked
 * first (EM_ERR_ARG naming the field). */
em_status em_config_write(const char *path, const em_config *c);
/* "no", "bf16", "fp16" <-> em_precision_kind; parse gives EM_ERR_ARG on
 * anything else. */
const char *em_precision_name(em_precision_kind p);
em_status em_precision_parse(const char *s, em_precision_kind *out);

/* ---- the Accelerator (dist/accelerator.c) ----------------------------------------
 * Configuration comes from, in increasing priority: defaults, the config
 * file (`ember config` writes it: $XDG_CONFIG_HOME/ember/default_config.yaml,
 * else ~/.config/ember/default_config.yaml; EMBER_CONFIG_FILE names another,
 * which must exist),
 * the environment (EMBER_GRAD_ACCUM, EMBER_MIXED_PRECISION, EMBER_SPLIT_
 * BATCHES, EMBER_EVEN_BATCHES, EMBER_TIMEOUT, plus the launcher's; the
 * project settings from EMBER_PROJECT_DIR, EMBER_AUTOMATIC_CHECKPOINT_NAMING
 * and EMBER_SAVE_TOTAL_LIMIT, which the config file does not hold), and the
 * non-zero fields of the em_accel_config given in code. */
typedef struct em_accel_config {
    int grad_accum;               /* micro-batches per optimizer step; 0 = config/env, else 1 */
    em_precision_kind mixed_precision; /* DEFAULT = config/env, else NO; see em_accel_prepare */
    int split_batches;            /* 0 = config/env (else off), 1 on, -1 off */
    int even_batches;             /* 0 = config/env (else on), 1 on, -1 off */
    /* ZeRO (em_zero): 0 = config/env (zero_stage, EMBER_ZERO_STAGE; else 0),
     * 1, 2 or 3 that stage, -1 stage 0 (plain DDP) whatever they say. With a
     * stage, em_accel_prepare shards the prepared optimizer over the ranks
     * (one model and one optimizer; world > 1), and backward, clip, step and
     * zero_grad go through em_zero. */
    int zero_stage;
    bool zero_offload;            /* with zero_stage 1-3 on a CUDA device: em_zero_config.offload */
    double timeout_s;             /* 0 = config/env, else EM_DIST_DEFAULT_TIMEOUT; to the group */
    double bucket_mb;             /* 0 = 25 */
    bool find_unused_parameters;
    const char *config_file;      /* NULL = em_config_load's search (absent default file is fine) */
    em_scaler_config scaler;      /* fp16's loss scaler; zeros = torch's defaults */
    /* Where the model, optimizer state and batches live: "cpu", "cuda"
     * (cuda:LOCAL_RANK, one device per process of the machine, as Accelerate
     * places them) or "cuda:N". NULL = EMBER_DEVICE from the environment,
     * else "cpu" (the default even where CUDA devices exist). */
    const char *device;
    /* ---- checkpoint management (dist/accel_ckpt.c), Accelerate's
     * ProjectConfiguration. project_dir: where automatic checkpoints go
     * (PROJECT/checkpoints/checkpoint_N); NULL = EMBER_PROJECT_DIR, else
     * none (copied: the string need not outlive em_accelerator_new).
     * automatic_checkpoint_naming: em_accel_save_state / load_state with a
     * NULL dir save to the next checkpoint_N / load the newest; false =
     * EMBER_AUTOMATIC_CHECKPOINT_NAMING (a boolean), else off. On needs
     * a project_dir (EM_ERR_ARG from em_accelerator_new otherwise).
     * total_limit: how many automatic checkpoints to keep (the newest K; the
     * older ones are removed after a new one is complete); 0 =
     * EMBER_SAVE_TOTAL_LIMIT (an integer >= 0), else all; < 0 is EM_ERR_ARG.
     * Only automatic checkpoints are ever counted or removed. */
    const char *project_dir;
    bool automatic_checkpoint_naming;
    int total_limit;
    /* trackers (em_accel_init_trackers, ember/tracker.h) */
    int log_with;            /* EM_TRACK_* flags; 0 = EMBER_LOG_WITH from the environment, else none */
    const char *logging_dir; /* where the trackers' runs go; NULL = project_dir if set, else "runs" */
} em_accel_config;

typedef struct em_accelerator em_accelerator;

/* Reads the configuration (em_config_load, then the environment, then cfg)
 * and joins the group (em_pg_from_env_with, given the resolved timeout: the
 * environment is read, never changed). Accelerators may be made one after
 * another, or several alive at once, as long as every rank makes them in
 * the same order. NULL + error naming the bad setting or the join failure. */
em_accelerator *em_accelerator_new(const em_accel_config *cfg);
void em_accelerator_free(em_accelerator *a);
int em_accel_rank(const em_accelerator *a);
int em_accel_world(const em_accelerator *a);
/* This process's rank among the processes of its machine, and their number,
 * as the launcher says them (LOCAL_RANK / LOCAL_WORLD_SIZE, mpirun's
 * OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE, Slurm's SLURM_LOCALID and tasks
 * per node; see the top of this file); rank and world when none does. -1
 * for NULL. */
int em_accel_local_rank(const em_accelerator *a);
int em_accel_local_world(const em_accelerator *a);
bool em_accel_is_main_process(const em_accelerator *a);
bool em_accel_is_local_main(const em_accelerator *a);
int em_accel_grad_accum(const em_accelerator *a);
/* The ZeRO stage this Accelerator runs (resolved from code, the
 * environment and the config file; 0 = DDP, and always 0 with world 1,
 * where there is nothing to shard); it shards the optimizer once one is
 * prepared. -1 for NULL. */
int em_accel_zero_stage(const em_accelerator *a);
/* Accelerate's get_state_dict for ZeRO-3: makes every prepared model's
 * parameters whole on every rank until the next em_accel_step (a
 * collective under stage 3; nothing to do otherwise), so they can be read
 * directly (em_module_save). EM_ERR_ARG for NULL. */
em_status em_accel_gather_params(em_accelerator *a);
em_pg *em_accel_pg(const em_accelerator *a); /* borrowed */
/* The device this process computes on (em_accel_config.device). */
em_device em_accel_device(const em_accelerator *a);
/* Moves b->x, b->y and b->mask (those set) to the Accelerator's device (em_to: the copies live in
 * the caller's scope; nothing happens on the CPU). em_accel_next does this
 * itself; a loop that draws batches another way (a window sampler) calls
 * it. EM_ERR_ARG on NULL, the em_to error otherwise (b unchanged). */
em_status em_accel_to_device(em_accelerator *a, em_batch *b);

/* prepare: any argument may be NULL, and it may be called several times:
 * each call ADDS what it is given (a train and an eval loader, a generator
 * and a discriminator with their optimizers...). The Accelerator borrows
 * everything: it must outlive it.
 *  - model: moved to the Accelerator's device (it must not be flattened yet
 *    unless it is there already; EM_ERR_DEVICE says so), flattened, and
 *    wrapped in DDP when world > 1. em_accel_backward syncs the gradients of
 *    every prepared model (DDP per model); clip covers all their parameters;
 *    save_state saves each (model.safetensors, model_1.safetensors, ...).
 *  - opt: every prepared optimizer steps and zeroes in em_accel_step /
 *    em_accel_zero_grad. Its parameters must all be parameters of models
 *    prepared earlier or in the same call: EM_ERR_ARG naming the first
 *    foreign one (its index in the optimizer and shape) otherwise.
 *  - loader: sharded over ranks (see em_loader_set_shard). The FIRST loader
 *    prepared is the training loader: em_accel_next iterates it, and its
 *    epoch's end makes a sync step. Others (evaluation) are iterated with
 *    em_loader_next; gather_for_metrics knows them all.
 *  - sched: a schedule drives one optimizer, applied before each step to
 *    every group's base lr (em_optim_apply_schedule: groups at 0.1 and
 *    0.01 keep their ratio, as under a torch LRScheduler; the schedule's
 *    base_lr is only the reference of COSINE's min_lr): the optimizer
 *    given in the same call, or, given alone, the most recently prepared
 *    optimizer (EM_ERR_ARG if there is none, or if that optimizer has a
 *    schedule already).
 * Preparing the same model, optimizer or loader twice, or more than 16 of
 * one kind, is EM_ERR_ARG. Every check comes before anything changes; a
 * failure while moving or wrapping a model (device, DDP) may leave that
 * model half prepared.
 * Mixed precision (bf16 / fp16): the forward passes of the training step run
 * under autocast (em_autocast_set, ember/amp.h) while the parameters stay f32
 * masters: from em_accel_next or em_accel_accumulate, whichever comes first
 * in the micro-step, until em_accel_backward returns (an em_accel_next that
 * ends the epoch ends it too). Anything else runs under the thread's own
 * setting unless the user marks it with em_accel_autocast_begin / _end (an
 * evaluation forward, say). fp16 also scales the loss in em_accel_backward
 * and unscales in clip / step, skipping (on every rank alike) a step whose
 * gradients hold inf or NaN. */
em_status em_accel_prepare(em_accelerator *a, em_module *model, em_optimizer *opt, em_loader *loader,
                           const em_lr_schedule *sched);
/* A window sampler is sharded so that the ranks together draw exactly the
 * windows one process with the whole batch draws (batch % world == 0). */
em_status em_accel_prepare_sampler(em_accelerator *a, em_window_sampler *s);
/* An extra generator whose state save_state / load_state must keep, for the
 * program's own generators (the default generator of the calling thread and
 * the generators the prepared models' modules own, such as dropout's, see
 * em_module_add_rng, are always kept). Borrowed. */
em_status em_accel_register_rng(em_accelerator *a, em_rng *rng);

/* A region where the calling thread's forward passes autocast to the
 * Accelerator's mixed precision (nothing changes without one): begin turns
 * it on, end restores the thread's setting from before the matching begin.
 * Regions nest. EM_ERR_ARG on NULL, on end without an open region, or past
 * 64 nested regions. em_accelerator_free restores the setting from before a
 * region left open. */
em_status em_accel_autocast_begin(em_accelerator *a);
em_status em_accel_autocast_end(em_accelerator *a);

/* Micro-step bookkeeping (Accelerate's `with accelerator.accumulate(model)`).
 * A micro-step is one batch's forward and em_accel_backward; the sync steps
 * (sync_gradients: DDP averages, clip / step / zero_grad act) are every
 * grad_accum-th micro-step and the one whose batch is the last of the
 * training loader's epoch, however the loop is written: em_accel_accumulate
 * is optional, and may come before or after em_accel_next (or the
 * em_loader_next of the training loader); em_accel_backward decides from
 * the loader itself whether the batch it returned since the last backward
 * ended its epoch. One em_accel_backward per micro-step.
 * em_accel_accumulate counts the micro-step (each call counts one; called
 * when the loader's next call will end the epoch, it leaves the count to
 * em_accel_backward, since that micro-step may have no batch) and returns
 * its sync_gradients: exact when the batch was drawn, else predicted from
 * the batch the loader returns next. */
bool em_accel_accumulate(em_accelerator *a);
/* sync_gradients of the current micro-step (final once em_accel_backward
 * returned). */
bool em_accel_sync_gradients(const em_accelerator *a);
/* em_loader_next on the training loader (the first prepared), moving the
 * batch to the Accelerator's device: 1 = b holds a batch, 0 = the epoch
 * ended (b zeroed, no error; the next call starts the next epoch), -1 =
 * failure (b zeroed, error set: the loader's, the move's, or EM_ERR_ARG for
 * NULL or no prepared loader). */
int em_accel_next(em_accelerator *a, em_batch *b);
/* Backward of loss / grad_accum (times the loss scale under fp16), DDP-synced
 * over every prepared model only on sync steps; ends the micro-step. With
 * several models in DDP, the models that took part in the backward on any
 * rank are averaged (after backward, model by model), the others are left
 * alone. Errors of backward and of the collectives; a NULL loss returns the
 * error that made it (or EM_ERR_ARG). */
em_status em_accel_backward(em_accelerator *a, em_tensor *loss);
/* Global-norm clipping of the gradients of every prepared model's
 * parameters together, returning their norm before clipping (as
 * em_clip_grad_norm_with, whose options _with takes: any p-norm, inf,
 * error_if_nonfinite; under ZeRO em_zero_clip_grad_norm_with's global norm
 * over the shards). Only on sync_gradients micro-steps: NAN and nothing
 * changed otherwise. Under fp16 it unscales the gradients first and returns
 * INFINITY without clipping when they overflowed (error_if_nonfinite does
 * not refuse that: the step is skipped anyway). EM_ERR_ARG (NAN) without a
 * prepared model, and the clip's own errors. */
double em_accel_clip_grad_norm(em_accelerator *a, double max_norm, em_status *status);
double em_accel_clip_grad_norm_with(em_accelerator *a, const em_clip_config *cfg, em_status *status);
/* Every prepared optimizer's step (each with its schedule, applied to every
 * group's base lr as em_optim_apply_schedule: the lr for the step about to
 * be taken), only when sync_gradients; a no-op otherwise.
 * Under fp16: unscales (if clip did not), skips the step when the gradients
 * overflowed on any rank (the schedules do not advance) and updates the
 * scale. EM_ERR_ARG without a prepared optimizer. */
em_status em_accel_step(em_accelerator *a);
/* Every prepared optimizer's zero_grad, only when sync_gradients. */
em_status em_accel_zero_grad(em_accelerator *a);
/* Optimizer steps taken (the schedule's position; skipped steps do not count). */
int64_t em_accel_step_count(const em_accelerator *a);
/* Whether the last sync step's optimizer step was skipped for an overflow. */
bool em_accel_step_was_skipped(const em_accelerator *a);
/* EM_BF16 / EM_F16 under mixed precision, else EM_F32. */
em_dtype em_accel_autocast_dtype(const em_accelerator *a);
/* fp16's loss scaler (borrowed), NULL otherwise. */
em_grad_scaler *em_accel_scaler(const em_accelerator *a);

/* Gathers t (same shape on every rank) along dim 0: (world*n, ...), made in
 * the caller's scope. gather_for_metrics also drops the samples that
 * even_batches padding duplicated, when the prepared loader that returned a
 * batch last (through em_accel_next or em_loader_next alike) returned its
 * epoch's last batch (em_loader_last_was_final): so gathering every batch
 * of an epoch gives each example once. */
em_tensor *em_accel_gather(em_accelerator *a, em_tensor *t);
em_tensor *em_accel_gather_for_metrics(em_accelerator *a, em_tensor *t);
/* op over ranks of t, as a new tensor in the caller's scope. */
em_tensor *em_accel_reduce(em_accelerator *a, em_tensor *t, em_reduce_op op);
/* t padded along dim (with pad_value, at the end or, with pad_first, the
 * start) to the largest size any rank has there. */
em_tensor *em_accel_pad_across_processes(em_accelerator *a, em_tensor *t, int dim, double pad_value,
                                         bool pad_first);
em_status em_accel_wait_for_everyone(em_accelerator *a);
/* printf on the main process only. */
void em_accel_print(const em_accelerator *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* This rank's share [*start, *start + *count) of n items, as contiguous and
 * even as possible (the first n % world ranks get one more). */
void em_accel_split_between_processes(const em_accelerator *a, int64_t n, int64_t *start, int64_t *count);
/* set_trigger on any rank makes the next check_trigger true on every rank
 * (check_trigger is collective and resets the trigger). */
void em_accel_set_trigger(em_accelerator *a);
bool em_accel_check_trigger(em_accelerator *a, em_status *status);

/* ---- main_process_first and gather_object (dist/accel_objects.c) ------------
 * main_process_first: Accelerate's `with accelerator.main_process_first():`
 * as two calls around a block (e.g. downloading or tokenising a data set the
 * other ranks then read from a cache):
 *     if (em_accel_main_process_first_begin(acc)) fail;
 *     ... the block ...
 *     if (em_accel_main_process_first_end(acc)) fail;
 * The main process (rank 0) runs its block at once; every other rank waits
 * in _begin until the main process has called _end, then runs its block
 * (the others run theirs concurrently). Both calls are collective: every
 * rank calls both, in this order, and each rank meets one barrier (the
 * others in _begin, the main process in _end); a rank that never arrives
 * makes the others fail after the timeout, naming it, as a barrier does.
 * Blocks do not nest: _begin with a block open, or _end with none, is
 * EM_ERR_ARG (nothing waits). World 1: both return at once. A failure of
 * the block itself is the program's to share (e.g. em_accel_set_trigger
 * then em_accel_check_trigger after _end). */
em_status em_accel_main_process_first_begin(em_accelerator *a);
em_status em_accel_main_process_first_end(em_accelerator *a);

/* Gathers n bytes at data from every rank (any length per rank, 0 too;
 * data may be NULL when n is 0) on every rank: *out receives one malloc'd
 * buffer holding the ranks' bytes concatenated in rank order, followed by a
 * NUL byte (so text stays a C string); the caller free()s it. sizes (an
 * array of em_accel_world(a) entries, the caller's) receives each rank's
 * length: rank r's bytes start at sizes[0] + ... + sizes[r-1]. Collective
 * (two all-gathers; every rank's bytes travel padded to the longest, so
 * memory is world x the longest). EM_ERR_ARG on NULL arguments; a group
 * error (EM_ERR_DIST / EM_ERR_TIMEOUT) as the collectives give it, with
 * *out NULL. */
em_status em_accel_gather_object(em_accelerator *a, const void *data, size_t n, void **out, size_t *sizes);

/* Saves every prepared model (DIR/model.safetensors, model_1.safetensors,
 * ... in prepare order, main process) and optimizer (DIR/optimizer.
 * safetensors, optimizer_1.safetensors, ...), schedule position and step,
 * every loader's position and global batch, sampler state and batch, loss
 * scaler, and every rank's registered generators, default generator and the
 * generators the prepared models' modules own, by name (em_module_rngs:
 * dropout's; DIR/rank_R.json), so load_state continues a run exactly
 * without registering those. load_state restores them all into the objects
 * this run prepared, in the same order: a checkpoint of other counts of
 * models, optimizers or loaders is EM_ERR_ARG naming both counts, as is a
 * model whose generators differ by count or name (a save of an older ember
 * without module generators leaves them as they are). Every rank calls it (it is
 * collective). The checkpoint is whole or absent: the files go to
 * DIR.tmp-<save id> beside DIR, DIR/manifest.json (written last) names each
 * with its size and crc32, and the directory replaces DIR in one atomic
 * rename, so until then DIR is the previous checkpoint, untouched. DIR must
 * be new or hold only a checkpoint (EM_ERR_IO naming a foreign file; it is
 * replaced whole); stale DIR.tmp-* of interrupted saves are removed.
 * EM_ERR_IO naming the file that could not be written, on every rank.
 *
 * load_state restores all of it (collective, like save_state), or fails.
 * First, on every rank, it verifies the checkpoint: DIR/manifest.json
 * (missing: EM_ERR_IO "not a complete checkpoint"; from an older ember:
 * EM_ERR_IO saying so), then every file it names, by size and crc32
 * (EM_ERR_IO naming the file: "the checksum does not match"), and each rank
 * file's save id. Then the counters: EM_ERR_IO naming the file when one
 * disagrees with rank 0's on what every rank of one save holds alike (steps,
 * micro-step, sampler, scaler: then both files are named); EM_ERR_ARG when
 * the checkpoint does not fit this run (generators, loader, sampler or
 * scaler present in one and not the other), naming what each has. Then all
 * ranks must have verified the same save (EM_ERR_DIST naming both ids). On
 * the other ranks a failure is EM_ERR_DIST naming the rank that failed. All
 * of this comes before any rank changes anything, so those errors leave
 * every rank's run untouched; a model or optimizer file that verifies but
 * does not fit the model (names, shapes) is found later and may leave part
 * of the state loaded. A DIR missing because a save on a file system
 * without atomic directory swaps was interrupted is found as its complete
 * DIR.old-* copy.
 *
 * Another world size. A directory saved by W processes loads on W' != W as
 * the continuation of the same trajectory, up to float reassociation, when
 * the global batch stays the same (and every rank's share of it is equal,
 * as even_batches, drop_last or a divisible dataset make it: DDP averages
 * the ranks' means, which at a ragged end depends on the world size):
 *  - steps, micro-step, window sampler (global) and scaler come from the
 *    checkpoint as they are;
 *  - the loader's position {epoch, b} is converted through the examples
 *    consumed (b global batches of the epoch's order), which needs this
 *    run's global batch (em_loader_global_batch: batch_size x W', or
 *    batch_size with split_batches) to equal the saved one; otherwise
 *    EM_ERR_ARG names both and the batch_size that keeps it (or says that
 *    the saved global batch does not divide over W' processes). A window
 *    sampler must draw the same global batch too;
 *  - per-rank generators (the default one and registered ones, e.g.
 *    dropout): rank r continues saved rank r % W's. Generators that were the
 *    same on every saved rank (an evaluation sampler's, dropout seeded alike
 *    on every rank) so stay the same and exact; per-rank ones cannot be
 *    mapped exactly, and dropout masks then differ from an uninterrupted run
 *    of either size (each rank draws for another share of the batch);
 *  - a checkpoint saved mid-accumulation (micro-step != 0) is refused
 *    (EM_ERR_ARG): its partial gradients were summed per rank.
 * Errors for what stays impossible say what the checkpoint has and what
 * this run has.
 *
 * dir NULL: automatic naming (PROJECT/checkpoints/checkpoint_N, below). */
em_status em_accel_save_state(em_accelerator *a, const char *dir);
em_status em_accel_load_state(em_accelerator *a, const char *dir);

/* ---- checkpoint management (dist/accel_ckpt.c) -----------------------------------
 * Automatic naming (em_accel_config.project_dir, .automatic_checkpoint_
 * naming, .total_limit). em_accel_save_state(a, NULL) saves to
 * PROJECT/checkpoints/checkpoint_N, N one more than the highest N of any
 * entry named checkpoint_N there (0 for the first; so a resumed run, or a
 * new Accelerator on the same project, continues the numbering; names with
 * leading zeros are not counted). Rank 0 picks N and tells the others; the
 * save itself is em_accel_save_state(a, that path), collective and whole or
 * absent as above. With total_limit K > 0 the oldest checkpoint_N go once
 * the new one is published, until K remain (the new one included). Each of
 * them must be a directory holding only checkpoint files (an emptied or
 * half-removed one counts): otherwise the save is refused before anything is
 * written, EM_ERR_IO naming the directory and the file that is not a
 * checkpoint's, so nothing else is ever removed. A checkpoint is removed
 * manifest first, so a kill in the middle leaves a directory that no load
 * takes for complete. EM_ERR_ARG when automatic_checkpoint_naming is off.
 *
 * em_accel_load_state(a, NULL) loads the newest complete checkpoint_N (the
 * highest N whose directory has a manifest.json; rank 0 picks it, every
 * rank loads it as above). None: EM_ERR_IO naming PROJECT/checkpoints, on
 * every rank.
 *
 * em_accel_latest_checkpoint: the path of that newest complete checkpoint
 * (PROJECT/checkpoints/checkpoint_N) into buf (size n). Not collective: the
 * calling process looks at the directory. Returns 1 with the path in buf, 0
 * when there is none (buf = ""; also when PROJECT/checkpoints does not
 * exist), -1 with EM_ERR_ARG (a NULL argument, no project_dir, buf too
 * small) or EM_ERR_IO (the directory cannot be read). */
int em_accel_latest_checkpoint(const em_accelerator *a, char *buf, size_t n);

/* em_accel_save_model: the model's weights alone (parameters and buffers,
 * names relative to model, as em_module_save), for inference or another
 * framework: Hugging Face's layout, as Accelerate's save_model writes it.
 *   max_shard_size 0, or everything fits in one shard:
 *       DIR/model.safetensors
 *   otherwise:
 *       DIR/model-00001-of-0000K.safetensors ... (tensors in the model's
 *       order, a new file when the next tensor would take the current one
 *       past max_shard_size bytes of tensor data; a tensor is never split,
 *       so one larger than max_shard_size has a file of its own)
 *       DIR/model.safetensors.index.json: {"metadata": {"total_size": bytes
 *       of all tensor data}, "weight_map": {"name": "file", ...}} (names
 *       sorted)
 * Every file is safetensors with {"format": "pt"} metadata (plus ember's own
 * "ember.crc32"). Floating-point tensors are written in cfg->dtype: EM_F32
 * (0, the default) keeps each tensor's dtype as the model holds it (under
 * mixed precision the f32 master weights); EM_F16 / EM_BF16 convert them
 * (round to nearest even); integer tensors are written as they are. cfg
 * NULL = all zeros.
 * The directory is published whole, as a checkpoint is (files written into
 * DIR.tmp-<id>, a manifest.json naming each with its size and crc32 last,
 * one atomic rename): DIR is the previous save or the new one, never a mix
 * of shards. So DIR must be new or hold only what a save_model or
 * save_state wrote (EM_ERR_IO naming the foreign file: put config or
 * tokenizer files into DIR after the last save, or beside it).
 * Collective: every rank calls it; only the main process reads the model and
 * writes (a model already identical on every rank under DDP), the others
 * wait for it, and all return its result (EM_ERR_DIST naming the rank that
 * failed on the others). model is borrowed and need not be prepared.
 * EM_ERR_ARG: NULL a/model/dir, max_shard_size < 0, another dtype. */
typedef struct em_save_model_config {
    int64_t max_shard_size; /* bytes of tensor data per file; 0 = one model.safetensors */
    em_dtype dtype;         /* EM_F32 (0) = as held; EM_F16 or EM_BF16 */
} em_save_model_config;
em_status em_accel_save_model(em_accelerator *a, em_module *model, const char *dir,
                              const em_save_model_config *cfg);
/* ---- trackers (Accelerate's log_with / init_trackers / log / end_training) ----
 *
 *   em_accelerator *acc = em_accelerator_new(&(em_accel_config){
 *       .log_with = EM_TRACK_TENSORBOARD | EM_TRACK_JSONL, .logging_dir = "runs"});
 *   em_accel_init_trackers(acc, "my_run", NULL);
 *   ... em_accel_log(acc, step, 2, (em_metric[]){{"loss", l}, {"lr", lr}}); ...
 *   em_accel_end_training(acc);
 *
 * Only the main process (rank 0) writes; every rank makes the same calls and
 * the same argument checks, so a bad call fails on every rank alike. */

/* Opens the trackers (em_tracker_open) for run `project_name` on the main
 * process: cfg's non-zero log_with / logging_dir override the Accelerator's
 * (em_accel_config, EMBER_LOG_WITH); cfg's jsonl_path / append are used as
 * given; cfg may be NULL. With no tracker named, the calls below do nothing.
 * EM_ERR_ARG for a NULL accelerator, a bad project name or flags, or
 * trackers already open (end_training first); em_tracker_open's errors on
 * the main process. */
em_status em_accel_init_trackers(em_accelerator *a, const char *project_name, const em_tracker_config *cfg);
/* Logs metrics[0..n) at `step` (step < 0: em_accel_step_count) to the
 * trackers (em_tracker_log's checks and errors; the write happens on the
 * main process). EM_ERR_ARG when em_accel_init_trackers was not called (or
 * end_training was): a metric would otherwise vanish silently. */
em_status em_accel_log(em_accelerator *a, int64_t step, int n, const em_metric *metrics);
/* Flushes and closes the trackers (em_tracker_close); EM_OK when none are
 * open. em_accelerator_free closes them too, ignoring errors. */
em_status em_accel_end_training(em_accelerator *a);

/* ---- memory per rank (dist/memory_estimate.c) ------------------------------------
 * What training em_gpt_new's model takes on each rank, by category, before
 * it is built: `ember estimate-memory` prints it, `ember train` refuses a run
 * whose total exceeds the memory it has. Parameters are f32 (the masters
 * under autocast). Stage arithmetic, P parameters, W ranks, bucket = bucket_mb:
 *   stage 0 (DDP): params 4P, grads 4P, optimizer (Adam/AdamW 8P, SGD with
 *                  momentum 4P, SGD 0)
 *   stage 1:       params 4P, grads 4P, optimizer / W
 *   stage 2:       params 4P, grads 4P/W + the largest parameter's bucket and
 *                  2 more held by backward (at most 4P), optimizer / W (on a
 *                  CUDA device: grads 4P + 4P/W, the full buffer kept)
 *   stage 3:       params 4P/W + 3 buckets kept whole (the largest and 2
 *                  more; never above 4P in all), grads and optimizer as
 *                  stage 2
 * Activations are what one step (forward, loss, backward) of batch x context
 * tokens leaves in the step scope, counted op by op from what nn/gpt.c's
 * forward keeps and its backward makes (docs/distributed.md, "Memory per
 * rank"); communication is the shared-memory segment of a group on one
 * host; runtime the process's own baseline (base_bytes, or a guess for
 * libraries, thread pool and scratch) plus data_bytes. Measured peaks of the tiny GPT fall within 10% of the
 * total (tests/test_memory_estimate.c). */
typedef enum em_mem_optimizer { EM_MEM_ADAMW = 0, EM_MEM_ADAM, EM_MEM_SGD } em_mem_optimizer;

typedef struct em_mem_config {
    em_gpt_config model;         /* vocab_size, block_size, n_layer, n_head, n_embd >= 1; bias, dropout */
    int world;                   /* ranks >= 1 */
    int zero_stage;              /* 0..3 */
    em_precision_kind precision; /* DEFAULT and NO: f32; BF16, FP16: autocast with f32 masters */
    int64_t batch;               /* sequences per rank per micro-batch, >= 1 */
    int64_t context;             /* tokens per sequence, 1..model.block_size; 0 = block_size */
    em_mem_optimizer optimizer;
    bool momentum;     /* SGD with momentum (EM_MEM_SGD only) */
    double bucket_mb;  /* gradient bucket, MiB; 0 = 25 (DDP's default) */
    int threads;       /* ember's pool; 0 = this process's (em_num_threads) */
    size_t data_bytes; /* the caller's data kept resident, counted in the runtime */
    /* The process's own resident baseline when the caller knows it (its
     * VmRSS before the model exists: ember's libraries, and CUDA's when the
     * build has them, which are over 100 MiB; the pool), replacing the
     * built-in guess of 8 MiB + 2 MiB per thread; 0 = the guess. data_bytes
     * adds to either. */
    size_t base_bytes;
    /* The model on a CUDA device (dist/zero.c): stages 2-3 keep the full
     * gradient buffer allocated beside the shard, 4P + 4P/W; stage 3 maps
     * the parameters in granules of 2 MiB, so each bucket's chunk may hold
     * up to 2 granules more than its share (2 MiB x 2 x buckets), within
     * the whole buffer rounded up to granules. */
    bool cuda;
} em_mem_config;

/* The tiny GPT (vocab 65, block 64, 4 layers, 4 heads, 128 wide, bias), world
 * 1, stage 0, f32, batch 12, context = block, AdamW, 25 MiB buckets. */
em_mem_config em_mem_config_defaults(void);

typedef enum em_mem_category {
    EM_MEM_PARAMS = 0,
    EM_MEM_GRADS,
    EM_MEM_OPTIMIZER,
    EM_MEM_ACTIVATIONS,
    EM_MEM_COMM,
    EM_MEM_RUNTIME,
    EM_MEM_NCATEGORIES
} em_mem_category;

typedef struct em_mem_estimate {
    int64_t n_params;                   /* P, as em_module_num_params counts em_gpt_new's model */
    uint64_t bytes[EM_MEM_NCATEGORIES]; /* per rank */
    uint64_t total;                     /* their sum */
} em_mem_estimate;

/* Fills *out (caller-owned; zeroed first) for config c. Allocates nothing and
 * reads nothing but c. EM_ERR_ARG naming the field and its value for a NULL
 * c or out, a size < 1, n_embd not a multiple of n_head, context outside
 * 0..block_size, a stage outside 0..3, an unknown precision or optimizer,
 * momentum without SGD, a negative bucket or threads, or a total past 2^62
 * bytes. */
em_status em_estimate_memory(const em_mem_config *c, em_mem_estimate *out);
/* "parameters", "gradients", "optimizer state", "activations",
 * "communication", "runtime" ("?" for anything else; static strings). */
const char *em_mem_category_name(em_mem_category c);
/* The category holding the most bytes of *e (EM_MEM_PARAMS for NULL). */
em_mem_category em_mem_biggest(const em_mem_estimate *e);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
