/* store.c — the rendezvous store's client: connect (retrying while nothing
 * listens yet), present the job's token, then set / get / add / wait /
 * barrier as request-reply frames (store_proto.h) over one TCP connection.
 * Blocking requests carry their timeout to the server, which answers when
 * the key appears or the time is up; the client waits a little longer than
 * that for the answer, so a dead server is an error, never a hang. The server
 * lives in store_server.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tensor/error_impl.h"
#include "dist_impl.h"
#include "store_proto.h"

#define REPLY_GRACE 10.0 /* seconds a reply may lag behind the server's own deadline */

struct em_store {
    int fd; /* -1 once the connection is lost */
    char host[256];
    int port;
    char *token;
    double timeout;
};

const char *dist_store_token(const em_store *s) { return s->token; }
int dist_store_fd(const em_store *s) { return s->fd; }
double dist_store_timeout(const em_store *s) { return s->timeout; }

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static em_status lost(em_store *s, const char *fn, const char *why)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    return em_err(EM_ERR_DIST, "%s: connection to the store at %s:%d lost (%s)", fn, s->host, s->port, why);
}

/* Sends frame[0..n) (its first 4 bytes are filled in here) and reads the
 * reply: *code, and its payload in *body (malloc'd, NUL-terminated; caller
 * frees) of *blen bytes. wait_s: how long the server may park it. */
static em_status request(em_store *s, const char *fn, uint8_t *frame, size_t n, double wait_s, int *code,
                         uint8_t **body, size_t *blen)
{
    *body = NULL;
    if (s->fd < 0)
        return em_err(EM_ERR_DIST, "%s: no connection to the store at %s:%d (lost by an earlier call)", fn,
                      s->host, s->port);
    sp_put(frame, n - 4, 4);
    net_result r = net_send_all(s->fd, frame, n, dist_now() + s->timeout);
    if (r != NET_OK) return lost(s, fn, r == NET_TIMEOUT ? "sending timed out" : strerror(errno));
    double deadline = dist_now() + wait_s + REPLY_GRACE;
    uint8_t hdr[4];
    r = net_recv_all(s->fd, hdr, 4, deadline);
    sp_reader rd = {hdr, 4, 0};
    size_t len = (size_t)sp_get(&rd, 4);
    if (r == NET_OK && (len == 0 || len > SP_MAX_VALUE + 64)) return lost(s, fn, "malformed reply");
    uint8_t *b = r == NET_OK ? malloc(len + 1) : NULL;
    if (r == NET_OK && !b) return lost(s, fn, "out of memory");
    if (r == NET_OK) r = net_recv_all(s->fd, b, len, deadline);
    if (r != NET_OK) {
        free(b);
        return lost(s, fn, r == NET_TIMEOUT ? "no reply" : "the store closed it");
    }
    b[len] = '\0';
    *code = b[0];
    memmove(b, b + 1, len); /* drop the code; keeps the NUL */
    *body = b;
    *blen = len - 1;
    return EM_OK;
}

static em_status unexpected(em_store *s, const char *fn, int code, const uint8_t *body)
{
    if (code == SR_ERR)
        return em_err(EM_ERR_DIST, "%s: the store at %s:%d says: %.200s", fn, s->host, s->port,
                      (const char *)body);
    return lost(s, fn, "unexpected reply");
}

static bool bad_timeout(double t) { return !(t >= 0) || isinf(t); }

/* One attempt: connect and present the token. 1 accepted (s->fd set), 0
 * no answer (retry; *last says why), -1 refused (*last is the store's reason,
 * in buf). */
static int try_connect(em_store *s, double deadline, const char **last, char *buf, size_t nbuf)
{
    s->fd = net_connect(s->host, s->port, deadline);
    if (s->fd < 0) {
        *last = strerror(errno);
        return 0;
    }
    size_t tl = strlen(s->token);
    uint8_t hello[SP_MAX_HELLO], h[4], b[256];
    uint8_t *p = sp_put(hello, 5 + tl, 4);
    *p++ = SP_HELLO;
    sp_put_str(p, s->token, tl);
    net_result r = net_send_all(s->fd, hello, 9 + tl, deadline);
    if (r == NET_OK) r = net_recv_all(s->fd, h, 4, deadline);
    sp_reader rd = {h, 4, 0};
    size_t len = r == NET_OK ? (size_t)sp_get(&rd, 4) : 0; /* a short reply: OK, or ERR + reason */
    if (r == NET_OK && (len == 0 || len >= sizeof b)) r = NET_CLOSED;
    if (r == NET_OK) r = net_recv_all(s->fd, b, len, deadline);
    if (r == NET_OK && b[0] == SR_OK) return 1;
    close(s->fd);
    s->fd = -1;
    if (r == NET_OK) {
        b[len] = '\0';
        snprintf(buf, nbuf, "%s", b[0] == SR_ERR ? (const char *)b + 1 : "unexpected reply");
        *last = buf;
        return -1;
    }
    *last =
        r == NET_TIMEOUT ? "no answer to the token" : "the connection closed before the token was answered";
    return 0;
}

em_store *em_store_connect(const char *host, int port, const char *token, double timeout_s)
{
    if (!host || !*host) return em_fail(EM_ERR_ARG, "em_store_connect: host is NULL or empty");
    if (strlen(host) >= sizeof((em_store *)0)->host)
        return em_fail(EM_ERR_ARG, "em_store_connect: host name of %zu characters is too long", strlen(host));
    if (port <= 0 || port > 65535)
        return em_fail(EM_ERR_ARG, "em_store_connect: port %d is not in 1..65535", port);
    if (!token || !*token) return em_fail(EM_ERR_ARG, "em_store_connect: token is NULL or empty");
    if (strlen(token) > SP_MAX_HELLO - 16)
        return em_fail(EM_ERR_ARG, "em_store_connect: token of %zu characters is too long", strlen(token));
    if (bad_timeout(timeout_s))
        return em_fail(EM_ERR_ARG, "em_store_connect: timeout %g s is not >= 0", timeout_s);
    em_store *s = calloc(1, sizeof *s);
    if (!s || !(s->token = strdup(token))) {
        free(s);
        return em_fail(EM_ERR_OOM, "em_store_connect: out of memory");
    }
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    s->timeout = timeout_s > 0 ? timeout_s : EM_DIST_DEFAULT_TIMEOUT;
    double deadline = dist_now() + s->timeout, pause = 0.01;
    const char *last = "nothing listens";
    char reason[256];
    for (;;) {
        int r = try_connect(s, deadline, &last, reason, sizeof reason);
        if (r == 1) return s;
        double left = deadline - dist_now();
        if (r < 0 || left <= 0) {
            double t = s->timeout;
            em_store_close(s);
            if (r < 0)
                return em_fail(EM_ERR_DIST, "em_store_connect: the store at %s:%d refused: %.100s", host,
                               port, last);
            return em_fail(EM_ERR_TIMEOUT, "em_store_connect: no store at %s:%d after %g s (%s)", host, port,
                           t, last);
        }
        sleep_s(fmin(pause, left)); /* nothing listens yet: the server may start later */
        pause = fmin(pause * 2, 0.2);
    }
}

void em_store_close(em_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s->token);
    free(s);
}

static em_status check_key(const char *fn, const em_store *s, const char *key)
{
    if (!s) return em_err(EM_ERR_ARG, "%s: store is NULL", fn);
    if (!key) return em_err(EM_ERR_ARG, "%s: key is NULL", fn);
    size_t n = strlen(key);
    if (n == 0 || n > SP_MAX_KEY)
        return em_err(EM_ERR_ARG, "%s: key of %zu bytes is not in 1..%d", fn, n, SP_MAX_KEY);
    return EM_OK;
}

/* key := value[0..n) as request `op` (SP_SET now, SP_ON_CLOSE when this
 * client's connection closes). */
static em_status key_value_request(em_store *s, const char *fn, uint8_t op, const char *key,
                                   const void *value, size_t n)
{
    em_status st = check_key(fn, s, key);
    if (st) return st;
    if (!value && n > 0) return em_err(EM_ERR_ARG, "%s: value is NULL but n is %zu", fn, n);
    if (n > SP_MAX_VALUE)
        return em_err(EM_ERR_ARG, "%s: value of %zu bytes for key '%.200s' is over the %zu-byte limit", fn, n,
                      key, SP_MAX_VALUE);
    size_t kl = strlen(key);
    uint8_t *f = malloc(4 + 1 + 4 + kl + 8 + n);
    if (!f) return em_err(EM_ERR_OOM, "%s: out of memory for %zu bytes", fn, n);
    uint8_t *p = f + 4;
    *p++ = op;
    p = sp_put_str(p, key, kl);
    p = sp_put(p, n, 8);
    if (n) memcpy(p, value, n);
    int code;
    uint8_t *body;
    size_t blen;
    st = request(s, fn, f, (size_t)(p - f) + n, 0, &code, &body, &blen);
    free(f);
    if (st) return st;
    if (code != SR_OK) st = unexpected(s, fn, code, body);
    free(body);
    return st;
}

em_status em_store_set(em_store *s, const char *key, const void *value, size_t n)
{
    return key_value_request(s, "em_store_set", SP_SET, key, value, n);
}

em_status em_store_get(em_store *s, const char *key, void **value, size_t *n)
{
    em_status st = check_key("em_store_get", s, key);
    if (st) return st;
    if (!value) return em_err(EM_ERR_ARG, "em_store_get: value is NULL");
    *value = NULL;
    if (n) *n = 0;
    size_t kl = strlen(key);
    uint8_t *f = malloc(4 + 1 + 8 + 4 + kl);
    if (!f) return em_err(EM_ERR_OOM, "em_store_get: out of memory");
    uint8_t *p = f + 4;
    *p++ = SP_GET;
    p = sp_put(p, (uint64_t)(s->timeout * 1000.0), 8);
    p = sp_put_str(p, key, kl);
    int code;
    uint8_t *body;
    size_t blen;
    st = request(s, "em_store_get", f, (size_t)(p - f), s->timeout, &code, &body, &blen);
    free(f);
    if (st) return st;
    if (code == SR_VAL) {
        *value = body;
        if (n) *n = blen;
        return EM_OK;
    }
    if (code == SR_TIMEOUT)
        st = em_err(EM_ERR_TIMEOUT, "em_store_get: key '%.200s' did not appear within %g s", key, s->timeout);
    else
        st = unexpected(s, "em_store_get", code, body);
    free(body);
    return st;
}

em_status em_store_add(em_store *s, const char *key, int64_t delta, int64_t *result)
{
    em_status st = check_key("em_store_add", s, key);
    if (st) return st;
    size_t kl = strlen(key);
    uint8_t *f = malloc(4 + 1 + 8 + 4 + kl);
    if (!f) return em_err(EM_ERR_OOM, "em_store_add: out of memory");
    uint8_t *p = f + 4;
    *p++ = SP_ADD;
    p = sp_put(p, (uint64_t)delta, 8);
    p = sp_put_str(p, key, kl);
    int code;
    uint8_t *body;
    size_t blen;
    st = request(s, "em_store_add", f, (size_t)(p - f), 0, &code, &body, &blen);
    free(f);
    if (st) return st;
    if (code == SR_INT && blen == 8) {
        sp_reader rd = {body, 8, 0};
        if (result) *result = (int64_t)sp_get(&rd, 8);
    } else if (code == SR_ERR) {
        st = em_err(EM_ERR_ARG, "em_store_add: key '%.200s': %.200s", key, (const char *)body);
    } else {
        st = unexpected(s, "em_store_add", code, body);
    }
    free(body);
    return st;
}

/* Sends one request `op` carrying a timeout and n keys (checked) and waits
 * for its reply: em_store_wait and dist_store_wait_any. */
static em_status keys_request(em_store *s, const char *fn, uint8_t op, int n, const char *const *keys,
                              double timeout_s, int *code, uint8_t **body, size_t *blen)
{
    size_t total = 4 + 1 + 8 + 4;
    for (int i = 0; i < n; i++) {
        em_status st = check_key(fn, s, keys[i]);
        if (st) return st;
        total += 4 + strlen(keys[i]);
        if (total > SP_MAX_FRAME)
            return em_err(EM_ERR_ARG, "%s: %d keys are too many for one request", fn, n);
    }
    uint8_t *f = malloc(total);
    if (!f) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    uint8_t *p = f + 4;
    *p++ = op;
    p = sp_put(p, (uint64_t)(timeout_s * 1000.0), 8);
    p = sp_put(p, (uint64_t)n, 4);
    for (int i = 0; i < n; i++) p = sp_put_str(p, keys[i], strlen(keys[i]));
    em_status st = request(s, fn, f, total, timeout_s, code, body, blen);
    free(f);
    return st;
}

em_status em_store_wait(em_store *s, int n, const char *const *keys, double timeout_s)
{
    if (!s) return em_err(EM_ERR_ARG, "em_store_wait: store is NULL");
    if (n < 0) return em_err(EM_ERR_ARG, "em_store_wait: n is %d", n);
    if (n > 0 && !keys) return em_err(EM_ERR_ARG, "em_store_wait: keys is NULL for n = %d", n);
    if (bad_timeout(timeout_s))
        return em_err(EM_ERR_ARG, "em_store_wait: timeout %g s is not >= 0", timeout_s);
    if (n == 0) return EM_OK;
    double t = timeout_s > 0 ? timeout_s : s->timeout;
    int code;
    uint8_t *body;
    size_t blen;
    em_status st = keys_request(s, "em_store_wait", SP_WAIT, n, keys, t, &code, &body, &blen);
    if (st) return st;
    if (code == SR_TIMEOUT && blen == 4) {
        sp_reader rd = {body, 4, 0};
        uint32_t i = (uint32_t)sp_get(&rd, 4);
        st = em_err(EM_ERR_TIMEOUT, "em_store_wait: key '%.200s' did not appear within %g s",
                    i < (uint32_t)n ? keys[i] : "?", t);
    } else if (code != SR_OK) {
        st = unexpected(s, "em_store_wait", code, body);
    }
    free(body);
    return st;
}

em_status em_store_barrier(em_store *s, const char *name, int world, double timeout_s)
{
    em_status st = check_key("em_store_barrier", s, name);
    if (st) return st;
    if (world < 1) return em_err(EM_ERR_ARG, "em_store_barrier: world %d is not >= 1", world);
    if (bad_timeout(timeout_s))
        return em_err(EM_ERR_ARG, "em_store_barrier: timeout %g s is not >= 0", timeout_s);
    double t = timeout_s > 0 ? timeout_s : s->timeout;
    size_t kl = strlen(name);
    uint8_t *f = malloc(4 + 1 + 8 + 4 + 4 + kl);
    if (!f) return em_err(EM_ERR_OOM, "em_store_barrier: out of memory");
    uint8_t *p = f + 4;
    *p++ = SP_BARRIER;
    p = sp_put(p, (uint64_t)(t * 1000.0), 8);
    p = sp_put(p, (uint64_t)world, 4);
    p = sp_put_str(p, name, kl);
    int code;
    uint8_t *body;
    size_t blen;
    st = request(s, "em_store_barrier", f, (size_t)(p - f), t, &code, &body, &blen);
    free(f);
    if (st) return st;
    if (code == SR_TIMEOUT && blen == 8) {
        sp_reader rd = {body, 8, 0};
        uint32_t arrived = (uint32_t)sp_get(&rd, 4), w = (uint32_t)sp_get(&rd, 4);
        st = em_err(EM_ERR_TIMEOUT, "em_store_barrier: '%.200s' timed out after %g s: %u of %u arrived", name,
                    t, arrived, w);
    } else if (code == SR_ERR) {
        st = em_err(EM_ERR_DIST, "em_store_barrier: '%.200s': %.200s", name, (const char *)body);
    } else if (code != SR_OK) {
        st = unexpected(s, "em_store_barrier", code, body);
    }
    free(body);
    return st;
}

em_status dist_store_check(em_store *s, const char *key, bool *exists)
{
    em_status st = check_key("em_store_check", s, key);
    if (st) return st;
    size_t kl = strlen(key);
    uint8_t *f = malloc(4 + 1 + 4 + kl);
    if (!f) return em_err(EM_ERR_OOM, "em_store_check: out of memory");
    uint8_t *p = f + 4;
    *p++ = SP_CHECK;
    p = sp_put_str(p, key, kl);
    int code;
    uint8_t *body;
    size_t blen;
    st = request(s, "em_store_check", f, (size_t)(p - f), 0, &code, &body, &blen);
    free(f);
    if (st) return st;
    if (code == SR_OK && blen == 1)
        *exists = body[0] != 0;
    else
        st = unexpected(s, "em_store_check", code, body);
    free(body);
    return st;
}

em_status dist_store_on_close(em_store *s, const char *key, const void *value, size_t n)
{
    return key_value_request(s, "em_store_on_close", SP_ON_CLOSE, key, value, n);
}

em_status dist_store_wait_any(em_store *s, int n, const char *const *keys, double timeout_s, int *index)
{
    if (!s || n < 1 || !keys || !index || bad_timeout(timeout_s))
        return em_err(EM_ERR_ARG, "em_store_wait_any: bad arguments (n %d, timeout %g s)", n, timeout_s);
    int code;
    uint8_t *body;
    size_t blen;
    em_status st = keys_request(s, "em_store_wait_any", SP_WAIT_ANY, n, keys, timeout_s, &code, &body, &blen);
    if (st) return st;
    if (code == SR_OK && blen == 4) {
        sp_reader rd = {body, 4, 0};
        uint32_t i = (uint32_t)sp_get(&rd, 4);
        if (i < (uint32_t)n)
            *index = (int)i;
        else
            st = lost(s, "em_store_wait_any", "malformed reply");
    } else if (code == SR_TIMEOUT && timeout_s == 0) {
        *index = -1; /* only looked: none exists yet */
    } else if (code == SR_TIMEOUT) {
        st = em_err(EM_ERR_TIMEOUT, "em_store_wait_any: none of %d keys ('%.200s'...) appeared within %g s",
                    n, keys[0], timeout_s);
    } else {
        st = unexpected(s, "em_store_wait_any", code, body);
    }
    free(body);
    return st;
}
