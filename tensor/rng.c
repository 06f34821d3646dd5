/* rng.c — counter-based random numbers (Philox4x32-10, tensor/philox.h,
 * shared with the CUDA kernels). A draw of n values
 * uses counters offset .. offset+ceil(n/4)-1 under key `seed`; element i
 * takes word i%4 of counter offset + i/4. The result depends only on
 * (seed, offset), never on how the work is split across threads. */
#include "kernel_impl.h"
#include "philox.h"
#include "tensor_impl.h"

void em_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4])
{
    philox4x32_10(key, counter_hi, counter_lo, out);
}

static _Thread_local em_rng default_rng = {0, 0};

em_rng em_rng_new(uint64_t seed) { return (em_rng){seed, 0}; }

/* splitmix64's finaliser over seed and a golden-ratio multiple of stream */
uint64_t em_seed_derive(uint64_t seed, uint64_t stream)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
em_rng *em_default_rng(void) { return &default_rng; }
void em_manual_seed(uint64_t seed) { default_rng = (em_rng){seed, 0}; }

typedef enum { DRAW_UNIFORM, DRAW_NORMAL, DRAW_INT } draw_kind;

typedef struct draw_ctx {
    tensor *t;
    em_rng rng;
    draw_kind kind;
    int64_t low, high;
} draw_ctx;

/* Normal: Box-Muller on words (0,1) -> values 0,1 and (2,3) -> values 2,3. */
static void draw_range(void *p, int64_t lo, int64_t hi)
{
    draw_ctx *c = p;
    size_t es = t_esize(c->t);
    char *base = t_ptr(c->t);
    uint64_t range = (uint64_t)(c->high - c->low);
    for (int64_t blk = lo; blk < hi; blk++) {
        uint32_t w[4];
        philox4x32_10(c->rng.seed, 0, c->rng.offset + (uint64_t)blk, w);
        double v[4];
        if (c->kind == DRAW_NORMAL) {
            for (int j = 0; j < 4; j += 2) {
                double u1 = ((double)(w[j] >> 8) + 1.0) * (1.0 / 16777216.0); /* (0,1] */
                double u2 = philox_u01(w[j + 1]);
                double r = sqrt(-2.0 * log(u1));
                v[j] = r * cos(2 * M_PI * u2);
                v[j + 1] = r * sin(2 * M_PI * u2);
            }
        } else if (c->kind == DRAW_UNIFORM) {
            for (int j = 0; j < 4; j++) v[j] = philox_u01(w[j]);
        } else {
            for (int j = 0; j < 4; j++) v[j] = (double)(c->low + (int64_t)(w[j] % range));
        }
        int64_t n = t_numel(c->t);
        for (int j = 0; j < 4 && blk * 4 + j < n; j++)
            st(c->t->dtype, base + (size_t)(blk * 4 + j) * es, v[j]);
    }
}

static em_tensor *draw(const char *op, em_dtype dt, int ndim, const int64_t *shape, em_rng *rng,
                       draw_kind kind, int64_t low, int64_t high)
{
    if (kind != DRAW_INT && !em_dtype_is_float(dt))
        return em_fail(EM_ERR_DTYPE, "%s: needs a float dtype, got %s", op, em_dtype_name(dt));
    if (kind == DRAW_INT) {
        if (dt == EM_BOOL || (unsigned)dt >= EM_NUM_DTYPES)
            return em_fail(EM_ERR_DTYPE, "%s: dtype %s cannot hold random integers", op, em_dtype_name(dt));
        if (high <= low || high - low > ((int64_t)1 << 32))
            return em_fail(EM_ERR_ARG, "%s: empty or too wide range [%lld, %lld)", op, (long long)low,
                           (long long)high);
    }
    tensor *t = t_new(dt, ndim, shape);
    if (!t) return NULL;
    if (!rng) rng = &default_rng;
    int64_t blocks = (t_numel(t) + 3) / 4;
    draw_ctx c = {t, *rng, kind, low, high};
    parallel_for(blocks, 1024, draw_range, &c);
    rng->offset += (uint64_t)blocks;
    return t_handle(t);
}

em_tensor *em_rand(em_dtype dt, int ndim, const int64_t *shape, em_rng *rng)
{
    return draw("em_rand", dt, ndim, shape, rng, DRAW_UNIFORM, 0, 0);
}

em_tensor *em_randn(em_dtype dt, int ndim, const int64_t *shape, em_rng *rng)
{
    return draw("em_randn", dt, ndim, shape, rng, DRAW_NORMAL, 0, 0);
}

em_tensor *em_randint(int64_t low, int64_t high, em_dtype dt, int ndim, const int64_t *shape, em_rng *rng)
{
    return draw("em_randint", dt, ndim, shape, rng, DRAW_INT, low, high);
}
