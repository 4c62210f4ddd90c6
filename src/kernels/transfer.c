/* Bytes between two backends' memories (ops.h, sl_backend_transfer). */
#include "kernels/ops.h"

#include <string.h>

void sl_backend_transfer(const sl_backend *to, void *dst, const sl_backend *from, const void *src,
                         size_t bytes, void *stage, size_t stage_bytes) {
    if (!to->device && !from->device) /* both host memory (CPU partitions) */
        memcpy(dst, src, bytes);
    else if (!to->device) /* to_host waits for the work queued on from */
        from->ops->to_host(from, dst, src, bytes);
    else if (!from->device)
        to->ops->to_dev(to, dst, src, bytes);
    else if (to->ops->copy_peer && to->ops == from->ops)
        to->ops->copy_peer(to, dst, from, src, bytes);
    else
        for (size_t off = 0; off < bytes; off += stage_bytes) {
            const size_t n = bytes - off < stage_bytes ? bytes - off : stage_bytes;
            from->ops->to_host(from, stage, (const uint8_t *)src + off, n);
            to->ops->to_dev(to, (uint8_t *)dst + off, stage, n);
        }
}
