/* GGUF files as checkpoints: metadata to config, llama.cpp's tensor names to Hugging Face's. */
#include "model/gguf_ckpt.h"

#include <fcntl.h>
#include <jansson.h>
#include <unistd.h>

/* ---- the architectures ---- */

/* What llama.cpp's architecture name means to sluice: the model_type whose family runs it,
 * and the choices llama.cpp makes for the architecture rather than reading them from the file
 * (qwen3moe renormalises the top-k router weights, qwen2moe does not). */
typedef struct gguf_arch {
    const char *arch;
    const char *model_type;
    int norm_topk_prob;
} gguf_arch;

static const gguf_arch archs[] = {
    {"qwen2moe", "qwen2_moe", 0},
    {"qwen3moe", "qwen3_moe", 1},
};

static const gguf_arch *find_arch(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].arch) == len && memcmp(archs[i].arch, name, len) == 0) return &archs[i];
    return NULL;
}

static void arch_list(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", archs[i].arch);
}

/* ---- names ---- */

/* A layer tensor: llama.cpp's name after "blk.L." and Hugging Face's after "layers.L.". The
 * stacked experts have no ".weight": they are not nn.Linear weights (blocks.c binds them). */
static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_exps.weight", "mlp.experts.gate_proj"},
    {"ffn_up_exps.weight", "mlp.experts.up_proj"},
    {"ffn_down_exps.weight", "mlp.experts.down_proj"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

static const struct {
    const char *gguf, *hf;
} top_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* The Hugging Face name of a GGUF tensor into out; 0 when the name is not one sluice maps (the
 * tensor then keeps its own name: nothing binds it). */
static int hf_name(const char *g, char *out, size_t n) {
    for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
        if (strcmp(g, top_names[i].gguf) == 0) {
            snprintf(out, n, "%s", top_names[i].hf);
            return 1;
        }
    int l, used = 0;
    if (sscanf(g, "blk.%d.%n", &l, &used) != 1 || used == 0 || l < 0) return 0;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (strcmp(g + used, layer_names[i].gguf) == 0) {
            snprintf(out, n, "model.layers.%d.%s", l, layer_names[i].hf);
            return 1;
        }
    return 0;
}

/* ---- files ---- */

/* For NAME-0000i-of-0000N.gguf: the part count N and where "0000i" starts in path (the other
 * parts' names differ only there); 1 for a single file. */
static int32_t split_count(const char *path, size_t *num_at) {
    size_t n = strlen(path);
    const char *tail = "-00001-of-00000.gguf"; /* the shape only */
    size_t tl = strlen(tail);
    if (n < tl) return 1;
    const char *s = path + n - tl;
    int i, total;
    char dash, rest[8];
    if (sscanf(s, "%c%5d-of-%5d.%4s", &dash, &i, &total, rest) != 4 || dash != '-' ||
        strcasecmp(rest, "gguf") != 0 || s[6] != '-' || total < 1)
        return 1;
    *num_at = (size_t)(s + 1 - path);
    return total;
}

static sl_status open_parts(sl_ckpt *ck, const char *path, sl_error *err) {
    size_t num_at = 0;
    const int32_t parts = split_count(path, &num_at);
    if (!(ck->gguf = sl_calloc((size_t)parts, sizeof(sl_gguf_file), err))) return SL_ERR_NOMEM;
    char *p = strdup(path);
    if (!p) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    sl_status st = SL_OK;
    for (int32_t i = 0; !st && i < parts; i++) {
        if (parts > 1) {
            char num[8];
            snprintf(num, sizeof num, "%05d", i + 1);
            memcpy(p + num_at, num, 5);
        }
        st = sl_gguf_open(&ck->gguf[i], p, err);
        ck->n_gguf = i + 1;
        if (!st && parts > 1) {
            uint32_t no = 0, count = 0;
            if ((st = sl_gguf_get_u32(&ck->gguf[i], "split.count", &count, err)) ||
                (st = sl_gguf_get_u32(&ck->gguf[i], "split.no", &no, err)))
                break;
            if (count != (uint32_t)parts || no != (uint32_t)i)
                st = sl_fail(err, SL_ERR_FORMAT,
                             "%s: split.no %u of split.count %u, but its name says part %d of %d",
                             p, no, count, i + 1, parts);
        }
    }
    free(p);
    return st;
}

/* ---- config ---- */

static sl_status put_u32(json_t *o, const sl_gguf_file *f, const char *arch, const char *key,
                         const char *hf, int required, sl_error *err) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (!sl_gguf_find_kv(f, k) && !required) return SL_OK;
    uint32_t v;
    sl_status st = sl_gguf_get_u32(f, k, &v, err);
    if (!st) json_object_set_new(o, hf, json_integer(v));
    return st;
}

static sl_status put_f32(json_t *o, const sl_gguf_file *f, const char *arch, const char *key,
                         const char *hf, int required, sl_error *err) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (!sl_gguf_find_kv(f, k) && !required) return SL_OK;
    float v;
    sl_status st = sl_gguf_get_f32(f, k, &v, err);
    if (!st) json_object_set_new(o, hf, json_real(v));
    return st;
}

static const sl_gguf_tensor *find_in(const sl_gguf_file *parts, int32_t n, const char *name) {
    for (int32_t i = 0; i < n; i++) {
        const sl_gguf_tensor *t = sl_gguf_find_tensor(&parts[i], name);
        if (t) return t;
    }
    return NULL;
}

static sl_status config_json(const sl_gguf_file *parts, int32_t n_parts, json_t **out,
                             sl_error *err) {
    const sl_gguf_file *f = &parts[0];
    sl_gguf_str an;
    sl_status st = sl_gguf_get_str(f, "general.architecture", &an, err);
    if (st) return st;
    const gguf_arch *a = find_arch(an.s, an.len);
    if (!a) {
        char list[256];
        arch_list(list, sizeof list);
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: architecture '%.*s' is not one sluice runs from GGUF (it runs: %s)",
                       f->path, (int)SL_MIN(an.len, 64), an.s, list);
    }
    char ar[64];
    snprintf(ar, sizeof ar, "%s", a->arch);
    json_t *o = json_object();
    if (!o) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    json_object_set_new(o, "model_type", json_string(a->model_type));
    if ((st = put_u32(o, f, ar, "embedding_length", "hidden_size", 1, err)) ||
        (st = put_u32(o, f, ar, "block_count", "num_hidden_layers", 1, err)) ||
        (st = put_u32(o, f, ar, "attention.head_count", "num_attention_heads", 1, err)) ||
        (st = put_u32(o, f, ar, "attention.head_count_kv", "num_key_value_heads", 0, err)) ||
        (st = put_u32(o, f, ar, "attention.key_length", "head_dim", 0, err)) ||
        (st = put_u32(o, f, ar, "context_length", "max_position_embeddings", 0, err)) ||
        (st = put_u32(o, f, ar, "feed_forward_length", "intermediate_size", 0, err)) ||
        (st = put_u32(o, f, ar, "expert_feed_forward_length", "moe_intermediate_size", 1, err)) ||
        (st = put_u32(o, f, ar, "expert_shared_feed_forward_length",
                      "shared_expert_intermediate_size", 0, err)) ||
        (st = put_u32(o, f, ar, "expert_count", "num_experts", 1, err)) ||
        (st = put_u32(o, f, ar, "expert_used_count", "num_experts_per_tok", 1, err)) ||
        (st = put_f32(o, f, ar, "attention.layer_norm_rms_epsilon", "rms_norm_eps", 1, err)) ||
        (st = put_f32(o, f, ar, "rope.freq_base", "rope_theta", 0, err)))
        goto fail;
    /* Key and value heads of one size: sluice's attention has one head_dim. */
    char k[160];
    snprintf(k, sizeof k, "%s.attention.value_length", ar);
    if (sl_gguf_find_kv(f, k) && json_object_get(o, "head_dim")) {
        uint32_t vl;
        if ((st = sl_gguf_get_u32(f, k, &vl, err))) goto fail;
        if ((json_int_t)vl != json_integer_value(json_object_get(o, "head_dim"))) {
            st = sl_fail(
                err, SL_ERR_UNSUPPORTED,
                "%s: %s = %u differs from the key length %lld (sluice needs one head size)",
                f->path, k, vl, (long long)json_integer_value(json_object_get(o, "head_dim")));
            goto fail;
        }
    }
    /* Long-context RoPE scaling is not in sluice's attention: refuse rather than mis-rotate. */
    snprintf(k, sizeof k, "%s.rope.scaling.type", ar);
    sl_gguf_str rs;
    if (sl_gguf_find_kv(f, k)) {
        if ((st = sl_gguf_get_str(f, k, &rs, err))) goto fail;
        if (!(rs.len == 4 && memcmp(rs.s, "none", 4) == 0)) {
            st = sl_fail(err, SL_ERR_UNSUPPORTED, "%s: %s '%.*s' is not supported", f->path, k,
                         (int)SL_MIN(rs.len, 32), rs.s);
            goto fail;
        }
    }
    json_object_set_new(o, "norm_topk_prob", json_boolean(a->norm_topk_prob));
    /* What the tensors say: the vocabulary is the embedding's rows, a missing output matrix
     * means tied embeddings, a bias on q means the projections have them, and a layer without
     * a router is a dense one. */
    const sl_gguf_tensor *emb = find_in(parts, n_parts, "token_embd.weight");
    if (!emb || emb->n_dims != 2) {
        st = sl_fail(err, SL_ERR_FORMAT, "%s: no 2-D tensor 'token_embd.weight'", f->path);
        goto fail;
    }
    json_object_set_new(o, "vocab_size", json_integer(emb->ne[1]));
    json_object_set_new(o, "tie_word_embeddings",
                        json_boolean(!find_in(parts, n_parts, "output.weight")));
    const int bias = find_in(parts, n_parts, "blk.0.attn_q.bias") != NULL;
    json_object_set_new(o, "qkv_bias", json_boolean(bias));
    json_object_set_new(o, "attention_bias",
                        json_boolean(bias && find_in(parts, n_parts, "blk.0.attn_output.bias")));
    const json_int_t nl = json_integer_value(json_object_get(o, "num_hidden_layers"));
    json_t *dense = json_array();
    for (json_int_t l = 0; l < nl && l < 4096; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)l);
        if (!find_in(parts, n_parts, name)) json_array_append_new(dense, json_integer(l));
    }
    json_object_set_new(o, "mlp_only_layers", dense);
    if (sl_gguf_find_kv(f, "tokenizer.ggml.eos_token_id")) {
        uint32_t eos;
        if ((st = sl_gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos, err))) goto fail;
        json_object_set_new(o, "eos_token_id", json_integer(eos));
    }
    *out = o;
    return SL_OK;
fail:
    json_decref(o);
    return st;
}

sl_status sl_gguf_config_text(const char *path, char **text, sl_error *err) {
    *text = NULL;
    sl_ckpt ck = {0};
    sl_status st = open_parts(&ck, path, err);
    json_t *o = NULL;
    if (!st) st = config_json(ck.gguf, ck.n_gguf, &o, err);
    if (!st && !(*text = json_dumps(o, JSON_INDENT(1) | JSON_SORT_KEYS)))
        st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    json_decref(o);
    sl_ckpt_close(&ck);
    return st;
}

/* ---- tensors ---- */

sl_status sl_gguf_ckpt_open(sl_ckpt *ck, const char *path, sl_error *err) {
    sl_status st = open_parts(ck, path, err);
    if (st) return st;
    int64_t total = 0;
    size_t name_bytes = 0;
    char name[256];
    for (int32_t p = 0; p < ck->n_gguf; p++)
        for (int64_t i = 0; i < ck->gguf[p].n_tensors; i++) {
            const sl_gguf_tensor *t = &ck->gguf[p].tensors[i];
            if (!hf_name(t->name, name, sizeof name)) snprintf(name, sizeof name, "%s", t->name);
            name_bytes += strlen(name) + 1;
            total++;
        }
    if (total > INT32_MAX / 2) return sl_fail(err, SL_ERR_FORMAT, "%s: too many tensors", path);
    if (!(ck->views = sl_calloc((size_t)total + 1, sizeof(sl_tensor), err)) ||
        !(ck->entries = sl_calloc((size_t)total + 1, sizeof(sl_ckpt_entry), err)) ||
        !(ck->names = sl_calloc(name_bytes + 1, 1, err)))
        return SL_ERR_NOMEM;
    char *np = ck->names;
    for (int32_t p = 0; p < ck->n_gguf; p++)
        for (int64_t i = 0; i < ck->gguf[p].n_tensors; i++) {
            const sl_gguf_tensor *g = &ck->gguf[p].tensors[i];
            sl_tensor *v = &ck->views[ck->n_entries];
            if (!hf_name(g->name, name, sizeof name)) snprintf(name, sizeof name, "%s", g->name);
            strcpy(np, name);
            v->name = np;
            np += strlen(name) + 1;
            v->dtype = g->dtype;
            v->data = g->data;
            v->nbytes = (size_t)g->nbytes;
            /* GGUF lists dimensions innermost first; nn.Linear's [out, in] is the reverse. */
            v->ndim = g->n_dims;
            for (int32_t d = 0; d < g->n_dims; d++)
                v->shape[d] = g->ne[g->n_dims - 1 - d];
            /* The shared expert's gate is a vector in GGUF, a [1, H] Linear in Hugging Face. */
            const size_t nl = strlen(name), sl = strlen("shared_expert_gate.weight");
            if (g->n_dims == 1 && nl > sl &&
                strcmp(name + nl - sl, "shared_expert_gate.weight") == 0) {
                v->ndim = 2;
                v->shape[1] = v->shape[0];
                v->shape[0] = 1;
            }
            ck->entries[ck->n_entries++] = (sl_ckpt_entry){v, p, g->name};
        }
    return SL_OK;
}
