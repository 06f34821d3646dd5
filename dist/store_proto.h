/* store_proto.h — the rendezvous store's wire protocol, shared by the server
 * (dist/store_server.c) and the client (dist/store.c).
 *
 * Every message is a frame: a u32 length (of what follows) then the body.
 * Integers are little-endian. A string is a u32 length then its bytes (no
 * NUL). A request body starts with a u8 op:
 *   HELLO   str token                     -> OK | ERR "bad token" (then closed)
 *   SET     str key, u64 n, n bytes       -> OK
 *   GET     u64 timeout_ms, str key       -> VAL bytes | TIMEOUT
 *   ADD     i64 delta, str key            -> INT i64 | ERR
 *   WAIT    u64 timeout_ms, u32 n, n str  -> OK | TIMEOUT u32 (index of the first missing key)
 *   BARRIER u64 timeout_ms, u32 world, str name -> OK | TIMEOUT u32 arrived, u32 world | ERR
 *   CHECK   str key                       -> OK u8 exists
 *   ON_CLOSE str key, u64 n, n bytes      -> OK (when this connection closes, key := the bytes)
 *   WAIT_ANY u64 timeout_ms, u32 n, n str -> OK u32 (index of the first key that exists) | TIMEOUT
 * A reply body is a u8 code then its payload. The first request of a
 * connection must be HELLO; anything else, or a frame over the limits,
 * closes the connection. Blocking requests (GET, WAIT, BARRIER) are parked
 * by the server until they can be answered or their timeout passes (a
 * WAIT_ANY with timeout 0 answers at once). ON_CLOSE is how the store tells
 * others that a client is gone: a process group's joining rank registers
 * "NAME/gone/RANK", and the ranks waiting for it see the key appear the
 * moment its connection closes (dist/pg.c). */
#ifndef EMBER_STORE_PROTO_H
#define EMBER_STORE_PROTO_H

#include <stdint.h>
#include <string.h>

enum { SP_HELLO = 1, SP_SET, SP_GET, SP_ADD, SP_WAIT, SP_BARRIER, SP_CHECK, SP_ON_CLOSE, SP_WAIT_ANY };
enum { SR_OK = 0, SR_VAL, SR_INT, SR_TIMEOUT, SR_ERR };

#define SP_MAX_VALUE ((size_t)64 << 20) /* bytes in a value */
#define SP_MAX_KEY 1023                 /* bytes in a key */
#define SP_MAX_FRAME (SP_MAX_VALUE + 65536)
#define SP_MAX_HELLO 4096 /* the largest frame a client may send before it is authenticated */

/* A bounds-checked reader over a frame body: any read past the end sets bad. */
typedef struct sp_reader {
    const uint8_t *p;
    size_t n;
    int bad;
} sp_reader;

static inline uint64_t sp_get(sp_reader *r, int bytes)
{
    if (r->bad || r->n < (size_t)bytes) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes;
    r->n -= (size_t)bytes;
    return v;
}

static inline const uint8_t *sp_bytes(sp_reader *r, size_t n)
{
    if (r->bad || r->n < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->n -= n;
    return p;
}

static inline const char *sp_str(sp_reader *r, size_t *len)
{
    *len = (size_t)sp_get(r, 4);
    return (const char *)sp_bytes(r, *len);
}

static inline uint8_t *sp_put(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + bytes;
}

static inline uint8_t *sp_put_str(uint8_t *p, const char *s, size_t n)
{
    p = sp_put(p, n, 4);
    memcpy(p, s, n);
    return p + n;
}

#endif
