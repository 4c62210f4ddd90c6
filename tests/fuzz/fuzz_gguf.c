/* Fuzz target: the GGUF parser on arbitrary bytes, then every accessor on what it accepted, and
 * the readers of its metadata: tokenizer (with one encode and decode), chat template, generation
 * settings. */
#include "chat/genconfig.h"
#include "chat/template.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sl_gguf_file f = {0};
    sl_error err = {0};
    if (sl_gguf_parse(&f, "fuzz.gguf", data, size, &err) == SL_OK) {
        /* Views must lie inside the input: touch each tensor's first and last byte, and every
         * byte of every string. */
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < f.n_tensors; i++) {
            const sl_gguf_tensor *t = sl_gguf_tensor_at(&f, i);
            if (t->nbytes)
                sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            if (sl_gguf_find_tensor(&f, t->name) != t) __builtin_trap();
        }
        for (int64_t i = 0; i < f.n_kv; i++) {
            const sl_gguf_kv *kv = &f.kv[i];
            uint32_t u32;
            uint64_t u64;
            int64_t i64;
            float f32;
            int32_t b;
            sl_gguf_str s;
            (void)sl_gguf_get_u32(&f, kv->key, &u32, &err);
            (void)sl_gguf_get_u64(&f, kv->key, &u64, &err);
            (void)sl_gguf_get_i64(&f, kv->key, &i64, &err);
            (void)sl_gguf_get_f32(&f, kv->key, &f32, &err);
            (void)sl_gguf_get_bool(&f, kv->key, &b, &err);
            if (sl_gguf_get_str(&f, kv->key, &s, &err) == SL_OK)
                for (uint64_t j = 0; j < s.len; j++)
                    sink ^= (uint8_t)s.s[j];
            if (kv->type != SL_GGUF_ARRAY) continue;
            for (uint64_t j = 0; j < kv->n; j++) {
                if (kv->arr_type == SL_GGUF_STRING) {
                    s = sl_gguf_arr_str(kv, j);
                    if (s.len) sink ^= (uint8_t)(s.s[0] ^ s.s[s.len - 1]);
                } else if (kv->arr_type == SL_GGUF_F32 || kv->arr_type == SL_GGUF_F64) {
                    sink ^= (uint8_t)(sl_gguf_arr_float(kv, j) != 0);
                } else if (kv->arr_type != SL_GGUF_BOOL) {
                    sink ^= (uint8_t)sl_gguf_arr_int(kv, j);
                }
            }
        }
        (void)sink;
        sl_tokenizer *tok = NULL;
        if (sl_tokenizer_load_gguf(&f, &tok, &err) == SL_OK) {
            sl_token_ids ids = {0};
            if (sl_tokenizer_encode(tok, "ab c<s>abc \xff x\n\n", 17, &ids, &err) == SL_OK) {
                char *text = NULL;
                size_t len;
                SL_ASSERT(sl_tokenizer_decode(tok, ids.ids, ids.n, 0, &text, &len, &err) == SL_OK);
                free(text);
            }
            sl_token_ids_free(&ids);
            sl_tokenizer_free(tok);
        }
        sl_chat_template tpl;
        sl_gen_config gc;
        (void)sl_chat_template_from_gguf(&f, &tpl, &err);
        (void)sl_gen_config_from_gguf(&f, &gc, &err);
    }
    sl_gguf_close(&f);
    return 0;
}
