/* fileio.c — whole-file reads and crash-safe writes (fileio_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

em_status file_write_atomic(const char *path, const void *data, size_t n, const char *fn)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return em_err(EM_ERR_IO, "%s: path too long: %.64s...", fn, path);
    int fd = mkstemp(tmp);
    if (fd < 0) return em_err(EM_ERR_IO, "%s: cannot write %s: %s", fn, path, strerror(errno));
    (void)fchmod(fd, 0644);
    const char *p = data;
    size_t done = 0;
    int err = 0;
    while (done < n && !err) {
        ssize_t w = write(fd, p + done, n - done);
        if (w > 0) done += (size_t)w;
        else if (w < 0 && errno != EINTR) err = errno;
        else if (w == 0) err = EIO;
    }
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
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
