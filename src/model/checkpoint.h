/*
 * A Hugging Face checkpoint directory: config.json plus one safetensors file
 * or several shards listed by model.safetensors.index.json. Tensors are
 * looked up by name across all shards and bound once at load time, with
 * dtype and shape checked ("expected vs actual").
 *
 * Names are given without the model prefix: "layers.0.self_attn.q_proj.weight"
 * resolves to "model.layers.0..." or "model.language_model.layers.0..."
 * (the ...ForConditionalGeneration layout), whichever the file uses. Names
 * starting with '/' are taken literally ("/lm_head.weight").
 */
#ifndef SL_CHECKPOINT_H
#define SL_CHECKPOINT_H

#include "format/safetensors.h"

typedef struct sl_gguf_file sl_gguf_file;

typedef struct sl_ckpt_entry {
    const sl_tensor *t;
    int32_t file;      /* index into files (or gguf) */
    const char *label; /* the name the file gives it, for messages (GGUF: "blk.0.attn_q.weight") */
} sl_ckpt_entry;

typedef struct sl_ckpt {
    char *dir; /* the directory, or the GGUF file */
    int32_t n_files;
    sl_st_file *files; /* safetensors shards, or a pack's core.bin */
    int32_t n_gguf;
    sl_gguf_file *gguf; /* a GGUF file and the rest of its split set (gguf_ckpt.h) */
    sl_tensor *views;   /* GGUF, MLX: the tensors under the names the families bind */
    char *names;        /* GGUF, MLX: those names, one allocation */
    int32_t n_entries;
    sl_ckpt_entry *entries; /* sorted by name */
    const char *prefix;     /* "model.", "model.language_model." or "language_model.model." */
    const char *head;       /* the LM head's full name: "lm_head.weight", or under
                             * "language_model." with that last prefix */
    /* GGUF: values llama.cpp's converter changed for the hybrids (gguf_ckpt.c) */
    int32_t norm_folded; /* RMSNorm weights hold 1 + w where the family scales by (1 + w) */
    int32_t A_neg_exp;   /* linear_attn.A_log holds -exp(A_log) (ssm_a; sl_delta_args) */
    int32_t v_tiled;     /* Gated DeltaNet's value heads in tiled order (sl_delta_args) */
    int32_t mlx_bits;    /* an MLX checkpoint (mlx_ckpt.h): config's default bits; else 0 */
    int32_t mlx_group;   /*   and group size */
} sl_ckpt;

/* dir: a checkpoint directory, a pack, or a GGUF file (gguf_ckpt.h). */
sl_status sl_ckpt_open(sl_ckpt *ck, const char *dir, sl_error *err);
void sl_ckpt_close(sl_ckpt *ck);
/* Every mapped file still as long as its mapping (sl_st_check_size): a cheap fstat each, so
 * a file truncated under a running model fails a request instead of raising SIGBUS. */
sl_status sl_ckpt_check(const sl_ckpt *ck, sl_error *err);

/* The checkpoint's files in order (safetensors shards, or GGUF parts): their count, file i's
 * path, and which of them a pointer into their mappings lies in (-1: none), *off the byte
 * offset there. The expert store reads experts from the files themselves with these. */
int32_t sl_ckpt_n_files(const sl_ckpt *ck);
const char *sl_ckpt_file(const sl_ckpt *ck, int32_t i);
int32_t sl_ckpt_locate(const sl_ckpt *ck, const void *p, uint64_t *off);

/* The file an entry is in, for messages. */
const char *sl_ckpt_path(const sl_ckpt *ck, const sl_ckpt_entry *e);

/* Whether a tensor's full name is of a decoder layer at or past n_layers ("<prefix>layers.N."
 * with N >= n_layers): the multi-token-prediction layers DeepSeek-V3 and GLM-4.5 checkpoints
 * append (num_nextn_predict_layers), which no forward pass reads, nor a pack keeps. */
int sl_ckpt_past_layers(const sl_ckpt *ck, const char *name, int32_t n_layers);
/* Whether a checkpoint tensor is (a part of) routed experts, which the expert store holds, by
 * its name: ".experts." in it ("layers.N.mlp.experts.gate_up_proj", Gemma 4's
 * "layers.N.experts.down_proj"; not "shared_experts"). */
static inline int sl_ckpt_is_expert_name(const char *name) {
    return strstr(name, ".experts.") != NULL;
}

/* Looks a tensor up by (unprefixed) name; NULL when absent. */
const sl_ckpt_entry *sl_ckpt_find(const sl_ckpt *ck, const char *name);

enum {
    SL_BIND_REQUIRED = 0,
    SL_BIND_OPTIONAL = 1, /* absent: leave the tensor empty and succeed */
};

/*
 * Binds a float weight (F32, F16 or BF16) of exactly the given shape.
 * Use SL_DIMS(a, b) for (ndim, shape). The name is a printf format.
 */
sl_status sl_ckpt_bind(const sl_ckpt *ck, sl_tensor *out, int flags, int32_t ndim,
                       const int64_t *shape, sl_error *err, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

#define SL_DIMS(...)                                                                               \
    (int32_t)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) {       \
        __VA_ARGS__                                                                                \
    }

/* A view of rows [row0, row0+rows) of a 2-D tensor, or of matrix i of a 3-D one. */
sl_tensor sl_tensor_rows(const sl_tensor *t, int64_t row0, int64_t rows);
sl_tensor sl_tensor_slice(const sl_tensor *t, int64_t i);

#endif /* SL_CHECKPOINT_H */
