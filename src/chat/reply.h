/*
 * Reading a reply the way its chat template lays it out: the part shown as the answer (the
 * content) and the model's reasoning, told apart while the reply streams in.
 *
 *   harmony (gpt-oss): the reply is a run of messages, each a header and a body,
 *     <|channel|>analysis<|message|>{reasoning}<|end|>
 *     <|start|>assistant<|channel|>final<|message|>{answer}            (<|return|> is EOS)
 *   the analysis channel's bodies are the reasoning, every other channel's (final, commentary)
 *   the content. It needs the reply decoded with its special tokens (sl_reply_needs_special):
 *   without them the markers are gone and "analysis...assistantfinal..." is all that is left.
 *
 * Other templates have no parts: the whole reply is content, as it was decoded.
 */
#ifndef SL_REPLY_H
#define SL_REPLY_H

#include "chat/template.h"

typedef enum sl_reply_part {
    SL_REPLY_CONTENT = 0,
    SL_REPLY_REASONING = 1,
} sl_reply_part;

/* Receives the reply's text, part by part, in order; pieces of one part concatenate. */
typedef void (*sl_reply_out)(void *user, sl_reply_part part, const char *text, size_t len);

typedef struct sl_reply_parser {
    sl_template_kind kind;
    int32_t in_body;    /* harmony: inside a message's body (else reading a header) */
    sl_reply_part part; /* the current body's */
    /* harmony: a header read so far, or a body's tail that may begin a marker */
    char held[256];
    size_t n_held;
} sl_reply_parser;

/* 1 when t's replies have parts: decode them keeping special tokens' text. */
int sl_reply_needs_special(const sl_chat_template *t);
void sl_reply_init(sl_reply_parser *p, const sl_chat_template *t);
/* Feeds the next n bytes of the reply; out receives what can no longer change (a tail that
 * may begin a marker waits for the next bytes). */
void sl_reply_feed(sl_reply_parser *p, const char *s, size_t n, sl_reply_out out, void *user);
/* The end of the reply: out receives what was held (an unfinished header of harmony's is
 * dropped, a text that never was one is content). */
void sl_reply_finish(sl_reply_parser *p, sl_reply_out out, void *user);

#endif /* SL_REPLY_H */
