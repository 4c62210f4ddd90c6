/* A reply told apart into content and reasoning by its template's layout (see reply.h). */
#include "chat/reply.h"

/* A body ends at one of these (the marker is dropped) ... */
static const char *const harmony_ends[] = {"<|end|>", "<|return|>", "<|call|>"};
/* ... or where the next header begins (the marker starts the header: a model that left out
 * <|end|>) */
static const char *const harmony_opens[] = {"<|start|>", "<|channel|>"};
#define HARMONY_MESSAGE "<|message|>"

int sl_reply_needs_special(const sl_chat_template *t) {
    return t->kind == SL_TEMPLATE_HARMONY;
}

void sl_reply_init(sl_reply_parser *p, const sl_chat_template *t) {
    memset(p, 0, sizeof *p);
    p->kind = t->kind;
    /* other templates: all content, as one body that never ends */
    p->in_body = t->kind != SL_TEMPLATE_HARMONY;
}

/* What held[0, n) is in a body: 0 no marker's start, 1 the start of one, 2 a whole end marker,
 * 3 a whole header marker. */
static int body_marker(const char *held, size_t n) {
    int partial = 0;
    for (int k = 0; k < 2; k++) {
        const char *const *set = k ? harmony_opens : harmony_ends;
        const size_t count = k ? 2 : 3;
        for (size_t i = 0; i < count; i++) {
            const size_t m = strlen(set[i]);
            if (n <= m && !memcmp(held, set[i], n)) {
                if (n == m) return k ? 3 : 2;
                partial = 1;
            }
        }
    }
    return partial;
}

/* A header's channel: the name after <|channel|>, up to a space or the next marker. */
static sl_reply_part header_part(const char *h, size_t n) {
    static const char ch[] = "<|channel|>", an[] = "analysis";
    for (size_t i = 0; i + sizeof ch - 1 <= n; i++)
        if (!memcmp(h + i, ch, sizeof ch - 1)) {
            const char *name = h + i + sizeof ch - 1;
            const size_t left = n - i - (sizeof ch - 1);
            if (left >= sizeof an - 1 && !memcmp(name, an, sizeof an - 1) &&
                (left == sizeof an - 1 || name[sizeof an - 1] == ' ' || name[sizeof an - 1] == '<'))
                return SL_REPLY_REASONING;
            return SL_REPLY_CONTENT;
        }
    return SL_REPLY_CONTENT;
}

void sl_reply_feed(sl_reply_parser *p, const char *s, size_t n, sl_reply_out out, void *user) {
    if (p->kind != SL_TEMPLATE_HARMONY) {
        if (n) out(user, SL_REPLY_CONTENT, s, n);
        return;
    }
    const size_t msg_len = strlen(HARMONY_MESSAGE);
    for (size_t i = 0; i < n;) {
        if (p->in_body && p->n_held == 0) { /* text up to the next '<' cannot be a marker */
            const char *lt = memchr(s + i, '<', n - i);
            const size_t run = lt ? (size_t)(lt - (s + i)) : n - i;
            if (run) {
                out(user, p->part, s + i, run);
                i += run;
                continue;
            }
        }
        p->held[p->n_held++] = s[i++];
        if (!p->in_body) {
            if (p->n_held >= msg_len &&
                !memcmp(p->held + p->n_held - msg_len, HARMONY_MESSAGE, msg_len)) {
                p->part = header_part(p->held, p->n_held - msg_len);
                p->n_held = 0;
                p->in_body = 1;
            } else if (p->n_held == sizeof p->held) { /* no header this long: plain text */
                out(user, SL_REPLY_CONTENT, p->held, p->n_held);
                p->n_held = 0;
                p->in_body = 1;
                p->part = SL_REPLY_CONTENT;
            }
            continue;
        }
        const int m = body_marker(p->held, p->n_held);
        if (m == 1) continue;
        if (m >= 2) { /* an end marker is dropped; a header marker begins the header */
            if (m == 2) p->n_held = 0;
            p->in_body = 0;
            continue;
        }
        /* not a marker: its '<' is text; what follows is looked at again */
        char rest[sizeof p->held];
        const size_t n_rest = p->n_held - 1;
        memcpy(rest, p->held + 1, n_rest);
        out(user, p->part, p->held, 1);
        p->n_held = 0;
        sl_reply_feed(p, rest, n_rest, out, user);
    }
}

void sl_reply_finish(sl_reply_parser *p, sl_reply_out out, void *user) {
    if (p->n_held && (p->in_body || p->held[0] != '<'))
        out(user, p->in_body ? p->part : SL_REPLY_CONTENT, p->held, p->n_held);
    p->n_held = 0;
}
