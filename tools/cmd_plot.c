/* cmd_plot.c — `ember plot METRICS.jsonl -o OUT.svg`: the losses and the
 * learning rate of a run as one SVG picture.
 *
 * It reads JSON lines as the JSONL tracker (and `ember train`) writes them,
 * one flat object per line with an integer "step" and numbers (or null) for
 * the other keys, and draws two panels over a shared step axis: the loss
 * series (every tag with "loss" in its name, or those --tags names) on a
 * log scale when they span more than a decade, and under it the learning
 * rate (a tag "lr" or one with "learning_rate" in its name), each with
 * tick labels, grid, legend and a title. Each series is one <path> with a
 * point per record (a null or missing value breaks the line), marked
 * class="series" data-tag="TAG" so a program can find it again.
 *
 * Bad usage exits 2; a file that cannot be read, a line that is not such an
 * object (named by number), or nothing to draw exits 1. The SVG is written
 * atomically (no half picture on a crash). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ember/ember.h"
#include "tensor/fileio_impl.h"

/* ---- the data ----------------------------------------------------------------- */

typedef struct series {
    char *tag;
    int n, cap;
    double *x, *y; /* step, value (NAN: a gap) */
} series;

typedef struct table {
    series *s;
    int n, cap;
} table;

static series *series_of(table *t, const char *tag)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->s[i].tag, tag)) return &t->s[i];
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        series *p = realloc(t->s, sizeof *p * (size_t)cap);
        if (!p) return NULL;
        t->s = p;
        t->cap = cap;
    }
    series *s = &t->s[t->n];
    *s = (series){.tag = strdup(tag)};
    if (!s->tag) return NULL;
    t->n++;
    return s;
}

static bool series_add(series *s, double x, double y)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, sizeof *nx * (size_t)cap);
        if (nx) s->x = nx;
        double *ny = nx ? realloc(s->y, sizeof *ny * (size_t)cap) : NULL;
        if (!ny) return false;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return true;
}

static void table_free(table *t)
{
    for (int i = 0; i < t->n; i++) {
        free(t->s[i].tag);
        free(t->s[i].x);
        free(t->s[i].y);
    }
    free(t->s);
}

/* ---- reading JSON lines ------------------------------------------------------------ */

typedef struct lexer {
    const char *p, *end;
    char err[160];
} lexer;

static void ws(lexer *L)
{
    while (L->p < L->end && (*L->p == ' ' || *L->p == '\t' || *L->p == '\r')) L->p++;
}

static bool fail(lexer *L, const char *what)
{
    snprintf(L->err, sizeof L->err, "%s", what);
    return false;
}

/* A JSON string into out (escapes decoded; \uXXXX beyond ASCII becomes '?'). */
static bool string(lexer *L, char *out, size_t cap)
{
    if (L->p >= L->end || *L->p != '"') return fail(L, "expected a string");
    L->p++;
    size_t n = 0;
    while (L->p < L->end && *L->p != '"') {
        char c = *L->p++;
        if ((unsigned char)c < 0x20) return fail(L, "control character in a string");
        if (c == '\\') {
            if (L->p >= L->end) break;
            char e = *L->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 0; k < 4; k++, L->p++) {
                    if (L->p >= L->end) return fail(L, "short \\u escape");
                    char h = *L->p;
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0) return fail(L, "bad \\u escape");
                    v = v * 16 + (unsigned)d;
                }
                c = v < 0x80 && v >= 0x20 ? (char)v : '?';
                break;
            }
            case '"':
            case '\\':
            case '/': c = e; break;
            default: return fail(L, "bad escape in a string");
            }
        }
        if (out && n + 1 < cap) out[n++] = c;
    }
    if (L->p >= L->end) return fail(L, "unterminated string");
    L->p++;
    if (out) out[n] = 0;
    return true;
}

/* Steps over a nested array or object (not plotted). */
static bool skip_nested(lexer *L)
{
    int depth = 0;
    while (L->p < L->end) {
        char c = *L->p;
        if (c == '"') {
            if (!string(L, NULL, 0)) return false;
            continue;
        }
        L->p++;
        if (c == '[' || c == '{') depth++;
        if ((c == ']' || c == '}') && --depth == 0) return true;
    }
    return fail(L, "unterminated array or object");
}

/* A value: *kind 'n' number (in *v), '0' null, 's' anything else (skipped). */
static bool value(lexer *L, char *kind, double *v)
{
    if (L->p >= L->end) return fail(L, "expected a value");
    char c = *L->p;
    if (c == '"') {
        *kind = 's';
        return string(L, NULL, 0);
    }
    if (c == '[' || c == '{') {
        *kind = 's';
        return skip_nested(L);
    }
    static const char *const words[] = {"null", "true", "false"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if ((size_t)(L->end - L->p) >= n && !strncmp(L->p, words[k], n)) {
            L->p += n;
            *kind = k == 0 ? '0' : 's';
            return true;
        }
    }
    if (c != '-' && !(c >= '0' && c <= '9')) return fail(L, "expected a value");
    char tmp[64];
    size_t n = 0;
    while (L->p + n < L->end && n + 1 < sizeof tmp && strchr("+-.0123456789eE", L->p[n])) n++;
    memcpy(tmp, L->p, n);
    tmp[n] = 0;
    char *e;
    *v = strtod(tmp, &e);
    if (e != tmp + n || n == 0) return fail(L, "bad number");
    L->p += n;
    *kind = 'n';
    return true;
}

/* One line {"step": N, "tag": value, ...} into the table. */
static bool line(lexer *L, table *t)
{
    enum { MAXK = 64 };
    char keys[MAXK][128];
    double vals[MAXK];
    int nk = 0;
    double step = NAN;
    ws(L);
    if (L->p >= L->end || *L->p != '{') return fail(L, "expected '{' (one JSON object per line)");
    L->p++;
    ws(L);
    bool first = true;
    while (L->p < L->end && *L->p != '}') {
        if (!first) {
            if (*L->p != ',') return fail(L, "expected ',' or '}'");
            L->p++;
            ws(L);
        }
        first = false;
        char key[128];
        if (!string(L, key, sizeof key)) return false;
        ws(L);
        if (L->p >= L->end || *L->p != ':') return fail(L, "expected ':'");
        L->p++;
        ws(L);
        char kind;
        double v = NAN;
        if (!value(L, &kind, &v)) return false;
        ws(L);
        if (!strcmp(key, "step")) {
            if (kind != 'n' || v != floor(v) || v < 0) return fail(L, "\"step\" must be an integer >= 0");
            step = v;
        } else if (kind != 's' && nk < MAXK) {
            snprintf(keys[nk], sizeof keys[nk], "%s", key);
            vals[nk] = kind == 'n' && isfinite(v) ? v : NAN;
            nk++;
        }
    }
    if (L->p >= L->end) return fail(L, "expected '}'");
    L->p++;
    ws(L);
    if (L->p != L->end) return fail(L, "text after the object");
    if (isnan(step)) return fail(L, "no \"step\"");
    for (int i = 0; i < nk; i++) {
        series *s = series_of(t, keys[i]);
        if (!s || !series_add(s, step, vals[i])) return fail(L, "out of memory");
    }
    return true;
}

static int read_metrics(const char *path, table *t)
{
    char *text;
    size_t n;
    if (file_read_all(path, (size_t)1 << 30, &text, &n, "ember plot")) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    int ln = 0;
    for (size_t at = 0; at < n;) {
        char *nl = memchr(text + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (text + at)) : n - at;
        ln++;
        lexer L = {.p = text + at, .end = text + at + len};
        ws(&L);
        if (L.p != L.end && !line(&L, t)) {
            fprintf(stderr, "ember plot: %s line %d: %s\n", path, ln, L.err);
            free(text);
            return 1;
        }
        at += len + 1;
    }
    free(text);
    return 0;
}

/* ---- axes --------------------------------------------------------------------------- */

typedef struct axis {
    double lo, hi; /* data range shown (log10 of it when log) */
    bool log;
    int nticks;
    double ticks[32]; /* in data units */
} axis;

static double nice(double raw)
{
    double mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void linear_axis(axis *a, double mn, double mx, bool from_zero, int target)
{
    if (from_zero && mn > 0) mn = 0;
    if (mx <= mn) {
        double d = fabs(mx) > 0 ? fabs(mx) * 0.1 : 1;
        mn -= d;
        mx += d;
    }
    double st = nice((mx - mn) / target);
    a->log = false;
    a->lo = floor(mn / st) * st;
    a->hi = ceil(mx / st) * st;
    a->nticks = 0;
    for (double v = a->lo; v <= a->hi + st * 0.5 && a->nticks < 32; v += st)
        a->ticks[a->nticks++] = fabs(v) < st * 1e-9 ? 0 : v;
}

static void log_axis(axis *a, double mn, double mx)
{
    a->log = true;
    a->lo = floor(log10(mn));
    a->hi = ceil(log10(mx));
    if (a->hi == a->lo) a->hi++;
    a->nticks = 0;
    bool fine = a->hi - a->lo <= 2; /* few decades: 1, 2, 5 in each */
    for (double e = a->lo; e <= a->hi && a->nticks < 30; e++) {
        double p = pow(10, e);
        a->ticks[a->nticks++] = p;
        if (fine && e < a->hi) {
            a->ticks[a->nticks++] = 2 * p;
            a->ticks[a->nticks++] = 5 * p;
        }
    }
}

/* position of v along [0, 1] of the axis */
static double frac(const axis *a, double v)
{
    double t = a->log ? log10(v) : v;
    return (t - a->lo) / (a->hi - a->lo);
}

static void fmt_tick(char *out, size_t cap, double v) { snprintf(out, cap, "%.4g", v); }

/* ---- the picture -------------------------------------------------------------------- */

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
}

typedef struct style {
    const char *color;
    double width;
    const char *label;
} style;

static style style_of(const char *tag, int i)
{
    static const char *const palette[] = {"#1f77b4", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    if (!strcmp(tag, "loss")) return (style){"#9ecae1", 1.4, "training batch loss"};
    if (!strcmp(tag, "train_loss")) return (style){"#1f77b4", 2.2, "train loss (evaluation)"};
    if (!strcmp(tag, "val_loss")) return (style){"#ff7f0e", 2.2, "val loss (evaluation)"};
    if (!strcmp(tag, "lr")) return (style){"#2ca02c", 2, "learning rate"};
    return (style){palette[i % 6], 1.8, tag};
}

typedef struct panel {
    double top, bottom; /* pixels */
    axis y;
    const char *ylabel;
    int n;
    series *s[16];
} panel;

enum { W = 960, ML = 86, MR = 28 };

static double px_x(const axis *x, double v) { return ML + frac(x, v) * (W - ML - MR); }
static double px_y(const panel *p, double v) { return p->bottom - frac(&p->y, v) * (p->bottom - p->top); }

static void draw_panel(FILE *f, const panel *p, const axis *x, bool xlabels, bool legend)
{
    /* frame, grid and tick labels */
    fprintf(f, "<g class=\"panel\">\n");
    fprintf(f,
            "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"#fbfbfd\" stroke=\"#c8c8d0\"/>\n",
            ML, p->top, W - ML - MR, p->bottom - p->top);
    char t[32];
    for (int i = 0; i < p->y.nticks; i++) {
        double v = p->y.ticks[i], y = px_y(p, v);
        if (y < p->top - 0.5 || y > p->bottom + 0.5) continue;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4ea\"/>\n", ML, y, W - MR,
                y);
        fmt_tick(t, sizeof t, v);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" class=\"tick\">%s</text>\n", ML - 8, y + 4,
                t);
    }
    for (int i = 0; i < x->nticks; i++) {
        double xx = px_x(x, x->ticks[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4ea\"/>\n", xx, p->top,
                xx, p->bottom);
        if (xlabels) {
            fmt_tick(t, sizeof t, x->ticks[i]);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"tick\">%s</text>\n", xx,
                    p->bottom + 18, t);
        }
    }
    double mid = (p->top + p->bottom) / 2;
    fprintf(f,
            "<text x=\"20\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 20 %.1f)\" "
            "class=\"label\">%s%s</text>\n",
            mid, mid, p->ylabel, p->y.log ? " (log scale)" : "");
    /* the series, clipped to the panel */
    static int clip_id;
    clip_id++;
    /* (a marker on the frame shows whole) */
    fprintf(f,
            "<clipPath id=\"clip%d\"><rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\"/></clipPath>\n",
            clip_id, ML - 5, p->top - 5, W - ML - MR + 10, p->bottom - p->top + 10);
    fprintf(f, "<g clip-path=\"url(#clip%d)\">\n", clip_id);
    int order[16]; /* thin lines first, so the bold ones stay on top */
    for (int k = 0; k < p->n; k++) order[k] = k;
    for (int a = 1; a < p->n; a++)
        for (int b = a; b > 0 && style_of(p->s[order[b - 1]]->tag, order[b - 1]).width >
                                     style_of(p->s[order[b]]->tag, order[b]).width;
             b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    for (int kk = 0; kk < p->n; kk++) {
        int k = order[kk];
        const series *s = p->s[k];
        style st = style_of(s->tag, k);
        fprintf(f, "<path class=\"series\" data-tag=\"");
        xml_text(f, s->tag);
        fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" stroke-linejoin=\"round\" d=\"",
                st.color, st.width);
        bool pen = false;
        for (int i = 0; i < s->n; i++) {
            if (isnan(s->y[i]) || (p->y.log && !(s->y[i] > 0))) {
                pen = false;
                continue;
            }
            fprintf(f, "%s%.1f,%.1f", pen ? " L" : (i ? " M" : "M"), px_x(x, s->x[i]), px_y(p, s->y[i]));
            pen = true;
        }
        fprintf(f, "\"/>\n");
        int finite = 0;
        for (int i = 0; i < s->n; i++) finite += !isnan(s->y[i]);
        if (finite <= 80 && st.width >= 2)
            for (int i = 0; i < s->n; i++)
                if (!isnan(s->y[i]) && !(p->y.log && !(s->y[i] > 0)))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.2\" fill=\"%s\"/>\n", px_x(x, s->x[i]),
                            px_y(p, s->y[i]), st.color);
    }
    fprintf(f, "</g>\n");
    /* legend, top right */
    if (legend && p->n > 0) {
        char last[16][24];
        double w = 0;
        for (int k = 0; k < p->n; k++) {
            const series *s = p->s[k];
            int i = s->n - 1;
            while (i >= 0 && isnan(s->y[i])) i--;
            last[k][0] = 0;
            if (i >= 0) snprintf(last[k], sizeof last[k], "%.4g", s->y[i]);
            w = fmax(w, (double)(strlen(style_of(s->tag, k).label) + strlen(last[k]) + 2));
        }
        double lw = 48 + 7.2 * w, lh = 10 + 20.0 * p->n, lx = W - MR - lw - 10, ly = p->top + 10;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"4\" fill=\"#ffffff\" "
                "fill-opacity=\"0.9\" stroke=\"#c8c8d0\"/>\n",
                lx, ly, lw, lh);
        for (int k = 0; k < p->n; k++) {
            style st = style_of(p->s[k]->tag, k);
            double yy = ly + 15 + 20.0 * k;
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                    "stroke-width=\"%.1f\"/>\n",
                    lx + 10, yy, lx + 36, yy, st.color, st.width + 0.6);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"legend\">", lx + 44, yy + 4);
            xml_text(f, st.label);
            if (last[k][0]) fprintf(f, "<tspan dx=\"10\" class=\"last\">%s</tspan>", last[k]);
            fprintf(f, "</text>\n");
        }
    }
    fprintf(f, "</g>\n");
}

/* The y axis of a panel from its series' finite values; log when they are
 * all positive and span more than a decade. false when there are none. */
static bool panel_axis(panel *p, bool allow_log)
{
    double mn = INFINITY, mx = -INFINITY;
    for (int k = 0; k < p->n; k++)
        for (int i = 0; i < p->s[k]->n; i++)
            if (!isnan(p->s[k]->y[i])) {
                mn = fmin(mn, p->s[k]->y[i]);
                mx = fmax(mx, p->s[k]->y[i]);
            }
    if (!(mn <= mx)) return false;
    if (allow_log && mn > 0 && mx / mn > 10)
        log_axis(&p->y, mn, mx);
    else /* a little room above the top value, so it does not run along the frame */
        linear_axis(&p->y, mn, mx + 0.03 * (mx - mn), !allow_log, 5);
    return true;
}

static bool is_lr(const char *tag)
{
    size_t n = strlen(tag);
    return !strcmp(tag, "lr") || strstr(tag, "learning_rate") || (n > 3 && !strcmp(tag + n - 3, "/lr")) ||
           (n > 3 && !strcmp(tag + n - 3, "_lr"));
}

static bool in_list(const char *list, const char *tag)
{
    size_t n = strlen(tag);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && !strncmp(p, tag, n)) return true;
        p += k + (p[k] == ',');
    }
    return false;
}

static int cmp_step(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x > y) - (x < y);
}

/* a series' points in step order (a resumed run's records can repeat an earlier step range) */
static bool sort_series(series *s)
{
    double *pairs = malloc(sizeof *pairs * 2 * (size_t)(s->n ? s->n : 1));
    if (!pairs) return false;
    for (int i = 0; i < s->n; i++) pairs[2 * i] = s->x[i], pairs[2 * i + 1] = s->y[i];
    qsort(pairs, (size_t)s->n, 2 * sizeof *pairs, cmp_step);
    for (int i = 0; i < s->n; i++) s->x[i] = pairs[2 * i], s->y[i] = pairs[2 * i + 1];
    free(pairs);
    return true;
}

static int usage(FILE *f)
{
    fprintf(f,
            "usage: ember plot METRICS.jsonl [-o OUT.svg] [--tags T1,T2,...] [--title TEXT]\n"
            "  draws the loss series (tags with \"loss\" in their name, or --tags) and the learning rate\n"
            "  (\"lr\") against \"step\" from JSON lines as `ember train` and the JSONL tracker write them\n"
            "  -o OUT.svg      where the picture goes (default: METRICS with .svg for .jsonl)\n"
            "  --tags LIST     the series of the upper panel, comma-separated\n"
            "  --title TEXT    the title (default: the metrics file's name)\n");
    return f == stderr ? 2 : 0;
}

int cmd_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *tags = NULL, *title = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        if (!strcmp(a, "-o") || !strcmp(a, "--out") || !strcmp(a, "--tags") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ember plot: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--tags"))
                tags = v;
            else if (!strcmp(a, "--title"))
                title = v;
            else
                out = v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ember plot: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (in) {
            fprintf(stderr, "ember plot: one metrics file, got '%s' and '%s'\n", in, a);
            return 2;
        } else {
            in = a;
        }
    }
    if (!in) {
        fprintf(stderr, "ember plot: which metrics file? (e.g. ember plot out/metrics.jsonl -o loss.svg)\n");
        usage(stderr);
        return 2;
    }
    if (tags && !*tags) {
        fprintf(stderr, "ember plot: --tags needs at least one tag\n");
        return 2;
    }
    char default_out[4096];
    if (!out) {
        size_t n = strlen(in);
        if (n > 6 && !strcmp(in + n - 6, ".jsonl")) n -= 6;
        snprintf(default_out, sizeof default_out, "%.*s.svg", (int)n, in);
        out = default_out;
    }
    table t = {0};
    int rc = read_metrics(in, &t);
    panel top = {.ylabel = "loss"}, bot = {.ylabel = "learning rate"};
    for (int i = 0; !rc && i < t.n; i++) {
        series *s = &t.s[i];
        if (!sort_series(s)) rc = 1;
        if (tags ? in_list(tags, s->tag) : (strstr(s->tag, "loss") != NULL && !is_lr(s->tag))) {
            if (top.n < 16) top.s[top.n++] = s;
        } else if (is_lr(s->tag) && (!tags || !in_list(tags, s->tag)) && bot.n < 16) {
            bot.s[bot.n++] = s;
        }
    }
    if (tags) top.ylabel = "value";
    bool have_top = !rc && panel_axis(&top, true), have_bot = !rc && panel_axis(&bot, false);
    if (!rc && !have_top && !have_bot) {
        fprintf(
            stderr, "ember plot: %s has no numbers to draw: %s\n", in,
            tags ? "none of the --tags series has a value"
                 : "no loss series (a tag with \"loss\" in its name) and no learning rate (\"lr\"); name the "
                   "series with --tags");
        rc = 1;
    }
    if (rc) {
        table_free(&t);
        return rc;
    }
    /* the step axis over every series drawn */
    double xmn = INFINITY, xmx = -INFINITY;
    panel *ps[2] = {&top, &bot};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < ps[k]->n; j++)
            for (int i = 0; i < ps[k]->s[j]->n; i++) {
                xmn = fmin(xmn, ps[k]->s[j]->x[i]);
                xmx = fmax(xmx, ps[k]->s[j]->x[i]);
            }
    axis x;
    linear_axis(&x, xmn, xmx, true, 8);
    int H = have_top && have_bot ? 660 : 520;
    if (have_top && have_bot) {
        top.top = 70, top.bottom = 440, bot.top = 468, bot.bottom = 600;
    } else {
        panel *only = have_top ? &top : &bot;
        only->top = 70, only->bottom = 460;
    }
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (!f) {
        fprintf(stderr, "ember plot: out of memory\n");
        table_free(&t);
        return 1;
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
            "<style>text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;fill:#333}"
            ".tick{font-size:12px;fill:#555}.label{font-size:14px}.legend{font-size:13px}"
            ".last{fill:#777}.title{font-size:19px;font-weight:bold}.sub{font-size:12px;fill:#777}</style>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"32\" class=\"title\">", ML);
    xml_text(f, title ? title : "Training metrics");
    fprintf(f, "</text>\n<text x=\"%d\" y=\"52\" class=\"sub\">", ML);
    xml_text(f, in);
    int points = 0;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < ps[k]->n; j++) points += ps[k]->s[j]->n;
    fprintf(f, " — steps %.0f to %.0f, %d points</text>\n", xmn, xmx, points);
    if (have_top) draw_panel(f, &top, &x, !have_bot, true);
    if (have_bot) draw_panel(f, &bot, &x, true, bot.n > 1); /* one series: its axis label says it */
    double xb = have_bot ? bot.bottom : top.bottom;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"label\">step</text>\n",
            ML + (W - ML - MR) / 2.0, xb + 40);
    fprintf(f, "</svg>\n");
    bool ok = fclose(f) == 0;
    table_free(&t);
    if (!ok) {
        free(svg);
        fprintf(stderr, "ember plot: out of memory\n");
        return 1;
    }
    em_status s = file_write_atomic(out, svg, len, "ember plot");
    free(svg);
    if (s) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    printf("ember plot: wrote %s\n", out);
    return 0;
}
