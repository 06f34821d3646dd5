/* net.c — the small layer of TCP the store and the process group share:
 * listen, connect with a deadline, send/receive exactly n bytes before a
 * deadline on non-blocking sockets, and a constant-time comparison for
 * tokens. Nothing here raises SIGPIPE: every send uses MSG_NOSIGNAL. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist_impl.h"

double dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dist_ms_until(double deadline, int cap_ms)
{
    double ms = (deadline - dist_now()) * 1000.0;
    if (ms <= 0) return 0;
    if (ms > cap_ms) return cap_ms;
    return (int)ms + 1; /* round up: never wake just before the deadline */
}

void net_prepare(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static struct addrinfo *resolve(const char *host, int port, bool passive)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    if (getaddrinfo(host, ps, &hints, &res) != 0) return NULL;
    return res;
}

int net_listen(const char *host, int port, int backlog, const char **what)
{
    struct addrinfo *res = resolve(host ? host : "127.0.0.1", port, true);
    if (!res) {
        *what = "resolve";
        errno = EADDRNOTAVAIL;
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            *what = "socket";
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            *what = "bind";
        } else if (listen(fd, backlog) != 0) {
            err = errno;
            *what = "listen";
        } else {
            break;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = err;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return fd;
}

int net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

int net_connect(const char *host, int port, double deadline)
{
    struct addrinfo *res = resolve(host, port, false);
    if (!res) {
        errno = EHOSTUNREACH;
        return -1;
    }
    int fd = -1, err = ECONNREFUSED;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        net_prepare(fd);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int r;
            do r = poll(&p, 1, dist_ms_until(deadline, 1000));
            while ((r == 0 && dist_now() < deadline) || (r < 0 && errno == EINTR));
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (r > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) break;
            err = r == 0 ? ETIMEDOUT : (soerr ? soerr : errno);
        } else {
            err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) errno = err;
    return fd;
}

/* Waits for events on fd until deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, dist_ms_until(deadline, 1000));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return 1; /* let the next call report it */
        if (r == 0 && dist_now() >= deadline) return 0;
    }
}

net_result net_send_all(int fd, const void *p, size_t n, double deadline)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, deadline)) return NET_TIMEOUT;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            return NET_CLOSED;
        }
    }
    return NET_OK;
}

net_result net_recv_all(int fd, void *p, size_t n, double deadline)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = recv(fd, c, n, MSG_DONTWAIT);
        if (r > 0) {
            c += r;
            n -= (size_t)r;
        } else if (r == 0) {
            errno = ECONNRESET;
            return NET_CLOSED;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait_fd(fd, POLLIN, deadline)) return NET_TIMEOUT;
        } else if (errno != EINTR) {
            return NET_CLOSED;
        }
    }
    return NET_OK;
}

bool ct_equal(const void *a, size_t na, const void *b, size_t nb)
{
    const unsigned char *x = a, *y = b;
    unsigned diff = (unsigned)(na != nb);
    for (size_t i = 0; i < nb; i++) diff |= (unsigned)(y[i] ^ (na ? x[i % na] : 0u));
    return diff == 0;
}

bool net_is_loopback_addr(int fd, bool peer)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int r =
        peer ? getpeername(fd, (struct sockaddr *)&ss, &len) : getsockname(fd, (struct sockaddr *)&ss, &len);
    if (r != 0) return false;
    if (ss.ss_family == AF_INET) return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return false;
}
