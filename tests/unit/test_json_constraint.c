/* Constrained decoding of JSON (sampler/json_constraint.c): documents fed byte by byte, schema
 * errors, and random sampling over Qwen3's vocabulary whose every document must parse and
 * validate. */
#include <jansson.h>

#include "sampler/json_constraint.h"
#include "test.h"

sl_tokenizer *test_qwen3_tokenizer(void); /* test_tokenizer.c */

static json_t *schema_of(const char *text) {
    json_error_t je;
    json_t *s = json_loads(text, 0, &je);
    if (!s) fprintf(stderr, "  bad test schema: %s: %s\n", text, je.text);
    return s;
}

/* A constraint without a vocabulary (feed only); schema NULL: json_object. */
static sl_json_constraint *make(const char *schema, sl_error *err) {
    json_t *s = schema ? schema_of(schema) : NULL;
    sl_json_constraint *c = NULL;
    const int32_t eos = 7;
    if (sl_json_constraint_create(NULL, s, &eos, 1, &c, err)) c = NULL;
    json_decref(s);
    return c;
}

/* 1: doc fed whole (one byte at a time, then again as one piece) is complete; 0: refused or
 * incomplete. */
static int takes(const char *schema, const char *doc) {
    sl_error err = {0};
    sl_json_constraint *c = make(schema, &err);
    if (!c) {
        fprintf(stderr, "  %s: %s\n", schema ? schema : "(object)", err.msg);
        return -1;
    }
    int ok = 1;
    for (size_t i = 0; doc[i] && ok; i++)
        ok = sl_json_constraint_feed(c, doc + i, 1) == 0;
    ok = ok && sl_json_constraint_done(c);
    sl_json_constraint_reset(c);
    const int whole =
        sl_json_constraint_feed(c, doc, strlen(doc)) == 0 && sl_json_constraint_done(c);
    if (whole != ok) ok = -2;
    sl_json_constraint_free(c);
    return ok;
}

TEST(test_json_constraint_bytes) {
    static const struct {
        const char *schema, *doc;
        int ok;
    } cases[] = {
        {NULL, "{}", 1},
        {NULL, "{\"a\": [1, -2.5e+10, true, null, {\"b\": \"\\u00e9\\n\"}], \"a\": \"x\"}", 1},
        {NULL, " {\n  \"k\" : \"caf\xc3\xa9\"\n}", 1},
        {NULL, "[1]", 0},                         /* json_object: an object */
        {NULL, "{} ", 0},                         /* nothing after the document */
        {NULL, "{\"a\":1,}", 0},                  /* no trailing comma */
        {NULL, "{\"a\":01}", 0},                  /* no leading zero */
        {NULL, "{\"a\":\"\\ud800\"}", 0},         /* no surrogate escape */
        {NULL, "{\"a\":\"\\u0000\"}", 0},         /* no NUL */
        {NULL, "{\"a\":\"\xc0\xaf\"}", 0},        /* no overlong UTF-8 */
        {NULL, "{\"a\":\"\xed\xa0\x80\"}", 0},    /* no UTF-8 surrogate */
        {NULL, "{\"a\":\"x\ty\"}", 0},            /* no raw control character */
        {NULL, "{\"a\":1234567890123456789}", 0}, /* 19 digits */
        {NULL, "{\"a\":1e100}", 0},               /* 3 exponent digits */
        {NULL, "{         \"a\":1}", 0},          /* 9 spaces */
        {NULL, "{        \"a\":1}", 1},           /* 8 */
        {NULL, "{\r\"a\":1}", 0},                 /* no \r */
        {"{\"type\":\"integer\"}", "-120", 1},
        {"{\"type\":\"integer\"}", "1.5", 0},
        {"{\"type\":\"number\"}", "0.25E-3", 1},
        {"{\"type\":\"string\"}", "\"ok\"", 1},
        {"{\"type\":\"boolean\"}", "false", 1},
        {"{\"type\":\"boolean\"}", "null", 0},
        {"{\"type\":[\"string\",\"null\"]}", "null", 1},
        {"{\"type\":[\"string\",\"null\"]}", "\"s\"", 1},
        {"{\"type\":[\"string\",\"null\"]}", "1", 0},
        {"{\"enum\":[\"red\",\"green\",1,12,null]}", "\"green\"", 1},
        {"{\"enum\":[\"red\",\"green\",1,12,null]}", "1", 1},
        {"{\"enum\":[\"red\",\"green\",1,12,null]}", "12", 1},
        {"{\"enum\":[\"red\",\"green\",1,12,null]}", "123", 0},
        {"{\"enum\":[\"red\",\"green\",1,12,null]}", "\"blue\"", 0},
        {"{\"const\":\"x\"}", "\"x\"", 1},
        {"{\"type\":\"string\",\"enum\":[\"a\",2]}", "2", 0}, /* filtered by type */
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}",
         "[1, 2]", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}",
         "[]", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}",
         "[1,2,3]", 0},
        {"{\"type\":\"array\"}", "[1, \"a\", {}]", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = takes(cases[i].schema, cases[i].doc);
        CHECKF(got == cases[i].ok, "case %zu: %s on %s: got %d", i, cases[i].doc,
               cases[i].schema ? cases[i].schema : "(object)", got);
    }

    /* properties in order, required ones present, optional ones left out or not */
    const char *obj = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                      "\"nick\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                      "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]}}},"
                      "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    CHECK(takes(obj, "{\"name\":\"x\",\"age\":3}") == 1);
    CHECK(takes(obj, "{\"name\":\"x\",\"nick\":\"y\",\"age\":3,\"tags\":[\"b\",\"a\"]}") == 1);
    CHECK(takes(obj, "{\"age\":3,\"name\":\"x\"}") == 0); /* out of order */
    CHECK(takes(obj, "{\"name\":\"x\"}") == 0);           /* age missing */
    CHECK(takes(obj, "{\"name\":\"x\",\"age\":3,\"zz\":1}") == 0);
    CHECK(takes(obj, "{\"name\":\"x\",\"name\":\"y\",\"age\":3}") == 0); /* twice */
    CHECK(takes(obj, "{\"name\":\"x\",\"age\":3,\"tags\":[\"c\"]}") == 0);
    /* property names sharing a prefix */
    const char *pre = "{\"properties\":{\"ab\":{},\"a\":{},\"abc\":{}},\"required\":[\"abc\"]}";
    CHECK(takes(pre, "{\"a\":1,\"abc\":2}") == 1);
    CHECK(takes(pre, "{\"ab\":1,\"a\":1,\"abc\":2}") == 1);
    CHECK(takes(pre, "{\"abc\":2}") == 1);
    CHECK(takes(pre, "{\"a\":1}") == 0);
    /* a map: additionalProperties as a schema */
    const char *map = "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}";
    CHECK(takes(map, "{\"x\":1,\"y\\\"\":2.5}") == 1);
    CHECK(takes(map, "{\"x\":\"s\"}") == 0);
    CHECK(takes("{\"type\":\"object\",\"additionalProperties\":false}", "{}") == 1);
    CHECK(takes("{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}") == 0);

    /* any value nests SL_JSON_MAX_NEST deep at most; a scalar is always left */
    {
        sl_error e = {0};
        sl_json_constraint *c = make(NULL, &e);
        int depth = 0;
        CHECK(c && sl_json_constraint_feed(c, "{\"a\":", 5) == 0);
        while (c && depth < 100 && sl_json_constraint_feed(c, "[", 1) == 0)
            depth++;
        CHECKF(depth > 8 && depth < SL_JSON_MAX_NEST, "nested %d deep", depth);
        CHECK(c && sl_json_constraint_feed(c, "{", 1) == -1 &&
              sl_json_constraint_feed(c, "1", 1) == 0);
        for (int i = 0; c && i < depth; i++)
            CHECK(sl_json_constraint_feed(c, "]", 1) == 0);
        CHECK(c && sl_json_constraint_feed(c, "}", 1) == 0 && sl_json_constraint_done(c));
        sl_json_constraint_free(c);
    }

    /* EOS: accepted only when complete, then nothing more */
    sl_error err = {0};
    sl_json_constraint *c = make("{\"type\":\"integer\"}", &err);
    CHECK(c && sl_json_constraint_accept(c, 7) == -1);
    CHECK(c && sl_json_constraint_feed(c, "-", 1) == 0 && !sl_json_constraint_done(c));
    CHECK(c && sl_json_constraint_accept(c, 7) == -1);
    CHECK(c && sl_json_constraint_feed(c, "42", 2) == 0 && sl_json_constraint_done(c));
    CHECK(c && sl_json_constraint_feed(c, "x", 1) == -1 && sl_json_constraint_done(c));
    CHECK(c && sl_json_constraint_accept(c, 7) == 0 && sl_json_constraint_done(c));
    CHECK(c && sl_json_constraint_feed(c, "1", 1) == -1);
    sl_json_constraint_free(c);
}

TEST(test_json_constraint_schema_errors) {
    static const struct {
        const char *schema, *msg;
        sl_status code;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "keyword 'pattern'", SL_ERR_UNSUPPORTED},
        {"{\"anyOf\":[{}]}", "keyword 'anyOf'", SL_ERR_UNSUPPORTED},
        {"{\"properties\":{\"a\":{\"$ref\":\"#/$defs/x\"}}}", "schema.properties.a: keyword '$ref'",
         SL_ERR_UNSUPPORTED},
        {"{\"type\":\"number\",\"minimum\":0}", "keyword 'minimum'", SL_ERR_UNSUPPORTED},
        {"{\"type\":\"strin\"}", "unknown type 'strin'", SL_ERR_ARG},
        {"{\"properties\":{\"a\":{}},\"additionalProperties\":true}", "only false",
         SL_ERR_UNSUPPORTED},
        {"{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'b' is not in properties",
         SL_ERR_ARG},
        {"{\"enum\":[[1]]}", "schema.enum: only strings", SL_ERR_UNSUPPORTED},
        {"{\"type\":\"string\",\"enum\":[1]}", "no enum value has the type", SL_ERR_ARG},
        {"{\"minItems\":3,\"maxItems\":2}", "minItems 3 is above maxItems 2", SL_ERR_ARG},
        {"[]", "a schema must be an object", SL_ERR_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_error err = {0};
        sl_json_constraint *c = make(cases[i].schema, &err);
        CHECKF(!c && err.code == cases[i].code && strstr(err.msg, cases[i].msg), "case %zu: %s", i,
               err.msg);
        sl_json_constraint_free(c);
    }
    /* too deep */
    char deep[2048] = "";
    for (int i = 0; i < SL_JSON_MAX_NEST + 2; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < SL_JSON_MAX_NEST + 2; i++)
        strcat(deep, "}");
    sl_error err = {0};
    sl_json_constraint *c = make(deep, &err);
    CHECKF(!c && strstr(err.msg, "nests deeper"), "%s", err.msg);
    /* annotations are fine */
    c = make("{\"title\":\"T\",\"description\":\"d\",\"type\":\"object\",\"properties\":{\"a\":"
             "{\"type\":\"string\",\"default\":\"x\",\"examples\":[\"y\"]}},\"$schema\":\"s\"}",
             &err);
    CHECKF(c != NULL, "%s", err.msg);
    sl_json_constraint_free(c);
}

/* ---- random sampling over a real vocabulary ---- */

static int is_type(const json_t *v, const char *t) {
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return 0;
}

/* The keywords json_constraint.h supports, checked the way JSON Schema reads them. */
static int validate(const json_t *s, const json_t *v) {
    if (!s || json_is_true(s)) return 1;
    const json_t *type = json_object_get(s, "type");
    if (json_is_string(type) && !is_type(v, json_string_value(type))) return 0;
    if (json_is_array(type)) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(type); i++)
            any |= is_type(v, json_string_value(json_array_get(type, i)));
        if (!any) return 0;
    }
    const json_t *en = json_object_get(s, "enum");
    if (en) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(en); i++)
            any |= json_equal((json_t *)json_array_get(en, i), (json_t *)v);
        if (!any) return 0;
    }
    if (json_object_get(s, "const") && !json_equal(json_object_get(s, "const"), (json_t *)v))
        return 0;
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"),
                     *ap = json_object_get(s, "additionalProperties");
        const json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) {
            const json_t *ps = json_object_get(props, key);
            if (ps) {
                if (!validate(ps, val)) return 0;
            } else if (ap && json_is_false(ap)) {
                return 0;
            } else if (props && json_object_size(props) && !ap) {
                return 0; /* sluice's default for objects with properties */
            } else if (json_is_object(ap) && !validate(ap, val)) {
                return 0;
            }
        }
    }
    if (json_is_array(v)) {
        const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (mn && (json_int_t)json_array_size(v) < json_integer_value(mn)) return 0;
        if (mx && (json_int_t)json_array_size(v) > json_integer_value(mx)) return 0;
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!validate(json_object_get(s, "items"), json_array_get(v, i))) return 0;
    }
    return 1;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* n_docs documents drawn at random (random logits, a pull towards closing after a while so
 * that they end) through the mask; each must parse and validate. Returns the documents that
 * ended before max_steps. */
static int sample_docs(sl_tokenizer *tok, const sl_json_vocab *v, const char *schema, int n_docs,
                       uint64_t seed) {
    json_t *s = schema ? schema_of(schema) : NULL;
    const int32_t n = sl_tokenizer_vocab_size(tok);
    int32_t eos[2] = {sl_tokenizer_token_to_id(tok, "<|im_end|>"),
                      sl_tokenizer_token_to_id(tok, "<|endoftext|>")};
    if (eos[0] < 0) eos[0] = eos[1] = sl_tokenizer_token_to_id(tok, "</s>"); /* SentencePiece */
    sl_json_constraint *c = NULL;
    sl_error err = {0};
    if (sl_json_constraint_create(v, s, eos, 2, &c, &err)) {
        fprintf(stderr, "  %s: %s\n", schema ? schema : "(object)", err.msg);
        test_failures++;
        json_decref(s);
        return 0;
    }
    float *logits = malloc((size_t)n * sizeof *logits);
    uint8_t *closes = calloc((size_t)n, 1); /* ids whose bytes start with '"', '}' or ']' */
    char *doc = malloc(1 << 16), buf[1100];
    for (int32_t id = 0; id < n; id++) {
        const int32_t len = sl_tokenizer_token_bytes(tok, id, buf, (int32_t)sizeof buf);
        closes[id] = len > 0 && strchr("\"}]", buf[0]) && buf[0];
    }
    const int max_steps = 300;
    int ended = 0;
    for (int d = 0; d < n_docs; d++) {
        sl_json_constraint_reset(c);
        size_t len = 0;
        int step = 0, finished = 0;
        for (; step < max_steps; step++) {
            for (int32_t i = 0; i < n; i++) {
                logits[i] = (float)(rng_next(&seed) >> 40) / (float)(1 << 24);
                if (step > 20 && (closes[i] || i == eos[0])) logits[i] += 2;
            }
            sl_json_constraint_mask(c, logits, n);
            int32_t best = -1, n_ok = 0, banned = -1;
            for (int32_t i = 0; i < n; i++) {
                if (logits[i] == -INFINITY) {
                    if (banned < 0 || (rng_next(&seed) & 7) == 0) banned = i;
                    continue;
                }
                n_ok++;
                if (best < 0 || logits[i] > logits[best]) best = i;
            }
            if (n_ok == 0) {
                CHECKF(0, "%s: no id allowed after %.*s", schema, (int)len, doc);
                break;
            }
            /* the mask and accept agree: a banned id is refused (and changes nothing) */
            if (banned >= 0 && banned != eos[0] && banned != eos[1])
                CHECKF(sl_json_constraint_accept(c, banned) == -1, "banned id %d accepted", banned);
            if (best == eos[0] || best == eos[1]) {
                CHECK(sl_json_constraint_done(c));
                CHECK(sl_json_constraint_accept(c, best) == 0);
                finished = 1;
                break;
            }
            const int32_t bl = sl_tokenizer_token_bytes(tok, best, buf, (int32_t)sizeof buf);
            CHECKF(sl_json_constraint_accept(c, best) == 0, "allowed id %d refused", best);
            if (bl > 0 && len + (size_t)bl < (1 << 16)) {
                memcpy(doc + len, buf, (size_t)bl);
                len += (size_t)bl;
            }
        }
        if (!finished) continue;
        ended++;
        json_error_t je;
        json_t *val = json_loadb(doc, len, JSON_DECODE_ANY, &je);
        CHECKF(val != NULL, "%s: does not parse (%s): %.*s", schema ? schema : "(object)", je.text,
               (int)len, doc);
        CHECKF(!val || (schema ? validate(s, val) : json_is_object(val)),
               "%s: does not validate: %.*s", schema ? schema : "(object)", (int)len, doc);
        if (d == 0 && getenv("SL_TEST_VERBOSE"))
            printf("  %s -> %.*s\n", schema ? schema : "(object)", (int)len, doc);
        json_decref(val);
    }
    free(doc);
    free(closes);
    free(logits);
    sl_json_constraint_free(c);
    json_decref(s);
    return ended;
}

TEST(test_json_constraint_sampling) {
    sl_tokenizer *tok = test_qwen3_tokenizer();
    if (!tok) {
        test_failures++;
        return;
    }
    sl_json_vocab *v = NULL;
    sl_error err = {0};
    double t0 = sl_now();
    if (sl_json_vocab_create(tok, &v, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    printf("  json vocab: %.0f ms\n", (sl_now() - t0) * 1e3);
    static const char *const schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"score\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"},\"tags\":{"
        "\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},\"color\":{\"enum\":["
        "\"red\",\"green\",null,7]},\"nick\":{\"type\":[\"string\",\"null\"]}},\"required\":["
        "\"name\",\"age\",\"color\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
        "\"number\"},\"y\":{\"const\":\"fixed\"}},\"required\":[\"x\",\"y\"]},\"minItems\":1,"
        "\"maxItems\":4}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"type\":\"integer\"}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        const int ended = sample_docs(tok, v, schemas[i], 12, 0x9E3779B97F4A7C15ull + i);
        CHECKF(ended >= 6, "%s: only %d of 12 documents ended",
               schemas[i] ? schemas[i] : "(object)", ended);
    }
    sl_json_vocab_free(v);
}

/* SentencePiece style (Llama 2: "\u2581" for spaces, <0xXX> byte tokens) through the same. */
TEST(test_json_constraint_sampling_sentencepiece) {
    char path[1024];
    snprintf(path, sizeof path, "%s/../tokenizer/lenml_llama2", test_fixtures);
    sl_tokenizer *tok = NULL;
    sl_json_vocab *v = NULL;
    sl_error err = {0};
    if (sl_tokenizer_load(path, &tok, &err) || sl_json_vocab_create(tok, &v, &err)) {
        CHECKF(0, "%s", err.msg);
        sl_tokenizer_free(tok);
        return;
    }
    static const char *const schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
        "\"number\"},\"e\":{\"enum\":[\"caf\u00e9\",false]}},\"required\":[\"name\",\"e\"]}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        const int ended = sample_docs(tok, v, schemas[i], 12, 0x2545F4914F6CDD1Dull + i);
        CHECKF(ended >= 6, "%s: only %d of 12 documents ended",
               schemas[i] ? schemas[i] : "(object)", ended);
    }
    sl_json_vocab_free(v);
    sl_tokenizer_free(tok);
}
