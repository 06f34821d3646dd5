/* test_view.c — views (reshape/view, flatten, transpose, permute, narrow, slice,
 * expand, squeeze, unsqueeze) and copies (contiguous, copy, cast): storage
 * sharing, values, strides, gradients, errors, bool semantics. */
#include "harness.h"

/* 0, 1, ..., numel-1 as dt in the given shape (contiguous) */
static em_tensor *iota(em_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return em_reshape(em_arange(0, (double)n, 1, dt), ndim, shape);
}

static bool shape_is(em_tensor *t, int ndim, const int64_t *shape)
{
    if (!t || em_ndim(t) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (em_shape(t)[i] != shape[i]) return false;
    return true;
}

/* ---- storage sharing ------------------------------------------------------------- */

TEST(test_views_share_storage_and_writes_show_in_base)
{
    em_scope s = em_scope_begin();
    em_tensor *base = iota(EM_F32, EM_SHAPE(2, 3));
    em_tensor *t = em_transpose(base, 0, 1);      /* (3,2) */
    em_tensor *n = em_narrow(base, 1, 1, 2);      /* (2,2): columns 1..2 */
    em_tensor *r = em_reshape(base, EM_SHAPE(6)); /* (6) */
    CHECK(em_shares_storage(t, base) && em_shares_storage(n, base) && em_shares_storage(r, base));
    CHECK_OK(em_set(t, (int64_t[]){2, 0}, 100)); /* base[0][2] */
    CHECK_NEAR(em_get(base, (int64_t[]){0, 2}), 100, 0);
    ((float *)em_data(n))[0] = -5; /* element 0 of the narrow view is base[0][1] */
    CHECK_NEAR(em_get(base, (int64_t[]){0, 1}), -5, 0);
    CHECK_OK(em_set(r, (int64_t[]){4}, 44));
    CHECK_NEAR(em_get(base, (int64_t[]){1, 1}), 44, 0);
    CHECK_VALUES(base, 0, 0, -5, 100, 3, 44, 5);
    CHECK(em_offset(n) == 1);
    em_scope_end(s);
}

TEST(test_view_of_persistent_tensor_writes_through)
{
    em_tensor *base = em_zeros(EM_F64, EM_SHAPE(4));
    em_tensor *v = em_slice(base, 0, 1, 4, 2); /* elements 1, 3 */
    CHECK_OK(em_set(v, (int64_t[]){1}, 7));
    CHECK_VALUES(base, 0, 0, 0, 0, 7);
    em_free(base);
    CHECK_VALUES(v, 0, 0, 7); /* the view keeps the storage alive */
    em_free(v);
}

/* ---- reshape / view ---------------------------------------------------------------- */

TEST(test_reshape_is_a_view_when_strides_allow)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 3, 4));
    em_tensor *r = em_reshape(a, EM_SHAPE(6, 4));
    CHECK(em_shares_storage(r, a) && shape_is(r, EM_SHAPE(6, 4)));
    /* rows 1..2 of a (2 of 6,4) viewed as (2,2,4): still a view */
    em_tensor *n = em_narrow(r, 0, 1, 2);
    em_tensor *rn = em_reshape(n, EM_SHAPE(2, 2, 2));
    CHECK(em_shares_storage(rn, a) && em_offset(rn) == 4);
    CHECK_NEAR(em_get(rn, (int64_t[]){1, 1, 1}), 11, 0);
    /* a transpose whose dims are then split without mixing: (3,2)->(3,2,1) */
    em_tensor *t = em_transpose(iota(EM_F32, EM_SHAPE(2, 3)), 0, 1);
    em_tensor *ts = em_reshape(t, EM_SHAPE(3, 1, 2));
    CHECK(em_shares_storage(ts, t));
    CHECK_VALUES(ts, 0, 0, 3, 1, 4, 2, 5);
    /* a column slice (4,1) of a (4,3) matrix flattened to (4,) is a view */
    em_tensor *m = iota(EM_F32, EM_SHAPE(4, 3));
    em_tensor *col = em_narrow(m, 1, 2, 1);
    em_tensor *fc = em_reshape(col, EM_SHAPE(4));
    CHECK(em_shares_storage(fc, m) && em_strides(fc)[0] == 3);
    CHECK_VALUES(fc, 0, 2, 5, 8, 11);
    em_scope_end(s);
}

TEST(test_reshape_copies_when_a_view_is_impossible)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 3));
    em_tensor *t = em_transpose(a, 0, 1); /* (3,2) */
    em_tensor *r = em_reshape(t, EM_SHAPE(6));
    CHECK(!em_shares_storage(r, a));
    CHECK(em_is_contiguous(r));
    CHECK_VALUES(r, 0, 0, 3, 1, 4, 2, 5);
    /* a stepped slice merged with the next dim cannot be a view either */
    em_tensor *sl = em_slice(iota(EM_F64, EM_SHAPE(4, 2)), 0, 0, 4, 2); /* rows 0, 2 */
    em_tensor *f = em_reshape(sl, EM_SHAPE(4));
    CHECK_VALUES(f, 0, 0, 1, 4, 5);
    em_scope_end(s);
}

TEST(test_view_rejects_layout_that_needs_a_copy)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_transpose(iota(EM_F32, EM_SHAPE(2, 3)), 0, 1);
    CHECK_ERR(em_view(t, EM_SHAPE(6)), EM_ERR_SHAPE,
              "view: (3,2) with strides (1,3) cannot be viewed as (6,)");
    /* but a view that keeps dims apart is fine */
    em_tensor *v = em_view(t, EM_SHAPE(3, 2, 1));
    CHECK(v && em_shares_storage(v, t));
    em_scope_end(s);
}

TEST(test_reshape_infers_one_minus_one)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 3, 4));
    CHECK(shape_is(em_reshape(a, EM_SHAPE(-1, 4)), EM_SHAPE(6, 4)));
    CHECK(shape_is(em_reshape(a, EM_SHAPE(4, -1)), EM_SHAPE(4, 6)));
    CHECK(shape_is(em_reshape(a, EM_SHAPE(2, -1, 2)), EM_SHAPE(2, 6, 2)));
    CHECK(shape_is(em_view(a, EM_SHAPE(-1)), EM_SHAPE(24)));
    CHECK_ERR(em_reshape(a, EM_SHAPE(-1, -1)), EM_ERR_SHAPE,
              "reshape: more than one -1 in target shape (-1,-1)");
    CHECK_ERR(em_reshape(a, EM_SHAPE(5, -1)), EM_ERR_SHAPE,
              "reshape: cannot reshape (2,3,4) (24 elements) to (5,-1)");
    em_scope_end(s);
}

TEST(test_reshape_rejects_wrong_element_count)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_ERR(em_reshape(a, EM_SHAPE(4, 2)), EM_ERR_SHAPE, "reshape: cannot reshape (2,3)");
    CHECK(strstr(em_last_error(), "(4,2)") != NULL);
    CHECK_ERR(em_reshape(a, EM_SHAPE(2, -3)), EM_ERR_SHAPE, "reshape: negative size in target shape (2,-3)");
    em_scope_end(s);
}

TEST(test_reshape_handles_scalars_and_empty_tensors)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_scalar(EM_F32, 3.5);
    em_tensor *r = em_reshape(x, EM_SHAPE(1, 1));
    CHECK(shape_is(r, EM_SHAPE(1, 1)));
    CHECK_NEAR(em_item(em_reshape(r, 0, NULL)), 3.5, 0);
    em_tensor *e = em_zeros(EM_F32, EM_SHAPE(0, 4));
    CHECK(shape_is(em_reshape(e, EM_SHAPE(2, 0, 3)), EM_SHAPE(2, 0, 3)));
    em_scope_end(s);
}

TEST(test_flatten_gives_one_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 2, 2));
    em_tensor *f = em_flatten(em_permute(a, (int[]){2, 0, 1}));
    CHECK(shape_is(f, EM_SHAPE(8)));
    CHECK_VALUES(f, 0, 0, 2, 4, 6, 1, 3, 5, 7);
    CHECK(shape_is(em_flatten(em_scalar(EM_F32, 1)), EM_SHAPE(1)));
    em_scope_end(s);
}

/* Brute-force reference for em_view: with a base whose values are their own
 * storage positions, any view's values are its element addresses. A reshape
 * to `shape` can be a view iff the strides read off unit steps reproduce every
 * address. Random views (permute, stepped slice, expand) and random targets. */
static uint32_t lcg(uint32_t *st) { return (*st = *st * 1664525u + 1013904223u) >> 8; }

static bool view_possible(const double *addr, int64_t n, int nd, const int64_t *shape)
{
    int64_t stride[EM_MAX_DIMS], unit = 1;
    for (int d = nd - 1; d >= 0; d--) {
        stride[d] = shape[d] > 1 ? (int64_t)(addr[unit] - addr[0]) : 0;
        unit *= shape[d];
    }
    for (int64_t j = 0; j < n; j++) {
        int64_t r = j, off = (int64_t)addr[0];
        for (int d = nd - 1; d >= 0; d--) {
            off += (r % shape[d]) * stride[d];
            r /= shape[d];
        }
        if (off != (int64_t)addr[j]) return false;
    }
    return true;
}

static const char *fmt_dims(int nd, const int64_t *d, char *buf)
{
    int k = sprintf(buf, "(");
    for (int i = 0; i < nd; i++) k += sprintf(buf + k, i ? ",%lld" : "%lld", (long long)d[i]);
    sprintf(buf + k, ")");
    return buf;
}

TEST(test_view_succeeds_exactly_when_strides_exist)
{
    uint32_t seed = 12345;
    int views = 0, copies = 0;
    for (int trial = 0; trial < 400; trial++) {
        em_scope s = em_scope_begin();
        int nd = 1 + (int)(lcg(&seed) % 4);
        int64_t shape[4];
        for (int d = 0; d < nd; d++) shape[d] = 1 + lcg(&seed) % 4;
        em_tensor *v = iota(EM_F64, nd, shape);
        int perm[4];
        for (int d = 0; d < nd; d++) perm[d] = d;
        for (int d = nd - 1; d > 0; d--) {
            int k = (int)(lcg(&seed) % (uint32_t)(d + 1)), t = perm[d];
            perm[d] = perm[k];
            perm[k] = t;
        }
        if (lcg(&seed) % 2) v = em_permute(v, perm);
        int sd = (int)(lcg(&seed) % (uint32_t)nd);
        if (lcg(&seed) % 2) v = em_slice(v, sd, lcg(&seed) % 2, 100, 1 + lcg(&seed) % 2);
        if (lcg(&seed) % 4 == 0 && em_size(v, 0) == 1) {
            int64_t es[4];
            memcpy(es, em_shape(v), sizeof(int64_t) * (size_t)nd);
            es[0] = 3;
            v = em_expand(v, nd, es);
        }
        int64_t n = em_numel(v);
        double addr[256];
        CHECK(n <= 256);
        CHECK_OK(em_to_array(v, EM_F64, addr));
        /* target: n split into up to 4 factors, with some 1s */
        int tn = 1 + (int)(lcg(&seed) % 4);
        int64_t ts[4], rest = n;
        for (int d = 0; d < tn - 1; d++) {
            int64_t f = 1;
            for (int64_t c = 1 + lcg(&seed) % 6; c >= 1; c--)
                if (rest % c == 0) {
                    f = c;
                    break;
                }
            ts[d] = f;
            rest /= f;
        }
        ts[tn - 1] = rest;
        bool want = n == 0 || view_possible(addr, n, tn, ts);
        em_clear_error();
        em_tensor *w = em_view(v, tn, ts);
        if (want != (w != NULL)) {
            char vs[128], vt[128], tt[128];
            th_fail(__FILE__, __LINE__, "trial %d: view of %s strides %s as %s: got %s, want %s (%s)", trial,
                    fmt_dims(em_ndim(v), em_shape(v), vs), fmt_dims(em_ndim(v), em_strides(v), vt),
                    fmt_dims(tn, ts, tt), w ? "a view" : "an error", want ? "a view" : "an error",
                    em_last_error());
        }
        if (w) {
            double got[256];
            CHECK_OK(em_to_array(w, EM_F64, got));
            CHECK(memcmp(got, addr, sizeof(double) * (size_t)n) == 0);
            CHECK(em_shares_storage(w, v));
            views++;
        } else {
            CHECK(em_last_status() == EM_ERR_SHAPE);
            em_tensor *r = em_reshape(v, tn, ts);
            double got[256];
            CHECK_OK(em_to_array(r, EM_F64, got));
            CHECK(memcmp(got, addr, sizeof(double) * (size_t)n) == 0);
            copies++;
        }
        em_scope_end(s);
    }
    CHECK(views > 50 && copies > 20); /* both sides were exercised */
}

/* ---- transpose / permute ----------------------------------------------------------------- */

TEST(test_transpose_swaps_shape_and_strides)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 3, 4));
    em_tensor *t = em_transpose(a, 0, -1);
    CHECK(shape_is(t, EM_SHAPE(4, 3, 2)));
    CHECK(em_strides(t)[0] == 1 && em_strides(t)[1] == 4 && em_strides(t)[2] == 12);
    CHECK(!em_is_contiguous(t));
    CHECK_NEAR(em_get(t, (int64_t[]){3, 1, 1}), 12 + 4 + 3, 0);
    CHECK_ERR(em_transpose(a, 0, 3), EM_ERR_ARG, "transpose: dim 3 is out of range for a 3-dim tensor");
    em_scope_end(s);
}

TEST(test_permute_reorders_dims)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F64, EM_SHAPE(2, 3, 4));
    em_tensor *p = em_permute(a, (int[]){1, 2, 0});
    CHECK(shape_is(p, EM_SHAPE(3, 4, 2)));
    CHECK_NEAR(em_get(p, (int64_t[]){2, 1, 1}), 12 + 2 * 4 + 1, 0);
    CHECK(shape_is(em_permute(a, (int[]){-1, 0, 1}), EM_SHAPE(4, 2, 3)));
    CHECK_ERR(em_permute(a, (int[]){0, 0, 1}), EM_ERR_ARG, "permute: dim 0 repeated");
    CHECK_ERR(em_permute(a, (int[]){0, 1, 5}), EM_ERR_ARG, "permute: dim 5 is out of range");
    em_scope_end(s);
}

/* ---- narrow / slice ----------------------------------------------------------------------- */

TEST(test_narrow_picks_a_range)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(3, 4));
    CHECK_VALUES(em_narrow(a, 1, 1, 2), 0, 1, 2, 5, 6, 9, 10);
    CHECK_VALUES(em_narrow(a, -2, 2, 1), 0, 8, 9, 10, 11);
    CHECK(em_numel(em_narrow(a, 0, 3, 0)) == 0);
    CHECK_ERR(em_narrow(a, 1, 3, 2), EM_ERR_INDEX, "narrow: [3, 5) is outside dim 1 of size 4 (shape (3,4))");
    CHECK_ERR(em_narrow(a, 0, -1, 1), EM_ERR_INDEX, "narrow:");
    em_scope_end(s);
}

TEST(test_slice_with_step_and_negative_bounds)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_arange(0, 10, 1, EM_F32);
    CHECK_VALUES(em_slice(a, 0, 1, 8, 3), 0, 1, 4, 7);      /* a[1:8:3] */
    CHECK_VALUES(em_slice(a, 0, -7, -1, 2), 0, 3, 5, 7);    /* a[-7:-1:2] */
    CHECK_VALUES(em_slice(a, 0, -100, 100, 4), 0, 0, 4, 8); /* clamped */
    CHECK_VALUES(em_slice(a, 0, 8, 100, 1), 0, 8, 9);
    CHECK(em_numel(em_slice(a, 0, 6, 2, 1)) == 0); /* start > end: empty */
    CHECK(em_numel(em_slice(a, 0, 10, 12, 1)) == 0);
    em_tensor *m = iota(EM_F32, EM_SHAPE(3, 4));
    CHECK_VALUES(em_slice(m, -1, 0, 4, 2), 0, 0, 2, 4, 6, 8, 10);
    CHECK_ERR(em_slice(a, 0, 0, 5, 0), EM_ERR_ARG, "slice: step 0 must be >= 1");
    CHECK_ERR(em_slice(a, 1, 0, 5, 1), EM_ERR_ARG, "slice: dim 1 is out of range for a 1-dim tensor");
    em_scope_end(s);
}

/* ---- expand / squeeze / unsqueeze ----------------------------------------------------------- */

TEST(test_expand_broadcasts_with_zero_strides)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(3, 1), (double[]){1, 2, 3});
    em_tensor *e = em_expand(a, EM_SHAPE(2, 3, 4));
    CHECK(shape_is(e, EM_SHAPE(2, 3, 4)) && em_shares_storage(e, a));
    CHECK(em_strides(e)[0] == 0 && em_strides(e)[2] == 0);
    CHECK_NEAR(em_get(e, (int64_t[]){1, 2, 3}), 3, 0);
    CHECK_VALUES(em_expand(a, EM_SHAPE(-1, 2)), 0, 1, 1, 2, 2, 3, 3);
    CHECK_ERR(em_expand(a, EM_SHAPE(4, 3)), EM_ERR_SHAPE, "expand: (3,1) does not broadcast to (4,3)");
    CHECK_ERR(em_expand(a, EM_SHAPE(3)), EM_ERR_SHAPE, "expand: cannot expand (3,1) to 1 dims");
    CHECK_ERR(em_expand(a, EM_SHAPE(-1, 3, 2)), EM_ERR_SHAPE,
              "expand: -1 is not allowed for a new leading dim");
    em_scope_end(s);
}

TEST(test_squeeze_and_unsqueeze_change_dims_not_values)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 1, 3));
    em_tensor *q = em_squeeze(a, 1);
    CHECK(shape_is(q, EM_SHAPE(2, 3)) && em_shares_storage(q, a));
    CHECK_VALUES(q, 0, 0, 1, 2, 3, 4, 5);
    CHECK(shape_is(em_unsqueeze(q, 0), EM_SHAPE(1, 2, 3)));
    CHECK(shape_is(em_unsqueeze(q, 2), EM_SHAPE(2, 3, 1)));
    CHECK(shape_is(em_unsqueeze(q, -1), EM_SHAPE(2, 3, 1)));
    CHECK(shape_is(em_unsqueeze(q, -3), EM_SHAPE(1, 2, 3)));
    CHECK(em_is_contiguous(em_unsqueeze(q, 1)));
    CHECK_ERR(em_squeeze(a, 0), EM_ERR_SHAPE, "squeeze: dim 0 of (2,1,3) has size 2, not 1");
    CHECK_ERR(em_unsqueeze(q, 3), EM_ERR_ARG, "unsqueeze: dim 3 is out of range");
    CHECK_ERR(em_unsqueeze(q, -4), EM_ERR_ARG, "unsqueeze: dim -4 is out of range");
    /* unsqueeze of a transposed view keeps addressing the same elements */
    em_tensor *t = em_unsqueeze(em_transpose(q, 0, 1), 1); /* (3,1,2) */
    CHECK_VALUES(t, 0, 0, 3, 1, 4, 2, 5);
    em_scope_end(s);
}

/* ---- contiguous / copy ------------------------------------------------------------------------- */

TEST(test_contiguous_returns_same_handle_or_a_copy)
{
    em_scope s = em_scope_begin();
    em_tensor *a = iota(EM_F32, EM_SHAPE(2, 3));
    CHECK(em_contiguous(a) == a);
    em_tensor *t = em_transpose(a, 0, 1);
    em_tensor *c = em_contiguous(t);
    CHECK(c != t && em_is_contiguous(c) && !em_shares_storage(c, a));
    CHECK_VALUES(c, 0, 0, 3, 1, 4, 2, 5);
    em_tensor *cp = em_copy(a);
    CHECK(!em_shares_storage(cp, a));
    CHECK_OK(em_set(cp, (int64_t[]){0, 0}, 9));
    CHECK_NEAR(em_get(a, (int64_t[]){0, 0}), 0, 0);
    em_scope_end(s);
}

/* ---- gradients through each view ------------------------------------------------------------ */

static em_tensor *f_reshape(em_tensor **x, void *c)
{
    (void)c;
    return em_reshape(x[0], EM_SHAPE(4, -1));
}
static em_tensor *f_reshape_copy(em_tensor **x, void *c)
{
    (void)c;
    return em_reshape(em_transpose(x[0], 0, 1), EM_SHAPE(-1));
}
static em_tensor *f_view(em_tensor **x, void *c)
{
    (void)c;
    return em_view(x[0], EM_SHAPE(2, 2, 3));
}
static em_tensor *f_flatten(em_tensor **x, void *c)
{
    (void)c;
    return em_flatten(x[0]);
}
static em_tensor *f_transpose(em_tensor **x, void *c)
{
    (void)c;
    return em_transpose(x[0], 0, 1);
}
static em_tensor *f_permute(em_tensor **x, void *c)
{
    (void)c;
    return em_permute(em_reshape(x[0], EM_SHAPE(2, 2, 3)), (int[]){2, 0, 1});
}
static em_tensor *f_narrow(em_tensor **x, void *c)
{
    (void)c;
    return em_narrow(x[0], 1, 1, 2);
}
static em_tensor *f_slice(em_tensor **x, void *c)
{
    (void)c;
    return em_slice(x[0], 0, -3, 4, 2);
}
static em_tensor *f_expand(em_tensor **x, void *c)
{
    (void)c;
    return em_expand(em_narrow(x[0], 0, 1, 1), EM_SHAPE(2, 3, 4));
}
static em_tensor *f_squeeze(em_tensor **x, void *c)
{
    (void)c;
    return em_squeeze(em_unsqueeze(em_squeeze(em_narrow(x[0], 0, 2, 1), 0), -1), 1);
}
static em_tensor *f_contiguous(em_tensor **x, void *c)
{
    (void)c;
    return em_contiguous(em_transpose(x[0], 0, 1));
}
static em_tensor *f_cast64(em_tensor **x, void *c)
{
    (void)c;
    return em_cast(x[0], EM_F64);
}
static em_tensor *f_copy(em_tensor **x, void *c)
{
    (void)c;
    return em_copy(x[0]);
}
/* views used twice: the gradients of both uses add up */
static em_tensor *f_two_views(em_tensor **x, void *c)
{
    (void)c;
    return em_add(em_transpose(em_narrow(x[0], 1, 0, 3), 0, 1), em_slice(x[0], 1, 1, 4, 1));
}

/* x (3,4) f64: GRADCHECK and F32_MATCHES_F64 through f, also on a
 * non-contiguous copy of x */
static void view_grad_case(const char *what, th_graph_fn f)
{
    em_rng r = em_rng_new(9);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(3, 4), &r);
    GRADCHECK(what, f, NULL, 1, &x);
    F32_MATCHES_F64(what, f, NULL, 1, &x, 1e-7);
    em_tensor *nc = th_noncontig(x);
    CHECK(!em_is_contiguous(nc));
    GRADCHECK(what, f, NULL, 1, &nc);
    em_scope s = em_scope_begin();
    CHECK(th_max_abs_diff(f(&nc, NULL), f(&x, NULL)) == 0);
    em_scope_end(s);
    em_free(nc);
    em_free(x);
}

TEST(test_reshape_gradient_matches_finite_difference) { view_grad_case("reshape", f_reshape); }
TEST(test_reshape_copy_gradient_matches_finite_difference) { view_grad_case("reshape copy", f_reshape_copy); }
TEST(test_view_gradient_matches_finite_difference) { view_grad_case("view", f_view); }
TEST(test_flatten_gradient_matches_finite_difference) { view_grad_case("flatten", f_flatten); }
TEST(test_transpose_gradient_matches_finite_difference) { view_grad_case("transpose", f_transpose); }
TEST(test_permute_gradient_matches_finite_difference) { view_grad_case("permute", f_permute); }
TEST(test_narrow_gradient_matches_finite_difference) { view_grad_case("narrow", f_narrow); }
TEST(test_slice_gradient_matches_finite_difference) { view_grad_case("slice", f_slice); }
TEST(test_expand_gradient_matches_finite_difference) { view_grad_case("expand", f_expand); }
TEST(test_squeeze_unsqueeze_gradient_matches_finite_difference) { view_grad_case("squeeze", f_squeeze); }
TEST(test_contiguous_gradient_matches_finite_difference) { view_grad_case("contiguous", f_contiguous); }
TEST(test_copy_gradient_matches_finite_difference) { view_grad_case("copy", f_copy); }
TEST(test_two_views_of_one_tensor_add_gradients) { view_grad_case("two views", f_two_views); }

TEST(test_slice_gradient_scatters_into_zeros)
{
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(6));
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_tensor *y = em_slice(x, 0, 1, 6, 2); /* elements 1, 3, 5 */
    CHECK_OK(em_backward(
        em_sum(em_mul(y, th_tensor(EM_F32, EM_SHAPE(3), (double[]){1, 2, 3})), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(x), 0, 0, 1, 0, 2, 0, 3);
    em_free(x);
}

/* ---- cast ------------------------------------------------------------------------------------ */

/* v as stored in dt (floats keep these values exactly; integers truncate
 * toward zero; bool is v != 0) */
static double as_dtype(em_dtype dt, double v)
{
    if (dt == EM_BOOL) return v != 0;
    if (dt == EM_I32 || dt == EM_U8) return trunc(v);
    return v;
}

TEST(test_cast_between_all_dtypes)
{
    em_scope s = em_scope_begin();
    const double v[5] = {0, 1, 2.75, 100, 255};
    for (em_dtype from = 0; from < EM_NUM_DTYPES; from++) {
        em_tensor *src = th_tensor(from, EM_SHAPE(5), v);
        for (em_dtype to = 0; to < EM_NUM_DTYPES; to++) {
            em_tensor *d = em_cast(src, to);
            CHECK(em_dtype_of(d) == to);
            CHECK(!em_shares_storage(d, src)); /* a copy even when to == from */
            double want[5], got[5];
            for (int i = 0; i < 5; i++) want[i] = as_dtype(to, as_dtype(from, v[i]));
            CHECK_OK(em_to_array(d, EM_F64, got));
            for (int i = 0; i < 5; i++)
                if (got[i] != want[i])
                    th_fail(__FILE__, __LINE__, "cast %s -> %s: element %d = %g, want %g",
                            em_dtype_name(from), em_dtype_name(to), i, got[i], want[i]);
        }
    }
    em_scope_end(s);
}

TEST(test_cast_float_to_int_truncates_toward_zero)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(4), (double[]){-2.7, -0.5, 0.5, 2.7});
    CHECK_VALUES(em_cast(x, EM_I32), 0, -2, 0, 0, 2);
    em_scope_end(s);
}

TEST(test_cast_rounds_to_nearest_even_for_halves)
{
    em_scope s = em_scope_begin();
    /* 1 + 2^-11 is halfway between f16 1 and 1 + 2^-10: ties go to 1 */
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(2), (double[]){1 + 1.0 / 2048, 1 + 3.0 / 2048});
    CHECK_VALUES(em_cast(x, EM_F16), 0, 1, 1 + 1.0 / 512);
    em_tensor *y = th_tensor(EM_F32, EM_SHAPE(2), (double[]){1 + 1.0 / 256, 1 + 3.0 / 256});
    CHECK_VALUES(em_cast(y, EM_BF16), 0, 1, 1 + 1.0 / 64);
    em_scope_end(s);
}

TEST(test_cast_to_bool_is_nonzero_and_back_is_zero_or_one)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(6), (double[]){0, -0.0, 0.5, -2, NAN, INFINITY});
    em_tensor *b = em_cast(x, EM_BOOL);
    CHECK_VALUES(b, 0, 0, 0, 1, 1, 1, 1);
    CHECK(((unsigned char *)em_data(b))[3] == 1); /* stored as byte 1 */
    CHECK_VALUES(em_cast(b, EM_I32), 0, 0, 0, 1, 1, 1, 1);
    CHECK_VALUES(em_cast(em_cast(th_tensor(EM_I32, EM_SHAPE(2), (double[]){-3, 0}), EM_BOOL), EM_F32), 0, 1,
                 0);
    em_scope_end(s);
}

TEST(test_bool_tensors_store_zero_or_one)
{
    em_scope s = em_scope_begin();
    em_tensor *b = em_full(EM_BOOL, EM_SHAPE(3), 5.0);
    CHECK_VALUES(b, 0, 1, 1, 1);
    CHECK_OK(em_set(b, (int64_t[]){1}, -7));
    CHECK_OK(em_set(b, (int64_t[]){2}, 0));
    CHECK_VALUES(b, 0, 1, 1, 0);
    CHECK(((unsigned char *)em_data(b))[1] == 1);
    CHECK(em_dtype_size(EM_BOOL) == 1);
    em_scope_end(s);
}

TEST(test_cast_gradient_flows_between_float_dtypes)
{
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(3), (double[]){1, 2, 3});
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_tensor *y = em_cast(x, EM_F64);
    CHECK(em_requires_grad(y));
    em_tensor *w = th_tensor(EM_F64, EM_SHAPE(3), (double[]){0.5, -1, 4});
    CHECK_OK(em_backward(em_sum(em_mul(y, w), 0, NULL, false), NULL));
    CHECK(!em_requires_grad(em_cast(x, EM_I32))); /* integer casts carry no gradient */
    em_scope_end(s);
    CHECK(em_dtype_of(em_grad(x)) == EM_F32);
    CHECK_VALUES(em_grad(x), 0, 0.5, -1, 4);
    em_free(x);
}

TEST(test_cast_f64_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(4);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(2, 3), &r);
    GRADCHECK("cast", f_cast64, NULL, 1, &x);
    em_free(x);
}

TEST(test_cast_rejects_invalid_dtype)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_cast(em_zeros(EM_F32, EM_SHAPE(2)), EM_NUM_DTYPES), EM_ERR_DTYPE, "cast: invalid dtype 7");
    em_scope_end(s);
}

/* ---- gradients of several views of one tensor ------------------------------------------------ */

/* loss = sum of each part times its own weight: x's gradient is each
 * part's weight where that part reads, summed where parts overlap */
static em_tensor *weighted_parts(em_tensor *x)
{
    em_tensor *q = em_narrow(x, 1, 0, 2), *k = em_narrow(x, 1, 2, 2), *v = em_slice(x, 1, 1, 6, 2);
    em_tensor *l =
        em_add(em_sum(em_mul_scalar(q, 1.0), 0, NULL, false), em_sum(em_mul_scalar(k, 10.0), 0, NULL, false));
    return em_add(l, em_sum(em_mul_scalar(v, 100.0), 0, NULL, false));
}

TEST(test_gradients_of_several_narrows_and_slices_of_one_tensor_add_up)
{
    /* columns 0-1 read by q (1), 2-3 by k (10), 1, 3, 5 by v (100): per row
     * 1, 101, 10, 110, 0, 100; for a leaf, for a non-leaf, and with the
     * whole tensor also read directly before or after the views */
    for (int variant = 0; variant < 4; variant++) {
        em_scope s = em_scope_begin();
        em_tensor *leaf = em_zeros(EM_F32, EM_SHAPE(3, 6));
        CHECK_OK(em_set_requires_grad(leaf, true));
        em_tensor *x = variant == 1 || variant == 3 ? em_mul_scalar(leaf, 2.0) : leaf;
        em_tensor *direct = variant >= 2 ? em_sum(x, 0, NULL, false) : NULL; /* + 1 everywhere */
        em_tensor *loss = weighted_parts(x);
        if (direct) loss = variant == 2 ? em_add(direct, loss) : em_add(loss, direct);
        CHECK_OK(em_backward(loss, NULL));
        double scale = variant == 1 || variant == 3 ? 2.0 : 1.0, plus = variant >= 2 ? 1.0 : 0.0;
        const double row[6] = {1, 101, 10, 110, 0, 100};
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 6; j++)
                CHECK_NEAR(em_get(em_grad(leaf), (int64_t[]){i, j}), scale * (row[j] + plus), 0);
        em_scope_end(s);
        em_free(leaf);
    }
}

/* A non-leaf's gradient accumulator is fresh scope memory, here left full
 * of 7s by an earlier scope: the first narrow to arrive zeroes what it does
 * not cover (rows or columns on either side, widths with odd tails). */
TEST(test_narrow_gradient_is_zero_outside_the_narrowed_range)
{
    for (int dim = 0; dim < 2; dim++) {
        em_scope dirty = em_scope_begin();
        for (int i = 0; i < 4; i++) em_full(EM_F32, EM_SHAPE(64, 64), 7.0);
        em_scope_end(dirty);
        em_scope s = em_scope_begin();
        em_tensor *leaf = em_zeros(EM_F32, EM_SHAPE(9, 11));
        CHECK_OK(em_set_requires_grad(leaf, true));
        em_tensor *x = em_mul_scalar(leaf, 2.0);
        CHECK_OK(em_backward(em_sum(em_narrow(x, dim, 3, 4), 0, NULL, false), NULL));
        for (int64_t i = 0; i < 9; i++)
            for (int64_t j = 0; j < 11; j++) {
                int64_t at = dim == 0 ? i : j;
                CHECK_NEAR(em_get(em_grad(leaf), (int64_t[]){i, j}), at >= 3 && at < 7 ? 2.0 : 0.0, 0);
            }
        em_scope_end(s);
        em_free(leaf);
    }
}

static int view_hook_calls;
static double view_hook_seen;

static em_status count_view_hook(em_tensor *t, em_tensor *grad, void *ctx)
{
    (void)t;
    (void)ctx;
    view_hook_calls++;
    view_hook_seen = em_get(grad, (int64_t[]){0, 3});
    return EM_OK;
}

TEST(test_a_leaf_read_through_views_fires_its_hook_once_with_the_final_gradient)
{
    /* DDP launches a bucket from the hook: it must come after the last view's contribution */
    em_scope s = em_scope_begin();
    em_tensor *leaf = em_zeros(EM_F32, EM_SHAPE(2, 6));
    CHECK_OK(em_set_requires_grad(leaf, true));
    CHECK_OK(em_register_grad_hook(leaf, count_view_hook, NULL));
    view_hook_calls = 0;
    CHECK_OK(em_backward(weighted_parts(leaf), NULL));
    CHECK(view_hook_calls == 1);
    CHECK_NEAR(view_hook_seen, 110, 0);
    em_scope_end(s);
    em_free(leaf);
}
