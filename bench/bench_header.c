/* bench_header.c — what opening a safetensors file with a hostile header
 * costs in memory: for each kind of tests/st_hostile.h, the peak resident
 * memory em_safetensors_open adds, in MB and as a multiple of the header.
 *
 *   ninja -C build bench/bench_header && ./build/bench/bench_header [MB]   (default 20)
 */
#include <time.h>

#include "../tests/st_hostile.h"

int main(int argc, char **argv)
{
    double mb = argc > 1 ? atof(argv[1]) : 20;
    size_t bytes = (size_t)(mb * 1024 * 1024);
    char path[] = "/tmp/ember-bench-header-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    printf("%-9s %10s %10s %7s %8s  %s\n", "kind", "header MB", "peak MB", "ratio", "open s", "result");
    for (int k = 0; k < ST_HOSTILE_KINDS; k++) {
        size_t n = st_hostile_write(path, st_hostile_kinds[k], bytes);
        if (!n) return 1;
        bool opened = false;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        long long peak = st_hostile_open_peak(path, &opened);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%-9s %10.1f %10.1f %6.1fx %8.2f  %s\n", st_hostile_kinds[k], (double)n / 1048576.0,
               (double)peak / 1048576.0, (double)peak / (double)n, secs, opened ? "opened" : "refused");
    }
    unlink(path);
    return 0;
}
