/* progress.c — the progress bar of the `ember` commands (progress.h): "\r",
 * "erase the line" (ESC [K) and the bar, flushed, so each draw replaces the
 * last; nothing at all when the stream is not a terminal. */
#include "progress.h"

#include <math.h>
#include <time.h>
#include <unistd.h>

progress progress_on(FILE *f, double every) { return (progress){f, isatty(fileno(f)) == 1, false, every, 0}; }

double progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_eta(double secs, char *buf, size_t n)
{
    int t = isfinite(secs) && secs > 0 ? (int)(secs + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, n, "%dh%02dm", t / 3600, t / 60 % 60);
    else
        snprintf(buf, n, "%dm%02ds", t / 60, t % 60);
}

void progress_draw(progress *p, int64_t done, int64_t total, const char *what, double loss, double tok_per_s,
                   double eta_s)
{
    if (!p->tty) return;
    double t = progress_now();
    if (p->shown && done < total && t - p->last < p->every) return;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1], eta[32], lossbuf[32] = "";
    int fill = total > 0 ? (int)(WIDTH * (done < total ? done : total) / total) : WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = 0;
    fmt_eta(eta_s, eta, sizeof eta);
    if (!isnan(loss)) snprintf(lossbuf, sizeof lossbuf, "  loss %.4f", loss);
    fprintf(p->f, "\r\033[K[%s] %lld/%lld%s%s  %.0f tok/s  ETA %s", bar, (long long)done, (long long)total,
            what, lossbuf, tok_per_s, eta);
    fflush(p->f);
    p->shown = true;
    p->last = t;
}

void progress_clear(progress *p)
{
    if (!p->shown) return;
    fputs("\r\033[K", p->f);
    fflush(p->f);
    p->shown = false;
}
