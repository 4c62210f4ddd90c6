/*
 * A GGUF file (llama.cpp's format) as a checkpoint: the config a Hugging Face config.json would
 * give, built from the file's metadata, and its tensors under the Hugging Face names the
 * families bind ("blk.3.attn_q.weight" is "model.layers.3.self_attn.q_proj.weight"), in the
 * shapes nn.Linear gives them (GGUF lists dimensions innermost first). A split set
 * (NAME-00001-of-00003.gguf) is opened as one checkpoint from its first file.
 *
 * Routed experts are llama.cpp's stacked tensors: ffn_gate_exps, ffn_up_exps [E, I, H] and
 * ffn_down_exps [E, H, I], named layers.L.mlp.experts.{gate,up,down}_proj (no ".weight").
 * Only the architectures in the table of gguf_ckpt.c load; another is refused by name. For the
 * hybrids (qwen3next, qwen35moe, qwen4exp) the converter also changed values, which the
 * checkpoint's flags say (sl_ckpt: norms as 1 + w, ssm_a, tiled value heads), and dropped keys
 * llama.cpp fixes by architecture (gguf_ckpt.c's table); an MTP layer appended to the blocks
 * (nextn_predict_layers) is not counted.
 */
#ifndef SL_GGUF_CKPT_H
#define SL_GGUF_CKPT_H

#include "format/gguf.h"
#include "model/checkpoint.h"

/* The config.json text (heap, NUL-terminated) for the GGUF model at path: model_type and the
 * sizes from the metadata, tie_word_embeddings, biases and dense layers from which tensors the
 * file has. Fails naming the file and key for an architecture sluice does not run or metadata
 * that is missing or disagrees with the tensors. */
sl_status sl_gguf_config_text(const char *path, char **text, sl_error *err);

/* Opens the file (and the rest of its split set) into ck: files in ck->gguf, one entry per
 * tensor under its Hugging Face name. */
sl_status sl_gguf_ckpt_open(sl_ckpt *ck, const char *path, sl_error *err);

#endif /* SL_GGUF_CKPT_H */
