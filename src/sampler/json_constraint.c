/* Constrained decoding of JSON (see json_constraint.h). */
#include "sampler/json_constraint.h"

#include <jansson.h>
#include <math.h>

/* ================================================================ the vocabulary's trie */

/*
 * Nodes in one array, each node's children next to each other (sorted by byte), so that a
 * walk reads them in order. The ids are sorted by their bytes: the ids of a subtree are then
 * one run of v->ids, [lo, hi), those ending at the node its start [lo, mid).
 */
typedef struct jt_node {
    uint32_t child;   /* first child */
    uint16_t n_child; /* at most 256 */
    uint8_t byte;     /* of the edge into this node */
    uint8_t plain;    /* JT_* flags */
    uint32_t lo, mid, hi;
} jt_node;

/* Every id of the subtree is plain string content (token_plain) from its first byte; from the
 * node's depth on (the bytes after the node's prefix). */
enum { JT_PLAIN = 1, JT_PLAIN_AFTER = 2 };

/* Longer tokens are left out (never allowed): they bound the walk's depth and its scratch. */
#define JV_MAX_TOKEN 1024

struct sl_json_vocab {
    int32_t n_vocab;
    uint32_t *off; /* [n_vocab] where id's bytes start in bytes */
    int32_t *len;  /* [n_vocab] their number; -1: never allowed (special, empty, too long) */
    uint8_t *bytes;
    jt_node *nodes; /* [n_nodes], the root first */
    uint32_t n_nodes;
    int32_t *ids; /* [n_ids] ids in the order of their bytes */
    uint32_t n_ids;
    int32_t max_len;
};

/* ================================================================ the string scanner */

/* Where a string's content is: a character, after a backslash, inside \uXXXX (need digits
 * due, hex the value so far), inside a UTF-8 character (need bytes due, the next in
 * [lo, hi]). */
enum { S_CHAR = 0, S_ESC, S_HEX, S_UTF8 };

typedef struct jscan {
    uint8_t st, need, lo, hi;
    uint16_t hex, pad;
} jscan;

static int hex_value(uint8_t x) {
    if (x >= '0' && x <= '9') return x - '0';
    if (x >= 'a' && x <= 'f') return x - 'a' + 10;
    if (x >= 'A' && x <= 'F') return x - 'A' + 10;
    return -1;
}

/* One byte of a string after its opening quote: 1 the closing quote, 0 taken, -1 refused.
 * UTF-8 as jansson checks it (no overlong forms, no surrogates, nothing past U+10FFFF): the
 * ranges of the first continuation byte after E0, ED, F0 and F4 rule those out. */
static int scan(jscan *s, uint8_t x) {
    switch (s->st) {
    case S_CHAR:
        if (x == '"') return 1;
        if (x == '\\') {
            s->st = S_ESC;
            return 0;
        }
        if (x < 0x20) return -1;
        if (x < 0x80) return 0;
        s->lo = 0x80, s->hi = 0xBF;
        if (x >= 0xC2 && x <= 0xDF)
            s->need = 1;
        else if (x == 0xE0)
            s->need = 2, s->lo = 0xA0;
        else if (x == 0xED)
            s->need = 2, s->hi = 0x9F;
        else if (x >= 0xE1 && x <= 0xEF)
            s->need = 2;
        else if (x == 0xF0)
            s->need = 3, s->lo = 0x90;
        else if (x >= 0xF1 && x <= 0xF3)
            s->need = 3;
        else if (x == 0xF4)
            s->need = 3, s->hi = 0x8F;
        else
            return -1;
        s->st = S_UTF8;
        return 0;
    case S_UTF8:
        if (x < s->lo || x > s->hi) return -1;
        s->lo = 0x80, s->hi = 0xBF;
        if (--s->need == 0) s->st = S_CHAR;
        return 0;
    case S_ESC:
        if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' ||
            x == 't') {
            s->st = S_CHAR;
            return 0;
        }
        if (x != 'u') return -1;
        s->st = S_HEX, s->need = 4, s->hex = 0;
        return 0;
    default: { /* S_HEX */
        const int h = hex_value(x);
        if (h < 0) return -1;
        const uint16_t v = (uint16_t)(s->hex << 4 | h);
        /* A surrogate (D800-DFFF) is refused at its second digit and \u0000 at its last (jansson
         * refuses both): refusing either later would leave a state with no way on. */
        if ((s->need == 3 && (v & 0xF8) == 0xD8) || (s->need == 1 && v == 0)) return -1;
        s->hex = v;
        if (--s->need == 0) s->st = S_CHAR;
        return 0;
    }
    }
}

/* A token that, from inside a string (at a character), stays inside it and ends at a
 * character: from such a state it is always allowed, whatever else the state holds. */
static int token_plain(const uint8_t *p, int32_t n) {
    jscan s = {0};
    for (int32_t i = 0; i < n; i++)
        if (scan(&s, p[i]) != 0) return 0;
    return s.st == S_CHAR;
}

/* ================================================================ vocab */

typedef struct jv_tok {
    const uint8_t *p;
    int32_t len, id;
} jv_tok;

static int tok_cmp(const void *a, const void *b) {
    const jv_tok *x = a, *y = b;
    const int c = memcmp(x->p, y->p, (size_t)SL_MIN(x->len, y->len));
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Fills node (its ids t[lo, hi) share their first d bytes) and, depth first, its subtree. */
static void build(sl_json_vocab *v, const jv_tok *t, uint32_t node, uint32_t lo, uint32_t hi,
                  int32_t d) {
    uint32_t mid = lo;
    while (mid < hi && t[mid].len == d)
        mid++;
    uint32_t k = 0;
    for (uint32_t i = mid; i < hi; k++) {
        const uint8_t b = t[i].p[d];
        while (i < hi && t[i].p[d] == b)
            i++;
    }
    const uint32_t first = v->n_nodes;
    v->n_nodes += k;
    int plain = 1, after = 1;
    for (uint32_t i = lo; i < mid; i++)
        plain &= token_plain(t[i].p, t[i].len);
    for (uint32_t i = mid; i < hi && after; i++)
        after = token_plain(t[i].p + d, t[i].len - d);
    uint32_t c = first;
    for (uint32_t i = mid; i < hi; c++) {
        const uint8_t b = t[i].p[d];
        uint32_t j = i;
        while (j < hi && t[j].p[d] == b)
            j++;
        v->nodes[c].byte = b;
        build(v, t, c, i, j, d + 1);
        plain &= v->nodes[c].plain & JT_PLAIN;
        i = j;
    }
    jt_node *nd = &v->nodes[node];
    nd->child = first, nd->n_child = (uint16_t)k;
    nd->plain = (uint8_t)((plain ? JT_PLAIN : 0) | (after ? JT_PLAIN_AFTER : 0));
    nd->lo = lo, nd->mid = mid, nd->hi = hi;
}

sl_status sl_json_vocab_create(const sl_tokenizer *tok, sl_json_vocab **out, sl_error *err) {
    *out = NULL;
    sl_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    const int32_t n = sl_tokenizer_vocab_size(tok);
    v->n_vocab = n;
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    v->len = calloc((size_t)n + 1, sizeof *v->len);
    jv_tok *t = calloc((size_t)n + 1, sizeof *t);
    size_t total = 0, cap = 0;
    if (!v->off || !v->len || !t) goto oom;
    for (int32_t id = 0; id < n; id++) {
        v->len[id] = -1;
        const int32_t len = sl_tokenizer_token_bytes(tok, id, NULL, 0);
        if (len <= 0 || len > JV_MAX_TOKEN || sl_tokenizer_is_special(tok, id)) continue;
        if (total + (size_t)len > cap) {
            cap = SL_MAX(2 * cap, total + (size_t)len + 4096);
            uint8_t *b = realloc(v->bytes, cap);
            if (!b) goto oom;
            v->bytes = b;
        }
        sl_tokenizer_token_bytes(tok, id, (char *)v->bytes + total, len);
        v->off[id] = (uint32_t)total;
        v->len[id] = len;
        total += (size_t)len;
        v->max_len = SL_MAX(v->max_len, len);
    }
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0) t[v->n_ids++] = (jv_tok){v->bytes + v->off[id], v->len[id], id};
    qsort(t, v->n_ids, sizeof *t, tok_cmp);
    v->ids = malloc(((size_t)v->n_ids + 1) * sizeof *v->ids);
    v->nodes = calloc(total + 1, sizeof *v->nodes); /* at most one node a byte, and the root */
    if (!v->ids || !v->nodes) goto oom;
    for (uint32_t i = 0; i < v->n_ids; i++)
        v->ids[i] = t[i].id;
    v->n_nodes = 1;
    build(v, t, 0, 0, v->n_ids, 0);
    jt_node *shrunk = realloc(v->nodes, v->n_nodes * sizeof *v->nodes);
    if (shrunk) v->nodes = shrunk;
    free(t);
    *out = v;
    return SL_OK;
oom:
    free(t);
    sl_json_vocab_free(v);
    return sl_fail(err, SL_ERR_NOMEM, "out of memory building the JSON constraint's vocabulary");
}

void sl_json_vocab_free(sl_json_vocab *v) {
    if (!v) return;
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->nodes);
    free(v->ids);
    free(v);
}

/* ================================================================ compiled schema */

/* What a value may be. A union picks its alternative by the value's first byte (JC_*). */
enum { JK_UNION = 0, JK_OBJECT, JK_ARRAY, JK_STRING, JK_NUMBER, JK_INTEGER, JK_LIT };
enum { JC_OBJ = 0, JC_ARR, JC_STR, JC_NUM, JC_LIT, JC_N };

typedef struct jn_text {
    int32_t off, len; /* in c->text */
} jn_text;

typedef struct jnode {
    int32_t kind;
    int32_t alt[JC_N];      /* JK_UNION: the node of each class, -1: none */
    int32_t props, n_props; /* JK_OBJECT: c->props[props, props + n_props), in schema order */
    int32_t extra;          /* JK_OBJECT without properties: the values' node (-1: only {}) */
    int32_t items, min_items, max_items; /* JK_ARRAY */
    int32_t lits, n_lits; /* JK_LIT: c->lits[lits, lits + n_lits), sorted by their bytes */
} jnode;

typedef struct jprop {
    jn_text key; /* as written in a document, quotes included: "\"name\"" */
    int32_t node;
    int32_t next_req; /* the first required property at or after this one (n_props: none) */
} jprop;

/* The nodes every constraint has. */
enum { N_ANY = 0, N_ANY_OBJ, N_ANY_ARR, N_STRING, N_NUMBER, N_SCALARS, N_INTEGER, N_FIXED };

/* ================================================================ the automaton's state */

/* A frame: one value being read. F_VALUE: its first byte is still to come (then it becomes
 * one of the others); F_END: the document is over. */
enum { F_END = 0, F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
/* F_OBJ: after '{', in a key, before ':', after a value, after ','. */
enum { O_OPEN = 0, O_KEY, O_COLON, O_AFTER, O_COMMA };
/* F_ARR: after '[', after a value, after ','. */
enum { A_OPEN = 0, A_AFTER, A_COMMA };
/* F_NUM: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at each point. */
enum { N_START = 0, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
#define NUM_MAX_DIGITS 18
#define NUM_MAX_EXP    2

typedef struct jframe {
    int32_t node;
    uint8_t kind, mode;
    uint8_t ws; /* whitespace bytes in the current gap */
    uint8_t pad;
    jscan s;      /* F_STR, and keys of objects without properties */
    int32_t a;    /* F_OBJ: the next property that may come; F_ARR: items so far; F_NUM: digits
                     of the current part; F_LIT: the first literal matching so far */
    int32_t b, c; /* F_OBJ key: the first property matching so far, and the bytes matched;
                     after it, b is the property whose value comes. F_LIT: b bytes matched */
} jframe;

/*
 * The stack of frames, its top by value and the rest a chain of links: a step that pushes
 * takes a link from an arena, so that a copy of the state is a few bytes and the walk can
 * branch at every trie node (the arena is given back as the walk returns). The committed
 * state's links live in c->stack.
 */
typedef struct jlink {
    jframe f;
    const struct jlink *up;
} jlink;

typedef struct jstate {
    jframe top;
    const jlink *up;
    int32_t depth; /* frames, the top included */
} jstate;

/* Deepest stack: the schema's nesting and any values' (SL_JSON_MAX_NEST each) and a few. */
#define MAX_FRAMES (2 * SL_JSON_MAX_NEST + 8)
#define MAX_EOS    16

struct sl_json_constraint {
    const sl_json_vocab *v;
    jnode *nodes;
    int32_t n_nodes, root;
    jprop *props;
    jn_text *lits;
    char *text;
    int32_t eos[MAX_EOS], n_eos;
    jstate st;
    int32_t ended;             /* an EOS id was accepted */
    jlink stack[MAX_FRAMES];   /* the committed state's frames below its top */
    jframe frames[MAX_FRAMES]; /* commit's scratch */
    jlink saved[MAX_FRAMES];   /* feed's copy to go back to */
    jlink *arena;              /* [arena_cap] links of the walk's states */
    int32_t arena_n, arena_cap;
    uint8_t *allowed; /* [v->n_vocab] the walk's marks */
};

/* ================================================================ schema compiler */

typedef struct jcc {
    sl_json_constraint *c;
    int32_t cap_nodes, n_props, cap_props, n_lits, cap_lits;
    size_t n_text, cap_text;
    sl_error *err;
} jcc;

static int32_t new_node(jcc *k, int32_t kind) {
    sl_json_constraint *c = k->c;
    if (c->n_nodes == k->cap_nodes) {
        const int32_t cap = k->cap_nodes ? 2 * k->cap_nodes : 16;
        jnode *p = realloc(c->nodes, (size_t)cap * sizeof *p);
        if (!p) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
        c->nodes = p, k->cap_nodes = cap;
    }
    jnode *nd = &c->nodes[c->n_nodes];
    *nd = (jnode){.kind = kind, .extra = -1, .items = -1, .max_items = INT32_MAX};
    for (int i = 0; i < JC_N; i++)
        nd->alt[i] = -1;
    return c->n_nodes++;
}

static int add_text(jcc *k, const char *s, size_t n, jn_text *out) {
    if (k->n_text + n > k->cap_text) {
        const size_t cap = SL_MAX(2 * k->cap_text, k->n_text + n + 256);
        char *p = realloc(k->c->text, cap);
        if (!p) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
        k->c->text = p, k->cap_text = cap;
    }
    memcpy(k->c->text + k->n_text, s, n);
    *out = (jn_text){(int32_t)k->n_text, (int32_t)n};
    k->n_text += n;
    return 0;
}

/* The text jansson writes for a scalar (a key: a JSON string), into the text pool. */
static int add_json_text(jcc *k, const json_t *v, jn_text *out) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
    const int rc = add_text(k, s, strlen(s), out);
    free(s);
    return rc;
}

static int text_cmp(const jn_text *x, const jn_text *y, const char *text) {
    const int c = memcmp(text + x->off, text + y->off, (size_t)SL_MIN(x->len, y->len));
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* A node of literals: the texts of vals[n] (scalars), sorted by their bytes, each once. */
static int32_t lit_node(jcc *k, const json_t *const *vals, int32_t n) {
    if (k->n_lits + n > k->cap_lits) {
        const int32_t cap = SL_MAX(2 * k->cap_lits, k->n_lits + n + 16);
        jn_text *p = realloc(k->c->lits, (size_t)cap * sizeof *p);
        if (!p) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
        k->c->lits = p, k->cap_lits = cap;
    }
    jn_text *l = k->c->lits + k->n_lits;
    for (int32_t i = 0; i < n; i++)
        if (add_json_text(k, vals[i], &l[i])) return k->err->code;
    /* insertion sort: enums are short, and qsort would want the text pool through a global */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const jn_text x = l[i];
        int32_t j = m;
        while (j > 0 && text_cmp(&l[j - 1], &x, k->c->text) > 0)
            j--;
        if (j > 0 && text_cmp(&l[j - 1], &x, k->c->text) == 0) continue; /* twice */
        memmove(&l[j + 1], &l[j], (size_t)(m - j) * sizeof *l);
        l[j] = x;
        m++;
    }
    const int32_t node = new_node(k, JK_LIT);
    if (node < 0) return node;
    k->c->nodes[node].lits = k->n_lits;
    k->c->nodes[node].n_lits = m;
    k->n_lits += m;
    return node;
}

/* Type bits. */
enum { TB_OBJ = 1, TB_ARR = 2, TB_STR = 4, TB_NUM = 8, TB_INT = 16, TB_BOOL = 32, TB_NULL = 64 };
#define TB_ALL 127

static int type_bit(const char *name) {
    static const char *const names[] = {"object",  "array",   "string", "number",
                                        "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, names[i])) return 1 << i;
    return 0;
}

/* The type bits a scalar satisfies. */
static int value_types(const json_t *v) {
    if (json_is_string(v)) return TB_STR;
    if (json_is_integer(v)) return TB_INT | TB_NUM;
    if (json_is_real(v)) {
        const double d = json_real_value(v);
        return TB_NUM | (d == floor(d) ? TB_INT : 0);
    }
    if (json_is_boolean(v)) return TB_BOOL;
    if (json_is_null(v)) return TB_NULL;
    return 0;
}

static int is_keyword(const char *key, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(key, *list)) return 1;
    return 0;
}

static int32_t compile(jcc *k, const json_t *s, int32_t depth, const char *path);

static int32_t compile_object(jcc *k, const json_t *s, int32_t depth, const char *path) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sl_fail(k->err, SL_ERR_ARG, "%s.properties must be an object", path);
    if (req && !json_is_array(req))
        return sl_fail(k->err, SL_ERR_ARG, "%s.required must be an array of names", path);
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return sl_fail(k->err, SL_ERR_ARG, "%s.additionalProperties must be a boolean or a schema",
                       path);
    const int32_t n = (int32_t)json_object_size(props);
    const int ap_open = ap && !json_is_false(ap);
    if (n > 0 && ap_open)
        return sl_fail(k->err, SL_ERR_UNSUPPORTED,
                       "%s.additionalProperties: only false is supported beside properties", path);
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r))
            return sl_fail(k->err, SL_ERR_ARG, "%s.required[%zu] must be a string", path, i);
        if (!json_object_get(props, json_string_value(r)))
            return sl_fail(k->err, SL_ERR_ARG,
                           "%s.required: '%.80s' is not in properties (no other property may "
                           "come)",
                           path, json_string_value(r));
    }
    const int32_t node = new_node(k, JK_OBJECT);
    if (node < 0) return node;
    if (n == 0) { /* a map: any keys, values of additionalProperties (absent: any) */
        int32_t extra = N_ANY;
        if (ap && json_is_false(ap)) extra = -1;
        if (ap && json_is_object(ap)) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.additionalProperties", path);
            if ((extra = compile(k, ap, depth + 1, sub)) < 0) return extra;
        }
        k->c->nodes[node].extra = extra;
        return node;
    }
    if (k->n_props + n > k->cap_props) {
        const int32_t cap = SL_MAX(2 * k->cap_props, k->n_props + n + 16);
        jprop *p = realloc(k->c->props, (size_t)cap * sizeof *p);
        if (!p) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
        k->c->props = p, k->cap_props = cap;
    }
    const int32_t base = k->n_props;
    k->n_props += n;
    k->c->nodes[node].props = base;
    k->c->nodes[node].n_props = n;
    const char *key;
    json_t *val;
    int32_t p = 0;
    json_object_foreach((json_t *)props, key, val) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s.properties.%s", path, key);
        json_t *name = json_string(key);
        int rc = name ? add_json_text(k, name, &k->c->props[base + p].key)
                      : sl_fail(k->err, SL_ERR_ARG, "%s: the name is not UTF-8", sub);
        json_decref(name);
        if (rc) return rc;
        const int32_t child = compile(k, val, depth + 1, sub);
        if (child < 0) return child;
        k->c->props[base + p].node = child;
        p++;
    }
    int32_t next = n;
    for (p = n - 1; p >= 0; p--) {
        json_t *rr;
        json_array_foreach(req, i, rr) {
            const jn_text *t = &k->c->props[base + p].key;
            /* the key's text is the name quoted by jansson: compare through a fresh dump */
            char *q = json_dumps(rr, JSON_ENCODE_ANY | JSON_COMPACT);
            if (!q) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
            const int same = strlen(q) == (size_t)t->len && !memcmp(q, k->c->text + t->off, t->len);
            free(q);
            if (same) next = p;
        }
        k->c->props[base + p].next_req = next;
    }
    return node;
}

static int32_t compile_array(jcc *k, const json_t *s, int32_t depth, const char *path) {
    const json_t *items = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"),
                 *mx = json_object_get(s, "maxItems");
    if ((mn && (!json_is_integer(mn) || json_integer_value(mn) < 0)) ||
        (mx && (!json_is_integer(mx) || json_integer_value(mx) < 0)))
        return sl_fail(k->err, SL_ERR_ARG, "%s: minItems and maxItems must be integers >= 0", path);
    const int64_t lo = mn ? json_integer_value(mn) : 0;
    const int64_t hi = mx ? SL_MIN(json_integer_value(mx), INT32_MAX) : INT32_MAX;
    if (lo > hi)
        return sl_fail(k->err, SL_ERR_ARG, "%s: minItems %lld is above maxItems %lld", path,
                       (long long)lo, (long long)hi);
    if (lo > 100000) return sl_fail(k->err, SL_ERR_UNSUPPORTED, "%s: minItems above 100000", path);
    int32_t it = N_ANY;
    if (items && json_is_false(items))
        return sl_fail(k->err, SL_ERR_UNSUPPORTED, "%s.items: false is not supported", path);
    if (items && !json_is_true(items)) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s.items", path);
        if ((it = compile(k, items, depth + 1, sub)) < 0) return it;
    }
    const int32_t node = new_node(k, JK_ARRAY);
    if (node < 0) return node;
    jnode *nd = &k->c->nodes[node];
    nd->items = it, nd->min_items = (int32_t)lo, nd->max_items = (int32_t)hi;
    return node;
}

static int32_t compile(jcc *k, const json_t *s, int32_t depth, const char *path) {
    static const char *const supported[] = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
        "enum", "const",      NULL};
    static const char *const annotations[] = {
        "title",      "description", "default",   "examples", "$schema",     "$id", "$comment",
        "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", NULL};
    if (json_is_true(s)) return N_ANY;
    if (!json_is_object(s))
        return sl_fail(k->err, SL_ERR_ARG, "%s: a schema must be an object (or true)", path);
    if (depth > SL_JSON_MAX_NEST)
        return sl_fail(k->err, SL_ERR_UNSUPPORTED, "%s: the schema nests deeper than %d levels",
                       path, SL_JSON_MAX_NEST);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)s, key, val) {
        if (!is_keyword(key, supported) && !is_keyword(key, annotations))
            return sl_fail(k->err, SL_ERR_UNSUPPORTED, "%s: keyword '%.60s' is not supported", path,
                           key);
    }
    /* the types allowed */
    const json_t *type = json_object_get(s, "type");
    int types = 0;
    if (json_is_string(type)) {
        if (!(types = type_bit(json_string_value(type))))
            return sl_fail(k->err, SL_ERR_ARG, "%s.type: unknown type '%.40s'", path,
                           json_string_value(type));
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            const int b = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
            if (!b) return sl_fail(k->err, SL_ERR_ARG, "%s.type[%zu] is not a type name", path, i);
            types |= b;
        }
    } else if (type) {
        return sl_fail(k->err, SL_ERR_ARG, "%s.type must be a type name or a list of them", path);
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) { /* literals, of the types allowed */
        if (en && cn)
            return sl_fail(k->err, SL_ERR_UNSUPPORTED, "%s: enum and const together", path);
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return sl_fail(k->err, SL_ERR_ARG, "%s.enum must be a non-empty array", path);
        const size_t n = en ? json_array_size(en) : 1;
        const json_t **vals = calloc(n, sizeof *vals);
        if (!vals) return sl_fail(k->err, SL_ERR_NOMEM, "out of memory");
        int32_t m = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *v = en ? json_array_get(en, i) : cn;
            const int vt = value_types(v);
            if (!vt ||
                (json_is_string(v) && strlen(json_string_value(v)) != json_string_length(v))) {
                free(vals);
                return sl_fail(k->err, SL_ERR_UNSUPPORTED,
                               "%s.%s: only strings (without NUL), numbers, booleans and null "
                               "are supported",
                               path, en ? "enum" : "const");
            }
            if (!types || (vt & types)) vals[m++] = v;
        }
        const int32_t node = m ? lit_node(k, vals, m)
                               : sl_fail(k->err, SL_ERR_ARG, "%s: no %s value has the type", path,
                                         en ? "enum" : "const");
        free(vals);
        return node;
    }
    if (!types) {
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties"))
            types = TB_OBJ;
        else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
                 json_object_get(s, "maxItems"))
            types = TB_ARR;
        else
            return N_ANY;
    }
    int32_t alt[JC_N] = {-1, -1, -1, -1, -1};
    if (types & TB_OBJ && (alt[JC_OBJ] = compile_object(k, s, depth, path)) < 0) return alt[JC_OBJ];
    if (types & TB_ARR && (alt[JC_ARR] = compile_array(k, s, depth, path)) < 0) return alt[JC_ARR];
    if (types & TB_STR) alt[JC_STR] = N_STRING;
    if (types & (TB_NUM | TB_INT)) alt[JC_NUM] = types & TB_NUM ? N_NUMBER : N_INTEGER;
    if (types & (TB_BOOL | TB_NULL)) {
        json_t *lits[3] = {json_false(), json_true(), json_null()};
        const json_t *pick[3];
        int32_t m = 0;
        if (types & TB_BOOL) pick[m++] = lits[0], pick[m++] = lits[1];
        if (types & TB_NULL) pick[m++] = lits[2];
        if ((alt[JC_LIT] = lit_node(k, pick, m)) < 0) return alt[JC_LIT];
    }
    int32_t n_alt = 0, one = -1;
    for (int i = 0; i < JC_N; i++)
        if (alt[i] >= 0) n_alt++, one = alt[i];
    if (n_alt == 1) return one;
    const int32_t node = new_node(k, JK_UNION);
    if (node < 0) return node;
    memcpy(k->c->nodes[node].alt, alt, sizeof alt);
    return node;
}

/* The nodes every constraint starts with (N_*). */
static int fixed_nodes(jcc *k) {
    const json_t *scalars[3] = {json_false(), json_true(), json_null()};
    if (new_node(k, JK_UNION) != N_ANY || new_node(k, JK_OBJECT) != N_ANY_OBJ ||
        new_node(k, JK_ARRAY) != N_ANY_ARR || new_node(k, JK_STRING) != N_STRING ||
        new_node(k, JK_NUMBER) != N_NUMBER || lit_node(k, scalars, 3) != N_SCALARS ||
        new_node(k, JK_INTEGER) != N_INTEGER)
        return k->err->code ? k->err->code : SL_ERR_NOMEM;
    jnode *any = &k->c->nodes[N_ANY];
    any->alt[JC_OBJ] = N_ANY_OBJ, any->alt[JC_ARR] = N_ANY_ARR, any->alt[JC_STR] = N_STRING;
    any->alt[JC_NUM] = N_NUMBER, any->alt[JC_LIT] = N_SCALARS;
    k->c->nodes[N_ANY_OBJ].extra = N_ANY;
    k->c->nodes[N_ANY_ARR].items = N_ANY;
    return 0;
}

/* ================================================================ the automaton */

/* JSON's whitespace but '\r', which a model writing JSON has no use for. */
static int is_ws(uint8_t x) {
    return x == ' ' || x == '\n' || x == '\t';
}

/* Whitespace in a gap: 1 taken, 0 refused (the gap is full). */
static int take_ws(jframe *f) {
    if (f->ws >= SL_JSON_MAX_WS) return 0;
    f->ws++;
    return 1;
}

static int value_class(uint8_t x) {
    switch (x) {
    case '{': return JC_OBJ;
    case '[': return JC_ARR;
    case '"': return JC_STR;
    case 't':
    case 'f':
    case 'n': return JC_LIT;
    default: return x == '-' || (x >= '0' && x <= '9') ? JC_NUM : -1;
    }
}

static void push(sl_json_constraint *c, jstate *s, int32_t node) {
    SL_ASSERT(c->arena_n < c->arena_cap && s->depth < MAX_FRAMES);
    jlink *l = &c->arena[c->arena_n++];
    l->f = s->top, l->up = s->up;
    s->up = l;
    s->depth++;
    s->top = (jframe){.node = node, .kind = F_VALUE};
}

/* The value on top is complete: back to its container (which already expects what follows). */
static void pop(jstate *s) {
    s->top = s->up->f;
    s->up = s->up->up;
    s->depth--;
}

static int num_can_end(int mode) {
    return mode == N_ZERO || mode == N_INT || mode == N_FRAC || mode == N_EXP;
}

static int lit_complete(const sl_json_constraint *c, const jframe *f) {
    return c->lits[f->a].len == f->b;
}

static int obj_can_close(const sl_json_constraint *c, const jnode *nd, const jframe *f) {
    return nd->n_props == 0 || f->a >= nd->n_props ||
           c->props[nd->props + f->a].next_req >= nd->n_props;
}

/* Feeds one byte: 1 taken (s advanced), 0 refused (s is then garbage: steps run on copies). A
 * byte that ends a number or a literal ends its frame and is fed again to the container. */
static int step(sl_json_constraint *c, jstate *s, uint8_t x) {
    for (;;) {
        jframe *f = &s->top;
        const jnode *nd = &c->nodes[f->node];
        switch (f->kind) {
        case F_END: return 0;
        case F_VALUE: {
            if (is_ws(x)) return take_ws(f);
            int32_t n = f->node;
            if (nd->kind == JK_UNION) {
                const int cls = value_class(x);
                if (cls < 0) return 0;
                /* any value nests only so deep: scalars are always left */
                if (n == N_ANY && (cls == JC_OBJ || cls == JC_ARR) && s->depth > SL_JSON_MAX_NEST)
                    return 0;
                if ((n = nd->alt[cls]) < 0) return 0;
                nd = &c->nodes[n];
            }
            f->node = n, f->ws = 0, f->a = 0;
            switch (nd->kind) {
            case JK_OBJECT: f->kind = F_OBJ, f->mode = O_OPEN; return x == '{';
            case JK_ARRAY: f->kind = F_ARR, f->mode = A_OPEN; return x == '[';
            case JK_STRING: f->kind = F_STR, f->s = (jscan){0}; return x == '"';
            case JK_NUMBER:
            case JK_INTEGER: f->kind = F_NUM, f->mode = N_START; continue;
            case JK_LIT: f->kind = F_LIT, f->a = nd->lits, f->b = 0; continue;
            default: return 0;
            }
        }
        case F_OBJ: {
            const int map = nd->n_props == 0;
            const jprop *P = c->props + nd->props;
            switch (f->mode) {
            case O_OPEN:
            case O_COMMA:
                if (is_ws(x)) return take_ws(f);
                if (x == '"') {
                    if (map ? nd->extra < 0 : f->a >= nd->n_props) return 0;
                    f->mode = O_KEY, f->ws = 0, f->s = (jscan){0}, f->b = f->a, f->c = 1;
                    return 1;
                }
                if (x == '}' && f->mode == O_OPEN && obj_can_close(c, nd, f)) {
                    pop(s);
                    return 1;
                }
                return 0;
            case O_KEY:
                if (map) {
                    const int r = scan(&f->s, x);
                    if (r == 1) f->mode = O_COLON;
                    return r >= 0;
                }
                {
                    /* The keys that may come: from the next property up to the first required
                     * one (properties come in order); the first of them matching so far is b. */
                    const int32_t last = SL_MIN(P[f->a].next_req, nd->n_props - 1);
                    const jn_text *cur = &P[f->b].key;
                    for (int32_t i = f->b; i <= last; i++) {
                        const jn_text *t = &P[i].key;
                        if (t->len <= f->c || (uint8_t)c->text[t->off + f->c] != x) continue;
                        if (i != f->b && memcmp(c->text + t->off, c->text + cur->off, (size_t)f->c))
                            continue;
                        f->b = i, f->c++;
                        if (f->c == t->len) f->mode = O_COLON, f->a = i + 1;
                        return 1;
                    }
                    return 0;
                }
            case O_COLON:
                if (is_ws(x)) return take_ws(f);
                if (x != ':') return 0;
                f->mode = O_AFTER, f->ws = 0;
                push(c, s, map ? nd->extra : P[f->b].node);
                return 1;
            default: /* O_AFTER */
                if (is_ws(x)) return take_ws(f);
                if (x == ',' && (map || f->a < nd->n_props)) {
                    f->mode = O_COMMA, f->ws = 0;
                    return 1;
                }
                if (x == '}' && obj_can_close(c, nd, f)) {
                    pop(s);
                    return 1;
                }
                return 0;
            }
        }
        case F_ARR:
            if (is_ws(x)) return take_ws(f);
            if (f->mode == A_AFTER) {
                if (x == ',' && f->a < nd->max_items) {
                    f->mode = A_COMMA, f->ws = 0;
                    return 1;
                }
                if (x == ']' && f->a >= nd->min_items) {
                    pop(s);
                    return 1;
                }
                return 0;
            }
            if (x == ']' && f->mode == A_OPEN && nd->min_items == 0) {
                pop(s);
                return 1;
            }
            if (f->a >= nd->max_items) return 0;
            f->a++, f->mode = A_AFTER, f->ws = 0;
            push(c, s, nd->items);
            continue; /* x starts the item */
        case F_STR: {
            const int r = scan(&f->s, x);
            if (r == 1) pop(s);
            return r >= 0;
        }
        case F_NUM: {
            const int digit = x >= '0' && x <= '9', integer = nd->kind == JK_INTEGER;
            const int exp = !integer && (x == 'e' || x == 'E'), dot = !integer && x == '.';
            switch (f->mode) {
            case N_START:
                if (x == '-') return f->mode = N_MINUS, 1;
                /* fall through */
            case N_MINUS:
                if (x == '0') return f->mode = N_ZERO, 1;
                if (digit) return f->mode = N_INT, f->a = 1, 1;
                return 0;
            case N_ZERO:
            case N_INT:
                if (digit && f->mode == N_INT && f->a < NUM_MAX_DIGITS) return f->a++, 1;
                if (dot) return f->mode = N_DOT, 1;
                if (exp) return f->mode = N_E, 1;
                break;
            case N_DOT:
                if (digit) return f->mode = N_FRAC, f->a = 1, 1;
                return 0;
            case N_FRAC:
                if (digit && f->a < NUM_MAX_DIGITS) return f->a++, 1;
                if (exp) return f->mode = N_E, 1;
                break;
            case N_E:
                if (x == '+' || x == '-') return f->mode = N_ESIGN, 1;
                /* fall through */
            case N_ESIGN:
                if (digit) return f->mode = N_EXP, f->a = 1, 1;
                return 0;
            default: /* N_EXP */
                if (digit && f->a < NUM_MAX_EXP) return f->a++, 1;
                break;
            }
            if (!num_can_end(f->mode)) return 0;
            pop(s);
            continue;
        }
        default: { /* F_LIT: the literals matching so far are a run from a (they are sorted) */
            const jn_text *cur = &c->lits[f->a], *end = c->lits + nd->lits + nd->n_lits;
            for (const jn_text *t = cur; t < end; t++) {
                if (t != cur &&
                    (t->len < f->b || memcmp(c->text + t->off, c->text + cur->off, (size_t)f->b)))
                    break;
                if (t->len > f->b && (uint8_t)c->text[t->off + f->b] == x) {
                    f->a = (int32_t)(t - c->lits), f->b++;
                    return 1;
                }
            }
            if (!lit_complete(c, f)) return 0;
            pop(s);
            continue;
        }
        }
    }
}

/* The document may end here: it is over, or a number or literal at its root may stop. */
static int can_finish(const sl_json_constraint *c, const jstate *s) {
    const jframe *f = &s->top;
    if (f->kind == F_END) return 1;
    if (!s->up || s->up->f.kind != F_END) return 0;
    return (f->kind == F_NUM && num_can_end(f->mode)) || (f->kind == F_LIT && lit_complete(c, f));
}

/* s (whose links may lie in the arena) into the committed state, its links in c->stack. */
static void commit(sl_json_constraint *c, const jstate *s) {
    int32_t i = s->depth - 1;
    c->frames[i] = s->top;
    for (const jlink *l = s->up; l; l = l->up)
        c->frames[--i] = l->f;
    SL_ASSERT(i == 0);
    for (i = 0; i + 1 < s->depth; i++)
        c->stack[i] = (jlink){c->frames[i], i ? &c->stack[i - 1] : NULL};
    c->st.top = s->top;
    c->st.depth = s->depth;
    c->st.up = s->depth > 1 ? &c->stack[s->depth - 2] : NULL;
    c->arena_n = 0;
}

void sl_json_constraint_reset(sl_json_constraint *c) {
    c->stack[0] = (jlink){.f = {.kind = F_END}, .up = NULL};
    c->st = (jstate){.top = {.node = c->root, .kind = F_VALUE}, .up = &c->stack[0], .depth = 2};
    c->ended = 0;
    c->arena_n = 0;
}

sl_status sl_json_constraint_create(const sl_json_vocab *v, const json_t *schema,
                                    const int32_t *eos, int32_t n_eos, sl_json_constraint **out,
                                    sl_error *err) {
    *out = NULL;
    sl_json_constraint *c = calloc(1, sizeof *c);
    if (!c) return sl_fail(err, SL_ERR_NOMEM, "out of memory");
    c->v = v;
    jcc k = {.c = c, .err = err};
    sl_status st = fixed_nodes(&k);
    if (!st) {
        const int32_t root = schema ? compile(&k, schema, 0, "schema") : N_ANY_OBJ;
        if (root < 0) st = (sl_status)root;
        c->root = root;
    }
    for (int32_t i = 0; !st && i < n_eos && c->n_eos < MAX_EOS; i++)
        if (eos[i] >= 0) c->eos[c->n_eos++] = eos[i];
    if (!st) {
        /* a step pushes at most one frame a byte: a token's bytes (or feed's one byte) */
        c->arena_cap = (v ? v->max_len : 0) + MAX_FRAMES + 8;
        c->arena = calloc((size_t)c->arena_cap, sizeof *c->arena);
        c->allowed = v ? calloc((size_t)v->n_vocab + 1, 1) : NULL;
        if (!c->arena || (v && !c->allowed)) st = sl_fail(err, SL_ERR_NOMEM, "out of memory");
    }
    if (st) {
        sl_json_constraint_free(c);
        return st;
    }
    sl_json_constraint_reset(c);
    *out = c;
    return SL_OK;
}

void sl_json_constraint_free(sl_json_constraint *c) {
    if (!c) return;
    free(c->nodes);
    free(c->props);
    free(c->lits);
    free(c->text);
    free(c->arena);
    free(c->allowed);
    free(c);
}

int sl_json_constraint_done(const sl_json_constraint *c) {
    return c->ended || can_finish(c, &c->st);
}

/* ---------------------------------------------------------------- mask */

static void mark_ids(sl_json_constraint *c, uint32_t lo, uint32_t hi) {
    const int32_t *ids = c->v->ids;
    for (uint32_t i = lo; i < hi; i++)
        c->allowed[ids[i]] = 1;
}

/* s is inside a string (a value, or a key of a map) at a character: whatever plain string
 * content comes next is taken, and leaves it so. */
static int in_string(const sl_json_constraint *c, const jstate *s) {
    const jframe *f = &s->top;
    return f->s.st == S_CHAR && (f->kind == F_STR || (f->kind == F_OBJ && f->mode == O_KEY &&
                                                      c->nodes[f->node].n_props == 0));
}

/* The children of trie node t from state s (clean: the walk started in_string). A subtree
 * whose ids are plain from their first byte (when clean), or plain after its node's byte
 * when that byte leaves the state in_string, is allowed whole without walking it: inside
 * strings that is most of the vocabulary. */
static void walk(sl_json_constraint *c, uint32_t t, const jstate *s, int clean) {
    const jt_node *nodes = c->v->nodes;
    const jt_node *nd = &nodes[t];
    for (uint32_t u = nd->child; u < nd->child + nd->n_child; u++) {
        const jt_node *cu = &nodes[u];
        if (clean && (cu->plain & JT_PLAIN)) {
            mark_ids(c, cu->lo, cu->hi);
            continue;
        }
        jstate s2 = *s;
        const int32_t mark = c->arena_n;
        if (step(c, &s2, cu->byte)) {
            if ((cu->plain & JT_PLAIN_AFTER) && in_string(c, &s2)) {
                mark_ids(c, cu->lo, cu->hi);
            } else {
                mark_ids(c, cu->lo, cu->mid);
                if (cu->n_child) walk(c, u, &s2, clean);
            }
        }
        c->arena_n = mark;
    }
}

void sl_json_constraint_mask(sl_json_constraint *c, float *logits, int32_t n) {
    SL_ASSERT(c->v);
    const int32_t nv = c->v->n_vocab;
    memset(c->allowed, 0, (size_t)nv);
    if (!c->ended) {
        c->arena_n = 0;
        walk(c, 0, &c->st, in_string(c, &c->st));
    }
    const int done = sl_json_constraint_done(c);
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos[i] < nv) c->allowed[c->eos[i]] = (uint8_t)done;
    for (int32_t i = 0; i < n; i++)
        if (i >= nv || !c->allowed[i]) logits[i] = -INFINITY;
}

/* ---------------------------------------------------------------- accept */

int sl_json_constraint_feed(sl_json_constraint *c, const char *bytes, size_t n) {
    if (c->ended || n == 0) return -1;
    /* byte by byte, committing each (the arena holds one byte's links), back to the copy if
     * one is refused */
    const jstate saved_st = c->st;
    memcpy(c->saved, c->stack, sizeof c->stack);
    for (size_t i = 0; i < n; i++) {
        jstate s = c->st;
        c->arena_n = 0;
        if (!step(c, &s, (uint8_t)bytes[i])) {
            memcpy(c->stack, c->saved, sizeof c->stack);
            c->st = saved_st;
            c->arena_n = 0;
            return -1;
        }
        commit(c, &s);
    }
    return 0;
}

int sl_json_constraint_accept(sl_json_constraint *c, int32_t id) {
    if (c->ended) return -1;
    for (int32_t i = 0; i < c->n_eos; i++)
        if (id == c->eos[i]) {
            if (!can_finish(c, &c->st)) return -1;
            c->ended = 1;
            return 0;
        }
    if (!c->v || id < 0 || id >= c->v->n_vocab || c->v->len[id] <= 0) return -1;
    return sl_json_constraint_feed(c, (const char *)c->v->bytes + c->v->off[id],
                                   (size_t)c->v->len[id]);
}

void sl_json_constraint_mask_cb(void *c, float *logits, int32_t n) {
    sl_json_constraint_mask(c, logits, n);
}

void sl_json_constraint_accept_cb(void *c, int32_t id) {
    sl_json_constraint_accept(c, id);
}
