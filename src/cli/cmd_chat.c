/*
 * `sluice chat MODEL`: an interactive conversation in the terminal, kept in the KV cache
 * between turns; a conversation longer than the context goes on without its oldest turns.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli/text_opts.h"

typedef struct chat_log {
    sl_chat_msg *msgs;
    char **owned; /* the texts we allocated, freed with the log */
    int32_t n, cap;
} chat_log;

static int log_add(chat_log *c, const char *role, const char *text) {
    if (c->n == c->cap) {
        const int32_t cap = c->cap ? 2 * c->cap : 16;
        sl_chat_msg *msgs = realloc(c->msgs, (size_t)cap * sizeof *c->msgs);
        if (msgs) c->msgs = msgs;
        char **owned = realloc(c->owned, (size_t)cap * sizeof *c->owned);
        if (owned) c->owned = owned;
        if (!msgs || !owned) return cli_error("out of memory");
        c->cap = cap;
    }
    if (!(c->owned[c->n] = strdup(text))) return cli_error("out of memory");
    c->msgs[c->n] = (sl_chat_msg){.role = role, .content = c->owned[c->n]};
    c->n++;
    return 0;
}

/* Removes messages [from, from + count). */
static void log_remove(chat_log *c, int32_t from, int32_t count) {
    for (int32_t i = from; i < from + count; i++)
        free(c->owned[i]);
    memmove(c->msgs + from, c->msgs + from + count,
            (size_t)(c->n - from - count) * sizeof *c->msgs);
    memmove(c->owned + from, c->owned + from + count,
            (size_t)(c->n - from - count) * sizeof *c->owned);
    c->n -= count;
}

static void log_clear(chat_log *c) {
    log_remove(c, 0, c->n);
}

/* Drops the oldest turn: a user message and the replies after it, never the system message nor
 * the last user message (the one to answer). 0 when there is no such turn. */
static int log_drop_turn(chat_log *c) {
    const int32_t first = c->n && !strcmp(c->msgs[0].role, "system");
    int32_t end = first + 1;
    while (end < c->n && strcmp(c->msgs[end].role, "user"))
        end++;
    if (end >= c->n) return 0;
    log_remove(c, first, end - first);
    return 1;
}

/*
 * The conversation's prompt in t->ids. A conversation longer than the context loses its oldest
 * turns, keeping the system message, until it leaves room for a reply (a quarter of the context,
 * or -n if less); the KV cache then still holds the system prompt, the only common prefix left.
 * 0 when it fits; 1 when even the last message with the system prompt does not (said, and
 * nothing dropped; the caller removes that message and the chat goes on).
 */
static int chat_prompt(text_ctx *t, chat_log *log, int *told) {
    const int32_t ctx = sl_session_max_ctx(t->g.seq.s);
    const int64_t reserve = SL_CLI_MAX(1, SL_CLI_MIN(t->o->max_tokens, ctx / 4));
    if (text_encode(t, log->msgs, log->n)) return 1;
    if ((int64_t)t->ids.n + reserve <= ctx) return 0;
    /* The least that can be sent: the system message and the new one. */
    const int32_t sys = !strcmp(log->msgs[0].role, "system");
    sl_chat_msg least[2] = {log->msgs[0], log->msgs[log->n - 1]};
    if (text_encode(t, least + !sys, 1 + sys)) return 1;
    if ((int64_t)t->ids.n + 1 > ctx)
        return cli_error("the message%s is %zu tokens, more than the context of %d tokens holds "
                         "with a reply: not sent (see --ctx)",
                         sys ? " with the system message" : "", t->ids.n, ctx);
    if (!*told)
        fprintf(stderr,
                "sluice: the conversation is longer than the context (%d tokens): its oldest "
                "turns are dropped from now on (the system message stays; --ctx sets a larger "
                "context, /reset starts afresh)\n",
                ctx);
    *told = 1;
    while (log_drop_turn(log)) {
        if (text_encode(t, log->msgs, log->n)) return 1;
        if ((int64_t)t->ids.n + reserve <= ctx) break;
    }
    return 0;
}

/* A line of input: line editing and history on a terminal, plain reads otherwise. */
static char *read_line(int tty) {
    if (tty) return readline("> ");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    return line;
}

static const char chat_commands[] = "commands: /reset (new conversation), /stats, /help, /exit "
                                    "(or Ctrl-D); Ctrl-C stops a reply\n";

static const char chat_help[] =
    "usage: sluice chat MODEL [options]\n"
    "\n"
    "An interactive conversation in the terminal, kept in the KV cache between\n"
    "turns. Line editing and history; Ctrl-C stops the current reply without\n"
    "leaving; /reset, /stats, /help, /exit. A conversation longer than the context\n"
    "goes on without its oldest turns (the system message stays).\n"
    "\n" TEXT_HELP CLI_MODEL_HELP;

int cli_chat(int argc, char **argv) {
    text_opts o = {
        .think = 1, .max_tokens = 2048, .repeat_last_n = 64, .sp = sl_sampler_defaults()};
    const char *model;
    int r = text_parse(argc, argv, chat_help, 0, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    text_ctx t = {0};
    int rc = text_init(&t, &o, model);
    if (rc) {
        text_free(&t);
        return rc;
    }
    const int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "sluice chat: %s (%s). %s", model, t.g.info.arch, chat_commands);
    chat_log log = {0};
    if (o.system) rc = log_add(&log, "system", o.system);
    int told = 0; /* the notice about dropped turns was shown */
    char *line;
    while (!rc && (line = read_line(tty))) {
        if (!*line) {
            free(line);
            continue;
        }
        if (tty) add_history(line);
        if (line[0] == '/') {
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
                free(line);
                break;
            } else if (!strcmp(line, "/reset")) {
                log_clear(&log);
                if (o.system) rc = log_add(&log, "system", o.system);
                sl_gen_reset(&t.g);
                sl_sampler_reset(t.g.seq.smp);
                printf("(new conversation)\n");
            } else if (!strcmp(line, "/stats")) {
                cli_print_stats(t.g.m, stdout);
            } else if (!strcmp(line, "/help")) {
                fputs(chat_commands, stdout);
            } else {
                printf("unknown command %s; %s", line, chat_commands);
            }
            fflush(stdout);
            free(line);
            continue;
        }
        rc = log_add(&log, "user", line);
        free(line);
        if (rc) break;
        if (chat_prompt(&t, &log, &told)) {
            log_remove(&log, log.n - 1, 1); /* not sent; the chat goes on */
            continue;
        }
        sl_gen_result res;
        rc = text_reply(&t, stdout, &res);
        if (rc) break;
        if (text_interrupted()) printf("(stopped)\n");
        if (res.ctx_full)
            fprintf(stderr,
                    "sluice: the reply reached the end of the context (%d tokens) and stops "
                    "there; the next turn drops the oldest ones\n",
                    sl_session_max_ctx(t.g.seq.s));
        fflush(stdout);
        rc = log_add(&log, "assistant", t.g.seq.reply ? t.g.seq.reply : "");
    }
    if (!rc) rc = text_finish(&t);
    log_clear(&log);
    free(log.msgs), free(log.owned);
    text_free(&t);
    return rc;
}
