/* classifier.c — image classification with an MLP or a small CNN.
 *
 * What it shows:
 *   - writing your own dataset: fill em_dataset's {len, get, free} over your
 *     own arrays (here 8x8 images of a horizontal, vertical or diagonal bar in
 *     noise, drawn with em_rng) and hand it to em_dataset_new; or use the
 *     built-in MNIST reader em_idx_dataset_open (--mnist DIR);
 *   - em_loader: shuffled mini-batches, a new order every epoch;
 *   - models from layers: em_nn_linear, em_nn_conv2d, em_nn_max_pool2d and
 *     em_nn_flatten, held in a module tree;
 *   - SGD with momentum, and test accuracy measured with autograd off.
 *
 *   ./build/examples/classifier [--model mlp|cnn] [--epochs N] [--lr X]
 *                               [--seed S] [--mnist DIR]
 *
 * --mnist DIR reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
 * t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from DIR (the same
 * names without .gz also work).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ember/ember.h"

enum { SIDE = 8, BAR_CLASSES = 3, N_TRAIN = 2000, N_TEST = 500, BATCH = 32, HIDDEN = 128 };

/* ---- a dataset of our own ----------------------------------------------------- */

/* n images (1,SIDE,SIDE) as f32 and their labels: the `user` of the dataset. */
typedef struct bars {
    float *x;
    int32_t *y;
    int64_t n;
} bars;

static int64_t bars_len(void *user) { return ((bars *)user)->n; }

/* Copies example i into the loader's buffers. It may run on the loader's
 * prefetch thread, so it only reads plain memory: no tensors here. */
static em_status bars_get(void *user, int64_t i, void *x, void *y)
{
    bars *b = user;
    memcpy(x, b->x + i * SIDE * SIDE, sizeof(float) * SIDE * SIDE);
    *(int32_t *)y = b->y[i];
    return EM_OK;
}

static void bars_free(void *user)
{
    bars *b = user;
    free(b->x);
    free(b->y);
    free(b);
}

/* n images: class 0 a horizontal bar, 1 a vertical bar, 2 a diagonal (either
 * way), each one pixel wide at a random place, plus Gaussian noise (std 0.5).
 * The random numbers come from ember's generator, so a seed fixes the data. */
static em_dataset *make_bars(int64_t n, em_rng *rng)
{
    bars *b = malloc(sizeof *b);
    if (!b) return NULL;
    *b = (bars){malloc(sizeof(float) * (size_t)n * SIDE * SIDE), malloc(sizeof(int32_t) * (size_t)n), n};
    /* made with no scope open: persistent tensors, freed below */
    em_tensor *noise = em_randn(EM_F32, EM_SHAPE(n, SIDE, SIDE), rng);
    em_tensor *cls = em_randint(0, BAR_CLASSES, EM_I32, EM_SHAPE(n), rng);
    em_tensor *where = em_randint(0, 2 * SIDE, EM_I32, EM_SHAPE(n), rng);
    if (b->x && b->y && noise && cls && where) {
        const float *z = em_data(noise);
        const int32_t *c = em_data(cls), *w = em_data(where);
        for (int64_t k = 0; k < n; k++) {
            float *img = b->x + k * SIDE * SIDE;
            for (int p = 0; p < SIDE * SIDE; p++) img[p] = 0.5f * z[k * SIDE * SIDE + p];
            int at = w[k] % SIDE, flip = w[k] / SIDE; /* position; diagonal direction */
            for (int i = 0; i < SIDE; i++) {
                int j = i + at - SIDE / 2; /* diagonal: column of row i, shifted by at - SIDE/2 */
                if (c[k] == 0)
                    img[at * SIDE + i] += 1;
                else if (c[k] == 1)
                    img[i * SIDE + at] += 1;
                else if (j >= 0 && j < SIDE)
                    img[i * SIDE + (flip ? SIDE - 1 - j : j)] += 1;
            }
            b->y[k] = c[k];
        }
    }
    em_free(noise);
    em_free(cls);
    em_free(where);
    em_dataset def = {
        .len = bars_len,
        .get = bars_get,
        .free = bars_free,
        .user = b,
        .x_field = {EM_F32, 3, {1, SIDE, SIDE}}, /* one channel */
        .y_field = {EM_I32, 0, {0}},             /* a scalar label */
    };
    em_dataset *ds = b->x && b->y ? em_dataset_new(&def) : NULL;
    if (!ds) bars_free(b); /* em_dataset_new takes ownership only on success */
    return ds;
}

/* DIR/name.gz if it exists, else DIR/name. */
static void mnist_path(char *out, size_t n, const char *dir, const char *name)
{
    snprintf(out, n, "%s/%s.gz", dir, name);
    if (access(out, R_OK) != 0) snprintf(out, n, "%s/%s", dir, name);
}

static em_dataset *open_mnist(const char *dir, bool train)
{
    char images[4096], labels[4096];
    mnist_path(images, sizeof images, dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
    mnist_path(labels, sizeof labels, dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
    return em_idx_dataset_open(images, labels);
}

/* ---- the models --------------------------------------------------------------- */

typedef struct classifier {
    em_module *root; /* owns the layers and their parameters */
    bool cnn;
    em_nn_linear *fc1, *fc2;     /* mlp: (H*W) -> HIDDEN -> classes; cnn: fc1 is the head */
    em_nn_conv2d *conv1, *conv2; /* cnn only */
    em_nn_max_pool2d pool;       /* 2x2, stride 2: halves H and W */
} classifier;

static em_status classifier_init(classifier *m, bool cnn, int64_t h, int64_t w, int64_t classes, em_rng *rng)
{
    *m = (classifier){.root = em_module_new(NULL, cnn ? "cnn" : "mlp"), .cnn = cnn, .pool = {2, 2, 0}};
    if (cnn) {
        m->conv1 = em_nn_conv2d_new(m->root, "conv1", 1, 8, 3, 1, 1, true, rng);  /* (N,8,H,W) */
        m->conv2 = em_nn_conv2d_new(m->root, "conv2", 8, 16, 3, 1, 1, true, rng); /* (N,16,H/2,W/2) */
        m->fc1 = em_nn_linear_new(m->root, "fc1", 16 * (h / 4) * (w / 4), classes, true, rng);
    } else {
        m->fc1 = em_nn_linear_new(m->root, "fc1", h * w, HIDDEN, true, rng);
        m->fc2 = em_nn_linear_new(m->root, "fc2", HIDDEN, classes, true, rng);
    }
    return m->fc1 ? em_last_status() : EM_ERR_ARG;
}

/* x (N,1,H,W) -> logits (N,classes), in the caller's scope. */
static em_tensor *classifier_forward(classifier *m, em_tensor *x)
{
    if (!m->cnn) {
        em_tensor *h = em_relu(em_nn_linear_forward(m->fc1, em_nn_flatten(x, 1))); /* (N,HIDDEN) */
        return em_nn_linear_forward(m->fc2, h);
    }
    em_tensor *h = em_nn_max_pool2d_forward(&m->pool, em_relu(em_nn_conv2d_forward(m->conv1, x)));
    h = em_nn_max_pool2d_forward(&m->pool, em_relu(em_nn_conv2d_forward(m->conv2, h))); /* (N,16,H/4,W/4) */
    return em_nn_linear_forward(m->fc1, em_nn_flatten(h, 1));
}

/* One pass over the training set; returns the mean loss (NAN on error). */
static double train_epoch(classifier *m, em_loader *loader, em_optimizer *opt)
{
    em_module_train(m->root, true);
    double sum = 0;
    int64_t batches = 0;
    for (;;) {
        em_scope s = em_scope_begin();
        em_batch b;
        int r = em_loader_next(loader, &b); /* 1 a batch, 0 the end of the epoch, -1 an error */
        if (r <= 0) {
            em_scope_end(s);
            if (r < 0) return NAN;
            break;
        }
        em_tensor *loss =
            em_cross_entropy_loss(classifier_forward(m, b.x), b.y, NULL); /* PyTorch's defaults */
        em_status st = loss ? em_backward(loss, NULL) : em_last_status();
        sum += loss ? em_item(loss) : 0;
        em_scope_end(s);
        if (st != EM_OK || em_optim_step(opt) != EM_OK) return NAN;
        em_optim_zero_grad(opt);
        batches++;
    }
    return em_last_status() == EM_OK && batches > 0 ? sum / (double)batches : NAN;
}

/* Fraction of the test set classified right (argmax of the logits), with
 * autograd off and the model in eval mode. NAN on error. */
static double accuracy(classifier *m, em_loader *loader)
{
    em_module_train(m->root, false);
    bool prev = em_set_grad_enabled(false);
    double right = 0, total = 0;
    for (;;) {
        em_scope s = em_scope_begin();
        em_batch b;
        int r = em_loader_next(loader, &b);
        if (r <= 0) {
            em_scope_end(s);
            if (r < 0) return NAN;
            break;
        }
        em_tensor *pred = em_argmax(classifier_forward(m, b.x), 1, false); /* (N) i32 */
        right += em_item(em_sum(em_cast(em_eq(pred, b.y), EM_F32), 0, NULL, false));
        total += (double)b.size;
        em_scope_end(s);
    }
    em_set_grad_enabled(prev);
    return em_last_status() == EM_OK && total > 0 ? right / total : NAN;
}

/* ---- the program ---------------------------------------------------------------- */

static int usage(const char *bad)
{
    if (bad) fprintf(stderr, "classifier: unknown flag or missing value: '%s'\n", bad);
    fprintf(stderr, "usage: classifier [--model mlp|cnn] [--epochs N] [--lr X] [--seed S] [--mnist DIR]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *model = "mlp", *mnist = NULL;
    long epochs = 5, seed = 1;
    double lr = 0.05;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = "";
        if (!v) return usage(f);
        i++;
        if (!strcmp(f, "--model"))
            model = v;
        else if (!strcmp(f, "--mnist"))
            mnist = v;
        else if (!strcmp(f, "--epochs"))
            epochs = strtol(v, &end, 10);
        else if (!strcmp(f, "--seed"))
            seed = strtol(v, &end, 10);
        else if (!strcmp(f, "--lr"))
            lr = strtod(v, &end);
        else
            return usage(f);
        if (*v == '\0' || *end != '\0' || epochs < 1 || seed < 0 || !(lr > 0)) {
            fprintf(stderr, "classifier: bad value '%s' for %s (--epochs >= 1, --seed >= 0, --lr > 0)\n", v,
                    f);
            return 2;
        }
    }
    if (strcmp(model, "mlp") && strcmp(model, "cnn")) {
        fprintf(stderr, "classifier: --model must be mlp or cnn, got '%s'\n", model);
        return 2;
    }

    /* the data: MNIST from files, or bars made here */
    em_rng rng = em_rng_new((uint64_t)seed);
    em_dataset *train = mnist ? open_mnist(mnist, true) : make_bars(N_TRAIN, &rng);
    em_dataset *test = !train ? NULL : mnist ? open_mnist(mnist, false) : make_bars(N_TEST, &rng);
    if (!test) {
        fprintf(stderr, "classifier: cannot load the %s data: %s\n", mnist ? "MNIST" : "synthetic",
                em_last_error());
        if (mnist)
            fprintf(stderr, "classifier: --mnist DIR needs train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                            "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte in DIR (each .gz or not)\n");
        em_dataset_free(train);
        return 1;
    }
    int64_t h = train->x_field.shape[1], w = train->x_field.shape[2], classes = mnist ? 10 : BAR_CLASSES;
    printf("data: %s, %lld training and %lld test images of %lldx%lld, %lld classes\n",
           mnist ? mnist : "synthetic bars", (long long)em_dataset_len(train),
           (long long)em_dataset_len(test), (long long)h, (long long)w, (long long)classes);

    /* the loaders: shuffled for training (a new order each epoch), in order for
     * testing; a background thread prepares two batches ahead */
    em_loader_config lc = {.batch_size = BATCH, .shuffle = true, .seed = (uint64_t)seed, .prefetch = 2};
    em_loader *train_loader = em_loader_new(train, &lc);
    lc.shuffle = false;
    em_loader *test_loader = em_loader_new(test, &lc);

    /* the model and its optimizer: SGD with momentum over every parameter */
    classifier m = {0};
    em_status st = train_loader && test_loader
                       ? classifier_init(&m, !strcmp(model, "cnn"), h, w, classes, &rng)
                       : em_last_status();
    em_optimizer *opt = NULL;
    if (st == EM_OK) {
        em_named ps[8];
        em_tensor *params[8];
        int n = em_module_params(m.root, ps, 8);
        for (int i = 0; i < n; i++) params[i] = ps[i].t;
        em_sgd_config sc = em_sgd_defaults();
        sc.lr = lr;
        sc.momentum = 0.9;
        opt = em_sgd_new(n, params, &sc);
        printf("model: %s, %lld parameters; SGD lr %g momentum %g, batch %d\n", model,
               (long long)em_module_num_params(m.root), lr, sc.momentum, BATCH);
    }

    int rc = 0;
    if (!opt) {
        fprintf(stderr, "classifier: setup failed: %s\n", em_last_error());
        rc = 1;
    } else {
        printf("epoch  0 | train loss    -    | test accuracy %5.1f%% (untrained)\n",
               100 * accuracy(&m, test_loader));
        for (long e = 1; e <= epochs && !rc; e++) {
            double loss = train_epoch(&m, train_loader, opt);
            double acc = isnan(loss) ? NAN : accuracy(&m, test_loader);
            if (isnan(acc)) {
                fprintf(stderr, "classifier: epoch %ld failed: %s\n", e, em_last_error());
                rc = 1;
            } else
                printf("epoch %2ld | train loss %.4f | test accuracy %5.1f%%\n", e, loss, 100 * acc);
        }
    }
    em_optim_free(opt);
    em_module_free(m.root);
    em_loader_free(train_loader);
    em_loader_free(test_loader);
    em_dataset_free(train);
    em_dataset_free(test);
    return rc;
}
