/* fuzz_util.h - small helpers the libFuzzer harnesses of fuzz/ share (header-only).
 *
 * Files from bytes (a memfd, for parsers that take a path), checksum fix-ups (so mutated inputs
 * get past an XXH3 trailer and reach the fields behind it) and the quiet start every harness
 * makes. Owns nothing beyond what each call returns; single-threaded, as libFuzzer runs.
 */
#ifndef TANDEM_FUZZ_UTIL_H
#define TANDEM_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"

/* Bytes of a path under /proc/self/fd. */
#define FUZZ_PATH_BYTES 64

/*
 * fuzz_quiet - every harness's start: parsers log one warn line per refusal, which would
 * dominate the run time; errors stay on.
 */
static inline void fuzz_quiet(void)
{
    tdm_log_set_level(TDM_LOG_OFF);
}

/*
 * fuzz_memfd_open - an anonymous in-memory file holding `size` bytes of `data`, reachable at
 * path_out ("/proc/self/fd/N"). Returns the fd (caller closes it) or -1. No disk, no names
 * left behind.
 */
static inline int fuzz_memfd_open(const uint8_t *data, size_t size, char *path_out,
                                  size_t path_bytes)
{
    int fd = memfd_create("tandem-fuzz", MFD_CLOEXEC);
    size_t done = 0;

    if (fd < 0) {
        return -1;
    }
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(path_out, path_bytes, "/proc/self/fd/%d", fd);
    return fd;
}

/* fuzz_put_u64le - store v little-endian at p (8 bytes). */
static inline void fuzz_put_u64le(uint8_t *p, uint64_t v)
{
    for (int b = 0; b < 8; b++) {
        p[b] = (uint8_t)(v >> (8 * b));
    }
}

/*
 * fuzz_fix_trailer - overwrite the last 8 bytes of buf (n bytes) with the XXH3-64 of the bytes
 * before them, the trailer of the state record and of the reservation descriptor. No-op when
 * n < 8.
 */
static inline void fuzz_fix_trailer(uint8_t *buf, size_t n)
{
    if (n >= 8) {
        fuzz_put_u64le(buf + n - 8, tdm_hash_xxh3_64(buf, n - 8));
    }
}

#endif
