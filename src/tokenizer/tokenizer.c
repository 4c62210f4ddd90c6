/*
 * Byte-level BPE tokenizer read from a Hugging Face tokenizer.json.
 *
 * Libraries: jansson (JSON), PCRE2 (the pre-tokenizer's Split regex, with
 * UTF-8, Unicode properties and JIT), utf8proc (NFC). The vocabulary and merge
 * tables are two small open-addressing hash tables (linear probing, FNV-1a for
 * strings, a splitmix64 finaliser for id pairs): they are built once at load
 * and only looked up after, which is all the code a general-purpose hash
 * library would bring.
 *
 * Layout of the loaded tables:
 *
 *   id -> byte-level string  (tok_off/tok_len into `strs`, "Ġthe")   token_to_id, merges
 *   id -> raw bytes          (raw_off/raw_len into `raws`, " the")   decode
 *   string -> id             (vocab_map: slot = id, -1 empty)
 *   (left id, right id) -> (rank, merged id)                         BPE
 *   byte -> id of its GPT-2 alphabet character                      BPE start symbols
 */
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/common.h"
#include "format/gguf.h"

/* ---- small helpers ----------------------------------------------------------- */

typedef struct tk_buf {
    char *data;
    size_t n, cap;
} tk_buf;

static int bytes_reserve(tk_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static int bytes_append(tk_buf *b, const void *p, size_t n) {
    if (bytes_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->n, p, n);
    b->n += n;
    b->data[b->n] = '\0';
    return 0;
}

void sl_token_ids_free(sl_token_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static int ids_push(sl_token_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* ---- UTF-8 ------------------------------------------------------------------ */

/*
 * Classifies the bytes at p (n > 0 available) per the Unicode table of
 * well-formed UTF-8: returns 1 for a complete character of *adv bytes, 0 for a
 * valid but truncated prefix (*adv bytes present), -1 for an invalid sequence
 * whose maximal subpart is *adv bytes (what from_utf8_lossy replaces by one
 * U+FFFD).
 */
static int utf8_check(const uint8_t *p, size_t n, size_t *adv) {
    uint8_t c = p[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c < 0x80) {
        *adv = 1;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *adv = 1;
        return -1;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *adv = k;
            return 0;
        }
        uint8_t b = p[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (b < l || b > h) {
            *adv = k;
            return -1;
        }
    }
    *adv = need;
    return 1;
}

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd};

/* Appends p[0..n) to out with invalid sequences replaced by U+FFFD. When final
 * is 0, a truncated character at the end is not consumed: returns how many
 * bytes were consumed. */
static size_t utf8_lossy_append(tk_buf *out, const uint8_t *p, size_t n, int final, int *oom) {
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int r = utf8_check(p + i, n - i, &adv);
        if (r == 0 && !final) break;
        if (r == 1) {
            size_t j = i + adv; /* copy a whole valid run at once */
            while (j < n && r == 1) {
                size_t a2;
                r = utf8_check(p + j, n - j, &a2);
                if (r == 1) j += a2;
            }
            if (bytes_append(out, p + i, j - i)) *oom = 1;
            i = j;
        } else {
            if (bytes_append(out, REPLACEMENT, 3)) *oom = 1;
            i += adv;
        }
    }
    return i;
}

/* ---- tokenizer --------------------------------------------------------------- */

typedef struct sl_added_token {
    int32_t id;
    int32_t special, normalized;
    char *content;
    size_t len;
} sl_added_token;

typedef struct sl_merge_slot {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} sl_merge_slot;

/* One step of the pre-tokenizer chain: a regex split ("Isolated") or nothing. */
typedef struct sl_pretok_step {
    pcre2_code *re; /* NULL: this step does not split (ByteLevel, use_regex false) */
} sl_pretok_step;

#define SL_MAX_PRETOK 8
#define SL_MAX_NORM   8

/* One normalizer step, applied in order: NFC, Prepend(a), Replace(String a -> b). */
enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE };
typedef struct sl_norm_step {
    int32_t kind;
    char *a, *b;
    size_t la, lb;
} sl_norm_step;

struct sl_tokenizer {
    int32_t n_ids; /* one past the largest id */

    char *strs; /* byte-level strings of vocab entries, NUL-separated */
    int64_t *tok_off;
    int32_t *tok_len; /* [n_ids]; -1 where no vocab entry */

    char *raws; /* decoded bytes of every id (vocab and added) */
    int64_t *raw_off;
    int32_t *raw_len; /* [n_ids]; -1 where the id does not exist */
    uint8_t *special; /* [n_ids] */

    int32_t *vocab_map; /* [vocab_mask + 1] ids */
    size_t vocab_mask;

    sl_merge_slot *merges; /* [merge_mask + 1] */
    size_t merge_mask;

    int32_t byte_id[256]; /* id of each byte's alphabet character; -1 if missing */
    int32_t unk_id;       /* -1: unknown symbols are dropped, as tokenizers does */
    int32_t ignore_merges;
    int32_t fuse_unk;

    sl_added_token *added;
    int32_t n_added;
    int32_t has_normalized_added, has_raw_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */

    sl_norm_step norm[SL_MAX_NORM];
    int32_t n_norm;

    /* what tokenizer(text) puts before a single text: the post-processor's special tokens
     * (Llama-4's <|begin_of_text|>, Mixtral's <s>), or tokenizer_config.json's add_bos_token */
    int32_t bos_ids[SL_TOK_MAX_BOS];
    int32_t n_bos;

    /* SentencePiece-style BPE (Llama 2 / Mistral): vocab written with U+2581 for
     * spaces, start symbols are characters, unknown ones become <0xXX> tokens
     * (byte_fallback); decoder Replace(U+2581 -> " "), ByteFallback, Fuse, Strip. */
    int32_t sp;
    int32_t byte_fallback;
    int32_t byte_tok[256]; /* id of <0xXX>; -1 if missing */
    int16_t *byte_val;     /* [n_ids] byte of a <0xXX> token for ByteFallback, else -1 */
    int32_t strip_start;   /* decoder Strip: leading spaces removed */

    int32_t add_prefix_space;
    /* Metaspace pre-tokenizer (SentencePiece style): spaces -> ms_rep, then a
     * prepended ms_rep (never / always / only on the text's first piece), then
     * optionally a split before every ms_rep */
    int32_t metaspace, ms_prepend, ms_split;
    char ms_rep[8];
    size_t ms_rep_len;
    sl_pretok_step steps[SL_MAX_PRETOK];
    int32_t n_steps;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * others to U+0100 onwards in byte order. */
static void byte_alphabet(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable =
            (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int32_t vocab_lookup(const sl_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_map) return -1;
    size_t i = fnv1a(s, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_map[i];
        if (id < 0) return -1;
        if ((size_t)t->tok_len[id] == n && memcmp(t->strs + t->tok_off[id], s, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

static const sl_merge_slot *merge_lookup(const sl_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = mix64(key) & t->merge_mask;
    for (;;) {
        const sl_merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

void sl_tokenizer_free(sl_tokenizer *t) {
    if (!t) return;
    free(t->strs);
    free(t->tok_off);
    free(t->tok_len);
    free(t->raws);
    free(t->raw_off);
    free(t->raw_len);
    free(t->special);
    free(t->byte_val);
    for (int32_t i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->vocab_map);
    free(t->merges);
    for (int32_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    for (int32_t i = 0; i < t->n_steps; i++)
        pcre2_code_free(t->steps[i].re);
    free(t);
}

/* ---- loading ------------------------------------------------------------------ */

/* Unicode White_Space, which is what `\s` means to the Rust tokenizers
 * (Oniguruma): PCRE2's own \s under UCP is close but not guaranteed equal, so
 * the pattern is rewritten to this explicit class before compiling. */
#define WS_CLASS                                                                                   \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"          \
    "\\x{205F}\\x{3000}"

static sl_status rewrite_pattern(const char *pat, tk_buf *out, const char *path, sl_error *err) {
    int in_class = 0;
    size_t n = strlen(pat);
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        int fail = 0;
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            if (e == 's')
                fail = bytes_append(out, in_class ? WS_CLASS : "[" WS_CLASS "]",
                                    strlen(WS_CLASS) + (in_class ? 0 : 2));
            else if (e == 'S' && !in_class)
                fail = bytes_append(out, "[^" WS_CLASS "]", strlen(WS_CLASS) + 3);
            else if (e == 'S')
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: pre-tokenizer regex uses \\S inside a character class", path);
            else if (e == 'h' || e == 'H')
                /* Oniguruma's \h is a hex digit, PCRE2's a horizontal space */
                return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: pre-tokenizer regex uses \\%c", path,
                               e);
            else {
                char two[2] = {'\\', e};
                fail = bytes_append(out, two, 2);
            }
        } else {
            if (c == '[' && !in_class) {
                in_class = 1;
                fail = bytes_append(out, "[", 1);
                /* a ']' right after '[' or '[^' is a literal */
                if (i + 1 < n && pat[i + 1] == '^') fail |= bytes_append(out, &pat[++i], 1);
                if (i + 1 < n && pat[i + 1] == ']') fail |= bytes_append(out, &pat[++i], 1);
                if (fail) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
                continue;
            }
            if (c == '[' && in_class && i + 1 < n && pat[i + 1] == ':') {
                /* a POSIX class such as [:alpha:] inside a class: copy it whole */
                const char *end = strstr(pat + i + 2, ":]");
                size_t len = end ? (size_t)(end - (pat + i)) + 2 : 1;
                if (bytes_append(out, pat + i, len))
                    return sl_fail(err, SL_ERR_NOMEM, "out of memory");
                i += len - 1;
                continue;
            }
            if (c == ']' && in_class) in_class = 0;
            fail = bytes_append(out, &c, 1);
        }
        if (fail) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    return SL_OK;
}

static sl_status compile_regex(const char *pat, int literal, pcre2_code **out, const char *path,
                               sl_error *err) {
    tk_buf p = {0};
    sl_status st;
    if (literal)
        st = bytes_append(&p, pat, strlen(pat)) ? sl_fail(err, SL_ERR_NOMEM, "out of memory") : 0;
    else
        st = rewrite_pattern(pat, &p, path, err);
    if (st) {
        free(p.data);
        return st;
    }
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    *out = pcre2_compile((PCRE2_SPTR)p.data, p.n, opts, &ec, &eo, NULL);
    free(p.data);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return sl_fail(err, SL_ERR_FORMAT,
                       "%s: pre-tokenizer regex does not compile at offset %zu: %s", path,
                       (size_t)eo, (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return SL_OK;
}

static int tk_json_true(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && json_is_true(v);
}

static int json_null_or_empty(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

static sl_status load_normalizer(sl_tokenizer *t, json_t *norm, const char *path, sl_error *err) {
    if (!norm || json_is_null(norm)) return SL_OK;
    const char *type = json_string_value(json_object_get(norm, "type"));
    if (type && (strcmp(type, "NFC") == 0 || strcmp(type, "Prepend") == 0 ||
                 strcmp(type, "Replace") == 0)) {
        if (t->n_norm == SL_MAX_NORM)
            return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: more than %d normalizers", path,
                           SL_MAX_NORM);
        sl_norm_step *ns = &t->norm[t->n_norm];
        const char *a = NULL, *b = "";
        if (strcmp(type, "NFC") == 0) {
            ns->kind = NORM_NFC;
        } else if (strcmp(type, "Prepend") == 0) {
            ns->kind = NORM_PREPEND;
            a = json_string_value(json_object_get(norm, "prepend"));
            if (!a)
                return sl_fail(err, SL_ERR_FORMAT, "%s: Prepend normalizer without a string", path);
        } else {
            ns->kind = NORM_REPLACE;
            json_t *pat = json_object_get(norm, "pattern");
            a = json_string_value(json_object_get(pat, "String"));
            b = json_string_value(json_object_get(norm, "content"));
            if (json_object_get(pat, "Regex"))
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: Replace normalizer with a Regex pattern (supported: String)",
                               path);
            if (!a || !a[0] || !b)
                return sl_fail(err, SL_ERR_FORMAT,
                               "%s: Replace normalizer needs a non-empty String pattern and a "
                               "content",
                               path);
        }
        if (a) {
            ns->la = strlen(a);
            ns->lb = strlen(b);
            ns->a = strdup(a);
            ns->b = strdup(b);
            if (!ns->a || !ns->b) {
                free(ns->a);
                free(ns->b);
                return sl_fail(err, SL_ERR_NOMEM, "out of memory");
            }
        }
        t->n_norm++;
        return SL_OK;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(norm, "normalizers");
        if (!json_is_array(list))
            return sl_fail(err, SL_ERR_FORMAT, "%s: normalizer Sequence without \"normalizers\"",
                           path);
        size_t i;
        json_t *n;
        json_array_foreach(list, i, n) {
            sl_status st = load_normalizer(t, n, path, err);
            if (st) return st;
        }
        return SL_OK;
    }
    return sl_fail(err, SL_ERR_UNSUPPORTED,
                   "%s: unsupported normalizer \"%s\" (supported: NFC, Prepend, Replace)", path,
                   type ? type : "?");
}

static sl_status load_pretok(sl_tokenizer *t, json_t *pt, int top, int only, const char *path,
                             sl_error *err) {
    if (!pt || json_is_null(pt)) return SL_OK;
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return sl_fail(err, SL_ERR_FORMAT, "%s: pre_tokenizer without a type", path);
    if (strcmp(type, "Sequence") == 0 && top) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return sl_fail(err, SL_ERR_FORMAT,
                           "%s: pre_tokenizer Sequence without \"pretokenizers\"", path);
        size_t i;
        json_t *p;
        json_array_foreach(list, i, p) {
            sl_status st = load_pretok(t, p, 0, json_array_size(list) == 1, path, err);
            if (st) return st;
        }
        return SL_OK;
    }
    if (t->n_steps == SL_MAX_PRETOK)
        return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", path,
                       SL_MAX_PRETOK);
    sl_pretok_step *s = &t->steps[t->n_steps];
    if (strcmp(type, "Split") == 0) {
        const char *beh = json_string_value(json_object_get(pt, "behavior"));
        if (!beh || strcmp(beh, "Isolated") != 0 || tk_json_true(pt, "invert"))
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: Split pre-tokenizer with behavior \"%s\"%s (supported: Isolated)",
                           path, beh ? beh : "?", tk_json_true(pt, "invert") ? " and invert" : "");
        json_t *pat = json_object_get(pt, "pattern");
        const char *rx = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!rx && !lit)
            return sl_fail(err, SL_ERR_FORMAT, "%s: Split pre-tokenizer without a pattern", path);
        sl_status st = compile_regex(rx ? rx : lit, rx == NULL, &s->re, path, err);
        if (st) return st;
        t->n_steps++;
        return SL_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        if (!top)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: Metaspace inside a Sequence (not supported)", path);
        const char *r = json_string_value(json_object_get(pt, "replacement"));
        const char *ps = json_string_value(json_object_get(pt, "prepend_scheme"));
        json_t *sp = json_object_get(pt, "split");
        size_t adv = 0;
        if (!r || !r[0] || utf8_check((const uint8_t *)r, strlen(r), &adv) != 1 || adv != strlen(r))
            return sl_fail(err, SL_ERR_FORMAT, "%s: Metaspace needs a one-character replacement",
                           path);
        if (ps && strcmp(ps, "never") == 0)
            t->ms_prepend = 0;
        else if (ps && strcmp(ps, "always") == 0)
            t->ms_prepend = 1;
        else if (ps && strcmp(ps, "first") == 0)
            t->ms_prepend = 2;
        else if (!ps && json_is_boolean(json_object_get(pt, "add_prefix_space")))
            t->ms_prepend = tk_json_true(pt, "add_prefix_space"); /* older files */
        else
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: Metaspace prepend_scheme \"%s\" (supported: first, always, never)",
                           path, ps ? ps : "none");
        if (sp && !json_is_boolean(sp))
            return sl_fail(err, SL_ERR_FORMAT, "%s: Metaspace split is not a boolean", path);
        t->ms_split = !sp || json_is_true(sp);
        memcpy(t->ms_rep, r, adv);
        t->ms_rep_len = adv;
        t->metaspace = 1;
        return SL_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (tk_json_true(pt, "add_prefix_space")) {
            if (!only)
                return sl_fail(err, SL_ERR_UNSUPPORTED,
                               "%s: ByteLevel add_prefix_space inside a Sequence", path);
            t->add_prefix_space = 1;
        }
        json_t *ur = json_object_get(pt, "use_regex");
        if (!ur || json_is_true(ur)) {
            /* GPT-2's own split, as the tokenizers crate spells it */
            sl_status st = compile_regex("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                         "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
                                         0, &s->re, path, err);
            if (st) return st;
        }
        t->n_steps++;
        return SL_OK;
    }
    return sl_fail(err, SL_ERR_UNSUPPORTED,
                   "%s: unsupported pre-tokenizer \"%s\" (supported: Split, ByteLevel, Sequence; "
                   "Metaspace alone)",
                   path, type);
}

/* Decoded bytes of a token per the ByteLevel decoder: every character mapped
 * back to its byte if all are in the alphabet, else the token as it is. */
static size_t bytelevel_decode(const char *s, size_t n, const int16_t *cp_byte, char *out) {
    size_t i = 0, k = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t a =
            utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (a <= 0 || cp >= 512 || cp_byte[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[k++] = (char)cp_byte[cp];
        i += (size_t)a;
    }
    return k;
}

/* Decoded bytes of a token per the decoder Replace(U+2581 -> " "). */
static size_t metaspace_decode(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            out[k++] = ' ';
            i += 2;
        } else {
            out[k++] = s[i];
        }
    }
    return k;
}

/* The byte of a "<0xXX>" token as the ByteFallback decoder reads it, else -1. */
static int16_t fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : (c == '+' && i == 3) ? 0 /* Rust's from_str_radix takes a sign */
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return (int16_t)v;
}

static int json_type_is(json_t *o, const char *type) {
    const char *t = json_string_value(json_object_get(o, "type"));
    return t && strcmp(t, type) == 0;
}

/* decoder: ByteLevel, or Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse, Strip(" ", n, 0)]
 * (the Strip optional). Sets t->sp. */
static sl_status load_decoder(sl_tokenizer *t, json_t *dec, const char *path, sl_error *err) {
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (dtype && strcmp(dtype, "ByteLevel") == 0) return SL_OK;
    json_t *list = json_object_get(dec, "decoders");
    size_t nd = json_array_size(list);
    int ok = dtype && strcmp(dtype, "Sequence") == 0 && (nd == 3 || nd == 4);
    if (ok) {
        json_t *r = json_array_get(list, 0);
        const char *pat =
            json_string_value(json_object_get(json_object_get(r, "pattern"), "String"));
        const char *con = json_string_value(json_object_get(r, "content"));
        ok = json_type_is(r, "Replace") && pat && con && strcmp(pat, "\xe2\x96\x81") == 0 &&
             strcmp(con, " ") == 0 && json_type_is(json_array_get(list, 1), "ByteFallback") &&
             json_type_is(json_array_get(list, 2), "Fuse");
    }
    if (ok && nd == 4) {
        json_t *st = json_array_get(list, 3);
        const char *c = json_string_value(json_object_get(st, "content"));
        json_t *a = json_object_get(st, "start"), *b = json_object_get(st, "stop");
        ok = json_type_is(st, "Strip") && c && strcmp(c, " ") == 0 && json_is_integer(a) &&
             json_integer_value(a) >= 0 && json_integer_value(a) < 1000 && json_is_integer(b) &&
             json_integer_value(b) == 0;
        if (ok) t->strip_start = (int32_t)json_integer_value(a);
    }
    if (!ok)
        return sl_fail(
            err, SL_ERR_UNSUPPORTED,
            "%s: unsupported decoder \"%s\" (supported: ByteLevel; Sequence of "
            "Replace(\"\xe2\x96\x81\" -> \" \"), ByteFallback, Fuse, Strip(\" \", n, 0))",
            path, dtype ? dtype : "none");
    t->sp = 1;
    return SL_OK;
}

static sl_status load_json(sl_tokenizer *t, json_t *root, const char *path, sl_error *err) {
    if (!json_is_object(root)) return sl_fail(err, SL_ERR_FORMAT, "%s: not a JSON object", path);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return sl_fail(err, SL_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype) return sl_fail(err, SL_ERR_FORMAT, "%s: model has no \"type\"", path);
    if (strcmp(mtype, "BPE") != 0)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: unsupported model type \"%s\" (supported: BPE)", path, mtype);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout))
        return sl_fail(err, SL_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", path);
    if (!json_null_or_empty(model, "continuing_subword_prefix") ||
        !json_null_or_empty(model, "end_of_word_suffix"))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported",
                       path);
    t->ignore_merges = tk_json_true(model, "ignore_merges");
    t->fuse_unk = tk_json_true(model, "fuse_unk");

    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return sl_fail(err, SL_ERR_FORMAT, "%s: model has no \"vocab\" object", path);
    if (!json_is_array(merges))
        return sl_fail(err, SL_ERR_FORMAT, "%s: model has no \"merges\" array", path);
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return sl_fail(err, SL_ERR_FORMAT, "%s: \"added_tokens\" is not an array", path);

    /* ids and sizes */
    int64_t max_id = -1;
    size_t str_bytes = 0, raw_bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX)
            return sl_fail(err, SL_ERR_FORMAT, "%s: vocab entry \"%.60s\" has no valid id", path,
                           key);
        max_id = SL_MAX(max_id, json_integer_value(val));
        str_bytes += strlen(key) + 1;
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX || !content || !content[0])
            return sl_fail(err, SL_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content",
                           path, i);
        if (tk_json_true(a, "lstrip") || tk_json_true(a, "rstrip") ||
            tk_json_true(a, "single_word"))
            return sl_fail(
                err, SL_ERR_UNSUPPORTED,
                "%s: added token \"%.60s\" uses lstrip/rstrip/single_word (not supported)", path,
                content);
        max_id = SL_MAX(max_id, json_integer_value(id));
        raw_bytes += json_string_length(json_object_get(a, "content"));
    }
    if (max_id < 0) return sl_fail(err, SL_ERR_FORMAT, "%s: empty vocabulary", path);
    /* ids index flat tables: refuse sparse ones rather than allocate for a stray huge id */
    size_t n_entries = json_object_size(vocab) + n_added;
    if ((uint64_t)max_id >= 2 * (uint64_t)n_entries + 1024)
        return sl_fail(err, SL_ERR_FORMAT, "%s: token id %lld is far beyond the %zu tokens defined",
                       path, (long long)max_id, n_entries);
    sl_status st = load_decoder(t, json_object_get(root, "decoder"), path, err);
    if (st) return st;
    t->byte_fallback = tk_json_true(model, "byte_fallback");
    if (t->byte_fallback && !t->sp)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: BPE byte_fallback is supported only with the ByteFallback decoder "
                       "(SentencePiece style), not with ByteLevel",
                       path);
    t->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)t->n_ids;
    raw_bytes += str_bytes;
    t->strs = malloc(str_bytes + 1);
    t->raws = malloc(raw_bytes + 1);
    t->tok_off = calloc(n, sizeof *t->tok_off);
    t->tok_len = malloc(n * sizeof *t->tok_len);
    t->raw_off = calloc(n, sizeof *t->raw_off);
    t->raw_len = malloc(n * sizeof *t->raw_len);
    t->special = calloc(n, 1);
    t->byte_val = malloc(n * sizeof *t->byte_val);
    size_t vcap = pow2_at_least(json_object_size(vocab) * 2 + 1);
    t->vocab_map = malloc(vcap * sizeof *t->vocab_map);
    t->vocab_mask = vcap - 1;
    t->added = calloc(n_added + 1, sizeof *t->added);
    if (!t->strs || !t->raws || !t->tok_off || !t->tok_len || !t->raw_off || !t->raw_len ||
        !t->special || !t->byte_val || !t->vocab_map || !t->added)
        return sl_fail(err, SL_ERR_NOMEM, "%s: out of memory for a vocabulary of %zu", path, n);
    for (size_t i = 0; i < n; i++) {
        t->tok_len[i] = t->raw_len[i] = -1;
        t->byte_val[i] = -1;
    }
    memset(t->vocab_map, 0xff, vcap * sizeof *t->vocab_map);

    uint32_t alpha[256];
    int16_t cp_byte[512];
    byte_alphabet(alpha);
    for (int i = 0; i < 512; i++)
        cp_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_byte[alpha[b]] = (int16_t)b;

    size_t so = 0, ro = 0;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t len = strlen(key);
        if (t->tok_len[id] >= 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: vocab id %d is used twice (\"%.60s\")", path,
                           id, key);
        memcpy(t->strs + so, key, len + 1);
        t->tok_off[id] = (int64_t)so;
        t->tok_len[id] = (int32_t)len;
        so += len + 1;
        size_t h = fnv1a(key, len) & t->vocab_mask;
        while (t->vocab_map[h] >= 0)
            h = (h + 1) & t->vocab_mask;
        t->vocab_map[h] = id;
        t->raw_off[id] = (int64_t)ro;
        t->raw_len[id] = (int32_t)(t->sp ? metaspace_decode(key, len, t->raws + ro)
                                         : bytelevel_decode(key, len, cp_byte, t->raws + ro));
        if (t->sp) t->byte_val[id] = fallback_byte(key, len);
        ro += (size_t)t->raw_len[id];
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        sl_added_token *at = &t->added[t->n_added++];
        at->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        json_t *c = json_object_get(a, "content");
        at->len = json_string_length(c);
        at->content = malloc(at->len + 1);
        if (!at->content) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
        memcpy(at->content, json_string_value(c), at->len + 1);
        at->special = tk_json_true(a, "special");
        at->normalized = tk_json_true(a, "normalized");
        if (at->normalized)
            t->has_normalized_added = 1;
        else
            t->has_raw_added = 1;
        t->added_first[(uint8_t)at->content[0]] = 1;
        t->special[at->id] = (uint8_t)at->special;
        t->raw_off[at->id] = (int64_t)ro;
        t->raw_len[at->id] =
            (int32_t)(t->sp ? metaspace_decode(at->content, at->len, t->raws + ro)
                            : bytelevel_decode(at->content, at->len, cp_byte, t->raws + ro));
        if (t->sp) t->byte_val[at->id] = fallback_byte(at->content, at->len);
        ro += (size_t)t->raw_len[at->id];
    }
    /* longest first, so the first match at a position is the longest */
    for (int32_t i = 1; i < t->n_added; i++)
        for (int32_t j = i; j > 0 && t->added[j].len > t->added[j - 1].len; j--) {
            sl_added_token tmp = t->added[j];
            t->added[j] = t->added[j - 1];
            t->added[j - 1] = tmp;
        }

    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = (int)utf8proc_encode_char((utf8proc_int32_t)alpha[b], (utf8proc_uint8_t *)u);
        t->byte_id[b] = t->sp ? -1 : vocab_lookup(t, u, (size_t)k);
        char bt[8];
        snprintf(bt, sizeof bt, "<0x%02X>", (unsigned)b);
        t->byte_tok[b] = vocab_lookup(t, bt, 6);
        if (t->byte_fallback && t->byte_tok[b] < 0)
            return sl_fail(err, SL_ERR_UNSUPPORTED,
                           "%s: byte_fallback without the vocab token \"%s\" (not supported)", path,
                           bt);
    }
    t->unk_id = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) {
        t->unk_id = vocab_lookup(t, unk, strlen(unk));
        if (t->unk_id < 0)
            return sl_fail(err, SL_ERR_FORMAT, "%s: unk_token \"%.60s\" is not in the vocab", path,
                           unk);
    }

    /* merges: "a b" strings or ["a", "b"] pairs; rank = index; a later duplicate wins */
    size_t nm = json_array_size(merges);
    size_t mcap = pow2_at_least(nm * 2 + 1);
    t->merges = malloc(mcap * sizeof *t->merges);
    if (!t->merges) return sl_fail(err, SL_ERR_NOMEM, "out of memory for %zu merges", nm);
    t->merge_mask = mcap - 1;
    for (size_t i = 0; i < mcap; i++)
        t->merges[i].key = UINT64_MAX;
    tk_buf cat = {0};
    for (size_t i = 0; i < nm && !st; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (sp) {
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        }
        if (!a || !b) {
            st = sl_fail(err, SL_ERR_FORMAT, "%s: merges[%zu] is not \"a b\" nor [\"a\", \"b\"]",
                         path, i);
            break;
        }
        int32_t ia = vocab_lookup(t, a, la), ib = vocab_lookup(t, b, lb);
        cat.n = 0;
        if (bytes_append(&cat, a, la) || bytes_append(&cat, b, lb)) {
            st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t ic = vocab_lookup(t, cat.data, cat.n);
        if (ia < 0 || ib < 0 || ic < 0) {
            st = sl_fail(err, SL_ERR_FORMAT,
                         "%s: merges[%zu] (\"%.*s\" \"%.*s\"): %s is not in the vocab", path, i,
                         (int)SL_MIN(la, 60), a, (int)SL_MIN(lb, 60), b,
                         ia < 0   ? "left token"
                         : ib < 0 ? "right token"
                                  : "merged token");
            break;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t h = mix64(k) & t->merge_mask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != k)
            h = (h + 1) & t->merge_mask;
        t->merges[h].key = k;
        t->merges[h].rank = (uint32_t)i;
        t->merges[h].new_id = ic;
    }
    free(cat.data);
    if (st) return st;

    st = load_normalizer(t, json_object_get(root, "normalizer"), path, err);
    if (st) return st;
    st = load_pretok(t, json_object_get(root, "pre_tokenizer"), 1, 1, path, err);
    if (st) return st;
    if (t->sp && (t->n_steps || t->add_prefix_space))
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: a pre-tokenizer with the SentencePiece-style decoder is not "
                       "supported (only null or Metaspace)",
                       path);
    if (t->metaspace && !t->sp)
        return sl_fail(err, SL_ERR_UNSUPPORTED,
                       "%s: Metaspace pre-tokenizer is supported only with the SentencePiece-"
                       "style decoder",
                       path);
    return SL_OK;
}

/* The special tokens a post-processor puts before a single text ("single": [SpecialToken ...,
 * Sequence A, ...] of TemplateProcessing, also inside a Sequence of processors). Anything
 * else adds nothing before the text. */
static void load_bos(sl_tokenizer *t, json_t *pp) {
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(pp, "processors"), i, v) load_bos(t, v);
        return;
    }
    if (strcmp(type, "TemplateProcessing")) return;
    json_t *specials = json_object_get(pp, "special_tokens");
    size_t i;
    json_t *item;
    t->n_bos = 0;
    json_array_foreach(json_object_get(pp, "single"), i, item) {
        json_t *sp = json_object_get(item, "SpecialToken");
        if (!sp) break; /* the text (Sequence A) comes next */
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            if (json_is_integer(id) && json_integer_value(id) >= 0 &&
                json_integer_value(id) < t->n_ids && t->n_bos < SL_TOK_MAX_BOS)
                t->bos_ids[t->n_bos++] = (int32_t)json_integer_value(id);
        }
    }
}

/* tokenizer_config.json beside tokenizer.json: an add_bos_token it sets wins over the
 * post-processor, as transformers' Llama and Gemma tokenizers rebuild it from that flag. An
 * unreadable file, or a bos_token that is no token, changes nothing. */
static void config_bos(sl_tokenizer *t, const char *file) {
    char path[4096];
    const char *slash = strrchr(file, '/');
    snprintf(path, sizeof path, "%.*stokenizer_config.json", slash ? (int)(slash - file + 1) : 0,
             file);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *add = json_object_get(root, "add_bos_token");
    if (json_is_false(add)) t->n_bos = 0;
    if (json_is_true(add)) {
        json_t *bos = json_object_get(root, "bos_token");
        if (json_is_object(bos)) bos = json_object_get(bos, "content");
        const int32_t id =
            json_is_string(bos) ? sl_tokenizer_token_to_id(t, json_string_value(bos)) : -1;
        if (id >= 0) t->bos_ids[0] = id, t->n_bos = 1;
    }
    json_decref(root);
}

sl_status sl_tokenizer_load(const char *path, sl_tokenizer **out, sl_error *err) {
    *out = NULL;
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) != 0) return sl_fail(err, SL_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode) && sl_gguf_is_file(path)) { /* a GGUF model's metadata */
        sl_gguf_file f = {0};
        sl_status st = sl_gguf_open(&f, path, err);
        if (!st) st = sl_tokenizer_load_gguf(&f, out, err);
        sl_gguf_close(&f);
        return st;
    }
    if (S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    json_t *root;
    sl_status st = sl_json_load_file(file, &root, err);
    if (st) return st;
    st = sl_tokenizer_from_json(root, file, out, err);
    json_decref(root);
    if (!st) config_bos(*out, file);
    return st;
}

sl_status sl_tokenizer_from_json(const struct json_t *root, const char *name, sl_tokenizer **out,
                                 sl_error *err) {
    *out = NULL;
    sl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    /* jansson's getters take a non-const json_t; nothing here changes the document */
    sl_status st = load_json(t, (json_t *)root, name, err);
    if (!st) load_bos(t, json_object_get((json_t *)root, "post_processor"));
    if (st) {
        sl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return SL_OK;
}

int32_t sl_tokenizer_token_to_id(const sl_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, token, n) == 0)
            return t->added[i].id;
    return vocab_lookup(t, token, n);
}

int32_t sl_tokenizer_vocab_size(const sl_tokenizer *t) {
    return t->n_ids;
}

int32_t sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

/* ---- encoding ----------------------------------------------------------------- */

/* A span of sl_tokenizer_encode_spans: [previous end, end) and its flags. */
typedef struct tk_span {
    size_t end;
    uint32_t flags;
} tk_span;

/* Per-call scratch: the tokenizer itself stays read-only. */
typedef struct sl_symbol {
    int32_t id, prev, next, alive;
} sl_symbol;

typedef struct sl_pair {
    uint32_t rank;
    int32_t pos, new_id;
} sl_pair;

typedef struct sl_enc {
    const sl_tokenizer *tok;
    sl_token_ids *out;
    sl_symbol *sym;
    size_t sym_cap;
    sl_pair *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
    tk_buf tmp;           /* ignore_merges: the word in the byte-level alphabet */
    int32_t raw_at0, at0; /* the segment / piece starts at offset 0 of the text */
    /* Added-token matching per span (sl_tokenizer_encode_spans; one span otherwise): the
     * spans with equal-flag neighbours merged, as end offsets into the text. span_k is the
     * span of the raw pass's scan position, seg_k the first span of the segment handed on
     * (both only move forward); seg_flags the flags of that segment, all its spans ORed,
     * for the pass after normalization, whose offsets no longer match the text's. */
    const tk_span *spans;
    size_t n_spans, span_k, seg_k;
    uint32_t seg_flags;
    sl_error *err;
} sl_enc;

static int pair_less(const sl_pair *a, const sl_pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(sl_enc *e, uint32_t rank, int32_t pos, int32_t new_id) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 256;
        sl_pair *p = realloc(e->heap, cap * sizeof *p);
        if (!p) return -1;
        e->heap = p;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    sl_pair x = {rank, pos, new_id};
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_less(&x, &e->heap[up])) break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = x;
    return 0;
}

static sl_pair heap_pop(sl_enc *e) {
    sl_pair top = e->heap[0], x = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!pair_less(&e->heap[c], &x)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = x;
    return top;
}

static sl_status oom(sl_enc *e) {
    return sl_fail(e->err, SL_ERR_NOMEM, "tokenizer: out of memory");
}

static void push_merge(sl_enc *e, int32_t pos, int *fail) {
    const sl_symbol *s = e->sym;
    int32_t nx = s[pos].next;
    if (nx < 0) return;
    const sl_merge_slot *m = merge_lookup(e->tok, s[pos].id, s[nx].id);
    if (m && heap_push(e, m->rank, pos, m->new_id)) *fail = 1;
}

/*
 * BPE over one word: symbols are a linked list over the word's bytes; a heap
 * holds the candidate merges of adjacent pairs ordered by (rank, position).
 * A popped entry is stale when its left symbol was merged away or the pair it
 * names no longer matches; otherwise the pair merges and the new neighbours'
 * pairs are pushed. Same order as the tokenizers crate's Word::merge_all.
 */
static sl_status bpe_word(sl_enc *e, const uint8_t *w, size_t n) {
    const sl_tokenizer *t = e->tok;
    if (t->sp && t->ignore_merges) {
        int32_t id = vocab_lookup(t, (const char *)w, n);
        if (id >= 0) return ids_push(e->out, id) ? oom(e) : SL_OK;
    }
    if (n == 1 && t->byte_id[w[0]] >= 0) return ids_push(e->out, t->byte_id[w[0]]) ? oom(e) : SL_OK;
    if (t->ignore_merges && !t->sp) {
        e->tmp.n = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t b = t->byte_id[w[i]];
            if (b < 0) break;
            if (bytes_append(&e->tmp, t->strs + t->tok_off[b], (size_t)t->tok_len[b]))
                return oom(e);
        }
        int32_t id = vocab_lookup(t, e->tmp.data ? e->tmp.data : "", e->tmp.n);
        if (id >= 0) return ids_push(e->out, id) ? oom(e) : SL_OK;
    }
    if (n > e->sym_cap) {
        sl_symbol *p = realloc(e->sym, n * sizeof *p);
        if (!p) return oom(e);
        e->sym = p;
        e->sym_cap = n;
    }
    /* start symbols; a byte missing from the vocab becomes unk (or is dropped) */
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        /* byte level: one symbol per byte; SentencePiece style: per character,
         * an unknown one as its <0xXX> bytes (byte_fallback) */
        size_t adv = 1;
        int32_t id;
        if (t->sp) {
            if (utf8_check(w + i, n - i, &adv) != 1) adv = 1; /* invalid: one byte */
            id = vocab_lookup(t, (const char *)w + i, adv);
            if (id < 0 && t->byte_fallback) {
                for (size_t k = 0; k < adv; k++) {
                    e->sym[ns] = (sl_symbol){t->byte_tok[w[i + k]], ns - 1, -1, 1};
                    if (ns > 0) e->sym[ns - 1].next = ns;
                    ns++;
                }
                i += adv;
                continue;
            }
        } else {
            id = t->byte_id[w[i]];
        }
        i += adv;
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && ns > 0 && e->sym[ns - 1].id == t->unk_id) continue;
            id = t->unk_id;
        }
        e->sym[ns] = (sl_symbol){id, ns - 1, -1, 1};
        if (ns > 0) e->sym[ns - 1].next = ns;
        ns++;
    }
    e->heap_n = 0;
    int fail = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_merge(e, i, &fail);
    while (e->heap_n && !fail) {
        sl_pair top = heap_pop(e);
        sl_symbol *s = e->sym;
        if (!s[top.pos].alive) continue;
        int32_t nx = s[top.pos].next;
        if (nx < 0) continue;
        const sl_merge_slot *m = merge_lookup(t, s[top.pos].id, s[nx].id);
        if (!m || m->new_id != top.new_id) continue;
        s[top.pos].id = top.new_id;
        s[nx].alive = 0;
        s[top.pos].next = s[nx].next;
        if (s[nx].next >= 0) s[s[nx].next].prev = top.pos;
        if (s[top.pos].prev >= 0) push_merge(e, s[top.pos].prev, &fail);
        push_merge(e, top.pos, &fail);
    }
    if (fail) return oom(e);
    for (int32_t i = ns ? 0 : -1; i >= 0; i = e->sym[i].next)
        if (ids_push(e->out, e->sym[i].id)) return oom(e);
    return SL_OK;
}

/* Runs pre-tokenizer step k over s[0..n) (its own subject, as tokenizers does),
 * recursing on every piece; past the last step the piece is a word for BPE. */
static sl_status pretok(sl_enc *e, int32_t k, const uint8_t *s, size_t n) {
    if (n == 0) return SL_OK;
    const sl_tokenizer *t = e->tok;
    while (k < t->n_steps && !t->steps[k].re)
        k++;
    if (k == t->n_steps) return bpe_word(e, s, n);
    pcre2_code *re = t->steps[k].re;
    size_t start = 0, last = 0;
    sl_status st;
    while (start <= n) {
        int rc = pcre2_match(re, s, n, start, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, s, n, start, PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sl_fail(e->err, SL_ERR_ARG, "tokenizer: regex match failed: %s",
                           (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t a = ov[0], b = ov[1];
        if (a > last && (st = pretok(e, k + 1, s + last, a - last)))
            return st; /* gap: isolated too */
        if (b > a && (st = pretok(e, k + 1, s + a, b - a))) return st;
        last = b;
        if (b > a) {
            start = b;
        } else { /* empty match: step over one character */
            size_t adv = 1;
            if (b < n) utf8_check(s + b, n - b, &adv);
            start = b + adv;
        }
    }
    if (last < n) return pretok(e, k + 1, s + last, n - last);
    return SL_OK;
}

/* The raw pass hands s[a..b) on to normalization, with the ORed flags of the spans that
 * segment covers. */
static sl_status raw_segment(sl_enc *e, const uint8_t *s, size_t a, size_t b,
                             sl_status (*next)(sl_enc *, const uint8_t *, size_t)) {
    while (e->seg_k + 1 < e->n_spans && e->spans[e->seg_k].end <= a)
        e->seg_k++;
    uint32_t flags = 0;
    for (size_t k = e->seg_k; k < e->n_spans; k++) {
        flags |= e->spans[k].flags;
        if (e->spans[k].end >= b) break;
    }
    e->seg_flags = flags;
    return next(e, s + a, b - a);
}

/*
 * Splits s[0..n) on added tokens with the given `normalized` flag (leftmost,
 * longest first); calls next() on the text in between. The raw pass
 * (normalized 0) runs over the whole text, so its offsets are the spans'; the
 * normalized pass runs over one normalized segment, under that segment's flags.
 * A special token met where SL_TOK_NO_SPECIAL holds is passed over whole and
 * stays text: Hugging Face's encode_special_tokens skips the leftmost-longest
 * match the same way, so no shorter token is looked for inside it either.
 */
static sl_status split_added(sl_enc *e, const uint8_t *s, size_t n, int32_t normalized,
                             sl_status (*next)(sl_enc *, const uint8_t *, size_t)) {
    const sl_tokenizer *t = e->tok;
    int any = normalized ? t->has_normalized_added : t->has_raw_added;
    size_t last = 0;
    sl_status st;
    for (size_t i = 0; any && i < n; i++) {
        if (!t->added_first[s[i]]) continue;
        size_t end = n; /* a token must end inside the span holding i */
        uint32_t flags = e->seg_flags;
        if (!normalized) {
            while (e->span_k + 1 < e->n_spans && e->spans[e->span_k].end <= i)
                e->span_k++;
            end = e->spans[e->span_k].end;
            flags = e->spans[e->span_k].flags;
        }
        for (int32_t j = 0; j < t->n_added; j++) {
            const sl_added_token *a = &t->added[j];
            if (a->normalized != normalized || a->len > end - i ||
                memcmp(s + i, a->content, a->len))
                continue;
            if (a->special && (flags & SL_TOK_NO_SPECIAL)) {
                i += a->len - 1;
                break;
            }
            if (normalized)
                e->at0 = e->raw_at0 && last == 0;
            else
                e->raw_at0 = last == 0;
            if (i > last) {
                st = normalized ? next(e, s + last, i - last) : raw_segment(e, s, last, i, next);
                if (st) return st;
            }
            if (ids_push(e->out, a->id)) return oom(e);
            i += a->len - 1;
            last = i + 1;
            break;
        }
    }
    if (normalized)
        e->at0 = e->raw_at0 && last == 0;
    else
        e->raw_at0 = last == 0;
    if (n > last)
        return normalized ? next(e, s + last, n - last) : raw_segment(e, s, last, n, next);
    return SL_OK;
}

/* Metaspace: spaces -> replacement, maybe a replacement first, maybe split
 * before every replacement (MergedWithNext); the pieces go to BPE. */
static sl_status metaspace(sl_enc *e, const uint8_t *s, size_t n) {
    const sl_tokenizer *t = e->tok;
    const char *r = t->ms_rep;
    size_t rl = t->ms_rep_len;
    tk_buf b = {0};
    int bad = 0;
    for (size_t i = 0, last = 0; i <= n && !bad; i++) {
        if (i == n || s[i] == ' ') {
            bad = bytes_append(&b, s + last, i - last);
            if (i < n) bad |= bytes_append(&b, r, rl);
            last = i + 1;
        }
    }
    int starts = b.n >= rl && memcmp(b.data, r, rl) == 0;
    if (!bad && !starts && (t->ms_prepend == 1 || (t->ms_prepend == 2 && e->at0))) {
        bad = bytes_reserve(&b, rl);
        if (!bad) {
            memmove(b.data + rl, b.data, b.n + 1);
            memcpy(b.data, r, rl);
            b.n += rl;
        }
    }
    sl_status st = bad ? oom(e) : SL_OK;
    const uint8_t *p = (const uint8_t *)b.data;
    size_t start = 0;
    for (size_t i = 1; !st && i <= b.n; i++) {
        if (i == b.n || (t->ms_split && i + rl <= b.n && memcmp(p + i, r, rl) == 0)) {
            st = bpe_word(e, p + start, i - start);
            start = i;
        }
    }
    free(b.data);
    return st;
}

static sl_status after_normalize(sl_enc *e, const uint8_t *s, size_t n) {
    const sl_tokenizer *t = e->tok;
    if (t->metaspace) return metaspace(e, s, n);
    if (t->add_prefix_space && s[0] != ' ') {
        /* ByteLevel add_prefix_space (only as the sole pre-tokenizer) */
        tk_buf p = {0};
        if (bytes_append(&p, " ", 1) || bytes_append(&p, s, n)) {
            free(p.data);
            return oom(e);
        }
        sl_status st = pretok(e, 0, (const uint8_t *)p.data, p.n);
        free(p.data);
        return st;
    }
    return pretok(e, 0, s, n);
}

static sl_status after_normalize_split(sl_enc *e, const uint8_t *s, size_t n) {
    return split_added(e, s, n, 1, after_normalize);
}

/* NFC over the valid UTF-8 runs of s; invalid bytes are kept as they are. */
static int nfc_append(tk_buf *out, const uint8_t *s, size_t n) {
    size_t i = 0;
    int bad = 0;
    while (i < n && !bad) {
        size_t j = i, adv;
        while (j < n && utf8_check(s + j, n - j, &adv) == 1)
            j += adv;
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map(s + i, (utf8proc_ssize_t)(j - i), &dst,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0)
                bad = bytes_append(out, s + i, j - i);
            else
                bad = bytes_append(out, dst, (size_t)r);
            free(dst);
        }
        if (j < n) {
            utf8_check(s + j, n - j, &adv);
            bad |= bytes_append(out, s + j, adv);
            j += adv;
        }
        i = j;
    }
    return bad;
}

/* Replace: every non-overlapping occurrence of a, left to right, becomes b. */
static int replace_append(tk_buf *out, const uint8_t *s, size_t n, const sl_norm_step *ns) {
    size_t i = 0, last = 0;
    int bad = 0;
    while (i + ns->la <= n && !bad) {
        if (s[i] == (uint8_t)ns->a[0] && memcmp(s + i, ns->a, ns->la) == 0) {
            bad = bytes_append(out, s + last, i - last) || bytes_append(out, ns->b, ns->lb);
            i += ns->la;
            last = i;
        } else {
            i++;
        }
    }
    return bad || bytes_append(out, s + last, n - last);
}

/* The normalizer steps in order (NFC, Prepend, Replace) over one segment. */
static sl_status normalize_segment(sl_enc *e, const uint8_t *s, size_t n) {
    const sl_tokenizer *t = e->tok;
    if (t->n_norm == 0) return after_normalize_split(e, s, n);
    tk_buf cur = {0}, nxt = {0};
    int bad = 0;
    const uint8_t *p = s;
    size_t pn = n;
    for (int32_t k = 0; k < t->n_norm && !bad; k++) {
        const sl_norm_step *ns = &t->norm[k];
        nxt.n = 0;
        if (ns->kind == NORM_NFC) {
            int ascii = 1;
            for (size_t i = 0; i < pn && ascii; i++)
                ascii = p[i] < 0x80;
            if (ascii) continue;
            bad = nfc_append(&nxt, p, pn);
        } else if (ns->kind == NORM_PREPEND) {
            if (pn == 0) continue;
            bad = bytes_append(&nxt, ns->a, ns->la) || bytes_append(&nxt, p, pn);
        } else {
            bad = replace_append(&nxt, p, pn, ns);
        }
        tk_buf tmp = cur;
        cur = nxt;
        nxt = tmp;
        p = (const uint8_t *)cur.data;
        pn = cur.n;
    }
    sl_status st = bad ? oom(e) : pn ? after_normalize_split(e, p, pn) : SL_OK;
    free(cur.data);
    free(nxt.data);
    return st;
}

/* Encodes text under spans (merged, non-empty, the last ending at len). */
static sl_status encode(const sl_tokenizer *t, const char *text, size_t len, const tk_span *spans,
                        size_t n_spans, sl_token_ids *out, sl_error *err) {
    sl_enc e = {.tok = t, .out = out, .err = err, .spans = spans, .n_spans = n_spans};
    e.md = pcre2_match_data_create(4, NULL);
    if (!e.md) return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    sl_status st = split_added(&e, (const uint8_t *)text, len, 0, normalize_segment);
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.heap);
    free(e.tmp.data);
    return st;
}

sl_status sl_tokenizer_encode_ex(const sl_tokenizer *t, const char *text, size_t len,
                                 uint32_t flags, sl_token_ids *out, sl_error *err) {
    out->n = 0;
    if (!text && len) return sl_fail(err, SL_ERR_ARG, "tokenizer: NULL text");
    if (len == 0) return SL_OK;
    const tk_span one = {len, flags};
    return encode(t, text, len, &one, 1, out, err);
}

sl_status sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len,
                              sl_token_ids *out, sl_error *err) {
    return sl_tokenizer_encode_ex(t, text, len, 0, out, err);
}

int32_t sl_tokenizer_bos(const sl_tokenizer *t, const int32_t **ids) {
    *ids = t->bos_ids;
    return t->n_bos;
}

sl_status sl_tokenizer_encode_prompt(const sl_tokenizer *t, const char *text, size_t len,
                                     sl_token_ids *out, sl_error *err) {
    sl_status st = sl_tokenizer_encode(t, text, len, out, err);
    if (st || !t->n_bos) return st;
    const size_t nb = (size_t)t->n_bos;
    if (out->n >= nb && !memcmp(out->ids, t->bos_ids, nb * sizeof *out->ids))
        return SL_OK; /* the text starts with them already: not twice */
    for (size_t i = 0; i < nb; i++)
        if (ids_push(out, 0)) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    memmove(out->ids + nb, out->ids, (out->n - nb) * sizeof *out->ids);
    memcpy(out->ids, t->bos_ids, nb * sizeof *out->ids);
    return SL_OK;
}

sl_status sl_tokenizer_encode_spans(const sl_tokenizer *t, const char *text, size_t len,
                                    const sl_tok_span *spans, size_t n_spans, sl_token_ids *out,
                                    sl_error *err) {
    out->n = 0;
    if (!text && len) return sl_fail(err, SL_ERR_ARG, "tokenizer: NULL text");
    size_t total = 0;
    for (size_t k = 0; k < n_spans; k++) {
        if (spans[k].len > len - total)
            return sl_fail(err, SL_ERR_ARG, "tokenizer: spans cover more than the %zu bytes", len);
        total += spans[k].len;
    }
    if (total != len)
        return sl_fail(err, SL_ERR_ARG, "tokenizer: spans cover %zu of the %zu bytes", total, len);
    if (len == 0) return SL_OK;
    /* Empty spans dropped, equal-flag neighbours merged: where spans split a text changes
     * nothing but the flags. */
    tk_span *m = malloc(n_spans * sizeof *m);
    if (!m) return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    size_t nm = 0, end = 0;
    for (size_t k = 0; k < n_spans; k++) {
        if (!spans[k].len) continue;
        end += spans[k].len;
        if (nm && m[nm - 1].flags == spans[k].flags)
            m[nm - 1].end = end;
        else
            m[nm++] = (tk_span){end, spans[k].flags};
    }
    sl_status st = encode(t, text, len, m, nm, out, err);
    free(m);
    return st;
}

/* ---- decoding ----------------------------------------------------------------- */

static sl_status id_bytes(const sl_tokenizer *t, int32_t id, int32_t skip_special,
                          const uint8_t **p, size_t *n, sl_error *err) {
    if (id < 0 || id >= t->n_ids || t->raw_len[id] < 0)
        return sl_fail(err, SL_ERR_ARG, "tokenizer: token id %d is not in the vocabulary (size %d)",
                       id, t->n_ids);
    if (skip_special && t->special[id]) {
        *n = 0;
        *p = (const uint8_t *)"";
        return SL_OK;
    }
    *p = (const uint8_t *)t->raws + t->raw_off[id];
    *n = (size_t)t->raw_len[id];
    return SL_OK;
}

int32_t sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, char *out, int32_t cap) {
    const uint8_t *p = NULL;
    size_t n = 0;
    if (id_bytes(t, id, 0, &p, &n, NULL)) return -1;
    uint8_t b;
    if (t->sp && t->byte_val[id] >= 0) {
        b = (uint8_t)t->byte_val[id];
        p = &b;
        n = 1;
    }
    if (cap > 0) memcpy(out, p, SL_MIN(n, (size_t)cap));
    return (int32_t)n;
}

/* A run of <0xXX> tokens, as ByteFallback: its bytes if they are valid UTF-8,
 * else one U+FFFD per byte. */
static int fallback_run(tk_buf *out, const uint8_t *p, size_t n) {
    size_t i = 0, adv;
    while (i < n && utf8_check(p + i, n - i, &adv) == 1)
        i += adv;
    if (i == n) return bytes_append(out, p, n);
    int bad = 0;
    for (size_t k = 0; k < n; k++)
        bad |= bytes_append(out, REPLACEMENT, 3);
    return bad;
}

/* SentencePiece-style decode: Replace(U+2581 -> " ") is in the raw table;
 * ByteFallback, Fuse, then Strip of leading spaces. */
static sl_status decode_sp(const sl_tokenizer *t, const int32_t *ids, size_t n,
                           int32_t skip_special, char **out, size_t *out_len, sl_error *err) {
    tk_buf run = {0}, txt = {0};
    int bad = bytes_reserve(&run, 16) || bytes_reserve(&txt, 64);
    for (size_t i = 0; i < n && !bad; i++) {
        const uint8_t *p = NULL;
        size_t k = 0;
        sl_status st = id_bytes(t, ids[i], skip_special, &p, &k, err);
        if (st) {
            free(run.data);
            free(txt.data);
            return st;
        }
        if (skip_special && t->special[ids[i]]) continue;
        int16_t b = t->byte_val[ids[i]];
        if (b >= 0) {
            uint8_t c = (uint8_t)b;
            bad = bytes_append(&run, &c, 1);
            continue;
        }
        if (run.n) bad |= fallback_run(&txt, (const uint8_t *)run.data, run.n);
        run.n = 0;
        bad |= bytes_append(&txt, p, k);
    }
    if (run.n && !bad) bad = fallback_run(&txt, (const uint8_t *)run.data, run.n);
    free(run.data);
    if (bad) {
        free(txt.data);
        return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t skip = 0;
    while (skip < txt.n && (int32_t)skip < t->strip_start && txt.data[skip] == ' ')
        skip++;
    memmove(txt.data, txt.data + skip, txt.n - skip + 1);
    *out = txt.data;
    *out_len = txt.n - skip;
    return SL_OK;
}

sl_status sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, size_t n,
                              int32_t skip_special, char **out, size_t *out_len, sl_error *err) {
    *out = NULL;
    *out_len = 0;
    if (t->sp) return decode_sp(t, ids, n, skip_special, out, out_len, err);
    tk_buf raw = {0}, txt = {0};
    int bad = bytes_reserve(&raw, 64) || bytes_reserve(&txt, 64);
    for (size_t i = 0; i < n && !bad; i++) {
        const uint8_t *p = NULL;
        size_t k = 0;
        sl_status st = id_bytes(t, ids[i], skip_special, &p, &k, err);
        if (st) {
            free(raw.data);
            free(txt.data);
            return st;
        }
        bad = bytes_append(&raw, p, k);
    }
    if (!bad) utf8_lossy_append(&txt, (const uint8_t *)raw.data, raw.n, 1, &bad);
    free(raw.data);
    if (bad) {
        free(txt.data);
        return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    *out = txt.data;
    *out_len = txt.n;
    return SL_OK;
}

void sl_detok_init(sl_detok *d, const sl_tokenizer *tok, int32_t skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
    d->strip_left = tok->strip_start;
}

/* SentencePiece style: a <0xXX> byte joins the pending character; a byte run
 * that turns invalid gives U+FFFD per byte from then on, as ByteFallback does;
 * any other token ends the run. Then the decoder's Strip on the stream start. */
static sl_status detok_sp(sl_detok *d, int32_t id, const uint8_t *p, size_t n, int final,
                          const char **text, size_t *len, sl_error *err) {
    tk_buf out = {.data = d->buf, .n = 0, .cap = d->cap};
    int bad = bytes_reserve(&out, 16);
    int16_t b = id >= 0 ? d->tok->byte_val[id] : -1;
    if (!final && b >= 0) {
        if (d->run_bad) {
            bad |= bytes_append(&out, REPLACEMENT, 3);
        } else {
            d->pending[d->n_pending++] = (uint8_t)b;
            size_t adv;
            int r = utf8_check(d->pending, (size_t)d->n_pending, &adv);
            if (r == 1) {
                bad |= bytes_append(&out, d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            } else if (r < 0) {
                d->run_bad = 1;
            }
        }
    }
    if (final || b < 0 || d->run_bad) {
        for (int32_t k = 0; k < d->n_pending; k++)
            bad |= bytes_append(&out, REPLACEMENT, 3);
        d->n_pending = 0;
    }
    if (final || b < 0) d->run_bad = 0;
    if (!final && b < 0) bad |= bytes_append(&out, p, n);
    d->buf = out.data;
    d->cap = out.cap;
    if (bad) return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    size_t skip = 0;
    while (d->strip_left > 0 && skip < out.n) {
        if (out.data[skip] != ' ') {
            d->strip_left = 0;
            break;
        }
        skip++;
        d->strip_left--;
    }
    *text = out.data + skip;
    *len = out.n - skip;
    if (final) d->strip_left = d->tok->strip_start;
    return SL_OK;
}

void sl_detok_free(sl_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}

static sl_status detok_emit(sl_detok *d, const uint8_t *p, size_t n, int final, const char **text,
                            size_t *len, sl_error *err) {
    /* pending bytes (< 4) then the new ones, through the lossy decoder */
    tk_buf in = {0}, out = {.data = d->buf, .n = 0, .cap = d->cap};
    int bad = bytes_append(&in, d->pending, (size_t)d->n_pending) || bytes_append(&in, p, n) ||
              bytes_reserve(&out, 16);
    size_t used = bad ? 0 : utf8_lossy_append(&out, (const uint8_t *)in.data, in.n, final, &bad);
    d->buf = out.data;
    d->cap = out.cap;
    if (bad) {
        free(in.data);
        return sl_fail(err, SL_ERR_NOMEM, "tokenizer: out of memory");
    }
    d->n_pending = (int32_t)(in.n - used);
    SL_ASSERT(d->n_pending < 4);
    memcpy(d->pending, in.data + used, (size_t)d->n_pending);
    free(in.data);
    d->buf[out.n] = '\0';
    *text = d->buf;
    *len = out.n;
    return SL_OK;
}

sl_status sl_detok_push(sl_detok *d, int32_t id, const char **text, size_t *len, sl_error *err) {
    const uint8_t *p = NULL;
    size_t n = 0;
    *text = "";
    *len = 0;
    sl_status st = id_bytes(d->tok, id, d->skip_special, &p, &n, err);
    if (st) return st;
    if (d->tok->sp) {
        if (d->skip_special && d->tok->special[id]) return SL_OK;
        return detok_sp(d, id, p, n, 0, text, len, err);
    }
    return detok_emit(d, p, n, 0, text, len, err);
}

sl_status sl_detok_flush(sl_detok *d, const char **text, size_t *len, sl_error *err) {
    *text = "";
    *len = 0;
    sl_status st = d->tok->sp ? detok_sp(d, -1, NULL, 0, 1, text, len, err)
                              : detok_emit(d, NULL, 0, 1, text, len, err);
    d->n_pending = 0;
    return st;
}
