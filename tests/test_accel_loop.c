/* test_accel_loop.c — the Accelerator's loop without traps (issue 15): each
 * test is a call order or setup a reasonable program uses, which trained
 * wrongly without an error before:
 *   iteration calls tell the end of an epoch from a failure (1 / 0 / -1);
 *   em_accel_accumulate before or after em_accel_next trains the same;
 *   gather_for_metrics drops the even_batches padding however the prepared
 *   loader is iterated, with several loaders too;
 *   the generators of a prepared model's modules (dropout) resume exactly
 *   without registering them;
 *   prepare adds models, optimizers, loaders and schedules, and save/load
 *   keep all of them;
 *   autocast only inside the regions marked and the training forward. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

static void no_user_config(void)
{
    th_no_user_config();
    unsetenv("EMBER_MIXED_PRECISION");
    unsetenv("EMBER_GRAD_ACCUM");
    unsetenv("EMBER_EVEN_BATCHES");
    unsetenv("EMBER_SPLIT_BATCHES");
}

static void alone(void)
{
    no_user_config();
    unsetenv("WORLD_SIZE");
}

static char *new_base(void)
{
    static char base[PATH_MAX];
    return th_tmpdir(base, sizeof base, "ember-accloop");
}

/* ---- datasets ------------------------------------------------------------------ */

/* n examples: x = (i, i mod 3, 1 - i/n) f32, y = (x0 * 0.1 - x1 + 2 x2) f32;
 * the example whose index is `fail` (if >= 0) fails with EM_ERR_IO. */
typedef struct reg_data {
    int64_t n, fail;
} reg_data;

static int64_t reg_len(void *user) { return ((reg_data *)user)->n; }

static em_status reg_get(void *user, int64_t i, void *x, void *y)
{
    reg_data *d = user;
    if (i == d->fail) return em_set_error(EM_ERR_IO, "reg: example %lld cannot be read", (long long)i);
    float *v = x;
    v[0] = (float)i;
    v[1] = (float)(i % 3);
    v[2] = 1.0f - (float)i / (float)d->n;
    *(float *)y = 0.1f * v[0] - v[1] + 2.0f * v[2];
    return EM_OK;
}

static em_dataset reg_dataset(reg_data *d)
{
    return (em_dataset){
        .len = reg_len, .get = reg_get, .user = d, .x_field = {EM_F32, 1, {3}}, .y_field = {EM_F32, 1, {1}}};
}

/* ---- 1. iteration calls: 1 a batch, 0 the end of the epoch, -1 a failure ---------- */

TEST(test_loader_next_returns_minus_one_with_the_datasets_error_when_get_fails)
{
    reg_data d = {
        6,
        3,
    };
    em_dataset ds = reg_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 2});
    CHECK_NOTNULL(l);
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_loader_next(l, &b) == 1);
    int r = 0;
    CHECK_ERR(r = em_loader_next(l, &b), EM_ERR_IO, "reg: example 3 cannot be read");
    CHECK(r == -1 && b.x == NULL && b.size == 0);
    em_scope_end(s);
    em_loader_free(l);
}

TEST(test_loader_next_returns_zero_without_an_error_at_the_end_of_the_epoch)
{
    reg_data d = {5, -1};
    em_dataset ds = reg_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 2, .prefetch = 2});
    em_scope s = em_scope_begin();
    em_batch b;
    int got[5];
    for (int i = 0; i < 5; i++) got[i] = em_loader_next(l, &b);
    CHECK(got[0] == 1 && got[1] == 1 && got[2] == 1 && got[3] == 0 && got[4] == 1); /* then epoch 1 */
    em_scope_end(s);
    em_loader_free(l);
}

TEST(test_accel_next_returns_minus_one_on_a_failing_loader_and_zero_at_the_end)
{
    alone();
    em_accelerator *a = em_accelerator_new(NULL);
    reg_data d = {4, -1};
    em_dataset ds = reg_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 2});
    em_batch b;
    int r = 0;
    CHECK_ERR(r = em_accel_next(a, &b), EM_ERR_ARG, "no loader was prepared");
    CHECK(r == -1);
    CHECK_OK(em_accel_prepare(a, NULL, NULL, l, NULL));
    em_scope s = em_scope_begin();
    CHECK(em_accel_next(a, &b) == 1 && em_accel_next(a, &b) == 1);
    CHECK(em_accel_next(a, &b) == 0 && em_last_status() == EM_OK);
    d.fail = 1; /* epoch 1's first batch holds example 1 */
    CHECK_ERR(r = em_accel_next(a, &b), EM_ERR_IO, "example 1 cannot be read");
    CHECK(r == -1 && b.x == NULL);
    em_scope_end(s);
    em_accelerator_free(a);
    em_loader_free(l);
}

/* ---- a small regression job ------------------------------------------------------- */

typedef enum order { NEXT_FIRST, ACCUMULATE_FIRST, NO_ACCUMULATE, RAW_LOADER } order;

typedef struct job {
    order order;
    int epochs, accum, batch;
    int64_t n;
    char params[PATH_MAX]; /* rank 0 writes the final parameters here */
    int64_t steps;    /* rank 0 writes em_accel_step_count here (through the file too) */
} job;

/* A linear 3 -> 1 model trained with SGD on reg_data over j->epochs epochs,
 * the micro-step calls in the order j->order; rank 0 writes the parameters
 * and the step count. */
static void order_job(int rank, int world, void *ctx)
{
    (void)world;
    job *j = ctx;
    no_user_config();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.grad_accum = j->accum});
    CHECK_NOTNULL(a);
    reg_data d = {j->n, -1};
    em_dataset ds = reg_dataset(&d);
    em_loader *l =
        em_loader_new(&ds, &(em_loader_config){.batch_size = j->batch, .shuffle = true, .seed = 3});
    em_rng init = em_rng_new(9);
    em_module *root = em_module_new(NULL, NULL);
    em_nn_linear *lin = em_nn_linear_new(root, "lin", 3, 1, true, &init);
    CHECK_NOTNULL(lin);
    em_tensor *ps[2] = {lin->weight, lin->bias};
    em_sgd_config sc = em_sgd_defaults();
    sc.lr = 0.01;
    em_optimizer *opt = em_sgd_new(2, ps, &sc);
    CHECK_OK(em_accel_prepare(a, root, opt, l, NULL));
    for (int e = 0; e < j->epochs; e++) {
        for (;;) {
            em_scope s = em_scope_begin();
            em_batch b;
            if (j->order == ACCUMULATE_FIRST) em_accel_accumulate(a);
            int r = j->order == RAW_LOADER ? em_loader_next(l, &b) : em_accel_next(a, &b);
            CHECK(r >= 0);
            if (r == 0) {
                em_scope_end(s);
                break;
            }
            if (j->order == NEXT_FIRST || j->order == RAW_LOADER) em_accel_accumulate(a);
            em_tensor *loss = em_mse_loss(em_nn_linear_forward(lin, b.x), b.y);
            CHECK_OK(em_accel_backward(a, loss));
            CHECK_OK(em_accel_step(a));
            CHECK_OK(em_accel_zero_grad(a));
            em_scope_end(s);
        }
    }
    if (rank == 0) {
        float out[5];
        memcpy(out, em_data(lin->weight), 3 * sizeof(float));
        memcpy(out + 3, em_data(lin->bias), sizeof(float));
        out[4] = (float)em_accel_step_count(a);
        th_write_file(j->params, out, sizeof out);
    }
    em_accelerator_free(a);
    em_optim_free(opt);
    em_module_free(root);
    em_loader_free(l);
}

/* Runs the job in each order and checks that all end with bitwise the same
 * parameters and `steps` optimizer steps. */
static void check_orders_agree(int world, job base, int64_t steps)
{
    char *dir = new_base();
    static const order orders[] = {NEXT_FIRST, ACCUMULATE_FIRST, NO_ACCUMULATE, RAW_LOADER};
    static const char *names[] = {"next then accumulate", "accumulate then next", "no accumulate",
                                  "em_loader_next then accumulate"};
    float want[5];
    for (int k = 0; k < 4; k++) {
        job j = base;
        j.order = orders[k];
        th_pathf(j.params, sizeof j.params, "%s/params-%d", dir, k);
        TH_RANKS_ENV(world, order_job, &j);
        size_t n = 0;
        float *got = (float *)th_slurp(j.params, &n);
        CHECK(n == sizeof want);
        if (k == 0) memcpy(want, got, sizeof want);
        if (got[4] != (float)steps)
            th_fail(__FILE__, __LINE__, "world %d, %s: %g optimizer steps, want %lld", world, names[k],
                    got[4], (long long)steps);
        if (memcmp(got, want, sizeof want))
            th_fail(__FILE__, __LINE__, "world %d: %s ends with weight[0] %.9g where %s ends with %.9g",
                    world, names[k], got[0], names[0], want[0]);
        free(got);
    }
}

/* 11 examples, batch 2: 6 batches an epoch, accumulation 4: syncs after
 * batch 4 and after batch 6, the end of the epoch; 2 epochs = 4 steps. */
TEST(test_accumulate_before_or_after_next_gives_the_same_parameters_one_process)
{
    check_orders_agree(1, (job){.epochs = 2, .accum = 4, .batch = 2, .n = 11}, 4);
}

/* 2 ranks x batch 2: 3 (padded) global batches an epoch, accumulation 2:
 * syncs after batch 2 and 3; 2 epochs = 4 steps. */
TEST(test_accumulate_before_or_after_next_gives_the_same_parameters_two_processes)
{
    check_orders_agree(2, (job){.epochs = 2, .accum = 2, .batch = 2, .n = 11}, 4);
}

/* ---- 3. gather_for_metrics -------------------------------------------------------- */

/* Gathers y of every batch of one epoch of l (through em_accel_next when
 * `accel`, else em_loader_next); checks each example arrives once. */
static void gather_epoch(em_accelerator *a, em_loader *l, bool accel, int64_t n)
{
    int64_t seen = 0;
    int r;
    em_batch b;
    char *count = calloc((size_t)n, 1);
    for (;;) {
        em_scope s = em_scope_begin();
        r = accel ? em_accel_next(a, &b) : em_loader_next(l, &b);
        if (r <= 0) {
            em_scope_end(s);
            break;
        }
        em_tensor *all = em_accel_gather_for_metrics(a, em_narrow(b.x, 1, 0, 1));
        CHECK_NOTNULL(all);
        for (int64_t i = 0; i < em_shape(all)[0]; i++) {
            int64_t id = (int64_t)((float *)em_data(em_contiguous(all)))[i];
            CHECK(id >= 0 && id < n);
            count[id]++;
        }
        seen += em_shape(all)[0];
        em_scope_end(s);
    }
    CHECK(r == 0);
    if (seen != n)
        th_fail(__FILE__, __LINE__, "gathered %lld examples of a dataset of %lld", (long long)seen,
                (long long)n);
    for (int64_t i = 0; i < n; i++) CHECK(count[i] == 1);
    free(count);
}

static void metrics_both_ways(int rank, int world, void *ctx)
{
    (void)rank, (void)world, (void)ctx;
    no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    reg_data d = {5, -1}; /* batch 2 x 2 ranks: [0 1 2 3] [4 + 3 padded] */
    em_dataset ds = reg_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 2});
    CHECK_OK(em_accel_prepare(a, NULL, NULL, l, NULL));
    gather_epoch(a, l, true, 5);
    gather_epoch(a, l, false, 5); /* as examples/classifier.c iterates */
    em_accelerator_free(a);
    em_loader_free(l);
}

TEST(test_gather_for_metrics_drops_the_padding_however_the_loader_is_iterated)
{
    TH_RANKS_ENV(2, metrics_both_ways, NULL);
}

/* A training loader (prepared first) run to its epoch's end, then an
 * evaluation loader of another size: gather_for_metrics follows the loader
 * that returned a batch last, not the one that ended an epoch. */
static void metrics_two_loaders(int rank, int world, void *ctx)
{
    (void)rank, (void)world, (void)ctx;
    no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    reg_data dt = {5, -1}, de = {7, -1};
    em_dataset dst = reg_dataset(&dt), dse = reg_dataset(&de);
    em_loader *train = em_loader_new(&dst, &(em_loader_config){.batch_size = 2});
    em_loader *eval = em_loader_new(&dse, &(em_loader_config){.batch_size = 2});
    CHECK_OK(em_accel_prepare(a, NULL, NULL, train, NULL));
    CHECK_OK(em_accel_prepare(a, NULL, NULL, eval, NULL));
    em_scope s = em_scope_begin();
    em_batch b;
    while (em_accel_next(a, &b) > 0) {
    }
    em_scope_end(s);
    gather_epoch(a, eval, false, 7);
    gather_epoch(a, train, false, 5);
    em_accelerator_free(a);
    em_loader_free(train);
    em_loader_free(eval);
}

TEST(test_gather_for_metrics_follows_the_prepared_loader_that_returned_last)
{
    TH_RANKS_ENV(2, metrics_two_loaders, NULL);
}

/* ---- 4. the generators of a prepared model's modules -------------------------------- */

TEST(test_module_rngs_lists_the_dropout_generators_by_dotted_name)
{
    em_gpt_config c = {
        .vocab_size = 8, .block_size = 4, .n_layer = 2, .n_head = 1, .n_embd = 8, .dropout = 0.1};
    em_gpt *g = em_gpt_new(&c, 1);
    CHECK_NOTNULL(g);
    em_named_rng r[8];
    CHECK(em_module_rngs(g->m, NULL, 0) == 5); /* 1 + 2 n_layer */
    CHECK(em_module_rngs(g->m, r, 8) == 5);
    CHECK(strcmp(r[0].name, "drop.rng") == 0 && r[0].rng == &g->drop->rng);
    CHECK(strcmp(r[1].name, "h.0.attn.resid_dropout.rng") == 0);
    CHECK(r[4].rng == &g->h[1]->mlp->dropout->rng);
    CHECK_ERR(em_module_add_rng(g->drop->m, "rng", &g->drop->rng), EM_ERR_ARG,
              "already has a member named 'rng'");
    em_gpt_free(g);
}

typedef struct gpt_job {
    int steps, save_at;
    bool resume;
    char dir[PATH_MAX], params[PATH_MAX];
} gpt_job;

enum { GV = 12, GT = 8, GB = 4 };

/* A GPT with dropout 0.2 trained on random windows, nothing registered by
 * hand; saves after save_at steps or resumes from dir. */
static void gpt_dropout_job(int rank, int world, void *ctx)
{
    (void)world;
    gpt_job *j = ctx;
    no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    static int32_t tok[600];
    for (int i = 0; i < 600; i++) tok[i] = (i * 7 + i / 5) % GV;
    em_tokens tokens = em_tokens_view(tok, 600, EM_TOK_I32);
    em_window_sampler sampler;
    CHECK_OK(em_window_sampler_init(&sampler, &tokens, GB, GT, 5));
    em_gpt_config c = {.vocab_size = GV,
                       .block_size = GT,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 16,
                       .dropout = 0.2,
                       .bias = true};
    em_gpt *g = em_gpt_new(&c, 77);
    CHECK_NOTNULL(g);
    int n = em_module_params(g->m, NULL, 0);
    em_named ps[64];
    em_tensor *pt[64];
    em_module_params(g->m, ps, n);
    for (int i = 0; i < n; i++) pt[i] = ps[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-2;
    em_optimizer *opt = em_adamw_new(n, pt, &ac);
    CHECK_OK(em_accel_prepare(a, g->m, opt, NULL, NULL));
    CHECK_OK(em_accel_prepare_sampler(a, &sampler));
    if (j->resume) CHECK_OK(em_accel_load_state(a, j->dir));
    while (em_accel_step_count(a) < j->steps) {
        em_scope s = em_scope_begin();
        em_batch b;
        CHECK_OK(em_window_sampler_next(&sampler, &b));
        CHECK_OK(em_accel_backward(a, em_gpt_loss(g, b.x, b.y)));
        CHECK_OK(em_accel_step(a));
        CHECK_OK(em_accel_zero_grad(a));
        em_scope_end(s);
        if (j->save_at && em_accel_step_count(a) == j->save_at) {
            CHECK_OK(em_accel_save_state(a, j->dir));
            break;
        }
    }
    if (rank == 0 && j->params[0]) {
        em_tensor *flat = em_module_flat_params(g->m, EM_F32);
        th_write_file(j->params, em_data(flat), (size_t)em_numel(flat) * sizeof(float));
    }
    em_accelerator_free(a);
    em_optim_free(opt);
    em_gpt_free(g);
}

TEST(test_resume_continues_dropout_masks_without_registering_generators)
{
    char *base = new_base();
    gpt_job straight = {.steps = 8};
    th_pathf(straight.params, sizeof straight.params, "%s/straight", base);
    TH_RANKS_ENV(1, gpt_dropout_job, &straight);
    gpt_job first = {.steps = 8, .save_at = 4};
    th_pathf(first.dir, sizeof first.dir, "%s/state", base);
    TH_RANKS_ENV(1, gpt_dropout_job, &first);
    gpt_job second = {.steps = 8, .resume = true};
    th_pathf(second.dir, sizeof second.dir, "%s/state", base);
    th_pathf(second.params, sizeof second.params, "%s/resumed", base);
    TH_RANKS_ENV(1, gpt_dropout_job, &second);
    size_t na = 0, nb = 0;
    char *pa = th_slurp(straight.params, &na), *pb = th_slurp(second.params, &nb);
    CHECK(na == nb && na > 0);
    if (memcmp(pa, pb, na)) th_fail(__FILE__, __LINE__, "the resumed weights differ from the straight run's");
    free(pa);
    free(pb);
}

/* ---- 5. several models, optimizers, loaders and schedules -------------------------- */

/* Two linear layers as two models: enc 3 -> 4, head 4 -> 1. */
typedef struct pair {
    em_module *enc_root, *head_root;
    em_nn_linear *enc, *head;
    em_optimizer *enc_opt, *head_opt;
} pair;

static void pair_new(pair *p, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    p->enc_root = em_module_new(NULL, NULL);
    p->head_root = em_module_new(NULL, NULL);
    p->enc = em_nn_linear_new(p->enc_root, "enc", 3, 4, true, &r);
    p->head = em_nn_linear_new(p->head_root, "head", 4, 1, true, &r);
    CHECK(p->enc && p->head);
    em_sgd_config sc = em_sgd_defaults();
    sc.lr = 0.05;
    p->enc_opt = em_sgd_new(2, (em_tensor *[]){p->enc->weight, p->enc->bias}, &sc);
    em_adam_config ac = em_adam_defaults();
    ac.lr = 0.01;
    p->head_opt = em_adam_new(2, (em_tensor *[]){p->head->weight, p->head->bias}, &ac);
    CHECK(p->enc_opt && p->head_opt);
}

static void pair_free(pair *p)
{
    em_optim_free(p->enc_opt);
    em_optim_free(p->head_opt);
    em_module_free(p->enc_root);
    em_module_free(p->head_root);
}

static em_tensor *pair_loss(pair *p, em_batch *b)
{
    em_tensor *h = em_relu(em_nn_linear_forward(p->enc, b->x));
    return em_mse_loss(em_nn_linear_forward(p->head, h), b->y);
}

static double sum_sq_grads(em_tensor *const *ps, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) {
        em_tensor *g = em_grad(ps[i]);
        for (int64_t k = 0; k < em_numel(g); k++)
            s += (double)((float *)em_data(g))[k] * ((float *)em_data(g))[k];
    }
    return s;
}

TEST(test_prepare_twice_adds_a_second_model_optimizer_and_schedule_and_steps_both)
{
    alone();
    em_accelerator *a = em_accelerator_new(NULL);
    pair p;
    pair_new(&p, 1);
    reg_data d = {8, -1}, d2 = {3, -1};
    em_dataset ds = reg_dataset(&d), ds2 = reg_dataset(&d2);
    em_loader *train = em_loader_new(&ds, &(em_loader_config){.batch_size = 4});
    em_loader *eval = em_loader_new(&ds2, &(em_loader_config){.batch_size = 3});
    em_lr_schedule warm = {.kind = EM_LR_WARMUP, .base_lr = 0.1, .warmup = 4};
    CHECK_OK(em_accel_prepare(a, p.enc_root, p.enc_opt, train, &warm));
    CHECK_OK(em_accel_prepare(a, p.head_root, p.head_opt, eval, NULL));
    float enc0 = ((float *)em_data(p.enc->weight))[0], head0 = ((float *)em_data(p.head->weight))[0];
    em_scope s = em_scope_begin();
    em_batch b;
    CHECK(em_accel_next(a, &b) == 1 && b.size == 4); /* the first loader prepared */
    CHECK_OK(em_accel_backward(a, pair_loss(&p, &b)));
    em_tensor *all[4] = {p.enc->weight, p.enc->bias, p.head->weight, p.head->bias};
    double want = sqrt(sum_sq_grads(all, 4));
    em_status st;
    CHECK_NEAR(em_accel_clip_grad_norm(a, 1e9, &st), want, 1e-6 * want); /* both models' gradients */
    CHECK_OK(st);
    CHECK_OK(em_accel_step(a));
    CHECK_OK(em_accel_zero_grad(a));
    em_scope_end(s);
    CHECK(((float *)em_data(p.enc->weight))[0] != enc0 && ((float *)em_data(p.head->weight))[0] != head0);
    CHECK(em_optim_step_count(p.enc_opt) == 1 && em_optim_step_count(p.head_opt) == 1);
    CHECK_NEAR(em_optim_get_lr(p.enc_opt, 0), 0.05 / 4, 1e-12); /* the schedule scaled its optimizer's lr */
    CHECK_NEAR(em_optim_get_lr(p.head_opt, 0), 0.01, 1e-12);   /* and only it */
    CHECK(sum_sq_grads(all, 4) == 0);                          /* zero_grad zeroed both */
    em_accelerator_free(a);
    pair_free(&p);
    em_loader_free(train);
    em_loader_free(eval);
}

TEST(test_a_schedule_prepared_alone_drives_the_last_prepared_optimizer)
{
    alone();
    em_accelerator *a = em_accelerator_new(NULL);
    pair p;
    pair_new(&p, 2);
    em_lr_schedule c = {.kind = EM_LR_WARMUP, .base_lr = 0.01, .warmup = 2};
    CHECK_ERR(em_accel_prepare(a, NULL, NULL, NULL, &c), EM_ERR_ARG, "none is prepared");
    CHECK_OK(em_accel_prepare(a, p.enc_root, p.enc_opt, NULL, NULL));
    CHECK_OK(em_accel_prepare(a, p.head_root, p.head_opt, NULL, NULL));
    CHECK_OK(em_accel_prepare(a, NULL, NULL, NULL, &c));
    CHECK_ERR(em_accel_prepare(a, NULL, NULL, NULL, &c), EM_ERR_ARG,
              "optimizer 1 (the last prepared) already has");
    em_scope s = em_scope_begin();
    em_tensor *x = em_full(EM_F32, 2, (int64_t[]){2, 3}, 1.0);
    em_batch b = {.x = x, .y = em_full(EM_F32, 2, (int64_t[]){2, 1}, 0.5), .size = 2};
    CHECK_OK(em_accel_backward(a, pair_loss(&p, &b)));
    CHECK_OK(em_accel_step(a));
    em_scope_end(s);
    CHECK_NEAR(em_optim_get_lr(p.head_opt, 0), 0.01 / 2, 0); /* warm-up step 0 of 2 from its lr */
    CHECK_NEAR(em_optim_get_lr(p.enc_opt, 0), 0.05, 0);
    em_accelerator_free(a);
    pair_free(&p);
}

TEST(test_prepare_refuses_an_optimizer_with_a_parameter_of_no_prepared_model)
{
    alone();
    em_accelerator *a = em_accelerator_new(NULL);
    pair p;
    pair_new(&p, 3);
    /* the head's optimizer while only the encoder is prepared */
    CHECK_ERR(em_accel_prepare(a, p.enc_root, p.head_opt, NULL, NULL), EM_ERR_ARG,
              "the optimizer's parameter 0 (shape (1,4)) is not a parameter of a prepared model");
    CHECK_OK(
        em_accel_prepare(a, p.enc_root, p.enc_opt, NULL, NULL)); /* nothing was prepared by the refusal */
    CHECK_ERR(em_accel_prepare(a, NULL, p.head_opt, NULL, NULL), EM_ERR_ARG, "parameter 0 (shape (1,4))");
    CHECK_OK(em_accel_prepare(a, p.head_root, p.head_opt, NULL, NULL)); /* with its model: fine */
    CHECK_ERR(em_accel_prepare(a, p.head_root, NULL, NULL, NULL), EM_ERR_ARG,
              "the model is prepared already");
    em_accelerator_free(a);
    pair_free(&p);
}

/* The encoder and head as two DDP models: 2 ranks x batch 3 against 1 rank
 * x batch 6, 4 steps through both models, then 2 through the encoder alone
 * (the head takes no part: its DDP is left alone, no error). */
typedef struct pair_job {
    char out[PATH_MAX];
} pair_job;

static void pair_ddp_job(int rank, int world, void *ctx)
{
    pair_job *j = ctx;
    no_user_config();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.bucket_mb = 1e-5});
    pair p;
    pair_new(&p, 10 + (uint64_t)rank); /* different inits: DDP broadcasts rank 0's */
    CHECK_OK(em_accel_prepare(a, p.enc_root, p.enc_opt, NULL, NULL));
    CHECK_OK(em_accel_prepare(a, p.head_root, p.head_opt, NULL, NULL));
    reg_data d = {6, -1};
    int per = 6 / world;
    for (int step = 0; step < 6; step++) {
        em_scope s = em_scope_begin();
        float x[6 * 3], y[6];
        for (int i = 0; i < per; i++) CHECK_OK(reg_get(&d, (rank * per + i + step) % 6, x + 3 * i, y + i));
        em_batch b = {.x = em_from_data(EM_F32, EM_SHAPE(per, 3), x),
                      .y = em_from_data(EM_F32, EM_SHAPE(per, 1), y),
                      .size = per};
        em_tensor *loss =
            step < 4 ? pair_loss(&p, &b) : em_mean(em_nn_linear_forward(p.enc, b.x), 0, NULL, false);
        CHECK_OK(em_accel_backward(a, loss));
        CHECK(em_last_status() == EM_OK); /* no stray error either */
        CHECK_OK(em_accel_step(a));
        CHECK_OK(em_accel_zero_grad(a));
        em_scope_end(s);
    }
    if (rank == 0) {
        float out[21];
        memcpy(out, em_data(p.enc->weight), 12 * sizeof(float));
        memcpy(out + 12, em_data(p.enc->bias), 4 * sizeof(float));
        memcpy(out + 16, em_data(p.head->weight), 4 * sizeof(float));
        memcpy(out + 20, em_data(p.head->bias), sizeof(float));
        th_write_file(j->out, out, sizeof out);
    }
    em_accelerator_free(a);
    pair_free(&p);
}

TEST(test_a_loss_through_two_prepared_models_under_ddp_matches_one_process)
{
    char *base = new_base();
    pair_job one, two;
    th_pathf(one.out, sizeof one.out, "%s/one", base);
    th_pathf(two.out, sizeof two.out, "%s/two", base);
    TH_RANKS_ENV(1, pair_ddp_job, &one);
    TH_RANKS_ENV(2, pair_ddp_job, &two);
    size_t n1 = 0, n2 = 0;
    float *a = (float *)th_slurp(one.out, &n1), *b = (float *)th_slurp(two.out, &n2);
    CHECK(n1 == n2 && n1 == 21 * sizeof(float));
    for (int i = 0; i < 21; i++)
        if (!(fabsf(a[i] - b[i]) <= 1e-5f * (1 + fabsf(a[i]))))
            th_fail(__FILE__, __LINE__, "parameter %d: %.9g alone, %.9g on two ranks", i, a[i], b[i]);
    free(a);
    free(b);
}

/* Two models, optimizers and loaders saved after a step and some
 * evaluation batches, loaded by fresh objects. */
typedef struct multi_run {
    em_accelerator *a;
    pair p;
    reg_data d, d2;
    em_dataset ds, ds2;
    em_loader *train, *eval;
} multi_run;

static multi_run *multi_new(int nmodels)
{
    alone();
    multi_run *r = calloc(1, sizeof *r);
    r->a = em_accelerator_new(NULL);
    pair_new(&r->p, 4);
    r->d = (reg_data){8, -1};
    r->d2 = (reg_data){9, -1};
    r->ds = reg_dataset(&r->d);
    r->ds2 = reg_dataset(&r->d2);
    r->train = em_loader_new(&r->ds, &(em_loader_config){.batch_size = 2, .shuffle = true, .seed = 1});
    r->eval = em_loader_new(&r->ds2, &(em_loader_config){.batch_size = 2});
    CHECK_OK(em_accel_prepare(r->a, r->p.enc_root, r->p.enc_opt, r->train, NULL));
    if (nmodels > 1) CHECK_OK(em_accel_prepare(r->a, r->p.head_root, r->p.head_opt, r->eval, NULL));
    return r;
}

static void multi_free(multi_run *r)
{
    em_accelerator_free(r->a);
    pair_free(&r->p);
    em_loader_free(r->train);
    em_loader_free(r->eval);
    free(r);
}

TEST(test_save_state_keeps_every_model_optimizer_and_loader_and_load_restores_them)
{
    char *base = new_base(), dir[PATH_MAX];
    th_pathf(dir, sizeof dir, "%s/state", base);
    multi_run *r = multi_new(2);
    em_scope s = em_scope_begin();
    em_batch b;
    for (int i = 0; i < 2; i++) {
        CHECK(em_accel_next(r->a, &b) == 1);
        CHECK_OK(em_accel_backward(r->a, pair_loss(&r->p, &b)));
        CHECK_OK(em_accel_step(r->a));
        CHECK_OK(em_accel_zero_grad(r->a));
    }
    CHECK(em_loader_next(r->eval, &b) == 1 && em_loader_next(r->eval, &b) == 1 &&
          em_loader_next(r->eval, &b) == 1);
    em_scope_end(s);
    CHECK_OK(em_accel_save_state(r->a, dir));
    struct stat st;
    CHECK(stat(th_path(dir, "model_1.safetensors"), &st) == 0 &&
          stat(th_path(dir, "optimizer_1.safetensors"), &st) == 0);
    float head[4];
    memcpy(head, em_data(r->p.head->weight), sizeof head);
    multi_free(r);

    r = multi_new(2);
    CHECK_OK(em_accel_load_state(r->a, dir));
    CHECK(memcmp(head, em_data(r->p.head->weight), sizeof head) == 0);
    CHECK(em_optim_step_count(r->p.enc_opt) == 2 && em_optim_step_count(r->p.head_opt) == 2);
    CHECK(em_loader_position(r->train).batch == 2 && em_loader_position(r->eval).batch == 3);
    multi_free(r);

    r = multi_new(1);
    CHECK_ERR(
        em_accel_load_state(r->a, dir), EM_ERR_ARG,
        "was saved with 2 models, 2 optimizers and 2 loaders; this run prepared 1 model, 1 optimizer and 1 "
        "loader");
    multi_free(r);
}

/* ---- 6. autocast only where it is marked ----------------------------------------------- */

static em_dtype matmul_dtype(void)
{
    em_scope s = em_scope_begin();
    em_tensor *m = em_ones(EM_F32, 2, (int64_t[]){2, 2});
    em_dtype dt = em_dtype_of(em_matmul(m, m));
    em_scope_end(s);
    return dt;
}

static em_accelerator *bf16_with_model(pair *p, em_loader *l)
{
    alone();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.mixed_precision = EM_PREC_BF16});
    pair_new(p, 5);
    CHECK_OK(em_accel_prepare(a, p->enc_root, p->enc_opt, l, NULL)); /* the head stays unprepared */
    return a;
}

TEST(test_an_op_after_prepare_outside_any_region_runs_in_f32)
{
    pair p;
    em_accelerator *a = bf16_with_model(&p, NULL);
    CHECK(em_autocast_dtype() == EM_F32);
    CHECK(matmul_dtype() == EM_F32);
    em_accelerator_free(a);
    pair_free(&p);
}

TEST(test_autocast_regions_nest_and_restore_the_threads_setting)
{
    pair p;
    em_accelerator *a = bf16_with_model(&p, NULL);
    CHECK_OK(em_accel_autocast_begin(a));
    CHECK(matmul_dtype() == EM_BF16);
    CHECK_OK(em_accel_autocast_begin(a));
    CHECK_OK(em_accel_autocast_end(a));
    CHECK(matmul_dtype() == EM_BF16); /* the outer region is still open */
    CHECK_OK(em_accel_autocast_end(a));
    CHECK(matmul_dtype() == EM_F32);
    CHECK_ERR(em_accel_autocast_end(a), EM_ERR_ARG, "no region is open");
    em_dtype prev = em_autocast_set(EM_F16); /* the thread's own setting comes back */
    CHECK_OK(em_accel_autocast_begin(a));
    CHECK(matmul_dtype() == EM_BF16);
    CHECK_OK(em_accel_autocast_end(a));
    CHECK(em_autocast_dtype() == EM_F16);
    em_autocast_set(prev);
    em_accelerator_free(a);
    pair_free(&p);
}

TEST(test_the_training_forward_autocasts_from_next_or_accumulate_until_backward)
{
    reg_data d = {4, -1};
    em_dataset ds = reg_dataset(&d);
    em_loader *l = em_loader_new(&ds, &(em_loader_config){.batch_size = 2});
    pair p;
    em_accelerator *a = bf16_with_model(&p, l);
    for (int k = 0; k < 2; k++) { /* next first, then accumulate first */
        em_scope s = em_scope_begin();
        em_batch b;
        if (k == 1) em_accel_accumulate(a);
        CHECK(em_accel_next(a, &b) == 1);
        CHECK(matmul_dtype() == EM_BF16);
        CHECK_OK(em_accel_backward(a, pair_loss(&p, &b)));
        CHECK(matmul_dtype() == EM_F32);
        CHECK_OK(em_accel_step(a));
        em_scope_end(s);
    }
    em_accel_accumulate(a); /* the micro-step whose next ends the epoch */
    em_batch b;
    CHECK(em_accel_next(a, &b) == 0);
    CHECK(matmul_dtype() == EM_F32);
    em_accelerator_free(a);
    pair_free(&p);
    em_loader_free(l);
}
