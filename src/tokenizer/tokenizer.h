/*
 * Tokenizer: Hugging Face `tokenizer.json`, BPE in two flavours:
 *
 *  - byte-level (GPT-2 / Qwen2 / Qwen3): decoder ByteLevel;
 *  - SentencePiece style (Llama 2 / Mistral): vocab written with "▁" (U+2581)
 *    for spaces, characters as start symbols, `byte_fallback` (a character
 *    not in the vocab becomes its UTF-8 bytes as <0xXX> tokens) or `unk_token`
 *    (`fuse_unk`), no pre-tokenizer, decoder Sequence[Replace("▁" -> " "),
 *    ByteFallback, Fuse, Strip(" ", n, 0)].
 *
 * Encoding follows the Rust `tokenizers` pipeline step by step:
 *
 *   raw text --split on added tokens (normalized=false; special ones skipped
 *              under SL_TOK_NO_SPECIAL)--> segments
 *   segment  --normalizer (NFC via utf8proc, Prepend, Replace with a String
 *              pattern, in file order)--> --split on added tokens (normalized=true)-->
 *   piece    --pre-tokenizer (Split regex, PCRE2, "Isolated"; ByteLevel)--> words
 *   word     --bytes -> GPT-2 alphabet ids, or characters -> ids / <0xXX> ids-->
 *            --BPE merges (heap over pairs)--> ids
 *
 * Anything else found in a tokenizer.json (other model types, normalizers,
 * pre-tokenizers such as Metaspace, decoders, split behaviours) is refused at
 * load with SL_ERR_UNSUPPORTED rather than silently giving other ids.
 *
 * Text is bytes: invalid UTF-8 is not an error. Valid runs are normalised and
 * matched by the regex; invalid bytes pass through as their own byte-level
 * tokens (byte-level) or <0xXX> tokens (byte fallback), so decode(encode(x))
 * gives them back (as U+FFFD once decoded).
 *
 * A loaded tokenizer is read-only: encode/decode may run from several threads.
 */
#ifndef SL_TOKENIZER_H
#define SL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

typedef struct sl_tokenizer sl_tokenizer;

/* A growable id array. Start zeroed; free with sl_token_ids_free. */
typedef struct sl_token_ids {
    int32_t *ids;
    size_t n, cap;
} sl_token_ids;

void sl_token_ids_free(sl_token_ids *v);

/* path is a tokenizer.json file, a directory holding one, or a GGUF file (its metadata:
 * sl_tokenizer_load_gguf). */
sl_status sl_tokenizer_load(const char *path, sl_tokenizer **out, sl_error *err);

/* A tokenizer.json document already parsed (jansson); name is what errors call it. The
 * document is only read. */
struct json_t;
sl_status sl_tokenizer_from_json(const struct json_t *root, const char *name, sl_tokenizer **out,
                                 sl_error *err);

/*
 * The tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*: see tokenizer_gguf.c),
 * giving the ids of the tokenizer.json it was converted from. Byte-level BPE ("gpt2") with the
 * pre-tokenizers "qwen2", "qwen35", "llama3"/"llama-bpe", "gpt-2", "deepseek-v3" and llama.cpp's
 * "default"; SentencePiece-style BPE ("llama"). Anything else, or metadata that does not hold
 * together (array lengths, types, ids, merges), is an error naming the file and the key.
 */
struct sl_gguf_file;
sl_status sl_tokenizer_load_gguf(const struct sl_gguf_file *f, sl_tokenizer **out, sl_error *err);
/* The tokenizer.json document sl_tokenizer_load_gguf builds and loads (*doc: a new reference,
 * the caller's to json_decref): `sluice pack` of a GGUF writes it as the pack's tokenizer.json,
 * which then gives the same ids. */
sl_status sl_tokenizer_json_from_gguf(const struct sl_gguf_file *f, struct json_t **doc,
                                      sl_error *err);
void sl_tokenizer_free(sl_tokenizer *tok);

/* The ids tokenizer(text) puts before a text (add_special_tokens=True): the special tokens
 * of tokenizer.json's post-processor (TemplateProcessing), or the bos_token where
 * tokenizer_config.json beside it sets add_bos_token (false: none); a GGUF's
 * tokenizer.ggml.add_bos_token and bos_token_id. Returns how many (0: none, as for Qwen). */
#define SL_TOK_MAX_BOS 4
int32_t sl_tokenizer_bos(const sl_tokenizer *tok, const int32_t **ids);
/* A raw prompt's ids: sl_tokenizer_bos's, then the text's (sl_tokenizer_encode), as
 * tokenizer(text) gives them; a text whose ids already start with them gets them once. */
sl_status sl_tokenizer_encode_prompt(const sl_tokenizer *tok, const char *text, size_t len,
                                     sl_token_ids *out, sl_error *err);

/* Encodes len bytes of text (no BOS/EOS added). out->n is reset to 0, then ids
 * are appended; out grows as needed. Added tokens are matched anywhere in the
 * text: "<|im_end|>" written in it becomes the control token. */
sl_status sl_tokenizer_encode(const sl_tokenizer *tok, const char *text, size_t len,
                              sl_token_ids *out, sl_error *err);

/*
 * Encoding flags.
 *
 * SL_TOK_NO_SPECIAL: added tokens marked "special": true in tokenizer.json
 * (<|im_start|>, <|im_end|>, <|endoftext|>, <s>, ...) are not matched: their
 * text is encoded as ordinary text, exactly as Hugging Face's
 * tokenizer(text, split_special_tokens=True) (the Rust encode_special_tokens)
 * does. Added tokens marked "special": false (Qwen3's <think>, <tool_call>)
 * are still matched, as there: they are vocabulary, not control. This is how
 * text that did not come from a template (a user's message) is kept from
 * faking a turn: only the template inserts control tokens.
 */
#define SL_TOK_NO_SPECIAL 1u

sl_status sl_tokenizer_encode_ex(const sl_tokenizer *tok, const char *text, size_t len,
                                 uint32_t flags, sl_token_ids *out, sl_error *err);

/* A run of the text given to sl_tokenizer_encode_spans and its SL_TOK_* flags. */
typedef struct sl_tok_span {
    size_t len;     /* bytes */
    uint32_t flags; /* SL_TOK_* */
} sl_tok_span;

/*
 * Encodes text as one text whose consecutive spans (their lengths add up to
 * len) carry their own flags: a chat template's own text (flags 0) and message
 * contents (SL_TOK_NO_SPECIAL). Only added-token matching differs per span; the
 * normalizer, pre-tokenizer and BPE see the whole text, so where no special
 * token's text lies in a NO_SPECIAL span the ids are exactly those of
 * sl_tokenizer_encode over the whole text (a pre-tokenizer piece may cross a
 * span boundary: "user\n" + "\nHi" gives "\n\n" as one token, as it does
 * there). The rules:
 *  - an added token matches only inside one span (neighbouring spans with the
 *    same flags count as one);
 *  - in a NO_SPECIAL span, special ones are skipped as SL_TOK_NO_SPECIAL says;
 *  - tokens matched after normalization ("normalized": true; none in the Qwen
 *    families) are matched in a segment between raw added tokens; a special one
 *    only where that whole segment is free of NO_SPECIAL bytes (normalization
 *    moves offsets, so a mixed segment is treated as NO_SPECIAL).
 * A span table that does not cover len exactly is SL_ERR_ARG.
 */
sl_status sl_tokenizer_encode_spans(const sl_tokenizer *tok, const char *text, size_t len,
                                    const sl_tok_span *spans, size_t n_spans, sl_token_ids *out,
                                    sl_error *err);

/* Decodes ids to a malloc'ed NUL-terminated string (*out, *out_len bytes without
 * the NUL; the caller frees it). Byte-level: bytes that do not form valid UTF-8
 * become U+FFFD, one per maximal invalid subsequence, as Rust's from_utf8_lossy
 * does. SentencePiece style: as the tokenizers decoders do, a run of <0xXX>
 * tokens that is not valid UTF-8 as a whole becomes one U+FFFD per byte, and
 * the decoder's Strip removes the leading space(s) of the whole text.
 * skip_special drops added tokens marked special. An id out of range is
 * SL_ERR_ARG. */
sl_status sl_tokenizer_decode(const sl_tokenizer *tok, const int32_t *ids, size_t n,
                              int32_t skip_special, char **out, size_t *out_len, sl_error *err);

/* The bytes id stands for in decoded text (a <0xXX> byte-fallback token: its byte; an added
 * token: its content; SentencePiece's U+2581 as a space, before any Strip), as OpenAI's
 * logprobs "bytes" give them: copied into out up to cap bytes. Returns their number (more
 * than cap: cut short, as snprintf), or -1 for an id not in the vocabulary. */
int32_t sl_tokenizer_token_bytes(const sl_tokenizer *tok, int32_t id, char *out, int32_t cap);

/* Id of a token (an added token's content, or a vocabulary entry as written in
 * the file: byte-level alphabet "Ġthe", or metaspace "▁the"); -1 if none. */
int32_t sl_tokenizer_token_to_id(const sl_tokenizer *tok, const char *token);
/* One past the largest id (vocabulary plus added tokens). */
int32_t sl_tokenizer_vocab_size(const sl_tokenizer *tok);
/* 1 if id is an added token marked special (<|im_end|>, ...). */
int32_t sl_tokenizer_is_special(const sl_tokenizer *tok, int32_t id);

/*
 * Streaming detokenizer: push ids one at a time; each push returns the text
 * that became complete. Text is emitted as soon as it is valid UTF-8 and a
 * character is never split across pushes; bytes that can never become valid
 * are emitted as U+FFFD, so the concatenation of every push plus the final
 * flush equals sl_tokenizer_decode of all the ids. One exception, SentencePiece
 * style only: a <0xXX> run holding complete valid characters followed by an
 * invalid byte; the characters were already emitted, where decode gives
 * U+FFFD for every byte of the run (from the invalid byte on, the stream gives
 * U+FFFD too). The decoder's Strip applies at the start of the stream (after
 * init or flush).
 */
typedef struct sl_detok {
    const sl_tokenizer *tok;
    int32_t skip_special;
    uint8_t pending[4]; /* start of an incomplete UTF-8 character */
    int32_t n_pending;
    int32_t run_bad;    /* SentencePiece style: the current <0xXX> run is invalid */
    int32_t strip_left; /* SentencePiece style: leading spaces still to strip */
    char *buf;          /* owned; the returned text points into it */
    size_t cap;
} sl_detok;

void sl_detok_init(sl_detok *d, const sl_tokenizer *tok, int32_t skip_special);
/* *text (NUL-terminated, *len bytes) stays valid until the next call on d. */
sl_status sl_detok_push(sl_detok *d, int32_t id, const char **text, size_t *len, sl_error *err);
/* Emits what is left (an incomplete character becomes U+FFFD) and resets d. */
sl_status sl_detok_flush(sl_detok *d, const char **text, size_t *len, sl_error *err);
void sl_detok_free(sl_detok *d);

#endif /* SL_TOKENIZER_H */
