/* mem_check.c — the memory a process may use (MemAvailable and cgroup
 * limits), its peak resident set, and human-readable sizes (mem_check.h). */
#include "mem_check.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of `key:` in a /proc file of "key: N kB" lines, in bytes; 0 if
 * absent. */
static double proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t k = strlen(key);
    double v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') {
            v = 1024.0 * strtod(line + k + 1, NULL);
            break;
        }
    fclose(f);
    return v;
}

double mem_peak_rss(void) { return proc_kb("/proc/self/status", "VmHWM"); }

double mem_rss(void) { return proc_kb("/proc/self/status", "VmRSS"); }

/* A limit file's number ("max", or a v1 "unlimited" near 2^63, is none: 0). */
static double read_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3)) return 0;
    char *end;
    double v = strtod(buf, &end);
    return end != buf && v > 0 && v < 0x1p62 ? v : 0;
}

/* The lowest `file` limit on the path from the process's cgroup (rel, as in
 * /proc/self/cgroup) up to the hierarchy's mount point. */
static void walk_limits(const char *mount, const char *root, const char *rel, const char *file, double *best,
                        char *what, size_t n)
{
    size_t rl = strlen(root);
    if (strcmp(root, "/") && !strncmp(rel, root, rl)) rel += rl; /* a mount of a sub-tree (a container) */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", mount, !strcmp(rel, "/") ? "" : rel);
    size_t floor = strlen(mount);
    for (;;) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        double v = read_limit(path);
        if (v > 0 && (*best == 0 || v < *best)) {
            *best = v;
            snprintf(what, n, "%.*s", (int)(n - 1), path);
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < floor) break;
        *slash = 0;
    }
}

/* The process's cgroup limit (v2 memory.max, v1 memory.limit_in_bytes), 0
 * when none applies. */
static double cgroup_limit(char *what, size_t n)
{
    char v2[1024] = "", v1[1024] = "", line[4096];
    bool has_v2 = false, has_v1 = false;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        if (!strncmp(line, "0::", 3)) has_v2 = snprintf(v2, sizeof v2, "%s", b + 1) > 0;
        *b = 0;
        for (char *c = strtok(a + 1, ","); c; c = strtok(NULL, ","))
            if (!strcmp(c, "memory")) has_v1 = snprintf(v1, sizeof v1, "%s", b + 1) > 0;
    }
    fclose(f);
    double best = 0;
    if (!(f = fopen("/proc/self/mountinfo", "r"))) return 0;
    /* "id parent maj:min root mount-point options ... - fstype source super-options" */
    while (fgets(line, sizeof line, f)) {
        char root[1024], mount[1024], *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %1023s %1023s", root, mount) != 2) continue;
        char fstype[64], super[1024] = "";
        if (sscanf(dash + 3, "%63s %*s %1023s", fstype, super) < 1) continue;
        if (has_v2 && !strcmp(fstype, "cgroup2"))
            walk_limits(mount, root, v2, "memory.max", &best, what, n);
        else if (has_v1 && !strcmp(fstype, "cgroup") && strstr(super, "memory"))
            walk_limits(mount, root, v1, "memory.limit_in_bytes", &best, what, n);
    }
    fclose(f);
    return best;
}

double mem_available(char *what, size_t n)
{
    double avail = proc_kb("/proc/meminfo", "MemAvailable");
    snprintf(what, n, "MemAvailable in /proc/meminfo");
    char cg[1024] = "";
    double limit = cgroup_limit(cg, sizeof cg);
    if (limit > 0 && (avail == 0 || limit < avail)) {
        avail = limit;
        snprintf(what, n, "the cgroup limit %.*s", (int)(n > 20 ? n - 20 : 1), cg);
    }
    return avail;
}

const char *mem_human(double bytes, char *buf, size_t n)
{
    if (bytes >= 0x1p30)
        snprintf(buf, n, "%.2f GiB", bytes / 0x1p30);
    else
        snprintf(buf, n, "%.1f MiB", bytes / 0x1p20);
    return buf;
}
