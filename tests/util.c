/* util.c — helpers shared by the tests: value checks, finite-difference
 * gradient checks, f32-vs-f64 agreement, non-contiguous copies, temporary
 * files under the test's own directory, running programs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"

double th_max_abs_diff(em_tensor *a, em_tensor *b)
{
    int64_t n = em_numel(a);
    if (n != em_numel(b)) return INFINITY;
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)),
           *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_to_array(a, EM_F64, x);
    em_to_array(b, EM_F64, y);
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(x[i] - y[i]);
        if (d > m || d != d) m = d;
    }
    free(x);
    free(y);
    return m;
}

void th_check_values(const char *file, int line, em_tensor *t, const double *want, double tol)
{
    if (!t) th_fail(file, line, "tensor is NULL: %s", em_last_error());
    int64_t n = em_numel(t);
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_to_array(t, EM_F64, x);
    for (int64_t i = 0; i < n; i++) {
        bool both_nan = x[i] != x[i] && want[i] != want[i];
        bool both_inf = isinf(x[i]) && x[i] == want[i];
        if (!both_nan && !both_inf && !(fabs(x[i] - want[i]) <= tol)) {
            double g = x[i];
            free(x);
            th_fail(file, line, "element %lld = %.10g, want %.10g (tol %g)", (long long)i, g, want[i], tol);
        }
    }
    free(x);
}

em_tensor *th_tensor(em_dtype dt, int ndim, const int64_t *shape, const double *vals)
{
    em_tensor *t = em_from_data(EM_F64, ndim, shape, vals);
    if (!t || dt == EM_F64) return t;
    em_tensor *c = em_cast(t, dt);
    if (em_scope_depth() == 0) em_free(t); /* persistent intermediate */
    return c;
}

em_tensor *th_noncontig(em_tensor *t)
{
    int nd = em_ndim(t);
    int64_t shape[EM_MAX_DIMS + 1];
    memcpy(shape, em_shape(t), sizeof(int64_t) * (size_t)nd);
    shape[nd] = 2;
    em_tensor *big = em_zeros(em_dtype_of(t), nd + 1, shape);
    em_tensor *v = em_squeeze(em_narrow(big, nd, 1, 1), nd);
    if (!v || em_copy_into(v, t) != EM_OK) return NULL;
    return em_detach(v);
}

/* sum(out * cot) computed with plain loops (no autograd) */
static double dot_out(em_tensor *out, const double *cot, int64_t n)
{
    double *o = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_to_array(out, EM_F64, o);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += o[i] * cot[i];
    free(o);
    return s;
}

void th_gradcheck(const char *file, int line, const char *what, th_graph_fn f, void *ctx, int n,
                  em_tensor **inputs, double eps, double atol, double rtol)
{
    for (int i = 0; i < n; i++) {
        if (em_dtype_of(inputs[i]) != EM_F64)
            th_fail(file, line, "%s: gradcheck input %d is not f64", what, i);
        if (!em_requires_grad(inputs[i])) CHECK_OK(em_set_requires_grad(inputs[i], true));
        CHECK_OK(em_zero_grad(inputs[i]));
    }
    em_scope s = em_scope_begin();
    em_tensor *out = f(inputs, ctx);
    if (!out) th_fail(file, line, "%s: forward failed: %s", what, em_last_error());
    int64_t no = em_numel(out);
    em_rng rng = em_rng_new(1234);
    em_tensor *cot = em_randn(EM_F64, em_ndim(out), em_shape(out), &rng);
    double *cotv = malloc(sizeof(double) * (size_t)(no ? no : 1));
    em_to_array(cot, EM_F64, cotv);
    em_tensor *loss = em_sum(em_mul(out, cot), 0, NULL, false);
    if (!loss) th_fail(file, line, "%s: loss failed: %s", what, em_last_error());
    if (em_backward(loss, NULL) != EM_OK)
        th_fail(file, line, "%s: backward failed: %s", what, em_last_error());
    em_scope_end(s);

    bool prev = em_set_grad_enabled(false);
    for (int i = 0; i < n; i++) {
        em_tensor *x = inputs[i];
        int64_t nx = em_numel(x);
        em_tensor *g = em_grad(x);
        double *ga = calloc((size_t)(nx ? nx : 1), sizeof(double));
        if (g) em_to_array(g, EM_F64, ga);
        int nd = em_ndim(x);
        const int64_t *shape = em_shape(x);
        for (int64_t j = 0; j < nx; j++) {
            int64_t idx[EM_MAX_DIMS], r = j;
            for (int d = nd - 1; d >= 0; d--) {
                idx[d] = r % shape[d];
                r /= shape[d];
            }
            double x0 = em_get(x, idx);
            em_scope s2 = em_scope_begin();
            em_set(x, idx, x0 + eps);
            double fp = dot_out(f(inputs, ctx), cotv, no);
            em_set(x, idx, x0 - eps);
            double fm = dot_out(f(inputs, ctx), cotv, no);
            em_set(x, idx, x0);
            em_scope_end(s2);
            double num = (fp - fm) / (2 * eps);
            if (!(fabs(num - ga[j]) <= atol + rtol * fabs(num))) {
                double a = ga[j];
                free(ga);
                free(cotv);
                th_fail(file, line, "%s: d/d input %d element %lld: autograd %.10g, finite difference %.10g",
                        what, i, (long long)j, a, num);
            }
        }
        free(ga);
        em_zero_grad(x);
    }
    em_set_grad_enabled(prev);
    free(cotv);
}

void th_f32_matches_f64(const char *file, int line, const char *what, th_graph_fn f, void *ctx, int n,
                        em_tensor **inputs, double tol)
{
    bool prev = em_set_grad_enabled(false);
    em_scope s = em_scope_begin();
    em_tensor *f32in[16];
    if (n > 16) th_fail(file, line, "%s: too many inputs", what);
    for (int i = 0; i < n; i++) {
        em_dtype dt = em_dtype_of(inputs[i]);
        f32in[i] = dt == EM_F64 ? em_cast(inputs[i], EM_F32) : inputs[i];
    }
    em_tensor *o64 = f(inputs, ctx), *o32 = f(f32in, ctx);
    if (!o64 || !o32) th_fail(file, line, "%s: forward failed: %s", what, em_last_error());
    if (em_dtype_of(o32) != EM_F32 && em_dtype_is_float(em_dtype_of(o64)))
        th_fail(file, line, "%s: f32 inputs gave a %s result", what, em_dtype_name(em_dtype_of(o32)));
    int64_t no = em_numel(o64);
    double *a = malloc(sizeof(double) * (size_t)(no ? no : 1)),
           *b = malloc(sizeof(double) * (size_t)(no ? no : 1));
    em_to_array(o64, EM_F64, a);
    em_to_array(o32, EM_F64, b);
    double scale = 1e-30, worst = 0;
    for (int64_t j = 0; j < no; j++) scale = fmax(scale, fabs(a[j]));
    for (int64_t j = 0; j < no; j++) worst = fmax(worst, fabs(a[j] - b[j]));
    free(a);
    free(b);
    em_scope_end(s);
    em_set_grad_enabled(prev);
    if (worst > tol * fmax(scale, 1.0))
        th_fail(file, line, "%s: f32 differs from f64 by %.3g (scale %.3g, tol %g)", what, worst, scale, tol);
}

void th_grad_f32_matches_f64(const char *file, int line, th_graph_fn f, void *ctx, int n, em_tensor **in64,
                             double tol)
{
    em_tensor *in32[16];
    if (n > 16) th_fail(file, line, "too many inputs");
    for (int i = 0; i < n; i++) {
        bool prev = em_set_grad_enabled(false);
        in32[i] = em_cast(in64[i], EM_F32);
        em_set_grad_enabled(prev);
        CHECK_OK(em_set_requires_grad(in64[i], true));
        CHECK_OK(em_set_requires_grad(in32[i], true));
    }
    em_scope s = em_scope_begin();
    em_tensor *o64 = f(in64, ctx), *o32 = f(in32, ctx);
    if (!o64 || !o32) th_fail(file, line, "forward failed: %s", em_last_error());
    em_rng r = em_rng_new(77);
    em_tensor *cot = em_randn(EM_F64, em_ndim(o64), em_shape(o64), &r);
    CHECK_OK(em_backward(em_sum(em_mul(o64, cot), 0, NULL, false), NULL));
    CHECK_OK(em_backward(em_sum(em_mul(o32, em_cast(cot, EM_F32)), 0, NULL, false), NULL));
    for (int i = 0; i < n; i++) {
        if (em_dtype_of(em_grad(in32[i])) != EM_F32)
            th_fail(file, line, "input %d: f32 gradient is not f32", i);
        double d = th_max_abs_diff(em_grad(in32[i]), em_grad(in64[i]));
        if (!(d < tol)) th_fail(file, line, "input %d: f32 gradient differs from f64 by %g", i, d);
    }
    em_scope_end(s);
    for (int i = 0; i < n; i++) {
        CHECK_OK(em_zero_grad(in64[i]));
        em_free(in32[i]);
    }
}

/* whole temp file f (rewound) into buf, NUL-terminated */
static void read_back(FILE *f, char *buf, size_t cap)
{
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
}

/* ---- temporary files ------------------------------------------------------ */

const char *th_tmp(void)
{
    const char *d = getenv("EMBER_TEST_TMP");
    if (!d || !*d)
        th_fail(__FILE__, __LINE__, "EMBER_TEST_TMP is not set: tests run under tests/main.c's runner");
    return d;
}

/* TEST_DIR/prefix-XXXXXX into buf (n bytes), or fails the test */
static void tmp_template(char *buf, size_t n, const char *prefix, const char *what)
{
    const char *d = th_tmp();
    int w = snprintf(buf, n, "%s/%s-XXXXXX", d, prefix);
    if (w < 0 || (size_t)w >= n)
        th_fail(__FILE__, __LINE__, "%s: %s/%s-XXXXXX does not fit in %zu bytes", what, d, prefix, n);
}

char *th_tmpdir(char *dir, size_t n, const char *prefix)
{
    tmp_template(dir, n, prefix, "th_tmpdir");
    if (!mkdtemp(dir)) th_fail(__FILE__, __LINE__, "th_tmpdir: mkdtemp(%s): %s", dir, strerror(errno));
    return dir;
}

int th_tmpfile(char *path, size_t n, const char *prefix)
{
    tmp_template(path, n, prefix, "th_tmpfile");
    int fd = mkstemp(path);
    if (fd < 0) th_fail(__FILE__, __LINE__, "th_tmpfile: mkstemp(%s): %s", path, strerror(errno));
    return fd;
}

/* Removes name (relative to the directory dirfd): a file at once, a
 * directory after its entries, made writable first so a test's read-only
 * directory goes too. Symbolic links are removed, never followed. */
static int remove_at(int dirfd, const char *name)
{
    if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return 0;
    if (errno != EISDIR) return -1;
    (void)fchmodat(dirfd, name, 0700, 0);
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return -1;
    }
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && remove_at(fd, e->d_name) != 0) rc = -1;
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) rc = -1;
    return rc;
}

int th_remove_tree(const char *path) { return remove_at(AT_FDCWD, path); }

void th_rhyme_corpus(char *dir, size_t n, char *txt, size_t tn)
{
    th_tmpdir(dir, n, "ember-corpus");
    th_pathf(txt, tn, "%s/corpus.txt", dir);
    FILE *f = fopen(txt, "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write %s", txt);
    for (int i = 0; i < 300; i++) fputs("the cat sat on the mat. the dog sat on the log.\n", f);
    fclose(f);
}

void th_train_steps(const char *run, char *buf, size_t n)
{
    char path[PATH_MAX], line[1024];
    size_t k = 0;
    buf[0] = '\0';
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long step;
        char loss[40], norm[40];
        const char *l = strstr(line, "\"loss\": "), *g = strstr(line, "\"grad_norm\": ");
        if (sscanf(line, "{\"step\": %ld", &step) != 1 || !l || !g || sscanf(l + 8, "%39[^,}]", loss) != 1 ||
            sscanf(g + 13, "%39[^,}]", norm) != 1)
            continue;
        int w = snprintf(buf + k, n - k, "%ld %s %s\n", step, loss, norm);
        if (w < 0 || (size_t)w >= n - k) break;
        k += (size_t)w;
    }
    fclose(f);
}

th_run_result *th_vrun(const char *bin, va_list ap)
{
    const char *argv[40] = {bin};
    int argc = 1;
    for (const char *a = va_arg(ap, const char *); a && argc < 39; a = va_arg(ap, const char *))
        argv[argc++] = a;
    argv[argc] = NULL;
    static th_run_result r;
    memset(&r, 0, sizeof r);
    FILE *out = tmpfile(), *err = tmpfile();
    if (!out || !err) th_fail(__FILE__, __LINE__, "tmpfile failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) th_fail(__FILE__, __LINE__, "fork failed");
    if (pid == 0) {
        dup2(fileno(out), 1);
        dup2(fileno(err), 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    read_back(out, r.out, sizeof r.out);
    read_back(err, r.err, sizeof r.err);
    fclose(out);
    fclose(err);
    if (r.status == 127) th_fail(__FILE__, __LINE__, "could not run %s", bin);
    return &r;
}

th_run_result *th_run(const char *bin, ...)
{
    va_list ap;
    va_start(ap, bin);
    th_run_result *r = th_vrun(bin, ap);
    va_end(ap);
    return r;
}

void th_reseal_checkpoint(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) th_fail(__FILE__, __LINE__, "cannot open %s", path);
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    size_t k = 0;
    const char *at = text, *key = "{\"name\": \"";
    for (const char *e; (e = strstr(at, key)); at = strchr(e, '}')) {
        const char *name = e + strlen(key);
        int len = (int)strcspn(name, "\"");
        char file[PATH_MAX];
        snprintf(file, sizeof file, "%s/%.*s", dir, len, name);
        FILE *g = fopen(file, "rb");
        if (!g) th_fail(__FILE__, __LINE__, "cannot open %s", file);
        uLong crc = crc32(0, NULL, 0);
        size_t size = 0, got;
        unsigned char buf[1 << 14];
        while ((got = fread(buf, 1, sizeof buf, g)) > 0) {
            crc = crc32(crc, buf, (uInt)got);
            size += got;
        }
        fclose(g);
        k += (size_t)snprintf(out + k, sizeof out - k,
                              "%.*s{\"name\": \"%.*s\", \"size\": \"%zu\", \"crc32\": \"%08lx\"",
                              (int)(e - at), at, len, name, size, crc);
    }
    k += (size_t)snprintf(out + k, sizeof out - k, "%s", at);
    char *self = strstr(out, "\n  \"crc32\": \"");
    if (!self) th_fail(__FILE__, __LINE__, "%s has no crc32 of its own", path);
    self += strlen("\n  \"crc32\": \"");
    memcpy(self, "00000000", 8);
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0, (const Bytef *)out, (uInt)k));
    memcpy(self, hex, 8);
    f = fopen(path, "wb");
    if (!f || fwrite(out, 1, k, f) != k || fclose(f)) th_fail(__FILE__, __LINE__, "cannot write %s", path);
}

char *th_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *p = len >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)len + 1) : NULL;
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (!p) return NULL;
    p[len] = '\0';
    *n = (size_t)len;
    return p;
}

char *th_slurp(const char *path, size_t *n)
{
    char *p = th_read_file(path, n);
    if (!p) th_fail(__FILE__, __LINE__, "cannot read %s", path);
    return p;
}

void th_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write %s", path);
    bool ok = fwrite(p, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) th_fail(__FILE__, __LINE__, "cannot write %s", path);
}

char *th_pathf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= n)
        th_fail(__FILE__, __LINE__, "th_pathf: \"%s\" needs %d bytes, has %zu", buf, w + 1, n);
    return buf;
}

const char *th_path(const char *dir, const char *name)
{
    static char bufs[4][PATH_MAX];
    static int next;
    return th_pathf(bufs[next++ % 4], sizeof bufs[0], "%s/%s", dir, name);
}

void th_no_user_config(void)
{
    unsetenv("EMBER_CONFIG_FILE");
    setenv("XDG_CONFIG_HOME", "/nonexistent/ember-test-xdg", 1);
}
