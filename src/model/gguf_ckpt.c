/* GGUF files as checkpoints: metadata to config, llama.cpp's tensor names to Hugging Face's. */
#include "model/gguf_ckpt.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <unistd.h>

/* ---- the architectures ---- */

/* What llama.cpp's architecture name means to sluice: the model_type whose family runs it,
 * and the choices llama.cpp makes for the architecture rather than reading them from the file
 * (qwen3moe and the hybrids renormalise the top-k router weights, qwen2moe does not; Qwen4-Exp's
 * Gated DeltaNet gates its output with a sigmoid). The hybrids (Gated DeltaNet layers) have
 * their ssm.* keys, and values the converter changed (sl_ckpt's flags): RMSNorm weights stored
 * as 1 + w, ssm_a = -exp(A_log), and from Qwen3.5 on the value heads in tiled order. */
typedef struct gguf_arch {
    const char *arch;
    const char *model_type;
    int norm_topk_prob;
    int hybrid;
    int v_tiled;
    int hyper; /* Qwen4-Exp: hyper-connections, PLE, the QSA indexer */
} gguf_arch;

static const gguf_arch archs[] = {
    /* clang-format off */
    {"qwen2moe",  "qwen2_moe",        0, 0, 0, 0},
    {"qwen3moe",  "qwen3_moe",        1, 0, 0, 0},
    {"qwen3next", "qwen3_next",       1, 1, 0, 0},
    {"qwen35moe", "qwen3_5_moe_text", 1, 1, 1, 0},
    {"qwen4exp",  "qwen4_exp_text",   1, 1, 1, 1},
    /* clang-format on */
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
    /* the hybrids: Gated DeltaNet (Qwen3-Next's fused in_proj_qkvz split into qkv and z; its
     * in_proj_ba kept), and the pre-FFN norm's other name */
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},
    {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},
    {"ssm_a", "linear_attn.A_log"}, /* -exp(A_log): sl_ckpt.A_neg_exp */
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_norm.weight", "linear_attn.norm.weight"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    /* Qwen4-Exp */
    {"hc_attn_norm.weight", "attn_hyper_connection.hc_norm.weight"},
    {"hc_attn_down.weight", "attn_hyper_connection.input_mix_weight_down.weight"},
    {"hc_attn_up.weight", "attn_hyper_connection.input_mix_weight_up.weight"},
    {"hc_attn_inject.weight", "attn_hyper_connection.block_inject_weight.weight"},
    {"hc_ffn_norm.weight", "mlp_hyper_connection.hc_norm.weight"},
    {"hc_ffn_down.weight", "mlp_hyper_connection.input_mix_weight_down.weight"},
    {"hc_ffn_up.weight", "mlp_hyper_connection.input_mix_weight_up.weight"},
    {"hc_ffn_inject.weight", "mlp_hyper_connection.block_inject_weight.weight"},
    {"ple_key.weight", "ple.key_proj.weight"},
    {"ple_value.weight", "ple.value_proj.weight"},
    {"ple_norm_key.weight", "ple.norm_key.weight"},
    {"ple_norm_query.weight", "ple.norm_query.weight"},
    {"ple_norm_conv.weight", "ple.norm_conv.weight"},
    {"ple_conv1d.weight", "ple.conv1d.weight"},
    {"indexer.q_proj.weight", "self_attn.indexer.q_proj.weight"},
    {"indexer.k_proj.weight", "self_attn.indexer.k_proj.weight"},
    {"indexer.q_norm.weight", "self_attn.indexer.q_layernorm.weight"},
    {"indexer.k_norm.weight", "self_attn.indexer.k_layernorm.weight"},
};

static const struct {
    const char *gguf, *hf;
} top_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"output_hc_norm.weight", "model.hyper_connection_mixer.hc_norm.weight"},
    {"output_hc_down.weight", "model.hyper_connection_mixer.input_mix_weight_down.weight"},
    {"output_hc_up.weight", "model.hyper_connection_mixer.input_mix_weight_up.weight"},
};

/* The Hugging Face name of a GGUF tensor into out; 0 when the name is not one sluice maps (the
 * tensor then keeps its own name: nothing binds it). ple_layer: Qwen4-Exp's PLE layer, whose
 * n-gram table GGUF names without a layer (per_layer_token_embd), or -1. */
static int hf_name(const char *g, int32_t ple_layer, char *out, size_t n) {
    for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
        if (strcmp(g, top_names[i].gguf) == 0) {
            snprintf(out, n, "%s", top_names[i].hf);
            return 1;
        }
    if (ple_layer >= 0 && strcmp(g, "per_layer_token_embd.weight") == 0) {
        snprintf(out, n, "model.layers.%d.ple.ple_embedding.ngram_embedding.weight", ple_layer);
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

/* An array key of at least n entries of an integer type (BOOL included: 0 or 1), or absent
 * (*out NULL) when not required. Per-layer arrays also cover the MTP layers after the model's. */
static sl_status int_array(const sl_gguf_file *f, const char *arch, const char *key, uint64_t n,
                           int required, const sl_gguf_kv **out, sl_error *err) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    *out = sl_gguf_find_kv(f, k);
    if (!*out)
        return required ? sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is missing", f->path, k)
                        : SL_OK;
    const uint32_t t = (*out)->arr_type;
    if ((*out)->type != SL_GGUF_ARRAY || t == SL_GGUF_F32 || t == SL_GGUF_F64 ||
        t == SL_GGUF_STRING || t == SL_GGUF_ARRAY || (*out)->n < n)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is not an array of at least %llu integers",
                       f->path, k, (unsigned long long)n);
    return SL_OK;
}

static int64_t arr_at(const sl_gguf_kv *kv, uint64_t i) {
    return kv->arr_type == SL_GGUF_BOOL ? kv->val[i] != 0 : sl_gguf_arr_int(kv, i);
}

static const sl_gguf_tensor *find_in(const sl_gguf_file *parts, int32_t n, const char *name);

/* The hybrids' Gated DeltaNet (llama.cpp's ssm.* keys: the value heads are the time-step rank,
 * the key heads the group count, the key head size the state size) and which layers it runs on
 * (recurrent_layers, else every full_attention_interval-th layer is full attention). */
static sl_status hybrid_keys(json_t *o, const sl_gguf_file *f, const char *ar, sl_error *err) {
    sl_status st;
    if ((st = put_u32(o, f, ar, "ssm.conv_kernel", "linear_conv_kernel_dim", 1, err)) ||
        (st = put_u32(o, f, ar, "ssm.state_size", "linear_key_head_dim", 1, err)) ||
        (st = put_u32(o, f, ar, "ssm.group_count", "linear_num_key_heads", 1, err)) ||
        (st = put_u32(o, f, ar, "ssm.time_step_rank", "linear_num_value_heads", 1, err)) ||
        (st = put_u32(o, f, ar, "full_attention_interval", "full_attention_interval", 0, err)))
        return st;
    char k[160];
    snprintf(k, sizeof k, "%s.ssm.inner_size", ar);
    uint32_t inner;
    if ((st = sl_gguf_get_u32(f, k, &inner, err))) return st;
    const json_int_t nv = json_integer_value(json_object_get(o, "linear_num_value_heads"));
    if (nv < 1 || inner % nv)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: %s = %u is not a multiple of %s.ssm.time_step_rank = %lld", f->path, k,
                       inner, ar, (long long)nv);
    json_object_set_new(o, "linear_value_head_dim", json_integer(inner / nv));
    const json_int_t nl = json_integer_value(json_object_get(o, "num_hidden_layers"));
    const sl_gguf_kv *rec;
    if ((st = int_array(f, ar, "attention.recurrent_layers", (uint64_t)nl, 0, &rec, err)))
        return st;
    if (rec) {
        json_t *types = json_array();
        for (uint64_t l = 0; l < (uint64_t)nl; l++)
            json_array_append_new(
                types, json_string(arr_at(rec, l) ? "linear_attention" : "full_attention"));
        json_object_set_new(o, "layer_types", types);
    }
    return SL_OK;
}

/* Qwen4-Exp's own keys. llama.cpp runs a full-attention layer densely when its compress ratio
 * is 0 (its converter writes 0 for every layer that transformers does not call
 * "full_attention"), so an indexer serves only layers with a ratio, all of one ratio here. One
 * PLE layer (llama.cpp holds one set of hash constants): its table is per_layer_token_embd,
 * rows of embedding_length_per_layer_input per n-gram head. */
static sl_status hyper_keys(json_t *o, const sl_gguf_file *parts, int32_t n_parts, const char *ar,
                            sl_error *err) {
    const sl_gguf_file *f = &parts[0];
    sl_status st;
    if ((st = put_u32(o, f, ar, "hyper_connection.count", "hc_count", 1, err)) ||
        (st = put_u32(o, f, ar, "hyper_connection.low_rank", "hc_lowrank", 1, err)))
        return st;
    json_object_set_new(o, "output_gate_type", json_string("sigmoid"));
    const json_int_t nl = json_integer_value(json_object_get(o, "num_hidden_layers"));
    const sl_gguf_kv *ratios, *rec;
    if ((st = int_array(f, ar, "attention.compress_ratios", (uint64_t)nl, 0, &ratios, err)) ||
        (st = int_array(f, ar, "attention.recurrent_layers", (uint64_t)nl, 1, &rec, err)))
        return st;
    int64_t ratio = 0;
    int dense = 0;
    for (uint64_t l = 0; ratios && l < (uint64_t)nl; l++) {
        const int64_t r = arr_at(ratios, l);
        if (arr_at(rec, l)) continue;
        if (r == 0) dense = 1;
        if (r < 0 || (r && ratio && r != ratio))
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: %s.attention.compress_ratios: layers of different ratios are not "
                           "supported",
                           f->path, ar);
        if (r) ratio = r;
    }
    if (ratio && dense)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: %s.attention.compress_ratios: sparse and dense full-attention layers "
                       "together are not supported",
                       f->path, ar);
    json_object_set_new(o, "indexer_n_heads", json_integer(0));
    if (ratio) {
        json_object_set_new(o, "indexer_compress_ratio", json_integer(ratio));
        json_object_set_new(o, "indexer_kv_heads", json_integer(1));
        if ((st = put_u32(o, f, ar, "attention.indexer.head_count", "indexer_n_heads", 1, err)) ||
            (st = put_u32(o, f, ar, "attention.indexer.key_length", "indexer_head_dim", 1, err)) ||
            (st = put_u32(o, f, ar, "attention.indexer.top_k", "indexer_budget", 1, err)))
            return st;
    }
    const sl_gguf_kv *ple;
    if ((st = int_array(f, ar, "ple.layers", 0, 0, &ple, err))) return st;
    if (!ple || ple->n == 0) return SL_OK;
    if (ple->n != 1 || arr_at(ple, 0) < 0 || arr_at(ple, 0) >= nl)
        return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: %s.ple.layers: one layer index expected",
                       f->path, ar);
    json_t *ids = json_array();
    json_array_append_new(ids, json_integer(arr_at(ple, 0) + 1));
    json_object_set_new(o, "ple_layer_ids", ids);
    if ((st = put_u32(o, f, ar, "ple.ngram_size", "ngram_size", 1, err)) ||
        (st = put_u32(o, f, ar, "ple.heads_per_ngram", "heads_per_ngram", 1, err)) ||
        (st = put_u32(o, f, ar, "ple.conv_kernel", "ple_conv_kernel_size", 1, err)) ||
        (st = put_u32(o, f, ar, "ple.eos_token_id", "eos_token_id", 1, err)) ||
        (st = put_u32(o, f, ar, "embedding_length_per_layer_input", "ple_embed_dim", 1, err)))
        return st;
    const json_int_t heads = (json_integer_value(json_object_get(o, "ngram_size")) - 1) *
                             json_integer_value(json_object_get(o, "heads_per_ngram"));
    json_object_set_new(
        o, "ple_embed_dim",
        json_integer(heads * json_integer_value(json_object_get(o, "ple_embed_dim"))));
    /* The hash constants are the file's (ple.layer_multipliers, ...: sl_gguf_ckpt_open makes
     * them tensors), not derived; the table's rows, padded as the converter found them, are
     * the tensor's, which "divisible by" its own row count lets the family's check accept. */
    const sl_gguf_tensor *tb = find_in(parts, n_parts, "per_layer_token_embd.weight");
    if (!tb || tb->n_dims != 2)
        return sl_fail(err, SL_ERR_FORMAT, "%s: no 2-D tensor 'per_layer_token_embd.weight'",
                       f->path);
    json_object_set_new(o, "make_ngram_vocab_size_divisible_by", json_integer(tb->ne[1]));
    return SL_OK;
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
    /* The converter appends the MTP (next-token prediction) layers to the blocks by default:
     * a draft head, not a layer of the model. */
    char k[160];
    snprintf(k, sizeof k, "%s.nextn_predict_layers", ar);
    if (sl_gguf_find_kv(f, k)) {
        uint32_t mtp;
        const json_int_t all = json_integer_value(json_object_get(o, "num_hidden_layers"));
        if ((st = sl_gguf_get_u32(f, k, &mtp, err))) goto fail;
        if ((json_int_t)mtp >= all) {
            st = sl_fail(err, SL_ERR_FORMAT, "%s: %s = %u leaves no layer of the %lld blocks",
                         f->path, k, mtp, (long long)all);
            goto fail;
        }
        json_object_set_new(o, "num_hidden_layers", json_integer(all - mtp));
    }
    /* Key and value heads of one size: sluice's attention has one head_dim. */
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
    /* Rotated dims per head, as transformers' partial_rotary_factor (whose product with the head
     * size sluice truncates: the factor is nudged up so that it gives back the count). */
    snprintf(k, sizeof k, "%s.rope.dimension_count", ar);
    if (sl_gguf_find_kv(f, k) && json_object_get(o, "head_dim")) {
        uint32_t rd;
        if ((st = sl_gguf_get_u32(f, k, &rd, err))) goto fail;
        const json_int_t hd = json_integer_value(json_object_get(o, "head_dim"));
        if (rd < 2 || rd > hd) {
            st = sl_fail(err, SL_ERR_FORMAT, "%s: %s = %u is not in [2, head size %lld]", f->path,
                         k, rd, (long long)hd);
            goto fail;
        }
        double pf = (double)rd / (double)hd;
        while ((int32_t)((double)hd * pf) < (int32_t)rd)
            pf = nextafter(pf, 2.0);
        json_object_set_new(o, "partial_rotary_factor", json_real(pf));
    }
    if (a->hybrid && (st = hybrid_keys(o, f, ar, err))) goto fail;
    if (a->hyper && (st = hyper_keys(o, parts, n_parts, ar, err))) goto fail;
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
    if (!json_object_get(o, "eos_token_id") && sl_gguf_find_kv(f, "tokenizer.ggml.eos_token_id")) {
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

/* Qwen4-Exp's PLE hash constants: metadata arrays in GGUF, I64 buffers of a Hugging Face
 * checkpoint (which ple.c reads); they become tensors over the arrays' bytes. */
static const struct {
    const char *key, *hf;
} ple_consts[] = {
    {"ple.layer_multipliers", "layer_multipliers"},
    {"ple.head_offsets", "ngram_heads_offsets"},
    {"ple.head_vocab_sizes", "ngram_heads_vocab_sizes"},
};
#define N_PLE_CONSTS ((int32_t)(sizeof ple_consts / sizeof ple_consts[0]))

/* What the architecture's converter changed in the values (sl_ckpt's flags), and its PLE layer
 * with the constants' arrays (ple_layer -1: none). */
static sl_status arch_layout(sl_ckpt *ck, int32_t *ple_layer, const sl_gguf_kv **consts,
                             sl_error *err) {
    const sl_gguf_file *f = &ck->gguf[0];
    sl_gguf_str an;
    *ple_layer = -1;
    sl_status st = sl_gguf_get_str(f, "general.architecture", &an, err);
    if (st) return st;
    const gguf_arch *a = find_arch(an.s, an.len);
    if (!a || !a->hybrid) return SL_OK;
    ck->norm_folded = 1;
    ck->A_neg_exp = 1;
    ck->v_tiled = a->v_tiled;
    const sl_gguf_kv *ple;
    if (!a->hyper || (st = int_array(f, a->arch, "ple.layers", 0, 0, &ple, err)) || !ple ||
        ple->n != 1)
        return st;
    *ple_layer = (int32_t)SL_MIN(SL_MAX(arr_at(ple, 0), -1), INT32_MAX);
    for (int32_t i = 0; i < N_PLE_CONSTS; i++) {
        char k[160];
        snprintf(k, sizeof k, "%s.%s", a->arch, ple_consts[i].key);
        if (!(consts[i] = sl_gguf_find_kv(f, k))) continue; /* ple.c says which it misses */
        if (consts[i]->type != SL_GGUF_ARRAY ||
            (consts[i]->arr_type != SL_GGUF_U64 && consts[i]->arr_type != SL_GGUF_I64))
            return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is not an array of 64-bit integers",
                           f->path, k);
    }
    return SL_OK;
}

/* The Hugging Face view of a GGUF tensor: dimensions reversed (GGUF lists them innermost
 * first, nn.Linear's [out, in] is the reverse), and the shapes the families bind where the
 * converter squeezed one. */
static void hf_view(sl_tensor *v, const sl_gguf_tensor *g, const char *name) {
    v->dtype = g->dtype;
    v->data = g->data;
    v->nbytes = (size_t)g->nbytes;
    v->ndim = g->n_dims;
    for (int32_t d = 0; d < g->n_dims; d++)
        v->shape[d] = g->ne[g->n_dims - 1 - d];
    const size_t nl = strlen(name);
    const char *gate = "shared_expert_gate.weight", *conv = "conv1d.weight";
    /* The shared expert's gate is a vector in GGUF, a [1, H] Linear in Hugging Face. */
    if (g->n_dims == 1 && nl > strlen(gate) && strcmp(name + nl - strlen(gate), gate) == 0) {
        v->ndim = 2;
        v->shape[1] = v->shape[0];
        v->shape[0] = 1;
    }
    /* A depthwise conv's [C, K] is nn.Conv1d's [C, 1, K]. */
    if (g->n_dims == 2 && nl > strlen(conv) && strcmp(name + nl - strlen(conv), conv) == 0) {
        v->ndim = 3;
        v->shape[2] = v->shape[1];
        v->shape[1] = 1;
    }
}

sl_status sl_gguf_ckpt_open(sl_ckpt *ck, const char *path, sl_error *err) {
    sl_status st = open_parts(ck, path, err);
    if (st) return st;
    int32_t ple_layer;
    const sl_gguf_kv *consts[N_PLE_CONSTS] = {0};
    if ((st = arch_layout(ck, &ple_layer, consts, err))) return st;
    int64_t total = 0;
    size_t name_bytes = 0;
    char name[256];
    for (int32_t p = 0; p < ck->n_gguf; p++)
        for (int64_t i = 0; i < ck->gguf[p].n_tensors; i++) {
            const sl_gguf_tensor *t = &ck->gguf[p].tensors[i];
            if (!hf_name(t->name, ple_layer, name, sizeof name))
                snprintf(name, sizeof name, "%s", t->name);
            name_bytes += strlen(name) + 1;
            total++;
        }
    for (int32_t i = 0; i < N_PLE_CONSTS; i++)
        if (consts[i]) {
            name_bytes +=
                (size_t)snprintf(name, sizeof name, "model.layers.%d.ple.ple_embedding.%s",
                                 ple_layer, ple_consts[i].hf) +
                1;
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
            if (!hf_name(g->name, ple_layer, name, sizeof name))
                snprintf(name, sizeof name, "%s", g->name);
            strcpy(np, name);
            v->name = np;
            np += strlen(name) + 1;
            hf_view(v, g, name);
            ck->entries[ck->n_entries++] = (sl_ckpt_entry){v, p, g->name};
        }
    for (int32_t i = 0; i < N_PLE_CONSTS; i++) {
        if (!consts[i]) continue;
        sl_tensor *v = &ck->views[ck->n_entries];
        v->name = np;
        np += sprintf(np, "model.layers.%d.ple.ple_embedding.%s", ple_layer, ple_consts[i].hf) + 1;
        v->dtype = SL_DTYPE_I64;
        v->ndim = 1;
        v->shape[0] = (int64_t)consts[i]->n;
        v->data = consts[i]->val;
        v->nbytes = (size_t)consts[i]->n * 8;
        ck->entries[ck->n_entries++] = (sl_ckpt_entry){v, 0, consts[i]->key};
    }
    return SL_OK;
}
