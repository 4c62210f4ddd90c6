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
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli/generate.h"

#define MAX_STOPS 8

typedef struct text_opts {
    const char *model, *prompt, *file, *system, *tokenizer, *template_name;
    const char *stops[MAX_STOPS];
    int n_stops, raw, think, max_tokens;
    sl_sampler_params sp;
    int sp_set; /* SET_* bits: sampling options given on the command line */
    cli_model_opts m;
} text_opts;

/* Sampling options given explicitly win over generation_config.json's defaults. */
enum { SET_TEMP = 1, SET_TOP_K = 2, SET_TOP_P = 4, SET_MIN_P = 8 };

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
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_SEED,
    OPT_STOP,
    OPT_MAX_TOKENS,
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
    {"presence-penalty", required_argument, 0, OPT_PRESENCE},
    {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
    {"seed", required_argument, 0, OPT_SEED},
    {"stop", required_argument, 0, OPT_STOP},
    {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

#define TEXT_HELP                                                                                  \
    "  --system TEXT          system message\n"                                                    \
    "  --chat-template NAME   chatml | chatml-think | raw (default: from the model)\n"             \
    "  --think, --no-think    the thinking switch of models that have one (default: on)\n"         \
    "  --tokenizer PATH       tokenizer.json (default: the one in MODEL)\n"                        \
    "  -n, --max-tokens N     most tokens per reply (default 512)\n"                               \
    "  --temp T               temperature; 0 = greedy (default: generation_config.json, else 0)\n" \
    "  --top-k K, --top-p P, --min-p P          filters (defaults as --temp)\n"                    \
    "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F   (over the last 64)\n"     \
    "  --seed N               random seed (default 0: runs are reproducible)\n"                    \
    "  --stop TEXT            stop when the reply contains TEXT (repeatable)\n"

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
static int parse(int argc, char **argv, const char *help, int need_prompt, text_opts *o) {
    optind = 1;
    opterr = 0;
    int c, r, bad = 0;
    int64_t v;
    while (!bad && (c = getopt_long(argc, argv, ":hp:f:n:t:", long_opts, NULL)) != -1) {
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
        case OPT_MAX_TOKENS:
            if (cli_parse_int(optarg, "--max-tokens", 1, 1 << 24, &v)) return 1;
            o->max_tokens = (int)v;
            break;
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
        case OPT_PRESENCE:
            o->sp.presence_penalty =
                (float)parse_float(optarg, "--presence-penalty", -10, 10, &bad);
            break;
        case OPT_FREQUENCY:
            o->sp.frequency_penalty =
                (float)parse_float(optarg, "--frequency-penalty", -10, 10, &bad);
            break;
        case OPT_SEED:
            if (cli_parse_int(optarg, "--seed", 0, INT64_MAX, &v)) return 1;
            o->sp.seed = (uint64_t)v;
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
    if (!(o->model = cli_model_operand(argc, argv, optind))) return 1;
    if (need_prompt && !o->prompt == !o->file)
        return cli_error("give the prompt with -p TEXT or -f FILE (see --help)");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

/* Everything a text command holds. */
typedef struct text_ctx {
    text_opts *o;
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

static int text_init(text_ctx *t, text_opts *o) {
    sl_error err = {0};
    t->o = o;
    cli_gen_setup su = {.model = o->model,
                        .tokenizer = o->tokenizer,
                        .template_name = o->template_name,
                        .raw = o->raw,
                        .mo = &o->m};
    if (cli_gen_init(&t->g, &su)) return 1;
    /* Sampling defaults from generation_config.json, unless given here. */
    const sl_gen_config *gc = &t->g.gen;
    if (!(o->sp_set & SET_TEMP) && gc->temperature >= 0) o->sp.temperature = gc->temperature;
    if (!(o->sp_set & SET_TOP_K) && gc->top_k >= 0) o->sp.top_k = gc->top_k;
    if (!(o->sp_set & SET_TOP_P) && gc->top_p > 0) o->sp.top_p = gc->top_p;
    if (!(o->sp_set & SET_MIN_P) && gc->min_p >= 0) o->sp.min_p = gc->min_p;
    if (sl_sampler_create(&o->sp, t->g.info.vocab_size, &t->g.smp, &err))
        return cli_error("%s", err.msg);
    return 0;
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

/* Runs `text` (already templated) after the ids in the KV cache that it starts with,
 * then streams a reply to out. 0 or 1 (error printed). */
static int generate_reply(text_ctx *t, const char *text, FILE *out) {
    sl_error err = {0};
    if (sl_tokenizer_encode(t->g.tok, text, strlen(text), &t->ids, &err))
        return cli_error("%s", err.msg);
    if ((int64_t)t->ids.n + 1 > sl_session_max_ctx(t->g.s))
        return cli_error("the conversation (%zu tokens) does not fit the context of %d (see --ctx)",
                         t->ids.n, sl_session_max_ctx(t->g.s));
    cli_gen_params p = {.max_tokens = t->o->max_tokens,
                        .stops = t->o->stops,
                        .n_stops = t->o->n_stops,
                        .emit = emit_file,
                        .cancelled = was_interrupted,
                        .user = out};
    cli_gen_result res;
    interrupted = 0;
    int rc = 0;
    if (cli_gen_reply(&t->g, t->ids.ids, (int32_t)t->ids.n, &p, &res, &err))
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
    "MODEL is a Hugging Face checkpoint directory or a sluice pack with tokenizer.json.\n"
    "\n"
    "  -p, --prompt TEXT      the prompt\n"
    "  -f, --file FILE        read the prompt from FILE ('-' for standard input)\n"
    "  --raw                  no chat template: the text is the prompt\n" TEXT_HELP CLI_MODEL_HELP;

int cli_run(int argc, char **argv) {
    text_opts o = {.think = 1, .max_tokens = 512, .sp = sl_sampler_defaults()};
    int r = parse(argc, argv, run_help, 1, &o);
    if (r) return r == 2 ? 0 : 1;
    char *file_text = NULL;
    if (o.file) {
        sl_error err = {0};
        const char *path = strcmp(o.file, "-") ? o.file : "/dev/stdin";
        if (sl_read_file(path, &file_text, NULL, &err)) return cli_error("%s", err.msg);
        o.prompt = file_text;
    }
    text_ctx t = {0};
    int rc = text_init(&t, &o);
    if (!rc) {
        sl_chat_msg msgs[2];
        int32_t n = 0;
        if (o.system && t.g.tpl.kind != SL_TEMPLATE_RAW)
            msgs[n++] = (sl_chat_msg){"system", o.system};
        msgs[n++] = (sl_chat_msg){"user", o.prompt};
        size_t need = sl_chat_render(&t.g.tpl, msgs, n, 1, o.think, NULL, 0);
        char *text = malloc(need + 1);
        sl_chat_render(&t.g.tpl, msgs, n, 1, o.think, text, need + 1);
        struct sigaction sa = {.sa_handler = on_sigint}, old;
        sigaction(SIGINT, &sa, &old);
        if (t.g.tpl.kind == SL_TEMPLATE_RAW) fputs(o.prompt, stdout); /* a continuation */
        rc = generate_reply(&t, text, stdout);
        sigaction(SIGINT, &old, NULL);
        free(text);
        if (!rc) {
            cli_print_summary(t.g.m, stderr);
            rc = cli_model_finish(t.g.m, &o.m);
        }
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

static void log_add(chat_log *c, const char *role, const char *text) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->msgs = realloc(c->msgs, (size_t)c->cap * sizeof *c->msgs);
        c->owned = realloc(c->owned, (size_t)c->cap * sizeof *c->owned);
    }
    c->owned[c->n] = strdup(text);
    c->msgs[c->n] = (sl_chat_msg){role, c->owned[c->n]};
    c->n++;
}

static void log_clear(chat_log *c) {
    for (int32_t i = 0; i < c->n; i++)
        free(c->owned[i]);
    c->n = 0;
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
    "leaving; /reset, /stats, /help, /exit.\n"
    "\n" TEXT_HELP CLI_MODEL_HELP;

int cli_chat(int argc, char **argv) {
    text_opts o = {.think = 1, .max_tokens = 2048, .sp = sl_sampler_defaults()};
    int r = parse(argc, argv, chat_help, 0, &o);
    if (r) return r == 2 ? 0 : 1;
    text_ctx t = {0};
    int rc = text_init(&t, &o);
    if (rc) {
        text_free(&t);
        return rc;
    }
    const int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "sluice chat: %s (%s). %s", o.model, t.g.info.arch, chat_commands);
    chat_log log = {0};
    if (o.system) log_add(&log, "system", o.system);
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    char *line;
    while ((line = read_line(tty))) {
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
                if (o.system) log_add(&log, "system", o.system);
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
        log_add(&log, "user", line);
        free(line);
        size_t need = sl_chat_render(&t.g.tpl, log.msgs, log.n, 1, o.think, NULL, 0);
        char *text = malloc(need + 1);
        sl_chat_render(&t.g.tpl, log.msgs, log.n, 1, o.think, text, need + 1);
        sigaction(SIGINT, &sa, &old);
        rc = generate_reply(&t, text, stdout);
        sigaction(SIGINT, &old, NULL);
        free(text);
        if (rc) break;
        if (interrupted) printf("(stopped)\n");
        log_add(&log, "assistant", t.g.reply ? t.g.reply : "");
    }
    if (!rc) cli_print_summary(t.g.m, stderr);
    log_clear(&log);
    free(log.msgs), free(log.owned);
    text_free(&t);
    return rc;
}
