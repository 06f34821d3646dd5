/* cmd_demo.c — `ember demo`: trains a small MLP with the autograd engine on
 * a synthetic task (three interleaved spirals in 2-D, 3 classes) and prints
 * the falling loss. Everything a training loop needs from the engine shows
 * up here: persistent parameters, a step scope per iteration, forward ops,
 * em_backward, and an SGD-with-momentum update written out over the
 * parameters' data (the optim layer will package this). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "ember/ember.h"

enum { N_PER_CLASS = 200, CLASSES = 3, HIDDEN = 64, IN = 2 };

typedef struct param {
    const char *name;
    em_tensor *w;
    float *velocity;
} param;

/* Points of class c lie on the c-th arm of a spiral, with noise. */
static void make_spirals(float *x, int32_t *y, em_rng *rng)
{
    em_tensor *noise = em_randn(EM_F32, EM_SHAPE(N_PER_CLASS * CLASSES, 2), rng);
    const float *nz = em_data(noise);
    for (int c = 0; c < CLASSES; c++)
        for (int i = 0; i < N_PER_CLASS; i++) {
            int k = c * N_PER_CLASS + i;
            float r = (float)i / N_PER_CLASS;
            float th = (float)c * 4.0f + r * 4.0f;
            x[2 * k] = r * sinf(th) + 0.03f * nz[2 * k];
            x[2 * k + 1] = r * cosf(th) + 0.03f * nz[2 * k + 1];
            y[k] = c;
        }
    em_free(noise);
}

/* He-uniform init for a ReLU layer: U(-b, b) with b = sqrt(6 / fan_in). */
static em_tensor *init_weight(int64_t fan_in, int64_t fan_out, em_rng *rng)
{
    em_tensor *u = em_rand(EM_F32, EM_SHAPE(fan_in, fan_out), rng);
    float *p = em_data(u), bound = sqrtf(6.0f / (float)fan_in);
    for (int64_t i = 0; i < fan_in * fan_out; i++) p[i] = (2 * p[i] - 1) * bound;
    em_set_requires_grad(u, true);
    return u;
}

static int usage(void)
{
    fprintf(stderr, "usage: ember demo [--steps N] [--lr X] [--seed S]\n");
    return 2;
}

int cmd_demo(int argc, char **argv)
{
    int steps = 400;
    double lr = 0.2, momentum = 0.9;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc)
            lr = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "ember demo: unknown or incomplete flag '%s'\n", argv[i]);
            return usage();
        }
    }
    if (steps < 1 || !(lr > 0)) {
        fprintf(stderr, "ember demo: --steps must be >= 1 and --lr > 0\n");
        return 2;
    }
    em_rng rng = em_rng_new(seed);
    enum { N = N_PER_CLASS * CLASSES };
    static float xs[N * 2];
    static int32_t ys[N];
    make_spirals(xs, ys, &rng);
    em_tensor *x = em_from_data(EM_F32, EM_SHAPE(N, IN), xs);
    em_tensor *y = em_from_data(EM_I32, EM_SHAPE(N), ys);

    /* the model: 2 -> 64 -> 64 -> 3, ReLU */
    param ps[] = {
        {"fc1.weight", init_weight(IN, HIDDEN, &rng), NULL},
        {"fc1.bias", em_zeros(EM_F32, EM_SHAPE(HIDDEN)), NULL},
        {"fc2.weight", init_weight(HIDDEN, HIDDEN, &rng), NULL},
        {"fc2.bias", em_zeros(EM_F32, EM_SHAPE(HIDDEN)), NULL},
        {"fc3.weight", init_weight(HIDDEN, CLASSES, &rng), NULL},
        {"fc3.bias", em_zeros(EM_F32, EM_SHAPE(CLASSES)), NULL},
    };
    int np = (int)(sizeof ps / sizeof ps[0]);
    int64_t n_params = 0;
    for (int i = 0; i < np; i++) {
        em_set_requires_grad(ps[i].w, true);
        ps[i].velocity = calloc((size_t)em_numel(ps[i].w), sizeof(float));
        n_params += em_numel(ps[i].w);
    }
    printf("ember demo: MLP %d-%d-%d-%d (%lld parameters) on %d spiral points, %d classes; SGD lr %g "
           "momentum %g\n",
           IN, HIDDEN, HIDDEN, CLASSES, (long long)n_params, N, CLASSES, lr, momentum);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = 0;
    double first = 0, last = 0, acc = 0;
    for (int step = 0; step <= steps; step++) {
        em_scope s = em_scope_begin();
        em_tensor *h1 = em_relu(em_add(em_matmul(x, ps[0].w), ps[1].w));
        em_tensor *h2 = em_relu(em_add(em_matmul(h1, ps[2].w), ps[3].w));
        em_tensor *logits = em_add(em_matmul(h2, ps[4].w), ps[5].w);
        em_tensor *loss = em_cross_entropy(logits, y, -100);
        if (!loss || em_backward(loss, NULL) != EM_OK) {
            fprintf(stderr, "ember demo: step %d failed: %s\n", step, em_last_error());
            rc = 1;
            em_scope_end(s);
            break;
        }
        last = em_item(loss);
        if (step == 0) first = last;
        if (step % 50 == 0 || step == steps) {
            /* accuracy: argmax of logits against y */
            em_tensor *hit = em_eq(em_argmax(logits, 1, false), y);
            acc = em_item(em_sum(em_cast(hit, EM_F32), 0, NULL, false)) / N;
            printf("step %4d  loss %.4f  accuracy %5.1f%%\n", step, last, 100 * acc);
        }
        em_scope_end(s);
        if (step == steps) break;
        /* SGD with momentum, written out: v = m v + g ; w -= lr v ; g = 0 */
        for (int i = 0; i < np; i++) {
            float *w = em_data(ps[i].w), *g = em_data(em_grad(ps[i].w)), *v = ps[i].velocity;
            for (int64_t j = 0; j < em_numel(ps[i].w); j++) {
                v[j] = (float)momentum * v[j] + g[j];
                w[j] -= (float)lr * v[j];
            }
            em_zero_grad(ps[i].w);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!rc)
        printf("loss %.4f -> %.4f in %d steps (%.2f s, %.2f ms/step)\n", first, last, steps, secs,
               1e3 * secs / steps);
    for (int i = 0; i < np; i++) {
        free(ps[i].velocity);
        em_free(ps[i].w);
    }
    em_free(x);
    em_free(y);
    return rc;
}
