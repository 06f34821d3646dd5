/* store_server.c — the rendezvous store's server: one thread, poll() over a
 * listening socket and any number of clients, a key-value table and named
 * barriers. It never blocks on one client: sockets are non-blocking, replies
 * that do not fit the socket wait in an output buffer, and a GET / WAIT /
 * BARRIER that cannot be answered yet is parked (its frame stays at the head
 * of the client's input) until a SET / ADD / arrival answers it or its
 * deadline passes. A client must present the job's token first (compared in
 * constant time) or it is told "bad token" and disconnected. Protocol:
 * store_proto.h. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../tensor/error_impl.h"
#include "dist_impl.h"
#include "store_proto.h"

#define AUTH_SECONDS 10.0 /* a connection that does not say HELLO in time is dropped */

typedef struct kv {
    char *key; /* NULL: empty slot */
    size_t klen;
    uint8_t *val;
    size_t vlen;
} kv;

typedef struct barrier {
    struct barrier *next;
    char *name;
    size_t nlen;
    uint32_t world, arrived;
    uint64_t round; /* completed rounds */
} barrier;

typedef struct client {
    int fd;
    bool authed, closing; /* closing: drop once the output is flushed */
    double auth_deadline;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_off, out_len, out_cap;
    /* the request at the head of `in` is parked */
    bool parked;
    double deadline;
    barrier *bar; /* parked in this barrier, arrived in round bar_round */
    uint64_t bar_round;
    /* ON_CLOSE: what the table gets when this connection closes */
    struct on_close *on_close;
} client;

typedef struct on_close {
    struct on_close *next;
    char *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
} on_close;

struct em_store_server {
    int lfd, wake[2], port;
    pthread_t thread;
    char *token;
    size_t token_len;
    client **cl;
    int ncl, capcl;
    kv *tab;
    size_t tab_cap, tab_used;
    barrier *bars;
    double accept_paused_until; /* accept failed for want of resources: the listener rests until then */
};

/* ---- the table ---- */
static uint64_t hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h;
}

static kv *lookup(em_store_server *s, const char *k, size_t n, bool create)
{
    if (create && (s->tab_used + 1) * 2 > s->tab_cap) {
        size_t ncap = s->tab_cap ? s->tab_cap * 2 : 64;
        kv *nt = calloc(ncap, sizeof *nt);
        if (!nt) return NULL;
        for (size_t i = 0; i < s->tab_cap; i++) {
            if (!s->tab[i].key) continue;
            size_t j = hash(s->tab[i].key, s->tab[i].klen) & (ncap - 1);
            while (nt[j].key) j = (j + 1) & (ncap - 1);
            nt[j] = s->tab[i];
        }
        free(s->tab);
        s->tab = nt;
        s->tab_cap = ncap;
    }
    if (!s->tab_cap) return NULL;
    size_t j = hash(k, n) & (s->tab_cap - 1);
    while (s->tab[j].key) {
        if (s->tab[j].klen == n && !memcmp(s->tab[j].key, k, n)) return &s->tab[j];
        j = (j + 1) & (s->tab_cap - 1);
    }
    if (!create) return NULL;
    char *key = malloc(n + 1);
    if (!key) return NULL;
    memcpy(key, k, n);
    key[n] = '\0';
    s->tab[j] = (kv){.key = key, .klen = n};
    s->tab_used++;
    return &s->tab[j];
}

/* ---- output ---- */
static bool out_reserve(client *c, size_t more)
{
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len + more <= c->out_cap) return true;
    size_t ncap = c->out_cap ? c->out_cap : 256;
    while (ncap < c->out_len + more) ncap *= 2;
    uint8_t *p = realloc(c->out, ncap);
    if (!p) return false;
    c->out = p;
    c->out_cap = ncap;
    return true;
}

static void flush(client *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c->closing = true, c->out_off = c->out_len;
            return;
        }
    }
}

/* Appends a reply: code + payload a (na bytes) + payload b (nb bytes). */
static void reply(client *c, int code, const void *a, size_t na, const void *b, size_t nb)
{
    if (!out_reserve(c, 5 + na + nb)) {
        c->closing = true; /* out of memory: drop this client, keep serving others */
        return;
    }
    uint8_t *p = sp_put(c->out + c->out_len, 1 + na + nb, 4);
    *p++ = (uint8_t)code;
    if (na) memcpy(p, a, na);
    if (nb) memcpy(p + na, b, nb);
    c->out_len += 5 + na + nb;
    flush(c);
}

static void reply_err(client *c, const char *msg) { reply(c, SR_ERR, msg, strlen(msg), NULL, 0); }

/* ---- requests ---- */
static barrier *find_barrier(em_store_server *s, const char *name, size_t n, bool create)
{
    for (barrier *b = s->bars; b; b = b->next)
        if (b->nlen == n && !memcmp(b->name, name, n)) return b;
    if (!create) return NULL;
    barrier *b = calloc(1, sizeof *b);
    if (!b || !(b->name = malloc(n + 1))) {
        free(b);
        return NULL;
    }
    memcpy(b->name, name, n);
    b->nlen = n;
    b->next = s->bars;
    s->bars = b;
    return b;
}

/* Handles the request in body[0..n). Returns false if it stays parked. */
static bool handle(em_store_server *s, client *c, const uint8_t *body, size_t n, double now)
{
    sp_reader r = {body, n, 0};
    int op = (int)sp_get(&r, 1);
    if (!c->authed && op != SP_HELLO) {
        c->closing = true;
        return true;
    }
    size_t klen = 0;
    const char *key;
    uint8_t tmp[16];
    switch (op) {
    case SP_HELLO: {
        key = sp_str(&r, &klen);
        if (!r.bad && ct_equal(key, klen, s->token, s->token_len)) {
            c->authed = true;
            reply(c, SR_OK, NULL, 0, NULL, 0);
        } else {
            reply_err(c, "bad token");
            c->closing = true;
        }
        return true;
    }
    case SP_SET: {
        key = sp_str(&r, &klen);
        size_t vlen = (size_t)sp_get(&r, 8);
        const uint8_t *v = sp_bytes(&r, vlen);
        if (r.bad || klen > SP_MAX_KEY || vlen > SP_MAX_VALUE) break;
        kv *e = lookup(s, key, klen, true);
        uint8_t *copy = malloc(vlen ? vlen : 1);
        if (!e || !copy) {
            free(copy);
            reply_err(c, "store out of memory");
            return true;
        }
        memcpy(copy, v, vlen);
        free(e->val);
        e->val = copy;
        e->vlen = vlen;
        reply(c, SR_OK, NULL, 0, NULL, 0);
        return true;
    }
    case SP_ADD: {
        int64_t delta = (int64_t)sp_get(&r, 8);
        key = sp_str(&r, &klen);
        if (r.bad || klen > SP_MAX_KEY) break;
        kv *e = lookup(s, key, klen, true);
        if (!e) {
            reply_err(c, "store out of memory");
            return true;
        }
        int64_t cur = 0;
        if (e->val) {
            char num[32];
            char *end;
            size_t m = e->vlen < sizeof num - 1 ? e->vlen : sizeof num - 1;
            memcpy(num, e->val, m);
            num[m] = '\0';
            errno = 0;
            cur = strtoll(num, &end, 10);
            if (e->vlen == 0 || e->vlen >= sizeof num - 1 || *end || errno) {
                reply_err(c, "the value is not an integer");
                return true;
            }
        }
        cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
        char num[32];
        int m = snprintf(num, sizeof num, "%lld", (long long)cur);
        uint8_t *copy = malloc((size_t)m);
        if (!copy) {
            reply_err(c, "store out of memory");
            return true;
        }
        memcpy(copy, num, (size_t)m);
        free(e->val);
        e->val = copy;
        e->vlen = (size_t)m;
        sp_put(tmp, (uint64_t)cur, 8);
        reply(c, SR_INT, tmp, 8, NULL, 0);
        return true;
    }
    case SP_CHECK: {
        key = sp_str(&r, &klen);
        if (r.bad) break;
        kv *e = lookup(s, key, klen, false);
        tmp[0] = e && e->val;
        reply(c, SR_OK, tmp, 1, NULL, 0);
        return true;
    }
    case SP_ON_CLOSE: {
        key = sp_str(&r, &klen);
        size_t vlen = (size_t)sp_get(&r, 8);
        const uint8_t *v = sp_bytes(&r, vlen);
        if (r.bad || klen > SP_MAX_KEY || vlen > SP_MAX_VALUE) break;
        on_close *o = calloc(1, sizeof *o);
        if (o) o->key = malloc(klen ? klen : 1), o->val = malloc(vlen ? vlen : 1);
        if (!o || !o->key || !o->val) {
            if (o) free(o->key), free(o->val);
            free(o);
            reply_err(c, "store out of memory");
            return true;
        }
        memcpy(o->key, key, klen);
        memcpy(o->val, v, vlen);
        o->klen = klen;
        o->vlen = vlen;
        o->next = c->on_close;
        c->on_close = o;
        reply(c, SR_OK, NULL, 0, NULL, 0);
        return true;
    }
    case SP_GET: {
        uint64_t ms = sp_get(&r, 8);
        key = sp_str(&r, &klen);
        if (r.bad) break;
        if (!c->parked) c->deadline = now + (double)ms / 1000.0;
        kv *e = lookup(s, key, klen, false);
        if (e && e->val) {
            reply(c, SR_VAL, e->val, e->vlen, NULL, 0);
            return true;
        }
        if (now >= c->deadline) {
            reply(c, SR_TIMEOUT, NULL, 0, NULL, 0);
            return true;
        }
        return false;
    }
    case SP_WAIT:       /* until every key exists; SR_TIMEOUT names the first missing one */
    case SP_WAIT_ANY: { /* until one of the keys exists; SR_OK names it */
        bool any = op == SP_WAIT_ANY;
        uint64_t ms = sp_get(&r, 8);
        uint32_t nk = (uint32_t)sp_get(&r, 4);
        if (r.bad) break;
        if (!c->parked) c->deadline = now + (double)ms / 1000.0;
        for (uint32_t i = 0; i < nk; i++) {
            key = sp_str(&r, &klen);
            if (r.bad) goto bad;
            kv *e = lookup(s, key, klen, false);
            bool have = e && e->val;
            if (have != any) continue; /* WAIT: present; WAIT_ANY: absent */
            if (!any && now < c->deadline) return false;
            sp_put(tmp, i, 4);
            reply(c, any ? SR_OK : SR_TIMEOUT, tmp, 4, NULL, 0);
            return true;
        }
        if (any && now < c->deadline) return false;
        reply(c, any ? SR_TIMEOUT : SR_OK, NULL, 0, NULL, 0);
        return true;
    }
    case SP_BARRIER: {
        uint64_t ms = sp_get(&r, 8);
        uint32_t world = (uint32_t)sp_get(&r, 4);
        key = sp_str(&r, &klen);
        if (r.bad || world == 0) break;
        if (!c->parked) {
            barrier *b = find_barrier(s, key, klen, true);
            if (!b) {
                reply_err(c, "store out of memory");
                return true;
            }
            if (b->arrived > 0 && b->world != world) {
                char msg[96];
                snprintf(msg, sizeof msg, "world %u, but %u other caller(s) said %u", world, b->arrived,
                         b->world);
                reply_err(c, msg);
                return true;
            }
            b->world = world;
            c->bar = b;
            c->bar_round = b->round;
            c->deadline = now + (double)ms / 1000.0;
            if (++b->arrived == world) {
                b->arrived = 0;
                b->round++;
            }
        }
        barrier *b = c->bar;
        if (b->round > c->bar_round) {
            c->bar = NULL;
            reply(c, SR_OK, NULL, 0, NULL, 0);
            return true;
        }
        if (now >= c->deadline) {
            sp_put(tmp, b->arrived, 4);
            sp_put(tmp + 4, b->world, 4);
            b->arrived--; /* withdraw: a later round must not count this caller */
            c->bar = NULL;
            reply(c, SR_TIMEOUT, tmp, 8, NULL, 0);
            return true;
        }
        return false;
    }
    default: break;
    }
bad:
    reply_err(c, "malformed request");
    c->closing = true;
    return true;
}

/* Serves the complete frames at the head of c's input until one parks. */
static void serve(em_store_server *s, client *c, double now)
{
    size_t off = 0;
    while (!c->closing && c->in_len - off >= 4) {
        sp_reader r = {c->in + off, 4, 0};
        size_t len = (size_t)sp_get(&r, 4);
        if (len == 0 || len > (c->authed ? SP_MAX_FRAME : SP_MAX_HELLO)) {
            c->closing = true;
            break;
        }
        if (c->in_len - off - 4 < len) break;
        bool done = handle(s, c, c->in + off + 4, len, now);
        c->parked = !done;
        if (!done) break;
        off += 4 + len;
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
}

/* Reads what the socket has. false when the peer closed or failed. */
static bool fill(client *c)
{
    for (;;) {
        if (c->in_cap - c->in_len < 65536) {
            size_t limit = c->authed ? SP_MAX_FRAME + 4 : SP_MAX_HELLO + 4;
            if (c->in_len >= limit) return true; /* serve() rejects or consumes it first */
            size_t ncap = c->in_cap ? c->in_cap * 2 : 65536;
            if (ncap > limit) ncap = limit;
            uint8_t *p = realloc(c->in, ncap);
            if (!p) return false;
            c->in = p;
            c->in_cap = ncap;
            if (c->in_cap == c->in_len) return true;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (r > 0) {
            c->in_len += (size_t)r;
            continue;
        }
        if (r == 0) return false;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
}

/* Drops client i. While serving (not when the server stops), what it asked
 * for with ON_CLOSE goes into the table now; the caller serves the parked
 * requests after, so a WAIT_ANY on such a key is answered at once. */
static void drop(em_store_server *s, int i, bool serving)
{
    client *c = s->cl[i];
    if (c->parked && c->bar && c->bar->round == c->bar_round) c->bar->arrived--;
    while (c->on_close) {
        on_close *o = c->on_close;
        c->on_close = o->next;
        kv *e = serving ? lookup(s, o->key, o->klen, true) : NULL;
        if (e) {
            free(e->val);
            e->val = o->val; /* the table takes the bytes */
            e->vlen = o->vlen;
            o->val = NULL;
        }
        free(o->key);
        free(o->val);
        free(o);
    }
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
    s->cl[i] = s->cl[--s->ncl];
}

static void accept_all(em_store_server *s, double now)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            /* Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM):
             * the connection stays queued and the listener stays readable,
             * so polling again at once would spin. Rest the listener 100 ms. */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                s->accept_paused_until = now + 0.1;
            return;
        }
        net_prepare(fd);
        if (s->ncl == s->capcl) {
            int ncap = s->capcl ? s->capcl * 2 : 16;
            client **ncl = realloc(s->cl, sizeof(client *) * (size_t)ncap);
            if (!ncl) {
                close(fd);
                return;
            }
            s->cl = ncl;
            s->capcl = ncap;
        }
        client *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            return;
        }
        c->fd = fd;
        c->auth_deadline = now + AUTH_SECONDS;
        s->cl[s->ncl++] = c;
    }
}

static void *server_main(void *arg)
{
    em_store_server *s = arg;
    struct pollfd *pf = NULL;
    int pf_cap = 0;
    for (;;) {
        double now = dist_now(), next = now + 1.0;
        if (pf_cap < s->ncl + 2) {
            pf_cap = (s->ncl + 2) * 2;
            struct pollfd *np = realloc(pf, sizeof *pf * (size_t)pf_cap);
            if (!np) {
                pf_cap = 0;
                usleep(10000);
                continue;
            }
            pf = np;
        }
        pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        bool resting = now < s->accept_paused_until;
        pf[1] = (struct pollfd){.fd = s->lfd, .events = resting ? 0 : POLLIN};
        if (resting && s->accept_paused_until < next) next = s->accept_paused_until;
        for (int i = 0; i < s->ncl; i++) {
            client *c = s->cl[i];
            /* a parked client is only watched for hanging up (it has nothing to say until answered) */
            short ev = c->closing ? 0 : c->parked ? POLLRDHUP : POLLIN;
            if (c->out_off < c->out_len) ev |= POLLOUT;
            pf[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
            if (c->parked && c->deadline < next) next = c->deadline;
            if (!c->authed && c->auth_deadline < next) next = c->auth_deadline;
        }
        int nfd = s->ncl + 2;
        int r = poll(pf, (nfds_t)nfd, dist_ms_until(next, 1000));
        if (r < 0 && errno != EINTR) usleep(1000);
        if (pf[0].revents & POLLIN) break;
        now = dist_now();
        /* clients first (indices match pf until one is dropped: walk backwards) */
        for (int i = s->ncl - 1; i >= 0; i--) {
            client *c = s->cl[i];
            short re = pf[i + 2].revents;
            bool alive = true;
            if (re & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP))
                alive = false;
            else if (re & POLLIN)
                alive = fill(c);
            if (alive && (re & POLLOUT)) flush(c);
            if (alive && !c->parked) serve(s, c, now);
            if (!c->authed && now >= c->auth_deadline) alive = false;
            if (!alive || (c->closing && c->out_off >= c->out_len)) drop(s, i, true);
        }
        /* parked requests: answered by what just changed, or timed out */
        for (int i = s->ncl - 1; i >= 0; i--) {
            client *c = s->cl[i];
            if (c->parked) serve(s, c, now);
            if (c->closing && c->out_off >= c->out_len) drop(s, i, true);
        }
        if (pf[1].revents & POLLIN) accept_all(s, now);
    }
    free(pf);
    return NULL;
}

em_store_server *em_store_server_start(const char *host, int port, const char *token)
{
    if (!token) return em_fail(EM_ERR_ARG, "em_store_server_start: token is NULL");
    if (strlen(token) < 16)
        return em_fail(EM_ERR_ARG, "em_store_server_start: token has %zu characters; at least 16 needed",
                       strlen(token));
    if (port < 0 || port > 65535)
        return em_fail(EM_ERR_ARG, "em_store_server_start: port %d is not in 0..65535", port);
    const char *h = host ? host : "127.0.0.1";
    em_store_server *s = calloc(1, sizeof *s);
    if (!s || !(s->token = strdup(token))) {
        free(s);
        return em_fail(EM_ERR_OOM, "em_store_server_start: out of memory");
    }
    s->token_len = strlen(token);
    s->wake[0] = s->wake[1] = -1;
    const char *what = "listen";
    s->lfd = net_listen(h, port, 128, &what);
    if (s->lfd < 0) {
        int e = errno;
        free(s->token);
        free(s);
        return em_fail(EM_ERR_IO, "em_store_server_start: cannot listen on %s:%d (%s: %s)", h, port, what,
                       strerror(e));
    }
    s->port = net_local_port(s->lfd);
    if (pipe2(s->wake, O_CLOEXEC) != 0 || pthread_create(&s->thread, NULL, server_main, s) != 0) {
        int e = errno;
        close(s->lfd);
        if (s->wake[0] >= 0) close(s->wake[0]), close(s->wake[1]);
        free(s->token);
        free(s);
        return em_fail(EM_ERR_IO, "em_store_server_start: cannot start the server thread: %s", strerror(e));
    }
    return s;
}

int em_store_server_port(const em_store_server *s) { return s ? s->port : -1; }

void em_store_server_stop(em_store_server *s)
{
    if (!s) return;
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->thread, NULL);
    while (s->ncl > 0) drop(s, s->ncl - 1, false);
    free(s->cl);
    for (size_t i = 0; i < s->tab_cap; i++) {
        free(s->tab[i].key);
        free(s->tab[i].val);
    }
    free(s->tab);
    while (s->bars) {
        barrier *b = s->bars;
        s->bars = b->next;
        free(b->name);
        free(b);
    }
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s->token);
    free(s);
}
