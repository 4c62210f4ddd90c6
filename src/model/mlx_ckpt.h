/*
 * MLX checkpoints (mlx-lm's quantised safetensors) read as Hugging Face checkpoints.
 *
 * config.json says "quantization": {"group_size": G, "bits": B} (newer mlx-lm writes the same
 * as "quantization_config" too), with per-module overrides as keys inside it
 * ("model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}, or false: not quantised). A
 * quantised module X is three tensors:
 *
 *   X.weight  U32 [..., out, in * B / 32]  element j of a row in word j*B/32 at bit (j*B)%32,
 *                                          least significant first
 *   X.scales  [..., out, in / G]           the model's float dtype (BF16, F16 or F32)
 *   X.biases  [..., out, in / G]           w = scale * q + bias per group
 *
 * Read as bytes, the words are sluice's Q4 (low nibble first) and Q8 codes: X.weight is bound
 * in place as a Q4/Q8 tensor of shape [..., out, in] with its group and scale dtype, nothing
 * converted. mlx-lm's fused routed experts (mlp.switch_mlp.{gate,up,down}_proj, [E, out, in])
 * take the stacked names the families bind (mlp.experts.{gate,up,down}_proj, as GGUF's).
 */
#ifndef SL_MLX_CKPT_H
#define SL_MLX_CKPT_H

#include "model/checkpoint.h"

/* If ck (an opened Hugging Face directory, entries sorted) is an MLX checkpoint, rewrites its
 * entries: each quantised module's weight becomes a Q4/Q8 view over its codes, scales and
 * biases (those two entries dropped), switch_mlp tensors are renamed, and ck->mlx_bits and
 * ck->mlx_group get the config's defaults; entries are left unsorted. Anything else is left
 * as it is. Refuses, naming the file and tensor, bit widths other than 4 and 8, a mode other
 * than affine, group sizes other than 32, 64 and 128 or that do not divide the row, and scales
 * or biases that are missing or mis-shaped. */
sl_status sl_mlx_ckpt_bind(sl_ckpt *ck, sl_error *err);

#endif /* SL_MLX_CKPT_H */
