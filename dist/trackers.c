/* trackers.c — experiment trackers (ember/tracker.h): scalars against the
 * step, as TensorBoard event files and as JSON lines.
 *
 * A TensorBoard event file is a TFRecord file: records of
 *
 *     uint64 length (little-endian)
 *     uint32 masked CRC-32C of those 8 bytes
 *     byte   data[length]
 *     uint32 masked CRC-32C of data
 *
 * whose data are tensorflow.Event protocol buffers, encoded here by hand
 * (proto3 wire format; field numbers from tensorflow/core/util/event.proto
 * and summary.proto):
 *
 *     Event   { double wall_time = 1; int64 step = 2;
 *               string file_version = 3; Summary summary = 5; }
 *     Summary { repeated Value value = 1; }
 *     Value   { string tag = 1; float simple_value = 2; }
 *
 * The first record names the file's version ("brain.Event:2"); each
 * em_tracker_log call is one Event whose Summary holds its metrics. A run
 * that continues an earlier one (cfg->append) puts an Event with
 * SessionLog session_log = 7 { status = 1 (START) } at the step of its
 * first record before it: TensorBoard then discards what the run's earlier
 * files hold from that step on (what a killed run logged after the
 * checkpoint it is resumed from), as it does for a restarted TensorFlow
 * job.
 *
 * Each record (and each JSON line) is built in memory and handed to the
 * kernel with one write(2) before the call returns, so a process that dies
 * afterwards loses nothing. A write that fails part-way is cut back
 * (ftruncate) to the last whole record, so a reader never meets a torn one
 * written by a live tracker. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/tracker_impl.h"
#include "ember/tracker.h"
#include "tensor/error_impl.h"

struct em_tracker {
    int log_with;
    int fd[2];     /* [0] TensorBoard, [1] JSONL; -1 when not written */
    off_t size[2]; /* bytes of whole records in each file */
    char *path[2];
    bool restart; /* TensorBoard, cfg->append: a SessionLog START goes before the first record */
};

/* ---- CRC-32C ------------------------------------------------------------------ */

uint32_t tracker_crc32c(uint32_t crc, const void *p, size_t n)
{
    /* bit by bit: the records are small (a few hundred bytes a step) */
    const unsigned char *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= b[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

uint32_t tracker_crc_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- a growing byte buffer ---------------------------------------------------- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_byte(buf *b, unsigned char c) { put(b, &c, 1); }

static void put_le(buf *b, uint64_t v, int bytes)
{
    unsigned char le[8];
    for (int i = 0; i < bytes; i++) le[i] = (unsigned char)(v >> (8 * i));
    put(b, le, (size_t)bytes);
}

static void put_varint(buf *b, uint64_t v)
{
    do {
        unsigned char c = v & 0x7f;
        v >>= 7;
        put_byte(b, c | (v ? 0x80 : 0));
    } while (v);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >>= 7) n++;
    return n;
}

static void put_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_printf(buf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    put(b, tmp, (size_t)n);
}

/* ---- protocol buffers ----------------------------------------------------------- */

/* wire types */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_BYTES = 2, WT_FIXED32 = 5 };

static void put_key(buf *b, int field, int wire) { put_varint(b, (uint64_t)(field << 3 | wire)); }

static size_t value_len(const em_metric *m)
{
    size_t tag = strlen(m->tag);
    return 1 + varint_len(tag) + tag + 1 + 4; /* tag = 1, simple_value = 2 */
}

/* The fields every Event starts with: wall_time (1, double) and step (2). */
static void put_event_head(buf *b, double wall_time, int64_t step)
{
    uint64_t wt;
    memcpy(&wt, &wall_time, sizeof wt);
    put_key(b, 1, WT_FIXED64);
    put_le(b, wt, 8);
    put_key(b, 2, WT_VARINT);
    put_varint(b, (uint64_t)step);
}

/* Event{wall_time, step, session_log{status: START}} */
static void put_start_event(buf *b, double wall_time, int64_t step)
{
    put_event_head(b, wall_time, step);
    put_key(b, 7, WT_BYTES); /* session_log */
    put_varint(b, 2);
    put_key(b, 1, WT_VARINT); /* status = START */
    put_varint(b, 1);
}

/* Event{wall_time, step, file_version or summary{value[i] = {tag, simple_value}}} */
static void put_event(buf *b, double wall_time, int64_t step, const char *file_version, int n,
                      const em_metric *m)
{
    put_event_head(b, wall_time, step);
    if (file_version) {
        put_key(b, 3, WT_BYTES);
        put_varint(b, strlen(file_version));
        put(b, file_version, strlen(file_version));
        return;
    }
    size_t summary = 0;
    for (int i = 0; i < n; i++) summary += 1 + varint_len(value_len(&m[i])) + value_len(&m[i]);
    put_key(b, 5, WT_BYTES);
    put_varint(b, summary);
    for (int i = 0; i < n; i++) {
        put_key(b, 1, WT_BYTES); /* Summary.value */
        put_varint(b, value_len(&m[i]));
        size_t tag = strlen(m[i].tag);
        put_key(b, 1, WT_BYTES); /* Value.tag */
        put_varint(b, tag);
        put(b, m[i].tag, tag);
        float v = (float)m[i].value;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        put_key(b, 2, WT_FIXED32); /* Value.simple_value */
        put_le(b, bits, 4);
    }
}

/* data[0..n) framed as one TFRecord */
static void put_record(buf *b, const unsigned char *data, size_t n)
{
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    put(b, len, 8);
    put_le(b, tracker_crc_mask(tracker_crc32c(0, len, 8)), 4);
    put(b, data, n);
    put_le(b, tracker_crc_mask(tracker_crc32c(0, data, n)), 4);
}

/* ---- JSON ------------------------------------------------------------------------ */

static void put_json_string(buf *b, const char *s)
{
    put_byte(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            put_byte(b, '\\');
            put_byte(b, *p);
        } else if (*p < 0x20) {
            put_printf(b, "\\u%04x", *p);
        } else {
            put_byte(b, *p);
        }
    }
    put_byte(b, '"');
}

/* The shortest %g text that reads back as v; null for NaN and infinities. */
static void put_json_number(buf *b, double v)
{
    if (!isfinite(v)) {
        put(b, "null", 4);
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    put(b, tmp, strlen(tmp));
}

/* ---- files ----------------------------------------------------------------------- */

static double wall_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Appends p[0..n) to file k of t in one write (retried on a short write);
 * on failure cuts the file back to its last whole record. */
static em_status append(em_tracker *t, int k, const void *p, size_t n, const char *fn)
{
    const char *c = p;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(t->fd[k], c + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            if (ftruncate(t->fd[k], t->size[k]) != 0) { /* keep the first error */
            }
            return em_err(EM_ERR_IO, "%s: cannot write %s: %s", fn, t->path[k], strerror(e));
        }
        done += (size_t)w;
    }
    t->size[k] += (off_t)n;
    return EM_OK;
}

/* mkdir -p */
static em_status make_dirs(const char *path, const char *fn)
{
    char *p = strdup(path);
    if (!p) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    em_status s = EM_OK;
    for (char *q = p + 1;; q++) {
        bool end = !*q;
        if (*q == '/' || end) {
            *q = 0;
            struct stat sb;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                s = em_err(EM_ERR_IO, "%s: cannot create %s: %s", fn, p, strerror(errno));
            else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
                s = em_err(EM_ERR_IO, "%s: %s exists and is not a directory", fn, p);
            if (s || end) break;
            *q = '/';
        }
    }
    free(p);
    return s;
}

/* Opens path for appending (and for reading back a torn last line) only if
 * it is (or becomes) a regular file: a FIFO or device is refused by type,
 * without waiting for a reader. */
static int open_regular_for_append(const char *path, int extra, const char *fn)
{
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC | extra, 0666);
    if (fd < 0) {
        int e = errno;
        em_err(EM_ERR_IO, "%s: cannot open %s: %s", fn, path,
               e == ENXIO ? "it is a FIFO or device, not a regular file" : strerror(e));
        errno = e; /* the caller tells EEXIST apart */
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        em_err(EM_ERR_IO, "%s: %s is not a regular file", fn, path);
        return -1;
    }
    fcntl(fd, F_SETFL, O_APPEND); /* blocking from here on */
    return fd;
}

/* The offset just past the last '\n' of fd's first `size` bytes (0 if none). */
static off_t end_of_last_line(int fd, off_t size)
{
    char chunk[4096];
    for (off_t end = size; end > 0;) {
        off_t start = end > (off_t)sizeof chunk ? end - (off_t)sizeof chunk : 0;
        ssize_t r = pread(fd, chunk, (size_t)(end - start), start);
        if (r <= 0) return size; /* cannot read: leave the file as it is */
        for (ssize_t i = r - 1; i >= 0; i--)
            if (chunk[i] == '\n') return start + i + 1;
        end = start;
    }
    return 0;
}

static em_status open_jsonl(em_tracker *t, const char *path, bool keep, const char *fn)
{
    if (!(t->path[1] = strdup(path))) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    if ((t->fd[1] = open_regular_for_append(path, 0, fn)) < 0) return em_last_status();
    struct stat sb;
    if (fstat(t->fd[1], &sb) != 0)
        return em_err(EM_ERR_IO, "%s: cannot stat %s: %s", fn, path, strerror(errno));
    off_t keep_to = keep ? end_of_last_line(t->fd[1], sb.st_size) : 0;
    if (keep_to != sb.st_size && ftruncate(t->fd[1], keep_to) != 0)
        return em_err(EM_ERR_IO, "%s: cannot truncate %s: %s", fn, path, strerror(errno));
    t->size[1] = keep_to;
    return EM_OK;
}

/* A new file LOGDIR/RUN/events.out.tfevents.<time>.<host>.<pid>.<n>, with
 * its first record. */
static em_status open_tensorboard(em_tracker *t, const char *dir, const char *fn)
{
    static int counter; /* unique names within the process */
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    size_t cap = strlen(dir) + strlen(host) + 96;
    if (!(t->path[0] = malloc(cap))) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int tries = 0;; tries++) {
        snprintf(t->path[0], cap, "%s/events.out.tfevents.%lld.%s.%d.%d", dir, (long long)time(NULL), host,
                 (int)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        t->fd[0] = open_regular_for_append(t->path[0], O_EXCL, fn);
        if (t->fd[0] >= 0) break;
        if (errno != EEXIST || tries > 100) return em_last_status();
    }
    buf b = {0}, rec = {0};
    put_event(&b, wall_clock(), 0, "brain.Event:2", 0, NULL);
    put_record(&rec, b.p, b.n);
    em_status s =
        b.oom || rec.oom ? em_err(EM_ERR_OOM, "%s: out of memory", fn) : append(t, 0, rec.p, rec.n, fn);
    free(b.p);
    free(rec.p);
    return s;
}

/* ---- the API --------------------------------------------------------------------- */

em_status tracker_check_run_name(const char *name, const char *fn)
{
    if (!name) return em_err(EM_ERR_ARG, "%s: the run name is NULL", fn);
    if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
        return em_err(EM_ERR_ARG,
                      "%s: run name '%s' must be one path component (not empty, no '/', not . or ..)", fn,
                      name);
    return EM_OK;
}

em_status tracker_check_flags(int log_with, const char *fn)
{
    if (log_with & ~EM_TRACK_ALL)
        return em_err(EM_ERR_ARG,
                      "%s: log_with 0x%x has unknown flags (EM_TRACK_TENSORBOARD | EM_TRACK_JSONL)", fn,
                      (unsigned)log_with);
    return EM_OK;
}

em_status tracker_check_metrics(int64_t step, int n, const em_metric *m, const char *fn)
{
    if (step < 0) return em_err(EM_ERR_ARG, "%s: step %lld is negative", fn, (long long)step);
    if (n < 0) return em_err(EM_ERR_ARG, "%s: n %d is negative", fn, n);
    if (n > 0 && !m) return em_err(EM_ERR_ARG, "%s: metrics is NULL with n %d", fn, n);
    for (int i = 0; i < n; i++) {
        if (!m[i].tag || !m[i].tag[0])
            return em_err(EM_ERR_ARG, "%s: metric %d has %s tag", fn, i, m[i].tag ? "an empty" : "a NULL");
        if (!strcmp(m[i].tag, "step"))
            return em_err(EM_ERR_ARG, "%s: metric %d is tagged \"step\", the name of the record's step", fn,
                          i);
        for (int j = 0; j < i; j++)
            if (!strcmp(m[i].tag, m[j].tag))
                return em_err(EM_ERR_ARG, "%s: tag \"%s\" is given twice (metrics %d and %d)", fn, m[i].tag,
                              j, i);
    }
    return EM_OK;
}

em_tracker *em_tracker_open(const char *run_name, const em_tracker_config *cfg)
{
    const char *fn = "em_tracker_open";
    if (!cfg) return em_fail(EM_ERR_ARG, "%s: cfg is NULL", fn);
    if (tracker_check_run_name(run_name, fn) || tracker_check_flags(cfg->log_with, fn)) return NULL;
    if (!cfg->log_with)
        return em_fail(EM_ERR_ARG, "%s: log_with is 0: name EM_TRACK_TENSORBOARD and/or EM_TRACK_JSONL", fn);
    em_tracker *t = calloc(1, sizeof *t);
    if (!t) return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    t->log_with = cfg->log_with;
    t->fd[0] = t->fd[1] = -1;
    const char *logdir = cfg->logging_dir && *cfg->logging_dir ? cfg->logging_dir : "runs";
    size_t cap = strlen(logdir) + strlen(run_name) + 32;
    char *dir = malloc(cap);
    if (!dir) {
        em_tracker_close(t);
        return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    }
    snprintf(dir, cap, "%s/%s", logdir, run_name);
    em_status s = EM_OK;
    if ((t->log_with & EM_TRACK_TENSORBOARD) || !cfg->jsonl_path) s = make_dirs(dir, fn);
    if (!s && (t->log_with & EM_TRACK_TENSORBOARD)) s = open_tensorboard(t, dir, fn);
    t->restart = cfg->append;
    if (!s && (t->log_with & EM_TRACK_JSONL)) {
        if (cfg->jsonl_path) {
            s = open_jsonl(t, cfg->jsonl_path, cfg->append, fn);
        } else {
            snprintf(dir, cap, "%s/%s/metrics.jsonl", logdir, run_name);
            s = open_jsonl(t, dir, cfg->append, fn);
        }
    }
    free(dir);
    if (s) {
        held_error h;
        error_hold(&h, s);
        if (t->fd[0] >= 0) unlink(t->path[0]); /* a tracker that failed to open leaves no event file */
        em_tracker_close(t);
        error_restore(&h);
        return NULL;
    }
    return t;
}

em_status em_tracker_log(em_tracker *t, int64_t step, int n, const em_metric *m)
{
    const char *fn = "em_tracker_log";
    if (!t) return em_err(EM_ERR_ARG, "%s: tracker is NULL", fn);
    em_status s = tracker_check_metrics(step, n, m, fn);
    if (s || n == 0) return s;
    if (t->fd[0] >= 0) {
        buf b = {0}, rec = {0};
        double now = wall_clock();
        if (t->restart) { /* both records in one write */
            put_start_event(&b, now, step);
            put_record(&rec, b.p, b.n);
            b.n = 0;
        }
        put_event(&b, now, step, NULL, n, m);
        put_record(&rec, b.p, b.n);
        s = b.oom || rec.oom ? em_err(EM_ERR_OOM, "%s: out of memory", fn) : append(t, 0, rec.p, rec.n, fn);
        if (!s) t->restart = false;
        free(b.p);
        free(rec.p);
    }
    if (!s && t->fd[1] >= 0) {
        buf b = {0};
        put_printf(&b, "{\"step\": %lld", (long long)step);
        for (int i = 0; i < n; i++) {
            put(&b, ", ", 2);
            put_json_string(&b, m[i].tag);
            put(&b, ": ", 2);
            put_json_number(&b, m[i].value);
        }
        put(&b, "}\n", 2);
        s = b.oom ? em_err(EM_ERR_OOM, "%s: out of memory", fn) : append(t, 1, b.p, b.n, fn);
        free(b.p);
    }
    return s;
}

em_status em_tracker_flush(em_tracker *t)
{
    if (!t) return em_err(EM_ERR_ARG, "em_tracker_flush: tracker is NULL");
    for (int k = 0; k < 2; k++)
        if (t->fd[k] >= 0 && fsync(t->fd[k]) != 0 && errno != EINVAL)
            return em_err(EM_ERR_IO, "em_tracker_flush: cannot fsync %s: %s", t->path[k], strerror(errno));
    return EM_OK;
}

em_status em_tracker_close(em_tracker *t)
{
    if (!t) return EM_OK;
    em_status s = EM_OK;
    for (int k = 0; k < 2; k++) {
        if (t->fd[k] >= 0) {
            if (fsync(t->fd[k]) != 0 && errno != EINVAL && !s)
                s = em_err(EM_ERR_IO, "em_tracker_close: cannot fsync %s: %s", t->path[k], strerror(errno));
            if (close(t->fd[k]) != 0 && !s)
                s = em_err(EM_ERR_IO, "em_tracker_close: cannot close %s: %s", t->path[k], strerror(errno));
        }
        free(t->path[k]);
    }
    free(t);
    return s;
}

const char *em_tracker_path(const em_tracker *t, int kind)
{
    if (!t) return NULL;
    if (kind == EM_TRACK_TENSORBOARD) return t->path[0];
    if (kind == EM_TRACK_JSONL) return t->path[1];
    return NULL;
}

em_status em_tracker_parse(const char *s, int *log_with)
{
    if (!s || !log_with)
        return em_err(EM_ERR_ARG, "em_tracker_parse: %s is NULL", s ? "log_with" : "the text");
    int v = 0;
    const char *p = s;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 11 && !strncmp(p, "tensorboard", n))
            v |= EM_TRACK_TENSORBOARD;
        else if (n == 5 && !strncmp(p, "jsonl", n))
            v |= EM_TRACK_JSONL;
        else if (n == 3 && !strncmp(p, "all", n))
            v |= EM_TRACK_ALL;
        else if (!(n == 4 && !strncmp(p, "none", n)))
            return em_err(EM_ERR_ARG,
                          "log_with '%s' is not tensorboard, jsonl, all or none (or a comma-separated list)",
                          s);
        if (!p[n]) break;
        p += n + 1;
    }
    *log_with = v;
    return EM_OK;
}
