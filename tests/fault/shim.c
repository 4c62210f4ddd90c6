/*
 * Fault injection for the I/O tests (tests/fault/fault_test.sh): an LD_PRELOAD library that
 * wraps open/openat/read/pread/close and misbehaves on reads of one file, as a failing disk
 * or network filesystem would. Controlled by the environment:
 *
 *   SLUICE_FAULT_FILE=S        the file: any path containing S (required; nothing else is touched)
 *   SLUICE_FAULT=K[,K...]      what goes wrong on its reads:
 *                                eio    fail with EIO
 *                                short  return at most SLUICE_FAULT_SHORT bytes (default 1000)
 *                                stall  sleep SLUICE_FAULT_STALL_MS (default 2000) first
 *                                flip   invert the byte at SLUICE_FAULT_AT of what was read
 *                                       (an offset into the buffer, default 100): the file is
 *                                       fine, the read brings back a corrupt copy
 *   SLUICE_FAULT_AFTER=N       leave the first N reads of the file alone (default 0: a header
 *                              read at load is read 1)
 *   SLUICE_FAULT_COUNT=N       misbehave on N reads, then never again (default: always)
 *   SLUICE_FAULT_DIRECT=1      where the filesystem refuses O_DIRECT (tmpfs), open without it
 *                              and still refuse unaligned reads with EINVAL, as O_DIRECT does
 *
 * Reads of a descriptor opened with O_DIRECT are checked for alignment (4096: offset, length
 * and buffer) whatever the filesystem, so a retry that forgets it fails here too. A fault
 * counts once per read call. Descriptors beyond SHIM_FDS are left alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define SHIM_FDS   4096
#define SHIM_ALIGN 4096

enum { F_TRACKED = 1, F_DIRECT = 2 };
static _Atomic unsigned char fd_flags[SHIM_FDS];
static atomic_long n_reads; /* reads of the file so far */

static struct {
    int init;
    const char *file;
    int eio, shortr, stall, flip, emulate_direct;
    long short_max, stall_ms, at, after, count;
} cfg;

static long env_long(const char *name, long def) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : def;
}

static void init(void) {
    if (cfg.init) return;
    cfg.file = getenv("SLUICE_FAULT_FILE");
    const char *k = getenv("SLUICE_FAULT");
    if (k) {
        cfg.eio = strstr(k, "eio") != NULL;
        cfg.shortr = strstr(k, "short") != NULL;
        cfg.stall = strstr(k, "stall") != NULL;
        cfg.flip = strstr(k, "flip") != NULL;
    }
    cfg.emulate_direct = env_long("SLUICE_FAULT_DIRECT", 0) != 0;
    cfg.short_max = env_long("SLUICE_FAULT_SHORT", 1000);
    cfg.stall_ms = env_long("SLUICE_FAULT_STALL_MS", 2000);
    cfg.at = env_long("SLUICE_FAULT_AT", 100);
    cfg.after = env_long("SLUICE_FAULT_AFTER", 0);
    cfg.count = env_long("SLUICE_FAULT_COUNT", -1);
    cfg.init = 1;
}

#define REAL(name, type)                                                                           \
    static type real_##name;                                                                       \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

static int opened(int fd, const char *path, int flags) {
    init();
    if (fd >= 0 && fd < SHIM_FDS) {
        unsigned char f = 0;
        if (cfg.file && path && strstr(path, cfg.file)) f |= F_TRACKED;
        if (flags & O_DIRECT) f |= F_DIRECT;
        atomic_store(&fd_flags[fd], f);
    }
    return fd;
}

/* O_DIRECT where the filesystem has none: opened without it, checked by the shim. */
static int direct_fallback(int fd, int flags) {
    return fd < 0 && errno == EINVAL && (flags & O_DIRECT) && cfg.emulate_direct;
}

typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*close_fn)(int);

static int do_openat(int dirfd, const char *path, int flags, mode_t mode) {
    REAL(openat, openat_fn);
    init();
    int fd = real_openat(dirfd, path, flags, mode);
    if (direct_fallback(fd, flags)) fd = real_openat(dirfd, path, flags & ~O_DIRECT, mode);
    return opened(fd, path, flags);
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_openat(AT_FDCWD, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_openat(dirfd, path, flags, mode);
}

/* _FORTIFY_SOURCE builds call these for open without a mode. */
int __open_2(const char *path, int flags) {
    return do_openat(AT_FDCWD, path, flags, 0);
}
int __open64_2(const char *path, int flags) {
    return do_openat(AT_FDCWD, path, flags, 0);
}
int __openat_2(int dirfd, const char *path, int flags) {
    return do_openat(dirfd, path, flags, 0);
}

int close(int fd) {
    REAL(close, close_fn);
    if (fd >= 0 && fd < SHIM_FDS) atomic_store(&fd_flags[fd], 0);
    return real_close(fd);
}

/* ---- reads */

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*read_fn)(int, void *, size_t);

static unsigned char flags_of(int fd) {
    return fd >= 0 && fd < SHIM_FDS ? atomic_load(&fd_flags[fd]) : 0;
}

/* Whether this read of the tracked file misbehaves (counts it). */
static int faulty(void) {
    const long i = atomic_fetch_add(&n_reads, 1);
    return i >= cfg.after && (cfg.count < 0 || i < cfg.after + cfg.count);
}

static int misaligned(const void *buf, size_t n, off_t off) {
    return (uintptr_t)buf % SHIM_ALIGN || n % SHIM_ALIGN || off % SHIM_ALIGN;
}

/* One read, through real (pread when off >= 0, else read). */
static ssize_t shim_read(int fd, void *buf, size_t n, off_t off) {
    REAL(pread, pread_fn);
    REAL(read, read_fn);
    init();
    const unsigned char f = flags_of(fd);
    if ((f & F_DIRECT) && misaligned(buf, n, off < 0 ? lseek(fd, 0, SEEK_CUR) : off)) {
        errno = EINVAL;
        return -1;
    }
    if (!(f & F_TRACKED) || !faulty())
        return off >= 0 ? real_pread(fd, buf, n, off) : real_read(fd, buf, n);
    if (cfg.stall) {
        struct timespec ts = {cfg.stall_ms / 1000, (cfg.stall_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    if (cfg.eio) {
        errno = EIO;
        return -1;
    }
    ssize_t r = off >= 0 ? real_pread(fd, buf, n, off) : real_read(fd, buf, n);
    /* Short: the whole (possibly O_DIRECT, aligned) read is done, fewer bytes reported; a
     * read() must then not have moved past them. */
    if (cfg.shortr && r > cfg.short_max) {
        if (off < 0) lseek(fd, cfg.short_max - r, SEEK_CUR);
        r = cfg.short_max;
    }
    if (cfg.flip && r > cfg.at) ((unsigned char *)buf)[cfg.at] ^= 0xff;
    return r;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    return shim_read(fd, buf, n, off);
}
ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    return shim_read(fd, buf, n, off);
}
ssize_t read(int fd, void *buf, size_t n) {
    return shim_read(fd, buf, n, -1);
}
ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t cap) {
    (void)cap;
    return shim_read(fd, buf, n, off);
}
ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t cap) {
    (void)cap;
    return shim_read(fd, buf, n, off);
}
ssize_t __read_chk(int fd, void *buf, size_t n, size_t cap) {
    (void)cap;
    return shim_read(fd, buf, n, -1);
}
