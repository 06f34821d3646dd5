/* progress.h — the progress bar of `ember train` and `ember sample`: one
 * line redrawn in place when its stream is a terminal, nothing otherwise
 * (the commands print their own plain lines there, so logs stay clean). */
#ifndef EMBER_TOOLS_PROGRESS_H
#define EMBER_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct progress {
    FILE *f;      /* where the bar goes */
    bool tty;     /* f is a terminal (isatty): only then is anything drawn */
    bool shown;   /* a bar is on the line now */
    double every; /* seconds between redraws (0: every call); the last step is always drawn */
    double last;  /* when it was drawn (progress_now) */
} progress;

/* A bar on f, drawn only if f is a terminal; redrawn at most every `every` s. */
progress progress_on(FILE *f, double every);
/* Seconds on a monotonic clock. */
double progress_now(void);
/* [#######.................] done/total<what>  loss L  R tok/s  ETA 1m05s
 * over the line (loss left out when NaN; what e.g. " tokens" or ""). */
void progress_draw(progress *p, int64_t done, int64_t total, const char *what, double loss, double tok_per_s,
                   double eta_s);
/* Erases the bar, so that a plain line can follow. */
void progress_clear(progress *p);

#endif
