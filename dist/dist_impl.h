/* dist_impl.h — helpers shared by the files of dist/ (never included by
 * users): a monotonic clock, TCP sockets with deadlines, constant-time
 * comparison, and the store client's internals that the process group needs.
 *
 * Deadlines are absolute times on dist_now()'s clock (seconds). Socket
 * helpers never raise SIGPIPE (MSG_NOSIGNAL) and return a net_result the
 * caller turns into a message naming its own operation. */
#ifndef EMBER_DIST_IMPL_H
#define EMBER_DIST_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dist.h"

/* Seconds on CLOCK_MONOTONIC. */
double dist_now(void);
/* Milliseconds from now until deadline, for poll(): 0 if past, capped at cap_ms. */
int dist_ms_until(double deadline, int cap_ms);

typedef enum net_result {
    NET_OK = 0,
    NET_CLOSED, /* the peer closed the connection (or it failed: errno says) */
    NET_TIMEOUT /* the deadline passed first */
} net_result;

/* A listening TCP socket on host:port (host NULL = 127.0.0.1, port 0 = any),
 * non-blocking, close-on-exec. -1 with errno set (and *what naming the step
 * that failed: "resolve", "bind", ...) on failure. */
int net_listen(const char *host, int port, int backlog, const char **what);
/* The port a socket is bound to (-1 on error). */
int net_local_port(int fd);
/* One connection attempt to host:port, waiting at most until deadline. The
 * socket is non-blocking, TCP_NODELAY, close-on-exec.
 * -1 with errno on failure (EAI errors become EHOSTUNREACH). */
int net_connect(const char *host, int port, double deadline);
/* Sets O_NONBLOCK and TCP_NODELAY; close-on-exec. */
void net_prepare(int fd);
/* Writes / reads exactly n bytes on a non-blocking socket, polling until deadline. */
net_result net_send_all(int fd, const void *p, size_t n, double deadline);
net_result net_recv_all(int fd, void *p, size_t n, double deadline);
/* true when a and b are equal, in time that depends only on nb (b is the
 * secret; a comes from the peer). */
bool ct_equal(const void *a, size_t na, const void *b, size_t nb);
/* true when the socket's remote (peer) or local address is loopback (127/8, ::1). */
bool net_is_loopback_addr(int fd, bool peer);

/* ---- store client internals (dist/store.c) ---- */
const char *dist_store_token(const em_store *s);
int dist_store_fd(const em_store *s);
double dist_store_timeout(const em_store *s);
/* *exists := whether key is set, without waiting. */
em_status dist_store_check(em_store *s, const char *key, bool *exists);
/* Registers key := value[0..n) to be set by the server when this client's
 * connection closes (for whatever reason: em_store_close, the process
 * exiting or dying): how the others learn that this client is gone. */
em_status dist_store_on_close(em_store *s, const char *key, const void *value, size_t n);
/* Waits until any of the n keys exists (*index := the first that does, in
 * the order given) or timeout_s passes (EM_ERR_TIMEOUT); timeout_s 0 only
 * looks, without waiting: EM_OK with *index -1 when none exists. */
em_status dist_store_wait_any(em_store *s, int n, const char *const *keys, double timeout_s, int *index);

/* ---- the config file's keys (dist/config.c) ---- */
/* Sets config key `key` (a name of the file's format, e.g. "split_batches")
 * from text, exactly as the file reader would. EM_ERR_ARG "SOURCE='value' is
 * not <what the key wants>" (source names where the text came from, e.g. an
 * environment variable); *c is untouched then. */
em_status config_set(em_config *c, const char *key, const char *value, const char *source);

#endif
