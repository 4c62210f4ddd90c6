/*
 * Tokenizer from GGUF metadata. llama.cpp's converter (convert_hf_to_gguf.py) flattens a
 * Hugging Face tokenizer into these keys:
 *
 *   tokenizer.ggml.model       "gpt2": byte-level BPE; "llama": SentencePiece-style BPE
 *   tokenizer.ggml.pre         gpt2: the pre-tokenizer (and normalizer) by name
 *   tokenizer.ggml.tokens      [n] id -> text as the vocabulary writes it ("Ġthe", "▁the",
 *                              "<0x0A>"); added tokens as plain (decoded) text
 *   tokenizer.ggml.token_type  [n] 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused
 *                              (padding up to the model's row count), 6 byte
 *   tokenizer.ggml.merges      [m] "left right", highest priority first (gpt2)
 *   tokenizer.ggml.scores      [n] f32 piece scores (llama: the merge order follows from them)
 *   tokenizer.ggml.*_token_id  bos, eos, eot, eom, unknown, padding, ...: ids below n
 *   tokenizer.ggml.add_bos_token, add_eos_token; add_space_prefix (llama)
 *   tokenizer.huggingface.json the whole tokenizer.json, where a converter kept it
 *
 * Rather than a second loader, this file writes back the tokenizer.json document the keys
 * came from and hands it to tokenizer.c, so both paths share every rule:
 *
 *   tokens, types -> model.vocab {text: id}, unused and empty tokens left out (tokenizer.json
 *                    has no such ids); control and unknown tokens also as special
 *                    added_tokens, user-defined ones as non-special added_tokens, all matched
 *                    on their raw text (the converter stores them decoded)
 *   merges        -> model.merges; for "llama" without merges, derived from the scores the
 *                    way Hugging Face's SentencePiece converter does: every split of a normal
 *                    piece into two vocabulary pieces, by the piece's score (highest first),
 *                    then by piece id, then by the two halves' ids
 *   pre           -> normalizer, pre_tokenizer and model.ignore_merges, from the table below
 *                    of what each name stands for
 *
 * What the arrays cannot say is lost in the conversion, not here: the converter marks an added
 * token that only looks special ("<|fim_prefix|>", "special": false in Qwen3's
 * tokenizer.json) as control, so under SL_TOK_NO_SPECIAL its text stays text where the
 * tokenizer.json would still match it.
 *
 * Every array length, element type, id and merge is checked here first, so that an error names
 * the file and the key (tokenizer.c's own checks would name the JSON that was never a file).
 */
#include <jansson.h>
#include <math.h>
#include <utf8proc.h>

#include "core/common.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

/* gguf-py's TokenType */
enum {
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

/* ---- pre-tokenizers by name ------------------------------------------------------------- */

/*
 * What a tokenizer.ggml.pre name stands for: the normalizer, pre-tokenizer and ignore_merges of
 * the tokenizer.json files the converter gives that name (it recognises a tokenizer by how it
 * splits a test text). Split regexes run in order, each as a Split(behavior "Isolated") over the
 * pieces of the one before, then ByteLevel without its own regex; gpt2_split instead means
 * ByteLevel with its built-in GPT-2 regex. Regexes are the ones those tokenizer.json files
 * hold, as tokenizer.c compiles them (PCRE2; \s as Unicode White_Space).
 */
typedef struct pretok_def {
    const char *names[4]; /* the name and its aliases */
    int32_t nfc;
    int32_t ignore_merges;
    int32_t gpt2_split;
    const char *split[5]; /* NULL-terminated */
} pretok_def;

static const pretok_def PRETOKS[] = {
    /* Qwen2, Qwen2.5, Qwen3 (and the DeepSeek-R1 distills of Qwen): NFC, one Split */
    {.names = {"qwen2", "deepseek-r1-qwen"},
     .nfc = 1,
     .split = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* Qwen3.5: letters take their combining marks; no normalizer */
    {.names = {"qwen35"},
     .split = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
               "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* Llama 3: digits in threes; a word found whole in the vocabulary skips the merges */
    {.names = {"llama3", "llama-bpe", "llama-v3"},
     .ignore_merges = 1,
     .split = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    /* GPT-2: ByteLevel's own regex, nothing else */
    {.names = {"gpt-2"}, .gpt2_split = 1},
    /* DeepSeek V3: digits in threes, CJK runs, then the rest (its normalizer is an empty
     * Sequence) */
    {.names = {"deepseek-v3"},
     .split = {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
               "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?["
               "\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    /* llama.cpp's own fallback (no tokenizer.json has it): what llama.cpp runs for a file
     * that names it, so that such a file tokenizes as it does there */
    {.names = {"default"},
     .split = {"[\\p{P}\\$\\+<=>\\^~\\|]+",
               "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
               "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static const pretok_def *pretok_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof PRETOKS / sizeof PRETOKS[0]; i++)
        for (int k = 0; k < 4 && PRETOKS[i].names[k]; k++)
            if (strlen(PRETOKS[i].names[k]) == len && !memcmp(PRETOKS[i].names[k], name, len))
                return &PRETOKS[i];
    return NULL;
}

/* ---- checked reading ---------------------------------------------------------------------- */

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t a =
            utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (a <= 0 || cp == 0) return 0;
        i += (size_t)a;
    }
    return 1;
}

/* An optional integer array of n elements (any integer element type). */
static sl_status int_array(const sl_gguf_file *f, const char *key, uint64_t n,
                           const sl_gguf_kv **out, sl_error *err) {
    const sl_gguf_kv *kv = sl_gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) return SL_OK;
    const uint32_t t = kv->arr_type;
    if (kv->type != SL_GGUF_ARRAY || t == SL_GGUF_F32 || t == SL_GGUF_F64 || t == SL_GGUF_BOOL ||
        t == SL_GGUF_STRING)
        return sl_fail(err, SL_ERR_FORMAT, "%s: key '%s' is not an array of integers", f->path,
                       key);
    if (kv->n != n)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: key '%s' has %llu elements but tokenizer.ggml.tokens has %llu", f->path,
                       key, (unsigned long long)kv->n, (unsigned long long)n);
    *out = kv;
    return SL_OK;
}

/* An optional token id: *id = -1 when absent, else an integer in [0, n). */
static sl_status opt_id(const sl_gguf_file *f, const char *key, uint64_t n, int32_t *id,
                        sl_error *err) {
    *id = -1;
    if (!sl_gguf_find_kv(f, key)) return SL_OK;
    int64_t v;
    sl_status st = sl_gguf_get_i64(f, key, &v, err);
    if (st) return st;
    if (v < 0 || (uint64_t)v >= n)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: key '%s' = %lld is not a token id (tokenizer.ggml.tokens has %llu)",
                       f->path, key, (long long)v, (unsigned long long)n);
    *id = (int32_t)v;
    return SL_OK;
}

/* An optional bool: dflt when absent. */
static sl_status opt_bool(const sl_gguf_file *f, const char *key, int32_t dflt, int32_t *out,
                          sl_error *err) {
    *out = dflt;
    return sl_gguf_find_kv(f, key) ? sl_gguf_get_bool(f, key, out, err) : SL_OK;
}

/* The special-token id keys the converter writes; each one present must be an id. */
static const char *const ID_KEYS[] = {
    "tokenizer.ggml.bos_token_id",       "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",       "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",   "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.mask_token_id",
};

/* ---- the document ------------------------------------------------------------------------- */

/* What is read once and used by several steps. */
typedef struct gg_tok {
    const sl_gguf_file *f;
    const sl_gguf_kv *tokens, *types;
    uint64_t n;
    json_t *vocab; /* text -> id (owned by the document) */
    char *scratch; /* NUL-terminated copies for jansson */
    size_t scratch_cap;
} gg_tok;

static int tok_type(const gg_tok *g, uint64_t i) {
    return g->types ? (int)sl_gguf_arr_int(g->types, i) : TT_NORMAL;
}

/* s[0..n) NUL-terminated in the scratch buffer (NULL when out of memory). */
static const char *cstr(gg_tok *g, const char *s, size_t n) {
    if (n + 1 > g->scratch_cap) {
        size_t cap = SL_MAX(n + 1, 2 * g->scratch_cap);
        char *p = realloc(g->scratch, cap);
        if (!p) return NULL;
        g->scratch = p;
        g->scratch_cap = cap;
    }
    memcpy(g->scratch, s, n);
    g->scratch[n] = '\0';
    return g->scratch;
}

/* Id of the vocabulary entry s[0..n), -1 if none, -2 out of memory. */
static int64_t vocab_id(gg_tok *g, const char *s, size_t n) {
    const char *c = cstr(g, s, n);
    if (!c) return -2;
    json_t *v = json_object_get(g->vocab, c);
    return v ? json_integer_value(v) : -1;
}

static int set_new(json_t *o, const char *key, json_t *v) {
    return !v || json_object_set_new(o, key, v);
}

/* model.vocab and added_tokens from tokens + token_type. */
static sl_status build_vocab(gg_tok *g, json_t *added, sl_error *err) {
    const char *path = g->f->path;
    for (uint64_t i = 0; i < g->n; i++) {
        const int type = tok_type(g, i);
        if (type < TT_NORMAL || type > TT_BYTE)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.token_type[%llu] = %d is not a token type (1 to 6)",
                           path, (unsigned long long)i, type);
        const sl_gguf_str s = sl_gguf_arr_str(g->tokens, i);
        if (type == TT_UNUSED || s.len == 0) continue;
        if (!valid_utf8(s.s, (size_t)s.len))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.tokens[%llu] is not valid UTF-8 (or holds a NUL)",
                           path, (unsigned long long)i);
        const int64_t dup = vocab_id(g, s.s, (size_t)s.len);
        if (dup == -2) return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
        if (dup >= 0)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.tokens[%llu] \"%.60s\" repeats tokens[%lld]", path,
                           (unsigned long long)i, g->scratch, (long long)dup);
        if (set_new(g->vocab, g->scratch, json_integer((json_int_t)i)))
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
        if (type != TT_CONTROL && type != TT_UNKNOWN && type != TT_USER_DEFINED) continue;
        json_t *a = json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i,
                              "content", s.s, (size_t)s.len, "single_word", 0, "lstrip", 0,
                              "rstrip", 0, "normalized", 0, "special", type != TT_USER_DEFINED);
        if (!a || json_array_append_new(added, a))
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    }
    if (json_object_size(g->vocab) == 0)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tokenizer.ggml.tokens holds no usable token", path);
    return SL_OK;
}

/* model.merges from tokenizer.ggml.merges: "left right", all three tokens in the vocabulary. */
static sl_status copy_merges(gg_tok *g, const sl_gguf_kv *kv, json_t *merges, sl_error *err) {
    const char *path = g->f->path;
    for (uint64_t i = 0; i < kv->n; i++) {
        const sl_gguf_str m = sl_gguf_arr_str(kv, i);
        const char *sp = memchr(m.s, ' ', (size_t)m.len);
        const size_t la = sp ? (size_t)(sp - m.s) : 0, lb = sp ? (size_t)m.len - la - 1 : 0;
        if (!sp || la == 0 || lb == 0 || memchr(sp + 1, ' ', lb) || !valid_utf8(m.s, m.len))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.merges[%llu] \"%.*s\" is not \"left right\"", path,
                           (unsigned long long)i, (int)SL_MIN(m.len, 60), m.s);
        const int64_t a = vocab_id(g, m.s, la), b = vocab_id(g, sp + 1, lb);
        int64_t c = -1;
        if (a >= 0 && b >= 0) {
            /* the merged text: the two halves without the space */
            const char *t = cstr(g, m.s, (size_t)m.len);
            if (t) {
                memmove(g->scratch + la, g->scratch + la + 1, lb + 1);
                json_t *v = json_object_get(g->vocab, g->scratch);
                c = v ? json_integer_value(v) : -1;
            } else {
                c = -2;
            }
        }
        if (a == -2 || b == -2 || c == -2)
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
        if (a < 0 || b < 0 || c < 0)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.merges[%llu] \"%.*s\": the %s is not in "
                           "tokenizer.ggml.tokens",
                           path, (unsigned long long)i, (int)SL_MIN(m.len, 60), m.s,
                           a < 0   ? "left token"
                           : b < 0 ? "right token"
                                   : "merged token");
        if (json_array_append_new(merges, json_stringn(m.s, (size_t)m.len)))
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    }
    return SL_OK;
}

typedef struct sp_merge {
    float score; /* of the merged piece */
    int32_t id, left, right;
} sp_merge;

static int sp_merge_cmp(const void *pa, const void *pb) {
    const sp_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* model.merges of a SentencePiece vocabulary, from tokenizer.ggml.scores (see the top). */
static sl_status derive_merges(gg_tok *g, json_t *merges, sl_error *err) {
    const char *path = g->f->path;
    const sl_gguf_kv *sc;
    sl_status st = sl_gguf_get_arr(g->f, "tokenizer.ggml.scores", SL_GGUF_F32, &sc, err);
    if (st) return st;
    if (sc->n != g->n)
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: key 'tokenizer.ggml.scores' has %llu elements but "
                       "tokenizer.ggml.tokens has %llu",
                       path, (unsigned long long)sc->n, (unsigned long long)g->n);
    sp_merge *m = NULL;
    size_t nm = 0, cap = 0;
    for (uint64_t i = 0; i < g->n && !st; i++) {
        const sl_gguf_str s = sl_gguf_arr_str(g->tokens, i);
        const float score = (float)sl_gguf_arr_float(sc, i);
        if (!isfinite(score)) {
            st = sl_fail(err, SL_ERR_FORMAT, "%s: tokenizer.ggml.scores[%llu] is not finite", path,
                         (unsigned long long)i);
            break;
        }
        if (tok_type(g, i) != TT_NORMAL || s.len < 2) continue;
        /* every split at a character boundary into two vocabulary pieces */
        for (size_t k = 1; k < s.len && !st; k++) {
            if (((uint8_t)s.s[k] & 0xc0) == 0x80) continue;
            const int64_t l = vocab_id(g, s.s, k), r = vocab_id(g, s.s + k, (size_t)s.len - k);
            if (l == -2 || r == -2) st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
            if (st || l < 0 || r < 0) continue;
            if (nm == cap) {
                cap = cap ? 2 * cap : 4096;
                sp_merge *p = realloc(m, cap * sizeof *m);
                if (!p) {
                    st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
                    break;
                }
                m = p;
            }
            m[nm++] = (sp_merge){score, (int32_t)i, (int32_t)l, (int32_t)r};
        }
    }
    if (!st) qsort(m, nm, sizeof *m, sp_merge_cmp);
    for (size_t i = 0; i < nm && !st; i++) {
        const sl_gguf_str a = sl_gguf_arr_str(g->tokens, (uint64_t)m[i].left);
        const sl_gguf_str b = sl_gguf_arr_str(g->tokens, (uint64_t)m[i].right);
        /* the pair form: a piece may hold a space */
        json_t *p = json_pack("[s%, s%]", a.s, (size_t)a.len, b.s, (size_t)b.len);
        if (!p || json_array_append_new(merges, p))
            st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    }
    free(m);
    return st;
}

/* normalizer, pre_tokenizer, decoder and the model's options of a byte-level vocabulary. */
static sl_status gpt2_parts(gg_tok *g, json_t *root, json_t *model, sl_error *err) {
    const char *path = g->f->path;
    if (!sl_gguf_find_kv(g->f, "tokenizer.ggml.pre"))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: no tokenizer.ggml.pre: the file does not say how to pre-tokenize "
                       "(llama.cpp guesses 'default'; convert the model again with a current "
                       "convert_hf_to_gguf.py)",
                       path);
    sl_gguf_str pre;
    sl_status st = sl_gguf_get_str(g->f, "tokenizer.ggml.pre", &pre, err);
    if (st) return st;
    const pretok_def *d = pretok_find(pre.s, (size_t)pre.len);
    if (!d)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.pre '%.*s' is not a pre-tokenizer sluice knows "
                       "(qwen2, qwen35, llama3, llama-bpe, gpt-2, deepseek-v3, default)",
                       path, (int)SL_MIN(pre.len, 60), pre.s);
    json_t *steps = json_array();
    int bad = !steps;
    for (int k = 0; !bad && d->split[k]; k++)
        bad = json_array_append_new(steps, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split",
                                                     "pattern", "Regex", d->split[k], "behavior",
                                                     "Isolated", "invert", 0));
    if (!bad)
        bad = json_array_append_new(steps, json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                                     "add_prefix_space", 0, "trim_offsets", 0,
                                                     "use_regex", d->gpt2_split));
    bad =
        bad ||
        set_new(root, "normalizer", d->nfc ? json_pack("{s:s}", "type", "NFC") : json_null()) ||
        set_new(root, "pre_tokenizer",
                json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", json_incref(steps))) ||
        set_new(root, "decoder", json_pack("{s:s}", "type", "ByteLevel")) ||
        set_new(model, "ignore_merges", json_boolean(d->ignore_merges));
    json_decref(steps);
    return bad ? sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path) : SL_OK;
}

/* add_bos_token: the post-processor Hugging Face's converted tokenizers carry for it, the
 * bos token before a single text (and before each of a pair). */
static sl_status bos_processor(gg_tok *g, json_t *root, int32_t bos, sl_error *err) {
    const sl_gguf_str s = sl_gguf_arr_str(g->tokens, (uint64_t)bos);
    const char *text = cstr(g, s.s, (size_t)s.len);
    json_t *pp =
        text ? json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, "
                         "{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, "
                         "s:[i], s:[s]}}}",
                         "type", "TemplateProcessing", "single", "SpecialToken", "id", text,
                         "type_id", 0, "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken",
                         "id", text, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                         "SpecialToken", "id", text, "type_id", 1, "Sequence", "id", "B", "type_id",
                         1, "special_tokens", text, "id", text, "ids", bos, "tokens", text)
             : NULL;
    return set_new(root, "post_processor", pp)
               ? sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", g->f->path)
               : SL_OK;
}

/* The same for a SentencePiece vocabulary: Hugging Face's layout for Llama 2 (Prepend("▁") and
 * Replace(" " -> "▁") as the normalizer, no pre-tokenizer, byte fallback, the decoder's Strip of
 * the space it prepended). */
static sl_status llama_parts(gg_tok *g, json_t *root, json_t *model, int32_t unk_id,
                             sl_error *err) {
    const char *path = g->f->path;
    int32_t prefix, extra_ws;
    sl_status st = opt_bool(g->f, "tokenizer.ggml.add_space_prefix", 1, &prefix, err);
    if (!st) st = opt_bool(g->f, "tokenizer.ggml.remove_extra_whitespaces", 0, &extra_ws, err);
    if (st) return st;
    if (extra_ws)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.remove_extra_whitespaces is not supported", path);
    if (sl_gguf_find_kv(g->f, "tokenizer.ggml.precompiled_charsmap"))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.precompiled_charsmap (a SentencePiece normalizer) is "
                       "not supported",
                       path);
    int32_t byte_fallback = 0;
    for (uint64_t i = 0; i < g->n && !byte_fallback; i++)
        byte_fallback = tok_type(g, i) == TT_BYTE;
    if (unk_id < 0)
        for (uint64_t i = 0; i < g->n && unk_id < 0; i++)
            if (tok_type(g, i) == TT_UNKNOWN) unk_id = (int32_t)i;
    if (unk_id >= 0) {
        const sl_gguf_str u = sl_gguf_arr_str(g->tokens, (uint64_t)unk_id);
        if (u.len == 0 || tok_type(g, (uint64_t)unk_id) == TT_UNUSED)
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: tokenizer.ggml.unknown_token_id %d is an unused or empty token",
                           path, unk_id);
        if (set_new(model, "unk_token", json_stringn(u.s, (size_t)u.len)))
            return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path);
    }
    const char *sp = "\xe2\x96\x81"; /* U+2581 */
    json_t *norm = json_array(), *dec = json_array();
    int bad = !norm || !dec;
    if (!bad && prefix)
        bad =
            json_array_append_new(norm, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", sp));
    if (!bad)
        bad = json_array_append_new(norm, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace",
                                                    "pattern", "String", " ", "content", sp));
    if (!bad)
        bad = json_array_append_new(dec, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace",
                                                   "pattern", "String", sp, "content", " ")) ||
              json_array_append_new(dec, json_pack("{s:s}", "type", "ByteFallback")) ||
              json_array_append_new(dec, json_pack("{s:s}", "type", "Fuse"));
    if (!bad && prefix)
        bad = json_array_append_new(dec, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip",
                                                   "content", " ", "start", 1, "stop", 0));
    bad = bad ||
          set_new(root, "normalizer",
                  json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", json_incref(norm))) ||
          set_new(root, "pre_tokenizer", json_null()) ||
          set_new(root, "decoder",
                  json_pack("{s:s, s:o}", "type", "Sequence", "decoders", json_incref(dec))) ||
          set_new(model, "byte_fallback", json_boolean(byte_fallback)) ||
          set_new(model, "fuse_unk", json_true());
    json_decref(norm);
    json_decref(dec);
    return bad ? sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", path) : SL_OK;
}

/* The document a converter kept whole in tokenizer.huggingface.json. */
static sl_status from_hf_json(const sl_gguf_file *f, json_t **doc, sl_error *err) {
    sl_gguf_str s;
    sl_status st = sl_gguf_get_str(f, "tokenizer.huggingface.json", &s, err);
    if (st) return st;
    json_error_t je;
    if (!(*doc = json_loadb(s.s, (size_t)s.len, 0, &je)))
        return sl_fail(err, SL_ERR_FORMAT, "%s: tokenizer.huggingface.json: line %d: %s", f->path,
                       je.line, je.text);
    return SL_OK;
}

sl_status sl_tokenizer_load_gguf(const sl_gguf_file *f, sl_tokenizer **out, sl_error *err) {
    *out = NULL;
    json_t *doc = NULL;
    sl_status st = sl_tokenizer_json_from_gguf(f, &doc, err);
    if (st) return st;
    char name[4096];
    if (sl_gguf_find_kv(f, "tokenizer.huggingface.json"))
        snprintf(name, sizeof name, "%s: tokenizer.huggingface.json", f->path);
    else
        snprintf(name, sizeof name, "%s", f->path);
    st = sl_tokenizer_from_json(doc, name, out, err);
    json_decref(doc);
    return st;
}

sl_status sl_tokenizer_json_from_gguf(const sl_gguf_file *f, json_t **doc, sl_error *err) {
    *doc = NULL;
    /* the original document, where a converter kept it, says everything the arrays do not */
    if (sl_gguf_find_kv(f, "tokenizer.huggingface.json")) return from_hf_json(f, doc, err);
    sl_gguf_str mname;
    sl_status st = sl_gguf_get_str(f, "tokenizer.ggml.model", &mname, err);
    if (st) return st;
    const int sp = mname.len == 5 && !memcmp(mname.s, "llama", 5);
    if (!sp && !(mname.len == 4 && !memcmp(mname.s, "gpt2", 4)))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2: byte-level BPE; "
                       "llama: SentencePiece BPE)",
                       f->path, (int)SL_MIN(mname.len, 60), mname.s);
    gg_tok g = {.f = f};
    st = sl_gguf_get_arr(f, "tokenizer.ggml.tokens", SL_GGUF_STRING, &g.tokens, err);
    if (st) return st;
    g.n = g.tokens->n;
    if (g.n == 0 || g.n >= INT32_MAX / 2)
        return sl_fail(err, SL_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu tokens", f->path,
                       (unsigned long long)g.n);
    if ((st = int_array(f, "tokenizer.ggml.token_type", g.n, &g.types, err))) return st;
    int32_t ids[sizeof ID_KEYS / sizeof ID_KEYS[0]], add_bos, flag;
    for (size_t k = 0; k < sizeof ID_KEYS / sizeof ID_KEYS[0]; k++)
        if ((st = opt_id(f, ID_KEYS[k], g.n, &ids[k], err))) return st;
    if ((st = opt_bool(f, "tokenizer.ggml.add_bos_token", 0, &add_bos, err)) ||
        (st = opt_bool(f, "tokenizer.ggml.add_eos_token", 0, &flag, err)))
        return st;
    const sl_gguf_kv *mkv = sl_gguf_find_kv(f, "tokenizer.ggml.merges");
    if (mkv && (st = sl_gguf_get_arr(f, "tokenizer.ggml.merges", SL_GGUF_STRING, &mkv, err)))
        return st;

    json_t *root = json_object(), *model = json_object(), *added = json_array();
    json_t *merges = json_array();
    g.vocab = json_object();
    if (!root || !model || !added || !merges || !g.vocab ||
        set_new(model, "type", json_string("BPE")) || json_object_set(model, "vocab", g.vocab) ||
        json_object_set(model, "merges", merges) || json_object_set(root, "model", model) ||
        json_object_set(root, "added_tokens", added))
        st = sl_fail(err, SL_ERR_NOMEM, "%s: out of memory", f->path);
    if (!st) st = build_vocab(&g, added, err);
    if (!st && mkv) st = copy_merges(&g, mkv, merges, err);
    if (!st && !mkv && sp) st = derive_merges(&g, merges, err);
    if (!st) st = sp ? llama_parts(&g, root, model, ids[4], err) : gpt2_parts(&g, root, model, err);
    if (!st && add_bos && ids[0] >= 0) st = bos_processor(&g, root, ids[0], err);
    json_decref(g.vocab);
    json_decref(merges);
    json_decref(added);
    json_decref(model);
    free(g.scratch);
    if (st)
        json_decref(root);
    else
        *doc = root;
    return st;
}
