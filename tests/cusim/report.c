/* report.c — how every part of the CUDA emulator reports what it found: one
 * line on stderr, counted and kept for the tests of the checkers. With
 * EMBER_CUSIM_FATAL=1 the first report aborts the process (so a report can
 * never scroll past unnoticed in a long run). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusim_impl.h"

static char last[1024];
static int count;

void cusim_report(const char *fmt, ...)
{
    char msg[sizeof last];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cusim_lock();
    memcpy(last, msg, sizeof last);
    count++;
    cusim_unlock();
    fprintf(stderr, "cusim: %s\n", msg);
    const char *fatal = getenv("EMBER_CUSIM_FATAL");
    if (fatal && !strcmp(fatal, "1")) abort();
}

int cusim_report_count(void)
{
    cusim_lock();
    int n = count;
    cusim_unlock();
    return n;
}

const char *cusim_last_message(void) { return last; }
