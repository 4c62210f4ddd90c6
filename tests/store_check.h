/*
 * For the store's tests (unit and fault): whether expert e of layer 1, in its stream slot, holds
 * exactly the pack file's bytes of that expert.
 */
#ifndef SL_TEST_STORE_CHECK_H
#define SL_TEST_STORE_CHECK_H

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/experts.h"

static inline int slot_matches_file(const sl_expert_store *s, int32_t e) {
    const sl_expert_layer *L = &s->layers[1];
    const int32_t slot = sl_slot_lookup(&L->slots, e);
    if (slot < 0) return 0;
    int fd = open(L->path, O_RDONLY);
    uint8_t *want = malloc(L->hdr.blob_bytes);
    const int ok =
        fd >= 0 && want &&
        pread(fd, want, L->hdr.blob_bytes,
              (off_t)(L->hdr.data_offset + (uint64_t)e * L->hdr.blob_bytes)) ==
            (ssize_t)L->hdr.blob_bytes &&
        !memcmp(want, L->slot_mem + (uint64_t)slot * L->hdr.blob_bytes, L->hdr.blob_bytes);
    if (fd >= 0) close(fd);
    free(want);
    return ok;
}

#endif /* SL_TEST_STORE_CHECK_H */
