/* st_hostile.h — safetensors headers built to cost a reader memory, and a
 * measure of what opening one costs. Shared by the suite
 * (test_safetensors.c) and bench/bench_header.c; no harness dependency.
 *
 * Each kind is valid JSON of about `bytes` bytes made of the smallest values
 * the format allows, so a reader that keeps a node, a pointer or an
 * allocation per value pays many times the header in memory:
 *   ints       one tensor whose shape is [0,0,0,...]      (2 bytes a value)
 *   arrays     a tensor entry holding [[],[],...]          (3 bytes a value)
 *   nested     [[[[[...]]]]] 15 deep, over and over        (2 bytes a value)
 *   strings    an array of "" strings                      (3 bytes a value)
 *   metadata   "__metadata__" with many short keys         (a valid file)
 *   tensors    many zero-size tensors with short names     (a valid file)
 * The first four are refused by the reader (after parsing), the last two open.
 */
#ifndef EMBER_TEST_ST_HOSTILE_H
#define EMBER_TEST_ST_HOSTILE_H

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember/ember.h"

static const char *const st_hostile_kinds[] = {"ints", "arrays", "nested", "strings", "metadata", "tensors"};
#define ST_HOSTILE_KINDS ((int)(sizeof st_hostile_kinds / sizeof st_hostile_kinds[0]))

/* A short distinct name for k: base-52 letters. */
static inline int st_hostile_name(char *o, uint64_t k)
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    int n = 0;
    do {
        o[n++] = al[k % 52];
        k /= 52;
    } while (k);
    o[n] = '\0';
    return n;
}

/* Writes a safetensors file at path whose header is `kind` of about `bytes`
 * bytes (no data buffer). Returns the header length, 0 on failure. */
static inline size_t st_hostile_write(const char *path, const char *kind, size_t bytes)
{
    char *h = malloc(bytes + 256);
    if (!h) return 0;
    size_t n = 0;
#define ST_PUT(s) (memcpy(h + n, (s), strlen(s)), n += strlen(s))
    if (!strcmp(kind, "ints")) {
        ST_PUT("{\"a\":{\"dtype\":\"U8\",\"shape\":[0");
        while (n < bytes) ST_PUT(",0");
        ST_PUT("],\"data_offsets\":[0,0]}}");
    } else if (!strcmp(kind, "arrays") || !strcmp(kind, "strings")) {
        const char *item = kind[0] == 'a' ? "[]" : "\"\"";
        ST_PUT("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":[");
        ST_PUT(item);
        while (n < bytes) ST_PUT(","), ST_PUT(item);
        ST_PUT("]}}");
    } else if (!strcmp(kind, "nested")) {
        ST_PUT("{\"a\":[");
        for (int k = 0; n < bytes; k++) {
            if (k) ST_PUT(",");
            ST_PUT("[[[[[[[[[[[[[[]]]]]]]]]]]]]]");
        }
        ST_PUT("]}");
    } else if (!strcmp(kind, "metadata")) {
        ST_PUT("{\"__metadata__\":{");
        for (uint64_t k = 0; n < bytes; k++) {
            char nm[16];
            st_hostile_name(nm, k);
            if (k) ST_PUT(",");
            ST_PUT("\""), ST_PUT(nm), ST_PUT("\":\"\"");
        }
        ST_PUT("}}");
    } else if (!strcmp(kind, "tensors")) {
        ST_PUT("{");
        for (uint64_t k = 0; n < bytes; k++) {
            char nm[16];
            st_hostile_name(nm, k);
            if (k) ST_PUT(",");
            ST_PUT("\""), ST_PUT(nm), ST_PUT("\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}");
        }
        ST_PUT("}");
    } else {
        free(h);
        return 0;
    }
#undef ST_PUT
    unsigned char len[8];
    for (int k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)n >> (8 * k));
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(len, 1, 8, f) == 8 && fwrite(h, 1, n, f) == n;
    if (f && fclose(f)) ok = false;
    free(h);
    return ok ? n : 0;
}

/* A line "Name: <kB> kB" of /proc/self/status, in bytes; -1 if absent. */
static inline long long st_status_bytes(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t nl = strlen(name);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, nl) && line[nl] == ':') v = atoll(line + nl + 1) * 1024;
    fclose(f);
    return v;
}

/* Opens path in a forked child and measures the peak resident memory the
 * open added: the child returns its free heap to the system, resets its
 * high-water mark (/proc/self/clear_refs "5"), notes VmRSS, opens (and
 * closes) the file and reads VmHWM. *opened says whether the open
 * succeeded. Returns the peak extra bytes, or -1 when this kernel cannot
 * reset or report the high-water mark. */
static inline long long st_hostile_open_peak(const char *path, bool *opened)
{
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        long long r[2] = {-1, 0};
        malloc_trim(0);
        FILE *cr = fopen("/proc/self/clear_refs", "w");
        bool reset = cr && fputs("5", cr) >= 0;
        if (cr && fclose(cr)) reset = false;
        long long before = st_status_bytes("VmRSS");
        em_safetensors *f = em_safetensors_open(path);
        long long peak = st_status_bytes("VmHWM");
        r[1] = f != NULL;
        em_safetensors_close(f);
        if (reset && before >= 0 && peak >= 0) r[0] = peak - before;
        ssize_t w = write(fds[1], r, sizeof r);
        (void)w;
        _exit(0);
    }
    close(fds[1]);
    long long r[2] = {-1, 0};
    ssize_t got = pid > 0 ? read(fds[0], r, sizeof r) : -1;
    close(fds[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    if (got != (ssize_t)sizeof r) return -1;
    *opened = r[1] != 0;
    return r[0];
}

#endif
