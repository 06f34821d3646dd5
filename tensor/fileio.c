/* fileio.c — whole-file reads and crash-safe writes (fileio_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "tensor/fault_impl.h"
#include "tensor/fileio_impl.h"
#include "tensor/tensor_impl.h"

void file_sync_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

uint32_t file_crc32(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    uLong c = crc;
    while (n) {
        uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
        c = crc32(c, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)c;
}

uint32_t file_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return (uint32_t)crc32_combine(crc_a, crc_b, (z_off_t)len_b);
}

em_status file_checksum(const char *path, file_sum *sum, const char *fn)
{
    int fd = file_open_regular(path, fn);
    if (fd < 0) return em_last_status();
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return em_err(EM_ERR_OOM, "%s: out of memory reading %s", fn, path);
    }
    *sum = (file_sum){0};
    int err = 0;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) err = errno;
        if (r <= 0) break;
        sum->crc = file_crc32(sum->crc, buf, (size_t)r);
        sum->size += (uint64_t)r;
    }
    free(buf);
    close(fd);
    if (err) return em_err(EM_ERR_IO, "%s: cannot read %s: %s", fn, path, strerror(err));
    return EM_OK;
}

static int write_fully(int fd, const char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w > 0)
            done += (size_t)w;
        else if (w < 0 && errno != EINTR)
            return errno;
        else if (w == 0)
            return EIO;
    }
    return 0;
}

em_status file_write_atomic(const char *path, const void *data, size_t n, const char *fn)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return em_err(EM_ERR_IO, "%s: path too long: %.64s...", fn, path);
    int fd = mkstemp(tmp);
    if (fd < 0) return em_err(EM_ERR_IO, "%s: cannot write %s: %s", fn, path, strerror(errno));
    (void)fchmod(fd, 0644);
    const char *p = data;
    int err = write_fully(fd, p, n / 2);
    if (!err) fault_point("file.write"); /* a temporary half written */
    if (!err) err = write_fully(fd, p + n / 2, n - n / 2);
    if (!err) fault_point("file.fsync");
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err) fault_point("file.rename");
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        return em_err(EM_ERR_IO, "%s: cannot write %s: %s", fn, path, strerror(err));
    }
    file_sync_dir(path);
    return EM_OK;
}

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    return "not a regular file";
}

int file_open_regular(const char *path, const char *fn)
{
    /* non-blocking, so that opening a FIFO returns at once; blocking again after */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return em_err(EM_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno)), -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return em_err(EM_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(e)), -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return em_err(EM_ERR_IO, "%s: %s is %s, not a regular file", fn, path, file_kind(st.st_mode)), -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return em_err(EM_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(e)), -1;
    }
    return fd;
}

FILE *file_fopen_regular(const char *path, const char *fn)
{
    int fd = file_open_regular(path, fn);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        em_err(EM_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(e));
    }
    return f;
}

em_status file_read_all(const char *path, size_t max, char **out, size_t *n, const char *fn)
{
    FILE *f = file_fopen_regular(path, fn);
    if (!f) return em_last_status();
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
        fclose(f);
        return em_err(EM_ERR_IO, "%s: cannot find the size of %s", fn, path);
    }
    size_t size = (size_t)st.st_size;
    if (size > max) {
        fclose(f);
        return em_err(EM_ERR_IO, "%s: %s is larger than %zu bytes", fn, path, max);
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return em_err(EM_ERR_OOM, "%s: out of memory for %zu bytes of %s", fn, size, path);
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        free(buf);
        return em_err(EM_ERR_IO, "%s: read %zu of %zu bytes of %s", fn, got, size, path);
    }
    buf[size] = '\0';
    *out = buf;
    *n = size;
    return EM_OK;
}
