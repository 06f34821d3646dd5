/* ddp_from_scratch.c — data-parallel training written out by hand with only a
 * process group and its collectives: first DDP (every rank averages its
 * gradient with the others'), then the same loop turned into ZeRO-1 (the
 * optimizer's state cut into one piece per rank).
 *
 * ember has both built in (em_ddp, the Accelerator); here every step is
 * spelled out so it can be read. The two parts train the same model on the
 * same data from the same start, and print the same losses: ZeRO-1 changes
 * where the optimizer's work is done, not what it computes.
 *
 *   ./build/ember launch -n 2 ./build/examples/ddp_from_scratch ddp
 *   ./build/ember launch -n 2 ./build/examples/ddp_from_scratch zero1
 *   ./build/examples/ddp_from_scratch ddp [--steps N]     (alone: a group of one)
 *
 * The task: points of R^8 in 3 classes, the class being the largest of three
 * fixed random projections of the point; an MLP 8 -> 32 -> 3 learns it. Each
 * step takes a batch of 24 points; on W ranks each rank computes 24/W of them.
 * Rank 0 prints the loss of the whole batch at every step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

enum { IN = 8, HIDDEN = 32, CLASSES = 3, N_DATA = 480, BATCH = 24 };
#define LR 1e-2

/* ---- set-up shared by both parts ---------------------------------------------- */

typedef struct trainer {
    em_pg *pg;
    int rank, world;
    em_tensor *x, *y; /* the whole dataset: (N_DATA,IN) f32 points, (N_DATA) i32 classes */
    em_module *model;
    em_nn_linear *fc1, *fc2;
    em_tensor *flat_params, *flat_grads; /* (P): every parameter (gradient), one after another */
    int64_t P;
} trainer;

static em_status setup(trainer *t)
{
    /* Under `ember launch -n W` the launcher tells each process its rank and
     * where to meet the others; started alone, this is a group of one and
     * every collective below just returns its input. */
    t->pg = em_pg_from_env();
    if (!t->pg) return em_last_status();
    t->rank = em_pg_rank(t->pg);
    t->world = em_pg_world(t->pg);
    if (BATCH % t->world != 0)
        return em_set_error(EM_ERR_ARG, "a batch of %d rows does not split evenly over %d ranks", BATCH,
                            t->world);

    /* Every rank makes the whole dataset from the same seed, so none is sent
     * (a real job would have each rank read its own part from disk). */
    em_rng data_rng = em_rng_new(42);
    t->x = em_randn(EM_F32, EM_SHAPE(N_DATA, IN), &data_rng);
    em_tensor *teacher = em_randn(EM_F32, EM_SHAPE(IN, CLASSES), &data_rng);
    em_scope s = em_scope_begin();
    t->y = em_keep(em_argmax(em_matmul(t->x, teacher), 1, false));
    em_scope_end(s);
    em_free(teacher);

    /* Each rank draws its initial weights from its own seed, on purpose:
     * ranks that started apart would train apart, and both parts begin with
     * the cure (a broadcast of rank 0's weights). */
    em_rng init_rng = em_rng_new(1000 + (uint64_t)t->rank);
    t->model = em_module_new(NULL, "");
    t->fc1 = em_nn_linear_new(t->model, "fc1", IN, HIDDEN, true, &init_rng);
    t->fc2 = em_nn_linear_new(t->model, "fc2", HIDDEN, CLASSES, true, &init_rng);
    if (!t->y || !t->fc2) return em_last_status();
    /* All parameters in one buffer, all gradients in another: a collective
     * then moves the whole model in one call, and ZeRO can cut it anywhere.
     * The buffer's length P is a little more than the 387 parameters: each
     * parameter starts on a 64-byte boundary, and the gaps hold zeros with
     * zero gradients, which no step below changes. */
    em_status st = em_module_flatten(t->model);
    t->flat_params = em_module_flat_params(t->model, EM_F32);
    t->flat_grads = em_module_flat_grads(t->model, EM_F32);
    t->P = em_numel(t->flat_params);
    return st;
}

/* The mean loss over this rank's share of step `step`'s batch: rows
 * [first + rank*B/W, first + (rank+1)*B/W) of the dataset. 0-dim, in the
 * caller's scope; NULL with the error set if anything failed. */
static em_tensor *local_loss(trainer *t, int step)
{
    int64_t per_rank = BATCH / t->world;
    int64_t first = (int64_t)step * BATCH % N_DATA + t->rank * per_rank;
    em_tensor *x = em_narrow(t->x, 0, first, per_rank), *y = em_narrow(t->y, 0, first, per_rank);
    em_tensor *h = em_relu(em_nn_linear_forward(t->fc1, x));                      /* (B/W,HIDDEN) */
    return em_cross_entropy(em_nn_linear_forward(t->fc2, h), y, EM_IGNORE_INDEX); /* logits (B/W,CLASSES) */
}

/* The whole batch's loss is the average of the ranks' losses (each a mean
 * over as many rows); rank 0 prints it. %.9g prints every f32 exactly, so
 * two runs can be compared bit for bit. */
static em_status report(trainer *t, int step, em_tensor *loss)
{
    em_tensor *mean = loss ? em_scalar(EM_F32, em_item(loss)) : NULL;
    em_status st = mean ? em_all_reduce(t->pg, mean, EM_RED_AVG, NULL) : em_last_status();
    if (st == EM_OK && t->rank == 0) printf("step %2d | loss %.9g\n", step, em_item(mean));
    return st;
}

static em_adam_config adamw_config(void)
{
    em_adam_config c = em_adamw_defaults();
    c.lr = LR;
    return c;
}

/* ---- part 1: DDP by hand ------------------------------------------------------ */

static em_status train_ddp(trainer *t, int steps)
{
    /* Start equal: rank 0's weights overwrite everyone's. From here on the
     * ranks stay equal without ever sending weights again, because each
     * applies the same update to the same weights. */
    em_status st = em_broadcast(t->pg, t->flat_params, 0, NULL);

    /* Every rank keeps a whole AdamW: two moments per parameter, the same
     * numbers on every rank (same gradients, same weights). That copy on
     * each of the W ranks is the waste part 2 removes. */
    em_named named[4];
    em_tensor *params[4];
    int n = em_module_params(t->model, named, 4);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_adam_config cfg = adamw_config();
    em_optimizer *opt = st == EM_OK ? em_adamw_new(n, params, &cfg) : NULL;
    if (!opt) st = em_last_status();
    if (st == EM_OK && t->rank == 0)
        printf("ddp: %d rank(s), %lld parameters, a batch of %d (%d per rank)\n", t->world,
               (long long)em_module_num_params(t->model), BATCH, BATCH / t->world);

    for (int step = 0; st == EM_OK && step < steps; step++) {
        em_scope s = em_scope_begin();
        /* Each rank computes the gradient of the loss on its own rows... */
        em_tensor *loss = local_loss(t, step);
        st = loss ? em_backward(loss, NULL) : em_last_status();
        /* ...and the ranks average them. Each loss is a mean over B/W rows,
         * so the loss of the whole batch is the average of the W losses, and
         * (the gradient being linear) its gradient is the average of the W
         * gradients: after this call every rank holds the gradient one
         * process would have computed on the whole batch. AVG is the sum
         * divided by W. (Forget the division and Adam would hardly notice:
         * its step barely depends on the gradient's scale. SGD would take
         * steps W times too long.) em_ddp does the same in pieces (buckets), each
         * started during backward as soon as its gradients are final, so
         * the communication overlaps the computation; here it waits for
         * the end. */
        if (st == EM_OK) st = em_all_reduce(t->pg, t->flat_grads, EM_RED_AVG, NULL);
        if (st == EM_OK) st = em_optim_step(opt);
        if (st == EM_OK) st = em_module_zero_grad(t->model); /* backward adds to gradients */
        if (st == EM_OK) st = report(t, step, loss);
        em_scope_end(s);
    }
    em_optim_free(opt);
    return st;
}

/* ---- part 2: the same loop as ZeRO-1 ----------------------------------------- */

static em_status train_zero1(trainer *t, int steps)
{
    em_status st = em_broadcast(t->pg, t->flat_params, 0, NULL); /* start equal, as in part 1 */

    /* Cut the P parameters into W chunks of C = ceil(P/W); rank r owns
     * elements [rC, rC+C). The collectives move equal pieces (reduce-scatter
     * hands rank r elements [rC, rC+C) of a buffer of W*C, all-gather joins W
     * pieces of C), so when W does not divide P the last chunk is padded with
     * W*C - P zeros. A padding element gets a zero gradient, AdamW leaves
     * it at zero (zero weight, zero moments, a zero update) and it is never
     * copied into the model. `mine` counts the real elements of this rank's
     * chunk (fewer than C on the last rank if it holds padding). */
    int64_t W = t->world, C = (t->P + W - 1) / W, lo = t->rank * C, mine = t->P - lo;
    if (mine > C) mine = C;
    if (mine < 0) mine = 0; /* a chunk of nothing but padding (a tiny P, many ranks) */

    /* `padded` is the whole model in W*C elements: the gradients on their
     * way into the reduce-scatter, then the weights on their way out of the
     * all-gather (its padding stays zero). The model's own flat buffers hold
     * exactly P elements, hence the copies; an implementation that
     * allocates its flat buffers padded needs none. */
    em_tensor *padded = em_zeros(EM_F32, EM_SHAPE(W * C));
    /* This rank's chunk of the weights, as a tensor of its own with a
     * gradient of its own, is the one parameter its optimizer knows: AdamW
     * allocates its two moments for C elements instead of P, saving 2(P-C)
     * numbers per rank (about 2P when W is large). That is all ZeRO-1 is.
     * It computes what part 1 computes because AdamW is elementwise: an
     * element's update reads only its own weight, gradient and moments, and
     * the step count and learning rate, which every element shares here (one
     * parameter group; with several, each chunk would need each group's
     * settings for its part). So em_adamw_new over a 1-D chunk does, element
     * by element, the very arithmetic part 1's optimizer does. */
    em_tensor *chunk = em_zeros(EM_F32, EM_SHAPE(C)), *chunk_grad = em_zeros(EM_F32, EM_SHAPE(C));
    if (!padded || !chunk || !chunk_grad) st = em_last_status();
    em_scope s = em_scope_begin();
    if (st == EM_OK && mine > 0)
        st = em_copy_into(em_narrow(chunk, 0, 0, mine), em_narrow(t->flat_params, 0, lo, mine));
    em_scope_end(s);
    if (st == EM_OK) st = em_set_requires_grad(chunk, true);
    if (st == EM_OK) st = em_set_grad_buffer(chunk, chunk_grad);
    em_adam_config cfg = adamw_config();
    em_optimizer *opt = st == EM_OK ? em_adamw_new(1, &chunk, &cfg) : NULL;
    if (!opt) st = em_last_status();
    if (st == EM_OK && t->rank == 0)
        printf("zero1: %d rank(s), a flat buffer of %lld in %d chunks of %lld (%lld of padding): "
               "AdamW state for %lld numbers per rank instead of %lld\n",
               t->world, (long long)t->P, t->world, (long long)C, (long long)(W * C - t->P),
               (long long)(2 * C), (long long)(2 * t->P));

    for (int step = 0; st == EM_OK && step < steps; step++) {
        s = em_scope_begin();
        /* Forward and backward as in part 1: each rank gets the full
         * gradient (all P elements) of the loss on its own rows. */
        em_tensor *loss = local_loss(t, step);
        st = loss ? em_backward(loss, NULL) : em_last_status();
        /* Reduce-scatter instead of all-reduce: rank r receives the average
         * over ranks of its own chunk only; no rank needs the averaged
         * gradient of weights it does not update. (ember's em_zero keeps
         * DDP's all-reduce at stage 1, where every rank then holds all the
         * gradients and clips them as DDP does, and reduce-scatters at
         * stage 2, where it also gives back the full gradients' memory.) */
        if (st == EM_OK) st = em_copy_into(em_narrow(padded, 0, 0, t->P), t->flat_grads);
        if (st == EM_OK) st = em_reduce_scatter(t->pg, chunk_grad, padded, EM_RED_AVG, NULL);
        /* Each rank updates its chunk: a W-th of the optimizer's work. */
        if (st == EM_OK) st = em_optim_step(opt);
        /* All-gather: the W updated chunks, end to end, are the new weights;
         * every rank copies them into its model for the next forward. An
         * all-reduce is itself a reduce-scatter followed by an all-gather,
         * so ZeRO-1 sends as many bytes per step as DDP: it saves memory,
         * not traffic (it moves weights in the second half, not gradients). */
        if (st == EM_OK) st = em_all_gather(t->pg, padded, chunk, NULL);
        if (st == EM_OK) st = em_copy_into(t->flat_params, em_narrow(padded, 0, 0, t->P));
        if (st == EM_OK) st = em_module_zero_grad(t->model);
        if (st == EM_OK) st = report(t, step, loss);
        em_scope_end(s);
    }
    em_optim_free(opt);
    em_free(chunk); /* after its optimizer, which holds it */
    em_free(chunk_grad);
    em_free(padded);
    return st;
}

/* ---- main ----------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *part = argc > 1 ? argv[1] : "", *bad = NULL;
    int steps = 20;
    if (strcmp(part, "ddp") && strcmp(part, "zero1")) bad = argc > 1 ? part : "(nothing)";
    for (int i = 2; !bad && i < argc; i += 2) {
        char *end;
        if (strcmp(argv[i], "--steps") || i + 1 == argc)
            bad = argv[i];
        else if ((steps = (int)strtol(argv[i + 1], &end, 10)) < 1 || *end)
            bad = argv[i + 1];
    }
    if (bad) {
        fprintf(stderr,
                "ddp_from_scratch: unexpected '%s'\nusage: ddp_from_scratch ddp|zero1 [--steps N>0]\n", bad);
        return 2;
    }
    trainer t = {0};
    em_status st = setup(&t);
    if (st == EM_OK) st = !strcmp(part, "ddp") ? train_ddp(&t, steps) : train_zero1(&t, steps);
    if (st != EM_OK) fprintf(stderr, "ddp_from_scratch: rank %d: %s\n", t.rank, em_last_error());
    em_module_free(t.model);
    em_free(t.x);
    em_free(t.y);
    em_pg_free(t.pg);
    return st == EM_OK ? 0 : 1;
}
