/* Internal entry points of the packer (model/packer.c) beyond the public API. */
#ifndef SL_PACKER_H
#define SL_PACKER_H

#include "sluice.h"

#include <stdint.h>

/* Rewrites the pack in dir at format version `to` (SL_PACK_VERSION_MIN .. SL_PACK_VERSION):
 * verified first (a pack that fails verify is left alone), then each file to NAME.tmp, all
 * renamed, the manifest last. sl_pack_upgrade is this with the current version; tests use it
 * to make version-1 packs. Nothing to do when the pack is at that version already. */
sl_status sl_pack_convert(const char *dir, uint32_t to, sl_progress_fn progress, void *user,
                          sl_error *err);

#endif /* SL_PACKER_H */
