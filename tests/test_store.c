/* test_store.c — the rendezvous store: set / get / add / wait / barrier
 * semantics and their timeouts, the token check, connect retrying until a
 * server starts, and a server that keeps serving others while one request
 * is parked or a stray connection misbehaves. Clients in other processes
 * are forked children that exit 0 when all their checks passed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TOKEN "test-token-0123456789abcdef"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static em_store *client(int port, double timeout)
{
    em_store *c = em_store_connect("127.0.0.1", port, TOKEN, timeout);
    CHECK_NOTNULL(c);
    return c;
}

/* Waits for a forked child and checks it exited 0. */
static void join(pid_t pid)
{
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        th_fail(__FILE__, __LINE__, "child %d ended with status 0x%x", (int)pid, st);
}

/* A port nothing listens on (a server's, after it stopped). */
static int free_port(void)
{
    em_store_server *s = em_store_server_start(NULL, 0, TOKEN);
    CHECK_NOTNULL(s);
    int port = em_store_server_port(s);
    em_store_server_stop(s);
    return port;
}

TEST(test_store_set_then_get_returns_the_value)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    CHECK_NOTNULL(srv);
    CHECK(em_store_server_port(srv) > 0);
    em_store *c = client(em_store_server_port(srv), 5);
    CHECK_OK(em_store_set(c, "k", "hello", 5));
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(em_store_get(c, "k", &v, &n));
    CHECK(n == 5 && !memcmp(v, "hello", 5) && ((char *)v)[5] == '\0');
    free(v);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_set_overwrites_and_empty_values_exist)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 5);
    CHECK_OK(em_store_set(c, "k", "one", 3));
    CHECK_OK(em_store_set(c, "k", "three", 5));
    CHECK_OK(em_store_set(c, "empty", NULL, 0));
    void *v;
    size_t n;
    CHECK_OK(em_store_get(c, "k", &v, &n));
    CHECK(n == 5 && !strcmp(v, "three"));
    free(v);
    CHECK_OK(em_store_get(c, "empty", &v, &n));
    CHECK(n == 0);
    free(v);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_get_waits_for_a_key_set_later_by_another_client)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pid = fork();
    if (pid == 0) {
        em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 5);
        sleep_ms(200);
        _exit(c && em_store_set(c, "late", "v", 1) == EM_OK ? 0 : 1);
    }
    em_store *c = client(port, 5);
    double t0 = now_s();
    void *v;
    CHECK_OK(em_store_get(c, "late", &v, NULL));
    CHECK(now_s() - t0 >= 0.15);
    CHECK(!strcmp(v, "v"));
    free(v);
    join(pid);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_get_times_out_naming_the_key)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 0.3);
    void *v = (void *)1;
    double t0 = now_s();
    CHECK_ERR(em_store_get(c, "missing/key", &v, NULL), EM_ERR_TIMEOUT, "'missing/key'");
    CHECK(v == NULL);
    CHECK(now_s() - t0 >= 0.25 && now_s() - t0 < 3);
    /* the connection is still usable */
    CHECK_OK(em_store_set(c, "a", "1", 1));
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_add_counts_from_zero_atomically_across_clients)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 5);
            bool ok = c != NULL;
            for (int j = 0; ok && j < 100; j++) ok = em_store_add(c, "count", 1, NULL) == EM_OK;
            _exit(ok ? 0 : 1);
        }
    }
    for (int i = 0; i < 3; i++) join(pids[i]);
    em_store *c = client(port, 5);
    int64_t r = 0;
    CHECK_OK(em_store_add(c, "count", 0, &r));
    CHECK(r == 300);
    CHECK_OK(em_store_add(c, "count", -301, &r));
    CHECK(r == -1);
    void *v;
    CHECK_OK(em_store_get(c, "count", &v, NULL));
    CHECK(!strcmp(v, "-1")); /* stored as decimal text */
    free(v);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_add_rejects_a_value_that_is_not_an_integer)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 5);
    CHECK_OK(em_store_set(c, "word", "abc", 3));
    CHECK_ERR(em_store_add(c, "word", 1, NULL), EM_ERR_ARG, "not an integer");
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_wait_returns_once_every_key_exists)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pid = fork();
    if (pid == 0) {
        em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 5);
        bool ok = c && em_store_set(c, "a", "", 0) == EM_OK;
        sleep_ms(150);
        _exit(ok && em_store_set(c, "b", "", 0) == EM_OK ? 0 : 1);
    }
    em_store *c = client(port, 5);
    const char *keys[] = {"a", "b"};
    CHECK_OK(em_store_wait(c, 2, keys, 3));
    CHECK_OK(em_store_wait(c, 0, NULL, 0));
    join(pid);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_wait_times_out_naming_the_first_missing_key)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 5);
    CHECK_OK(em_store_set(c, "here", "", 0));
    const char *keys[] = {"here", "gone1", "gone2"};
    double t0 = now_s();
    CHECK_ERR(em_store_wait(c, 3, keys, 0.2), EM_ERR_TIMEOUT, "'gone1'");
    CHECK(now_s() - t0 < 3);
    em_store_close(c);
    em_store_server_stop(srv);
}

/* each of `world` processes (the parent is one) calls the barrier `rounds` times */
TEST(test_store_barrier_releases_everyone_and_counts_rounds)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 5);
            bool ok = c != NULL;
            for (int r = 0; ok && r < 5; r++) {
                ok = em_store_add(c, "arrivals", 1, NULL) == EM_OK && em_store_barrier(c, "b", 3, 5) == EM_OK;
                int64_t n = 0;
                /* nobody leaves round r before all 3 arrived in it */
                ok = ok && em_store_add(c, "arrivals", 0, &n) == EM_OK && n >= 3 * (r + 1);
            }
            _exit(ok ? 0 : 1);
        }
    }
    em_store *c = client(port, 5);
    for (int r = 0; r < 5; r++) {
        sleep_ms(20); /* arrive last, often */
        int64_t n = 0;
        CHECK_OK(em_store_add(c, "arrivals", 1, NULL));
        CHECK_OK(em_store_barrier(c, "b", 3, 5));
        CHECK_OK(em_store_add(c, "arrivals", 0, &n));
        CHECK(n >= 3 * (r + 1));
    }
    for (int i = 0; i < 2; i++) join(pids[i]);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_barrier_times_out_saying_how_many_arrived)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 5);
    CHECK_ERR(em_store_barrier(c, "lonely", 3, 0.2), EM_ERR_TIMEOUT, "1 of 3 arrived");
    em_store_close(c);
    em_store_server_stop(srv);
}

/* a caller that timed out is withdrawn: a later caller does not pair with it */
TEST(test_store_barrier_timeout_withdraws_the_arrival)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *a = client(em_store_server_port(srv), 5), *b = client(em_store_server_port(srv), 5);
    CHECK_ERR(em_store_barrier(a, "x", 2, 0.15), EM_ERR_TIMEOUT, "1 of 2");
    CHECK_ERR(em_store_barrier(b, "x", 2, 0.15), EM_ERR_TIMEOUT, "1 of 2");
    em_store_close(a);
    em_store_close(b);
    em_store_server_stop(srv);
}

TEST(test_store_barrier_rejects_a_different_world)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pid = fork();
    if (pid == 0) {
        em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 5);
        _exit(c && em_store_barrier(c, "w", 3, 0.5) == EM_ERR_TIMEOUT ? 0 : 1);
    }
    em_store *c = client(port, 5);
    const char *k[] = {"never"};
    em_store_wait(c, 1, k, 0.2); /* let the child arrive first */
    CHECK_ERR(em_store_barrier(c, "w", 2, 1), EM_ERR_DIST, "world 2");
    join(pid);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_connect_with_a_bad_token_is_refused)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = NULL;
    CHECK_ERR(c = em_store_connect("127.0.0.1", em_store_server_port(srv), "wrong-token-0123456789", 2),
              EM_ERR_DIST, "refused: bad token");
    CHECK(c == NULL);
    /* a prefix of the right token is still wrong */
    CHECK_ERR(em_store_connect("127.0.0.1", em_store_server_port(srv), "test-token", 2), EM_ERR_DIST,
              "bad token");
    em_store_server_stop(srv);
}

TEST(test_store_connect_retries_until_the_server_starts)
{
    int port = free_port();
    pid_t pid = fork();
    if (pid == 0) {
        em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 10);
        _exit(c && em_store_set(c, "hello", "", 0) == EM_OK ? 0 : 1);
    }
    sleep_ms(300);
    em_store_server *srv = em_store_server_start(NULL, port, TOKEN);
    CHECK_NOTNULL(srv);
    em_store *c = client(port, 5);
    void *v;
    CHECK_OK(em_store_get(c, "hello", &v, NULL));
    free(v);
    join(pid);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_connect_times_out_when_nothing_listens)
{
    int port = free_port();
    double t0 = now_s();
    CHECK_ERR(em_store_connect("127.0.0.1", port, TOKEN, 0.3), EM_ERR_TIMEOUT, "no store at 127.0.0.1:");
    CHECK(now_s() - t0 >= 0.25 && now_s() - t0 < 3);
}

/* one client parked in a long get does not hold up anyone else */
TEST(test_store_serves_others_while_a_get_is_parked)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    pid_t pid = fork();
    if (pid == 0) {
        em_store *c = em_store_connect("127.0.0.1", port, TOKEN, 3);
        void *v;
        _exit(c && em_store_get(c, "unblock", &v, NULL) == EM_OK ? 0 : 1);
    }
    em_store *c = client(port, 5);
    sleep_ms(100);
    double t0 = now_s();
    for (int i = 0; i < 50; i++) CHECK_OK(em_store_add(c, "n", 1, NULL));
    CHECK(now_s() - t0 < 1.0);
    CHECK_OK(em_store_set(c, "unblock", "", 0));
    join(pid);
    em_store_close(c);
    em_store_server_stop(srv);
}

/* a connection without the token (here: garbage, then silence) is dropped,
 * and the server keeps working for real clients */
TEST(test_store_drops_a_stray_connection_without_the_token)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    int port = em_store_server_port(srv);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL) > 0);
    char buf[64];
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(recv(fd, buf, sizeof buf, 0) == 0); /* closed by the server, nothing said */
    close(fd);
    /* a client skipping HELLO with a well-formed SET is dropped as well */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    const unsigned char set[] = {10, 0, 0, 0, 2, 1, 0, 0, 0, 'k', 0, 0, 0, 0};
    CHECK(send(fd, set, 14, MSG_NOSIGNAL) == 14);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(recv(fd, buf, sizeof buf, 0) <= 0);
    close(fd);
    em_store *c = client(port, 5);
    bool exists = true;
    const char *k[] = {"k"};
    CHECK_ERR(em_store_wait(c, 1, k, 0.1), EM_ERR_TIMEOUT, "'k'");
    (void)exists;
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_large_value_round_trips)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 10);
    size_t n = (size_t)8 << 20;
    unsigned char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
    CHECK_OK(em_store_set(c, "big", big, n));
    void *v;
    size_t got;
    CHECK_OK(em_store_get(c, "big", &v, &got));
    CHECK(got == n && !memcmp(v, big, n));
    free(v);
    free(big);
    em_store_close(c);
    em_store_server_stop(srv);
}

TEST(test_store_calls_fail_when_the_server_goes_away)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 2);
    em_store_server_stop(srv);
    /* no SIGPIPE: the failing send returns an error */
    CHECK_ERR(em_store_set(c, "k", "v", 1), EM_ERR_DIST, "lost");
    CHECK_ERR(em_store_set(c, "k", "v", 1), EM_ERR_DIST, "store at 127.0.0.1");
    em_store_close(c);
}

TEST(test_store_rejects_bad_arguments)
{
    CHECK_ERR(em_store_server_start(NULL, 0, "short"), EM_ERR_ARG, "at least 16");
    CHECK_ERR(em_store_server_start(NULL, 70000, TOKEN), EM_ERR_ARG, "70000");
    CHECK_ERR(em_store_connect(NULL, 1, TOKEN, 1), EM_ERR_ARG, "host");
    CHECK_ERR(em_store_connect("127.0.0.1", 0, TOKEN, 1), EM_ERR_ARG, "port 0");
    CHECK_ERR(em_store_connect("127.0.0.1", 1, NULL, 1), EM_ERR_ARG, "token");
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    em_store *c = client(em_store_server_port(srv), 5);
    char longkey[1100];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    CHECK_ERR(em_store_set(c, longkey, "v", 1), EM_ERR_ARG, "1099 bytes");
    CHECK_ERR(em_store_set(c, NULL, "v", 1), EM_ERR_ARG, "key is NULL");
    CHECK_ERR(em_store_set(c, "k", NULL, 3), EM_ERR_ARG, "value is NULL");
    CHECK_ERR(em_store_set(c, "k", "v", ((size_t)64 << 20) + 1), EM_ERR_ARG, "limit");
    CHECK_ERR(em_store_barrier(c, "b", 0, 1), EM_ERR_ARG, "world 0");
    CHECK_ERR(em_store_wait(c, 1, NULL, 1), EM_ERR_ARG, "keys is NULL");
    CHECK_ERR(em_store_set(NULL, "k", "v", 1), EM_ERR_ARG, "store is NULL");
    em_store_close(c);
    em_store_server_stop(srv);
}

/* A connection the server cannot accept for want of descriptors stays queued
 * and keeps the listener readable; the server must rest, not spin. With the
 * process's descriptor table full and one connection pending, it uses well
 * under a tenth of a CPU second per second. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

TEST(test_store_server_out_of_descriptors_rests_instead_of_spinning)
{
    struct rlimit rl = {64, 64};
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0); /* this test runs in its own process */
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    CHECK_NOTNULL(srv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)em_store_server_port(srv))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int spare = dup(0), last = spare;
    CHECK(spare >= 0);
    for (int fd; (fd = dup(0)) >= 0;) last = fd; /* fill the table */
    close(spare); /* exactly one free descriptor: the client's socket takes it */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0); /* queued: the server has no descriptor to accept it */
    struct timespec settle = {0, 100 * 1000 * 1000};
    nanosleep(&settle, NULL);
    double t0 = cpu_seconds();
    struct timespec wait = {1, 0};
    nanosleep(&wait, NULL);
    double used = cpu_seconds() - t0;
    for (int fd = spare + 1; fd <= last; fd++) close(fd);
    close(c);
    em_store_server_stop(srv);
    if (!(used < 0.1)) th_fail(__FILE__, __LINE__, "the server used %.2f CPU seconds in 1 s while it could not accept", used);
}
