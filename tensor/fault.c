/* fault.c — EMBER_FAULT: kill this process at a named point (fault_impl.h). */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensor/fault_impl.h"

#define MAX_FAULTS 16

typedef struct fault {
    char point[64];
    long n;    /* dies the nth time */
    long seen; /* times reached so far */
} fault;

static fault faults[MAX_FAULTS];
static int nfaults = -1; /* -1: not parsed yet */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static long env_long(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : 0;
}

/* One "POINT:N[:RANK[:ATTEMPT]]" item; false when malformed. Items whose
 * RANK or ATTEMPT is not this process's are dropped (kept == false). */
static bool parse_item(char *item, fault *f, bool *kept)
{
    char *fields[4] = {0};
    int k = 0;
    for (char *save = NULL, *p = strtok_r(item, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        if (k == 4) return false;
        fields[k++] = p;
    }
    if (k < 2 || strlen(fields[0]) >= sizeof f->point) return false;
    long v[3] = {0, -1, -1};
    for (int i = 1; i < k; i++) {
        char *end;
        v[i - 1] = strtol(fields[i], &end, 10);
        if (*end || end == fields[i] || v[i - 1] < 0) return false;
    }
    if (v[0] < 1) return false;
    snprintf(f->point, sizeof f->point, "%s", fields[0]);
    f->n = v[0];
    f->seen = 0;
    *kept = (v[1] < 0 || v[1] == env_long("RANK")) && (v[2] < 0 || v[2] == env_long("EMBER_RESTART_COUNT"));
    return true;
}

static void parse_env(void)
{
    nfaults = 0;
    const char *env = getenv("EMBER_FAULT");
    if (!env || !*env) return;
    char *copy = strdup(env);
    if (!copy) return;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        fault f;
        bool kept = false;
        if (!parse_item(item, &f, &kept) || nfaults == MAX_FAULTS) {
            fprintf(stderr,
                    "ember: EMBER_FAULT='%s' is not POINT:N[:RANK[:ATTEMPT]][,...] (at most %d); ignored\n",
                    env, MAX_FAULTS);
            nfaults = 0;
            break;
        }
        if (kept) faults[nfaults++] = f;
    }
    free(copy);
}

void fault_point(const char *name)
{
    static bool none; /* parsed and empty: the common case, no lock */
    if (__atomic_load_n(&none, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&mu);
    if (nfaults < 0) parse_env();
    bool die = false;
    for (int i = 0; i < nfaults; i++) {
        fault *f = &faults[i];
        if ((!strcmp(f->point, "*") || !strcmp(f->point, name)) && ++f->seen == f->n) die = true;
    }
    if (nfaults == 0) __atomic_store_n(&none, true, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
    if (die) {
        fprintf(stderr, "ember: EMBER_FAULT: killed at %s\n", name);
        fflush(NULL);
        kill(getpid(), SIGKILL);
    }
}
