/*
 * The text commands: `run` (one prompt, streamed reply) and `chat` (an
 * interactive conversation kept in the KV cache). Both tokenize with the
 * model's tokenizer.json, render the chat template, sample, and stream text
 * through the detokenizer, holding back what could be the start of a stop
 * string.
 */
#include <getopt.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli/generate.h"

#define MAX_STOPS 8

typedef struct text_opts {
    const char *prompt, *file, *system, *tokenizer, *template_name;
    const char *stops[MAX_STOPS];
    int n_stops, raw, think, max_tokens, ignore_eos;
    int64_t repeat_last_n; /* -1: the context's length */
    sl_sampler_params sp;
    int sp_set; /* SET_* bits: sampling options given on the command line */
    cli_model_opts m;
} text_opts;

/* Sampling options given explicitly win over generation_config.json's defaults. */
enum { SET_TEMP = 1, SET_TOP_K = 2, SET_TOP_P = 4, SET_MIN_P = 8, SET_SEED = 16 };

enum {
    OPT_RAW = CLI_OPT_COMMAND,
    OPT_SYSTEM,
    OPT_TOKENIZER,
    OPT_TEMPLATE,
    OPT_THINK,
    OPT_NO_THINK,
    OPT_TEMP,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_MIN_P,
    OPT_REPEAT,
    OPT_REPEAT_LAST_N,
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_STOP,
    OPT_IGNORE_EOS,
};

static const struct option long_opts[] = {
    {"prompt", required_argument, 0, 'p'},
    {"file", required_argument, 0, 'f'},
    {"raw", no_argument, 0, OPT_RAW},
    {"system", required_argument, 0, OPT_SYSTEM},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"chat-template", required_argument, 0, OPT_TEMPLATE},
    {"think", no_argument, 0, OPT_THINK},
    {"no-think", no_argument, 0, OPT_NO_THINK},
    {"temp", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"min-p", required_argument, 0, OPT_MIN_P},
    {"repeat-penalty", required_argument, 0, OPT_REPEAT},
    {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N},
    {"presence-penalty", required_argument, 0, OPT_PRESENCE},
    {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
    {"seed", required_argument, 0, 's'},
    {"stop", required_argument, 0, OPT_STOP},
    {"max-tokens", required_argument, 0, 'n'},
    {"n-predict", required_argument, 0, 'n'},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

#define TEXT_HELP                                                                                  \
    "  --system TEXT          system message (chat templates; a raw prompt has none)\n"            \
    "  --chat-template NAME   chatml | chatml-think | raw (default: from the model)\n"             \
    "  --think, --no-think    the thinking switch of models that have one (default: on)\n"         \
    "  --tokenizer PATH       tokenizer.json (default: the one in MODEL)\n"                        \
    "  -n, --max-tokens N     most tokens per reply (also --n-predict; -1: until the\n"            \
    "                         context is full)\n"                                                  \
    "  --ignore-eos           go on past the end-of-turn and EOS ids\n"                            \
    "  --temp T               temperature; 0 = greedy (default: generation_config.json, else 0)\n" \
    "  --top-k K, --top-p P, --min-p P          filters (defaults as --temp)\n"                    \
    "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F\n"                          \
    "                         penalties of the tokens in the last --repeat-last-n\n"               \
    "  --repeat-last-n N      the penalties' window (default 64; 0 = off, -1 = the context)\n"     \
    "  -s, --seed N           random seed (default: a random one, shown by --stats and -v;\n"      \
    "                         the same seed and options repeat a run)\n"                           \
    "  --stop TEXT            stop when the reply contains TEXT (repeatable)\n"                    \
    "  (-c/--ctx-size defaults to the model's maximum, at most 8192)\n"

static double parse_float(const char *s, const char *what, double lo, double hi, int *bad) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        cli_error("invalid %s '%s' (expected a number in [%g, %g])", what, s, lo, hi);
        *bad = 1;
    }
    return v;
}

/* 0 to go on, 1 error, 2 help printed. need_prompt: run (1) or chat (0). */
static int parse(int argc, char **argv, const char *help, int need_prompt, text_opts *o,
                 const char **model) {
    static const char shortopts[] = ":hp:f:n:s:" CLI_MODEL_SHORTOPTS;
    int c, r, bad = 0;
    int64_t v;
    if (cli_getopt_start(argc, argv, shortopts, long_opts)) return 1;
    while (!bad && (c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
        if ((r = cli_model_option(c, optarg, &o->m))) {
            if (r < 0) return 1;
            continue;
        }
        switch (c) {
        case 'h': fputs(help, stdout); return 2;
        case 'p': o->prompt = optarg; break;
        case 'f': o->file = optarg; break;
        case OPT_RAW: o->raw = 1; break;
        case OPT_SYSTEM: o->system = optarg; break;
        case OPT_TOKENIZER: o->tokenizer = optarg; break;
        case OPT_TEMPLATE: o->template_name = optarg; break;
        case OPT_THINK: o->think = 1; break;
        case OPT_NO_THINK: o->think = 0; break;
        case 'n':
            if (cli_parse_int(optarg, "--max-tokens", -1, 1 << 24, &v)) return 1;
            if (v == 0) return cli_error("invalid --max-tokens '0' (at least 1, or -1)");
            o->max_tokens = v < 0 ? INT32_MAX : (int)v;
            break;
        case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
        case OPT_TEMP:
            o->sp.temperature = (float)parse_float(optarg, "--temp", 0, 100, &bad);
            o->sp_set |= SET_TEMP;
            break;
        case OPT_TOP_K:
            if (cli_parse_int(optarg, "--top-k", 0, 1 << 24, &v)) return 1;
            o->sp.top_k = (int32_t)v;
            o->sp_set |= SET_TOP_K;
            break;
        case OPT_TOP_P:
            o->sp.top_p = (float)parse_float(optarg, "--top-p", 1e-6, 1, &bad);
            o->sp_set |= SET_TOP_P;
            break;
        case OPT_MIN_P:
            o->sp.min_p = (float)parse_float(optarg, "--min-p", 0, 1, &bad);
            o->sp_set |= SET_MIN_P;
            break;
        case OPT_REPEAT:
            o->sp.repetition_penalty =
                (float)parse_float(optarg, "--repeat-penalty", 1e-3, 100, &bad);
            break;
        case OPT_REPEAT_LAST_N:
            if (cli_parse_int(optarg, "--repeat-last-n", -1, 1 << 24, &o->repeat_last_n)) return 1;
            break;
        case OPT_PRESENCE:
            o->sp.presence_penalty =
                (float)parse_float(optarg, "--presence-penalty", -10, 10, &bad);
            break;
        case OPT_FREQUENCY:
            o->sp.frequency_penalty =
                (float)parse_float(optarg, "--frequency-penalty", -10, 10, &bad);
            break;
        case 's':
            if (cli_parse_int(optarg, "--seed", 0, INT64_MAX, &v)) return 1;
            o->sp.seed = (uint64_t)v;
            o->sp_set |= SET_SEED;
            break;
        case OPT_STOP:
            if (o->n_stops == MAX_STOPS) return cli_error("at most %d --stop strings", MAX_STOPS);
            if (!*optarg) return cli_error("--stop needs a non-empty text");
            o->stops[o->n_stops++] = optarg;
            break;
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (bad) return 1;
    if (!(*model = cli_model_operand(argc, argv, optind, o->m.model))) return 1;
    if (need_prompt && !o->prompt == !o->file)
        return cli_error("give the prompt with -p TEXT or -f FILE (see --help)");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

/* Everything a text command holds. */
typedef struct text_ctx {
    text_opts *o;
    const char *model;
    cli_gen g;
    sl_token_ids ids;
} text_ctx;

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void text_free(text_ctx *t) {
    sl_token_ids_free(&t->ids);
    cli_gen_free(&t->g);
}

/* A seed for runs given none: each run differs, and --stats / -v show it to repeat one. */
static uint64_t random_seed(void) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed =
            (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() ^ (uint64_t)clock();
    return seed & INT64_MAX; /* --seed takes [0, 2^63) */
}

static int text_init(text_ctx *t, text_opts *o, const char *model) {
    sl_error err = {0};
    t->o = o;
    t->model = model;
    cli_gen_setup su = {.model = model,
                        .tokenizer = o->tokenizer,
                        .template_name = o->template_name,
                        .raw = o->raw,
                        .mo = &o->m};
    if (cli_gen_init(&t->g, &su)) return 1;
    if (o->system && t->g.tpl.kind == SL_TEMPLATE_RAW) {
        cli_warn("--system does nothing with a raw prompt (no chat template, no system role)");
        o->system = NULL;
    }
    /* Sampling defaults from generation_config.json, unless given here. */
    const sl_gen_config *gc = &t->g.gen;
    if (!(o->sp_set & SET_TEMP) && gc->temperature >= 0) o->sp.temperature = gc->temperature;
    if (!(o->sp_set & SET_TOP_K) && gc->top_k >= 0) o->sp.top_k = gc->top_k;
    if (!(o->sp_set & SET_TOP_P) && gc->top_p > 0) o->sp.top_p = gc->top_p;
    if (!(o->sp_set & SET_MIN_P) && gc->min_p >= 0) o->sp.min_p = gc->min_p;
    if (!(o->sp_set & SET_SEED)) o->sp.seed = random_seed();
    o->sp.penalty_last_n =
        (int32_t)(o->repeat_last_n < 0 ? sl_session_max_ctx(t->g.s) : o->repeat_last_n);
    if (sl_sampler_create(&o->sp, t->g.info.vocab_size, &t->g.smp, &err))
        return cli_error("%s", err.msg);
    return 0;
}

/* The end of a text command: the statistics line, the seed and the table when asked for, the
 * router histogram. 0 or 1. */
static int text_finish(text_ctx *t) {
    cli_print_summary(t->g.m, stderr);
    if (t->o->m.stats || t->o->m.verbose)
        fprintf(stderr, "seed %llu (--seed %llu repeats this run)\n",
                (unsigned long long)t->o->sp.seed, (unsigned long long)t->o->sp.seed);
    return cli_model_finish(t->g.m, &t->o->m);
}

/*
 * Renders msgs with the chat template and tokenizes them into t->ids. 0 or 1 (printed).
 * With a template, message text never becomes control tokens: "<|im_end|>" typed in a prompt
 * is text, and only the template inserts <|im_start|> and the like (sl_chat_encode). Without
 * one (--raw, --chat-template raw, a model that has none) the text is the prompt as written,
 * special tokens' text included, as llama.cpp's --special: the documented raw mode, where
 * nothing else could insert them.
 */
static int encode_msgs(text_ctx *t, const sl_chat_msg *msgs, int32_t n) {
    sl_error err = {0};
    sl_status st;
    if (t->g.tpl.kind != SL_TEMPLATE_RAW) {
        st = sl_chat_encode(&t->g.tpl, t->g.tok, msgs, n, 1, t->o->think, &t->ids, &err);
        return st ? cli_error("%s", err.msg) : 0;
    }
    size_t need = sl_chat_render(&t->g.tpl, msgs, n, 1, t->o->think, NULL, 0);
    char *text = malloc(need + 1);
    if (!text) return cli_error("out of memory");
    sl_chat_render(&t->g.tpl, msgs, n, 1, t->o->think, text, need + 1);
    st = sl_tokenizer_encode(t->g.tok, text, need, &t->ids, &err);
    free(text);
    return st ? cli_error("%s", err.msg) : 0;
}

static int emit_file(void *user, const char *text, size_t len) {
    fwrite(text, 1, len, (FILE *)user);
    fflush((FILE *)user);
    return 0;
}

static int was_interrupted(void *user) {
    (void)user;
    return interrupted;
}

/* Runs t->ids after the ids in the KV cache that they start with (they fit the context), then
 * streams a reply to out. 0 or 1 (error printed). */
static int generate_reply(text_ctx *t, FILE *out, cli_gen_result *res) {
    sl_error err = {0};
    cli_gen_params p = {.max_tokens = t->o->max_tokens,
                        .stops = t->o->stops,
                        .n_stops = t->o->n_stops,
                        .ignore_eos = t->o->ignore_eos,
                        .emit = emit_file,
                        .cancelled = was_interrupted,
                        .user = out};
    interrupted = 0;
    int rc = 0;
    if (cli_gen_reply(&t->g, t->ids.ids, (int32_t)t->ids.n, &p, res, &err))
        rc = cli_error("%s", err.msg);
    fputc('\n', out);
    fflush(out);
    return rc;
}

static const char run_help[] =
    "usage: sluice run MODEL (-p TEXT | -f FILE) [options]\n"
    "\n"
    "Streams the model's reply to the prompt (or, with --raw or for models without a\n"
    "chat template, the continuation of the text), then one statistics line on stderr.\n"
    "A reply that reaches the end of the context stops there, with a notice.\n"
    "MODEL is a Hugging Face checkpoint directory or a sluice pack with tokenizer.json.\n"
    "\n"
    "  -p, --prompt TEXT      the prompt\n"
    "  -f, --file FILE        read the prompt from FILE ('-' for standard input)\n"
    "  --raw                  no chat template: the text is the prompt\n" TEXT_HELP CLI_MODEL_HELP;

int cli_run(int argc, char **argv) {
    text_opts o = {.think = 1, .max_tokens = 512, .repeat_last_n = 64, .sp = sl_sampler_defaults()};
    const char *model;
    int r = parse(argc, argv, run_help, 1, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    char *file_text = NULL;
    if (o.file) {
        sl_error err = {0};
        const char *path = strcmp(o.file, "-") ? o.file : "/dev/stdin";
        if (sl_read_file(path, &file_text, NULL, &err)) return cli_error("%s", err.msg);
        o.prompt = file_text;
    }
    text_ctx t = {0};
    int rc = text_init(&t, &o, model);
    if (!rc) {
        sl_chat_msg msgs[2];
        int32_t n = 0;
        if (o.system) msgs[n++] = (sl_chat_msg){"system", o.system};
        msgs[n++] = (sl_chat_msg){"user", o.prompt};
        rc = encode_msgs(&t, msgs, n);
        const int32_t ctx = sl_session_max_ctx(t.g.s);
        if (!rc && (int64_t)t.ids.n + 1 > ctx)
            rc = cli_error("the prompt (%zu tokens) does not fit the context of %d tokens (one "
                           "more is needed to reply; see --ctx)",
                           t.ids.n, ctx);
    }
    if (!rc) {
        struct sigaction sa = {.sa_handler = on_sigint}, old;
        sigaction(SIGINT, &sa, &old);
        if (t.g.tpl.kind == SL_TEMPLATE_RAW) fputs(o.prompt, stdout); /* a continuation */
        cli_gen_result res;
        rc = generate_reply(&t, stdout, &res);
        sigaction(SIGINT, &old, NULL);
        if (!rc && res.ctx_full)
            fprintf(stderr,
                    "sluice: the reply reached the end of the context (%d tokens) and stops "
                    "there (a larger --ctx gives more room)\n",
                    sl_session_max_ctx(t.g.s));
        if (!rc) rc = text_finish(&t);
    }
    text_free(&t);
    free(file_text);
    return rc;
}

/* ---------------------------------------------------------------- chat */

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
    c->msgs[c->n] = (sl_chat_msg){role, c->owned[c->n]};
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
    const int32_t ctx = sl_session_max_ctx(t->g.s);
    const int64_t reserve = SL_CLI_MAX(1, SL_CLI_MIN(t->o->max_tokens, ctx / 4));
    if (encode_msgs(t, log->msgs, log->n)) return 1;
    if ((int64_t)t->ids.n + reserve <= ctx) return 0;
    /* The least that can be sent: the system message and the new one. */
    const int32_t sys = !strcmp(log->msgs[0].role, "system");
    sl_chat_msg least[2] = {log->msgs[0], log->msgs[log->n - 1]};
    if (encode_msgs(t, least + !sys, 1 + sys)) return 1;
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
        if (encode_msgs(t, log->msgs, log->n)) return 1;
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
    int r = parse(argc, argv, chat_help, 0, &o, &model);
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
    struct sigaction sa = {.sa_handler = on_sigint}, old;
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
                sl_session_reset(t.g.s);
                sl_sampler_reset(t.g.smp);
                t.g.n_ctx = 0;
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
        cli_gen_result res;
        sigaction(SIGINT, &sa, &old);
        rc = generate_reply(&t, stdout, &res);
        sigaction(SIGINT, &old, NULL);
        if (rc) break;
        if (interrupted) printf("(stopped)\n");
        if (res.ctx_full)
            fprintf(stderr,
                    "sluice: the reply reached the end of the context (%d tokens) and stops "
                    "there; the next turn drops the oldest ones\n",
                    sl_session_max_ctx(t.g.s));
        fflush(stdout);
        rc = log_add(&log, "assistant", t.g.reply ? t.g.reply : "");
    }
    if (!rc) rc = text_finish(&t);
    log_clear(&log);
    free(log.msgs), free(log.owned);
    text_free(&t);
    return rc;
}
