/*
 * The disk's O_DIRECT read bandwidth as an expert stream meets it: random reads of BLOCK bytes
 * at aligned offsets of FILE, DEPTH in flight through io_uring, for SECONDS; prints MB/s (1e6).
 * For machines without fio (the GPU host): bench_stream_trace.sh takes it as DISK_PROBE.
 *   cc -O2 -o disk_bw tools/lab/disk_bw.c -luring   (or -I.deps/include .deps/lib/liburing.a)
 *   disk_bw FILE [BLOCK_MIB=8] [DEPTH=32] [SECONDS=4]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: disk_bw FILE [BLOCK_MIB=8] [DEPTH=32] [SECONDS=4]\n");
        return 2;
    }
    const size_t block = (size_t)(argc > 2 ? atof(argv[2]) : 8) * (1u << 20);
    const unsigned depth = argc > 3 ? (unsigned)atoi(argv[3]) : 32;
    const double seconds = argc > 4 ? atof(argv[4]) : 4;
    const int fd = open(argv[1], O_RDONLY | O_DIRECT);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || block == 0 || depth == 0) {
        perror(argv[1]);
        return 1;
    }
    const unsigned long long blocks = (unsigned long long)sb.st_size / block;
    if (blocks == 0) {
        fprintf(stderr, "%s: smaller than one block\n", argv[1]);
        return 1;
    }
    struct io_uring ring;
    if (io_uring_queue_init(depth, &ring, 0)) {
        fprintf(stderr, "io_uring_queue_init failed\n");
        return 1;
    }
    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, block * depth)) return 1;
    unsigned *free_buf = malloc(depth * sizeof *free_buf), n_free = depth;
    if (!free_buf) return 1;
    for (unsigned i = 0; i < depth; i++)
        free_buf[i] = i;
    srand(12345);
    unsigned long long bytes = 0;
    const double t0 = now();
    unsigned inflight = 0;
    for (int issuing = 1; issuing || inflight;) {
        while (issuing && n_free) { /* each read into a buffer of its own */
            const unsigned i = free_buf[--n_free];
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            const unsigned long long b =
                ((unsigned long long)rand() << 16 ^ (unsigned)rand()) % blocks;
            io_uring_prep_read(sqe, fd, buf + (size_t)i * block, (unsigned)block, b * block);
            io_uring_sqe_set_data64(sqe, i);
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe)) break;
        if (cqe->res < 0) {
            fprintf(stderr, "read: %s\n", strerror(-cqe->res));
            return 1;
        }
        bytes += (unsigned long long)cqe->res;
        free_buf[n_free++] = (unsigned)io_uring_cqe_get_data64(cqe);
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
        if (now() - t0 > seconds) issuing = 0;
    }
    printf("%.0f\n", (double)bytes / (now() - t0) / 1e6);
    return 0;
}
