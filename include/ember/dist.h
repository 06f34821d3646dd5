/* ember/dist.h — distribution: the rendezvous store, process groups and their
 * collectives (CPU backend), DDP, and the Accelerator that ties prepare /
 * backward / accumulate / step / save together.
 *
 * The same program runs alone or under `ember launch -n N`: the launcher sets
 * RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
 * (torchrun's names) plus EMBER_STORE_TOKEN (the job's secret) and
 * EMBER_RESTART_COUNT, and hosts the store at MASTER_ADDR:MASTER_PORT. With
 * no WORLD_SIZE in the environment a program is a group of one and needs no
 * store.
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
    EM_TRANSPORT_SHM       /* shared memory only: every rank must be on this host */
} em_transport;

typedef struct em_pg em_pg;

typedef struct em_pg_config {
    int rank, world;   /* 0 <= rank < world */
    em_store *store;   /* borrowed; NULL only when world == 1 */
    /* Key prefix in the store; NULL = "pg". The store counts the groups
     * joined under a name, so one name serves any number of groups, one
     * after another or alive at once, as long as every rank makes them in
     * the same order (each join meets under "NAME/G", G = 0, 1, ...). */
    const char *name;
    double timeout_s;  /* every collective's limit; 0 = EM_DIST_DEFAULT_TIMEOUT */
    em_transport transport;
} em_pg_config;

/* Joins a group: publishes this rank's address in the store, connects to
 * every other rank, maps the shared segment for local ranks. Blocks until all
 * `world` ranks joined or the timeout. NULL + EM_ERR_ARG / EM_ERR_DIST /
 * EM_ERR_TIMEOUT with a message naming the rank(s) missing. A join that
 * cannot complete fails as soon as the store knows it, not at the timeout:
 * EM_ERR_DIST naming the rank when that rank's store connection closed
 * after it began to join (its process exited or died), when a launcher
 * noted its process's exit (em_pg_from_env's groups, see below), or when it
 * joins as one of a different number of ranks. */
em_pg *em_pg_new(const em_pg_config *cfg);
/* The group the environment describes (see the top of this file), owning
 * its store connection: a group of one when WORLD_SIZE is unset. EMBER_
 * TRANSPORT=tcp|shm|auto and EMBER_TIMEOUT (seconds) are honoured. NULL +
 * error when the variables are malformed (naming the variable) or joining
 * fails. Call it again for another group (after freeing the first, or with
 * both alive: every rank in the same order). A launcher that watches the
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
/* Waits for queued asynchronous work, leaves the group, frees. NULL no-op. */
void em_pg_free(em_pg *pg);
int em_pg_rank(const em_pg *pg);
int em_pg_world(const em_pg *pg);
/* The seconds every blocking call of the group may wait (0 for NULL). */
double em_pg_timeout(const em_pg *pg);
/* The data path the group's collectives use: EM_TRANSPORT_SHM when every rank
 * is on this machine and mapped the shared segment (AUTO or SHM asked for),
 * else EM_TRANSPORT_TCP (also for a group of one, and for send/recv, which
 * always go over TCP). */
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
     * true: its (zero or accumulated) gradient is averaged like the rest. */
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
} em_config;

/* The defaults: 1 process, 1 machine, rank 0, 127.0.0.1, port 29500, no
 * mixed precision, accumulation 1, split off, even on, 300 s, 0 restarts. */
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
 * BATCHES, EMBER_EVEN_BATCHES, EMBER_TIMEOUT, plus the launcher's), and the
 * non-zero fields of the em_accel_config given in code. */
typedef struct em_accel_config {
    int grad_accum;               /* micro-batches per optimizer step; 0 = config/env, else 1 */
    em_precision_kind mixed_precision; /* DEFAULT = config/env, else NO; see em_accel_prepare */
    int split_batches;            /* 0 = config/env (else off), 1 on, -1 off */
    int even_batches;             /* 0 = config/env (else on), 1 on, -1 off */
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
int em_accel_local_rank(const em_accelerator *a);
bool em_accel_is_main_process(const em_accelerator *a);
bool em_accel_is_local_main(const em_accelerator *a);
int em_accel_grad_accum(const em_accelerator *a);
em_pg *em_accel_pg(const em_accelerator *a); /* borrowed */
/* The device this process computes on (em_accel_config.device). */
em_device em_accel_device(const em_accelerator *a);
/* Moves b->x and b->y to the Accelerator's device (em_to: the copies live in
 * the caller's scope; nothing happens on the CPU). em_accel_next does this
 * itself; a loop that draws batches another way (a window sampler) calls
 * it. EM_ERR_ARG on NULL, the em_to error otherwise (b unchanged). */
em_status em_accel_to_device(em_accelerator *a, em_batch *b);

/* prepare: any argument may be NULL. model: moved to the Accelerator's
 * device (it must not be flattened yet unless it is there already; EM_ERR_
 * DEVICE says so), flattened, and wrapped in DDP when world > 1; opt: its step/zero_grad go through em_accel_step /
 * em_accel_zero_grad; loader: sharded over ranks (see em_loader_set_shard);
 * sched: stepped with the optimizer (its lr written to every group). The
 * Accelerator borrows all of them: they must outlive it.
 * Mixed precision (bf16 / fp16): preparing the model turns autocast on in the
 * calling thread (em_autocast_set, ember/amp.h) until em_accelerator_free, so
 * the forward passes run under the policy while the parameters stay f32
 * masters; fp16 also scales the loss in em_accel_backward and unscales in
 * clip / step, skipping (on every rank alike) a step whose gradients hold
 * inf or NaN. */
em_status em_accel_prepare(em_accelerator *a, em_module *model, em_optimizer *opt, em_loader *loader,
                           const em_lr_schedule *sched);
/* A window sampler is sharded so that the ranks together draw exactly the
 * windows one process with the whole batch draws (batch % world == 0). */
em_status em_accel_prepare_sampler(em_accelerator *a, em_window_sampler *s);
/* An extra generator whose state save_state / load_state must keep (the
 * default generator of the calling thread is always kept). Borrowed. */
em_status em_accel_register_rng(em_accelerator *a, em_rng *rng);

/* Micro-step bookkeeping (Accelerate's `with accelerator.accumulate(model)`):
 * call once before each micro-batch's forward. Returns sync_gradients for
 * it: true on every grad_accum-th micro-batch and on the last batch of the
 * prepared loader's epoch. */
bool em_accel_accumulate(em_accelerator *a);
bool em_accel_sync_gradients(const em_accelerator *a);
/* Like em_loader_next on the prepared loader, and records whether this is
 * the epoch's last batch (for sync_gradients and gather_for_metrics). */
bool em_accel_next(em_accelerator *a, em_batch *b);
/* Backward of loss / grad_accum (times the loss scale under fp16), DDP-synced
 * only when sync_gradients. */
em_status em_accel_backward(em_accelerator *a, em_tensor *loss);
/* Global-norm clipping of the model's gradients, returning their norm before
 * clipping (as em_clip_grad_norm). Only on sync_gradients micro-steps: NAN
 * and nothing changed otherwise. Under fp16 it unscales the gradients first
 * and returns INFINITY without clipping when they overflowed. */
double em_accel_clip_grad_norm(em_accelerator *a, double max_norm, em_status *status);
/* Optimizer step (and schedule: the lr for the next step) only when
 * sync_gradients; a no-op otherwise. Under fp16: unscales (if clip did not),
 * skips the step when the gradients overflowed on any rank (the schedule does
 * not advance) and updates the scale. */
em_status em_accel_step(em_accelerator *a);
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
 * even_batches padding duplicated in the last batch of the epoch. */
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

/* Saves model (DIR/model.safetensors, main process), optimizer
 * (DIR/optimizer.safetensors), schedule position and step, loader position
 * and global batch, sampler state and batch, loss scaler, and every rank's
 * registered generators and default generator (DIR/rank_R.json), so
 * load_state continues a run exactly. Every rank calls it (it is
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
 * this run has. */
em_status em_accel_save_state(em_accelerator *a, const char *dir);
em_status em_accel_load_state(em_accelerator *a, const char *dir);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
