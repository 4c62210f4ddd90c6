/* GGUF reader: every value type, tensors, and every way to break a file. */
#include "format/gguf.h"
#include "test.h"

/* ---- a tiny GGUF writer ---- */

typedef struct gw {
    uint8_t *b;
    size_t n, cap;
} gw;

static void gw_put(gw *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void gw_u8(gw *w, uint8_t v) {
    gw_put(w, &v, 1);
}
static void gw_u32(gw *w, uint32_t v) {
    gw_put(w, &v, 4);
}
static void gw_u64(gw *w, uint64_t v) {
    gw_put(w, &v, 8);
}
static void gw_str(gw *w, const char *s) {
    gw_u64(w, strlen(s));
    gw_put(w, s, strlen(s));
}
static void gw_key(gw *w, const char *k, uint32_t type) {
    gw_str(w, k);
    gw_u32(w, type);
}

/* What to break in the otherwise valid file that build() writes. */
typedef struct gopts {
    const char *magic;   /* NULL: "GGUF" */
    uint32_t version;    /* 0: 3 */
    uint64_t nkv, nt;    /* 0: the true counts */
    uint32_t align;      /* 0: no general.alignment key (default 32) */
    uint64_t arch_len;   /* 0: the true length of general.architecture */
    uint32_t t1_type;    /* 0: Q4_K */
    uint64_t t1_off_add; /* added to tensor 1's offset */
    int t1_huge;         /* tensor 1's dims overflow */
    int t1_row;          /* tensor 1's row length is not a whole block */
    int nested;          /* add an array of arrays */
    int dup_key;         /* add general.architecture twice */
    int dup_tensor;      /* name tensor 2 as tensor 0 */
    uint32_t bool_val;   /* 0: 1 */
} gopts;

#define N_KV 17u

typedef struct gtensor {
    const char *name;
    uint32_t type;
    uint32_t nd;
    uint64_t ne[4];
    uint64_t nbytes;
} gtensor;

/* Key/values of every type, then three tensors (F32 [8,2], Q4_K [256,2,3], Q8_0 [32]), the last
 * one ending exactly at the end of the file. */
static uint8_t *build(const gopts *o, size_t *size) {
    gw w = {0};
    gw_put(&w, o->magic ? o->magic : "GGUF", 4);
    gw_u32(&w, o->version ? o->version : 3);
    gw_u64(&w, o->nt ? o->nt : 3);
    gw_u64(&w, o->nkv ? o->nkv
                      : (uint64_t)(N_KV + (o->align != 0) + (o->nested != 0) + (o->dup_key != 0)));
    gw_key(&w, "general.architecture", SL_GGUF_STRING);
    gw_u64(&w, o->arch_len ? o->arch_len : 8);
    gw_put(&w, "qwen3moe", 8);
    gw_key(&w, "k.u8", SL_GGUF_U8), gw_u8(&w, 200);
    gw_key(&w, "k.i8", SL_GGUF_I8), gw_u8(&w, (uint8_t)-5);
    gw_key(&w, "k.u16", SL_GGUF_U16), gw_put(&w, &(uint16_t){60000}, 2);
    gw_key(&w, "k.i16", SL_GGUF_I16), gw_put(&w, &(int16_t){-300}, 2);
    gw_key(&w, "k.u32", SL_GGUF_U32), gw_u32(&w, 4000000000u);
    gw_key(&w, "k.i32", SL_GGUF_I32), gw_put(&w, &(int32_t){-70000}, 4);
    gw_key(&w, "k.f32", SL_GGUF_F32), gw_put(&w, &(float){1.5f}, 4);
    gw_key(&w, "k.bool", SL_GGUF_BOOL), gw_u8(&w, (uint8_t)(o->bool_val ? o->bool_val : 1));
    gw_key(&w, "k.u64", SL_GGUF_U64), gw_u64(&w, UINT64_C(1) << 40);
    gw_key(&w, "k.i64", SL_GGUF_I64), gw_put(&w, &(int64_t){-(INT64_C(1) << 40)}, 8);
    gw_key(&w, "k.f64", SL_GGUF_F64), gw_put(&w, &(double){2.25}, 8);
    gw_key(&w, "k.empty", SL_GGUF_STRING), gw_str(&w, "");
    gw_key(&w, "a.str", SL_GGUF_ARRAY), gw_u32(&w, SL_GGUF_STRING), gw_u64(&w, 3);
    gw_str(&w, "a"), gw_str(&w, ""), gw_str(&w, "hello");
    gw_key(&w, "a.i32", SL_GGUF_ARRAY), gw_u32(&w, SL_GGUF_I32), gw_u64(&w, 3);
    gw_put(&w, (int32_t[]){1, -2, 3}, 12);
    gw_key(&w, "a.f32", SL_GGUF_ARRAY), gw_u32(&w, SL_GGUF_F32), gw_u64(&w, 2);
    gw_put(&w, (float[]){0.5f, -1.0f}, 8);
    gw_key(&w, "a.u8", SL_GGUF_ARRAY), gw_u32(&w, SL_GGUF_U8), gw_u64(&w, 0);
    if (o->align) gw_key(&w, "general.alignment", SL_GGUF_U32), gw_u32(&w, o->align);
    if (o->nested) {
        gw_key(&w, "a.nested", SL_GGUF_ARRAY), gw_u32(&w, SL_GGUF_ARRAY), gw_u64(&w, 1);
        gw_u32(&w, SL_GGUF_U8), gw_u64(&w, 1), gw_u8(&w, 7);
    }
    if (o->dup_key) gw_key(&w, "general.architecture", SL_GGUF_STRING), gw_str(&w, "x");

    /* the layout's alignment: the key's, unless it is refused anyway (not a power of two, or
     * 2 GiB, which padded a byte at a time took most of a minute) */
    const uint64_t al =
        o->align && !(o->align & (o->align - 1)) && o->align <= 4096 ? o->align : 32;
    gtensor ts[3] = {
        {"tok_embd.weight", SL_GGML_F32, 2, {8, 2, 1, 1}, 64},
        {"blk.0.ffn_down_exps.weight",
         o->t1_type ? o->t1_type : SL_GGML_Q4_K,
         3,
         {256, 2, 3, 1},
         6 * 144},
        {o->dup_tensor ? "tok_embd.weight" : "output_norm.weight",
         SL_GGML_Q8_0,
         1,
         {32, 1, 1, 1},
         34},
    };
    if (o->t1_huge) ts[1].ne[1] = ts[1].ne[2] = UINT64_C(1) << 40;
    if (o->t1_row) ts[1].ne[0] = 100;
    uint64_t off[3], at = 0;
    for (int i = 0; i < 3; i++) {
        off[i] = at;
        at = (at + ts[i].nbytes + al - 1) / al * al;
    }
    off[1] += o->t1_off_add;
    for (int i = 0; i < 3; i++) {
        gw_str(&w, ts[i].name);
        gw_u32(&w, ts[i].nd);
        for (uint32_t d = 0; d < ts[i].nd; d++)
            gw_u64(&w, ts[i].ne[d]);
        gw_u32(&w, ts[i].type);
        gw_u64(&w, off[i]);
    }
    while (w.n % al)
        gw_u8(&w, 0);
    const size_t data = w.n;
    const size_t end = data + off[2] + ts[2].nbytes;
    while (w.n < end)
        gw_u8(&w, (uint8_t)(w.n - data));
    *size = w.n;
    return w.b;
}

/* Parses build(o) as x.gguf; the message stays in err. */
static sl_status try_parse(const gopts *o, sl_error *err) {
    size_t n;
    uint8_t *img = build(o, &n);
    sl_gguf_file f = {0};
    sl_error_clear(err);
    sl_status st = sl_gguf_parse(&f, "x.gguf", img, n, err);
    sl_gguf_close(&f);
    free(img);
    return st;
}

static int has(const sl_error *err, const char *s) {
    return strstr(err->msg, s) != NULL;
}

TEST(gguf_values_and_tensors) {
    for (uint32_t version = 2; version <= 3; version++) {
        size_t n;
        gopts o = {.version = version, .align = 64};
        uint8_t *img = build(&o, &n);
        sl_gguf_file f = {0};
        sl_error err = {0};
        sl_status st = sl_gguf_parse(&f, "x.gguf", img, n, &err);
        CHECKF(st == SL_OK, "%s", err.msg);
        if (st) {
            free(img);
            continue;
        }
        CHECK(f.version == version && f.alignment == 64 && f.data_start % 64 == 0);
        CHECK(f.n_kv == N_KV + 1 && f.n_tensors == 3);
        sl_gguf_str s;
        CHECK(sl_gguf_get_str(&f, "general.architecture", &s, &err) == SL_OK && s.len == 8 &&
              memcmp(s.s, "qwen3moe", 8) == 0);
        CHECK(sl_gguf_get_str(&f, "k.empty", &s, &err) == SL_OK && s.len == 0);
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f32;
        int32_t b;
        CHECK(sl_gguf_get_u32(&f, "k.u8", &u32, &err) == SL_OK && u32 == 200);
        CHECK(sl_gguf_get_i64(&f, "k.i8", &i64, &err) == SL_OK && i64 == -5);
        CHECK(sl_gguf_get_u32(&f, "k.u16", &u32, &err) == SL_OK && u32 == 60000);
        CHECK(sl_gguf_get_i64(&f, "k.i16", &i64, &err) == SL_OK && i64 == -300);
        CHECK(sl_gguf_get_u32(&f, "k.u32", &u32, &err) == SL_OK && u32 == 4000000000u);
        CHECK(sl_gguf_get_i64(&f, "k.i32", &i64, &err) == SL_OK && i64 == -70000);
        CHECK(sl_gguf_get_f32(&f, "k.f32", &f32, &err) == SL_OK && f32 == 1.5f);
        CHECK(sl_gguf_get_bool(&f, "k.bool", &b, &err) == SL_OK && b == 1);
        CHECK(sl_gguf_get_u64(&f, "k.u64", &u64, &err) == SL_OK && u64 == UINT64_C(1) << 40);
        CHECK(sl_gguf_get_i64(&f, "k.i64", &i64, &err) == SL_OK && i64 == -(INT64_C(1) << 40));
        CHECK(sl_gguf_get_f32(&f, "k.f64", &f32, &err) == SL_OK && f32 == 2.25f);
        /* Type mismatches and values that do not fit name the file and the key. */
        sl_error_clear(&err);
        CHECK(sl_gguf_get_u32(&f, "k.i32", &u32, &err) == SL_ERR_FORMAT && has(&err, "x.gguf") &&
              has(&err, "'k.i32'"));
        sl_error_clear(&err);
        CHECK(sl_gguf_get_u32(&f, "k.u64", &u32, &err) == SL_ERR_FORMAT && has(&err, "k.u64"));
        sl_error_clear(&err);
        CHECK(sl_gguf_get_str(&f, "k.u8", &s, &err) == SL_ERR_FORMAT &&
              has(&err, "expected string"));
        sl_error_clear(&err);
        CHECK(sl_gguf_get_f32(&f, "k.u8", &f32, &err) == SL_ERR_FORMAT);
        sl_error_clear(&err);
        CHECK(sl_gguf_get_bool(&f, "k.u8", &b, &err) == SL_ERR_FORMAT);
        sl_error_clear(&err);
        CHECK(sl_gguf_get_u32(&f, "a.i32", &u32, &err) == SL_ERR_FORMAT && has(&err, "array"));
        sl_error_clear(&err);
        CHECK(sl_gguf_get_u32(&f, "nope", &u32, &err) == SL_ERR_FORMAT && has(&err, "missing"));
        CHECK(sl_gguf_find_kv(&f, "nope") == NULL);
        /* Arrays. */
        const sl_gguf_kv *kv;
        CHECK(sl_gguf_get_arr(&f, "a.str", SL_GGUF_STRING, &kv, &err) == SL_OK && kv->n == 3);
        if (kv && kv->n == 3) {
            s = sl_gguf_arr_str(kv, 0);
            CHECK(s.len == 1 && s.s[0] == 'a');
            CHECK(sl_gguf_arr_str(kv, 1).len == 0);
            s = sl_gguf_arr_str(kv, 2);
            CHECK(s.len == 5 && memcmp(s.s, "hello", 5) == 0);
        }
        CHECK(sl_gguf_get_arr(&f, "a.i32", SL_GGUF_I32, &kv, &err) == SL_OK && kv->n == 3 &&
              sl_gguf_arr_int(kv, 0) == 1 && sl_gguf_arr_int(kv, 1) == -2 &&
              sl_gguf_arr_int(kv, 2) == 3);
        CHECK(sl_gguf_get_arr(&f, "a.f32", SL_GGUF_F32, &kv, &err) == SL_OK && kv->n == 2 &&
              sl_gguf_arr_float(kv, 0) == 0.5 && sl_gguf_arr_float(kv, 1) == -1.0);
        CHECK(sl_gguf_get_arr(&f, "a.u8", SL_GGUF_U8, &kv, &err) == SL_OK && kv->n == 0);
        sl_error_clear(&err);
        CHECK(sl_gguf_get_arr(&f, "a.i32", SL_GGUF_F32, &kv, &err) == SL_ERR_FORMAT &&
              has(&err, "array of i32") && has(&err, "expected an array of f32"));
        /* Tensors: file order, lookup by name, views inside the image. */
        const sl_gguf_tensor *t0 = sl_gguf_tensor_at(&f, 0), *t1 = sl_gguf_tensor_at(&f, 1);
        const sl_gguf_tensor *t2 = sl_gguf_tensor_at(&f, 2);
        CHECK(t0 && t1 && t2 && !sl_gguf_tensor_at(&f, 3) && !sl_gguf_tensor_at(&f, -1));
        CHECK(sl_gguf_find_tensor(&f, "blk.0.ffn_down_exps.weight") == t1);
        CHECK(sl_gguf_find_tensor(&f, "tok_embd.weight") == t0);
        CHECK(sl_gguf_find_tensor(&f, "output_norm.weight") == t2);
        CHECK(sl_gguf_find_tensor(&f, "missing") == NULL);
        CHECK(t0->type == SL_GGML_F32 && t0->n_dims == 2 && t0->ne[0] == 8 && t0->ne[1] == 2 &&
              t0->ne[2] == 1 && t0->nbytes == 64);
        CHECK(t1->type == SL_GGML_Q4_K && t1->n_dims == 3 && t1->ne[2] == 3 &&
              t1->nbytes == 6 * 144 && t1->offset == 64);
        CHECK(t2->type == SL_GGML_Q8_0 && t2->nbytes == 34);
        CHECK((const uint8_t *)t1->data == img + f.data_start + t1->offset);
        CHECK((const uint8_t *)t2->data + t2->nbytes == img + n);
        CHECK(strcmp(sl_gguf_type_name(t1->type), "Q4_K") == 0);
        sl_gguf_close(&f);
        free(img);
    }
}

TEST(gguf_type_table) {
    /* Block size and bytes per block from ggml's block layouts. */
    static const struct {
        uint32_t id, block, bytes;
    } want[] = {{0, 1, 4},      {1, 1, 2},      {30, 1, 2},     {2, 32, 18},    {3, 32, 20},
                {6, 32, 22},    {7, 32, 24},    {8, 32, 34},    {10, 256, 84},  {11, 256, 110},
                {12, 256, 144}, {13, 256, 176}, {14, 256, 210}, {23, 256, 136}, {39, 32, 17}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        sl_dtype dt = sl_gguf_dtype(want[i].id);
        CHECKF(dt != SL_DTYPE_NONE && (uint32_t)sl_dtype_block_size(dt) == want[i].block &&
                   sl_dtype_block_bytes(dt) == want[i].bytes &&
                   sl_row_bytes(dt, 2 * want[i].block) == 2 * want[i].bytes,
               "type %u", want[i].id);
    }
    CHECK(sl_gguf_dtype(9) == SL_DTYPE_NONE && sl_gguf_dtype(1000) == SL_DTYPE_NONE);
    CHECK(sl_dtype_bits(SL_DTYPE_Q4_0) == 4.5 && sl_dtype_bits(SL_DTYPE_Q4_K) == 4.5 &&
          sl_dtype_bits(SL_DTYPE_Q6_K) == 6.5625 && sl_dtype_bits(SL_DTYPE_BF16) == 16.0);
    CHECK(strcmp(sl_gguf_type_name(1000), "?") == 0);
}

TEST(gguf_default_alignment) {
    size_t n;
    gopts o = {0};
    uint8_t *img = build(&o, &n);
    sl_gguf_file f = {0};
    sl_error err = {0};
    CHECKF(sl_gguf_parse(&f, "x.gguf", img, n, &err) == SL_OK, "%s", err.msg);
    CHECK(f.alignment == 32 && f.data_start % 32 == 0);
    sl_gguf_close(&f);
    free(img);
}

TEST(gguf_corrupt) {
    static const struct {
        gopts o;
        const char *want1, *want2;
    } cases[] = {
        {{.magic = "GGUG"}, "bad magic", NULL},
        {{.version = 1}, "version 1", NULL},
        {{.version = 0x03000000}, "big-endian", NULL},
        {{.nkv = UINT64_C(1) << 60}, "key/values cannot fit", NULL},
        {{.nkv = 50}, "x.gguf", NULL},
        {{.nt = UINT64_C(1) << 40}, "tensors cannot fit", NULL},
        {{.nt = 30}, "x.gguf", NULL},
        {{.arch_len = UINT64_C(1) << 62}, "past the end", NULL},
        {{.arch_len = 100000}, "past the end", NULL},
        {{.t1_off_add = 1024}, "'blk.0.ffn_down_exps.weight'", "past the end"},
        {{.t1_off_add = 3}, "'blk.0.ffn_down_exps.weight'", "not a multiple of the alignment"},
        {{.align = 48}, "general.alignment", "power of two"},
        {{.align = 0x80000000u}, "general.alignment", "power of two"},
        {{.t1_type = 99}, "'blk.0.ffn_down_exps.weight'", "unknown"},
        {{.t1_type = 9}, "'blk.0.ffn_down_exps.weight'", "unknown"}, /* Q8_1: not a file type */
        {{.t1_huge = 1}, "'blk.0.ffn_down_exps.weight'", "overflow"},
        {{.t1_row = 1}, "'blk.0.ffn_down_exps.weight'", "not a multiple of Q4_K's block"},
        {{.nested = 1}, "'a.nested'", "nested"},
        {{.dup_key = 1}, "'general.architecture' appears twice", NULL},
        {{.dup_tensor = 1}, "'tok_embd.weight' appears twice", NULL},
        {{.bool_val = 2}, "'k.bool'", "not 0 or 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_error err = {0};
        sl_status st = try_parse(&cases[i].o, &err);
        CHECKF(st == SL_ERR_FORMAT && has(&err, "x.gguf") && has(&err, cases[i].want1) &&
                   (!cases[i].want2 || has(&err, cases[i].want2)),
               "case %zu: status %d, '%s'", i, st, err.msg);
    }
}

/* Every prefix of a valid file is refused with the file's name (the last tensor ends at the end);
 * every single-byte change parses or fails cleanly (the sanitizer build catches the rest). */
TEST(gguf_truncated_and_flipped) {
    size_t n;
    gopts o = {.align = 64};
    uint8_t *img = build(&o, &n);
    for (size_t len = 0; len < n; len++) {
        uint8_t *cut = malloc(len ? len : 1); /* its own allocation, so ASan sees overreads */
        memcpy(cut, img, len);
        sl_gguf_file f = {0};
        sl_error err = {0};
        sl_status st = sl_gguf_parse(&f, "x.gguf", cut, len, &err);
        CHECKF(st == SL_ERR_FORMAT && has(&err, "x.gguf"), "prefix %zu: %d '%s'", len, st, err.msg);
        sl_gguf_close(&f);
        free(cut);
    }
    for (size_t i = 0; i < n; i++)
        for (int v = 0; v < 3; v++) {
            uint8_t *m = malloc(n);
            memcpy(m, img, n);
            m[i] = v == 0 ? 0xff : v == 1 ? 0x00 : (uint8_t)(m[i] ^ 0x80);
            sl_gguf_file f = {0};
            sl_error err = {0};
            sl_status st = sl_gguf_parse(&f, "x.gguf", m, n, &err);
            CHECK(st == SL_OK || (st == SL_ERR_FORMAT && has(&err, "x.gguf")));
            sl_gguf_close(&f);
            free(m);
        }
    free(img);
}

TEST(gguf_open_file) {
    size_t n;
    gopts o = {.align = 64};
    uint8_t *img = build(&o, &n);
    char path[512];
    snprintf(path, sizeof path, "%s/t.gguf", test_tmpdir());
    CHECK(test_write_file(path, img, n) == 0);
    sl_gguf_file f;
    sl_error err = {0};
    CHECKF(sl_gguf_open(&f, path, &err) == SL_OK, "%s", err.msg);
    const sl_gguf_tensor *t = sl_gguf_find_tensor(&f, "output_norm.weight");
    CHECK(t && memcmp(t->data, img + (n - 34), 34) == 0);
    sl_gguf_close(&f);
    /* Truncated on disk: the message names the path and the tensor. */
    CHECK(test_write_file(path, img, n - 1) == 0);
    sl_error_clear(&err);
    CHECK(sl_gguf_open(&f, path, &err) == SL_ERR_FORMAT && has(&err, path) &&
          has(&err, "output_norm.weight"));
    sl_gguf_close(&f);
    CHECK(test_write_file(path, img, 10) == 0);
    sl_error_clear(&err);
    CHECK(sl_gguf_open(&f, path, &err) == SL_ERR_FORMAT && has(&err, path));
    sl_gguf_close(&f);
    sl_error_clear(&err);
    CHECK(sl_gguf_open(&f, "/nonexistent/x.gguf", &err) != SL_OK &&
          has(&err, "/nonexistent/x.gguf"));
    sl_gguf_close(&f);
    free(img);
}

/* The fuzz seeds (written by a GGUF writer independent of this test's): the valid ones parse. */
TEST(gguf_fuzz_seeds) {
    static const struct {
        const char *name;
        int ok;
        int64_t n_tensors;
    } seeds[] = {{"full.gguf", 1, 8},    {"v2.gguf", 1, 1},       {"empty.gguf", 1, 0},
                 {"kv_only.gguf", 1, 0}, {"bad_type.gguf", 0, 0}, {"truncated.gguf", 0, 0}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/../fuzz/seeds_gguf/%s", test_fixtures, seeds[i].name);
        sl_gguf_file f;
        sl_error err = {0};
        sl_status st = sl_gguf_open(&f, path, &err);
        CHECKF(seeds[i].ok ? st == SL_OK && f.n_tensors == seeds[i].n_tensors
                           : st == SL_ERR_FORMAT && has(&err, seeds[i].name),
               "%s: %d '%s'", seeds[i].name, st, err.msg);
        if (st == SL_OK && strcmp(seeds[i].name, "full.gguf") == 0) {
            const sl_gguf_kv *kv;
            float base;
            CHECK(f.alignment == 64);
            CHECK(sl_gguf_get_f32(&f, "qwen3moe.rope.freq_base", &base, &err) == SL_OK &&
                  base == 1e6f);
            CHECK(sl_gguf_get_arr(&f, "tokenizer.ggml.tokens", SL_GGUF_STRING, &kv, &err) ==
                      SL_OK &&
                  kv->n == 3 && sl_gguf_arr_str(kv, 2).len == 10);
            const sl_gguf_tensor *t = sl_gguf_find_tensor(&f, "blk.0.ffn_down_exps.weight");
            CHECK(t && t->type == SL_GGML_Q4_K && t->nbytes == 4 * 144);
        }
        sl_gguf_close(&f);
    }
}
