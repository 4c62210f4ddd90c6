/* The options and the generation around the library loop that `run` and `chat` share (see
 * text_opts.h). */
#include <getopt.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "chat/reply.h"
#include "cli/text_opts.h"

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
    OPT_LOGIT_BIAS,
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
    {"logit-bias", required_argument, 0, OPT_LOGIT_BIAS},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

static double parse_float(const char *s, const char *what, double lo, double hi, int *bad) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        cli_error("invalid %s '%s' (expected a number in [%g, %g])", what, s, lo, hi);
        *bad = 1;
    }
    return v;
}

/* --logit-bias ID=BIAS into o->bias (a later one for the same id replaces it); the id is
 * checked against the vocabulary once the model is open (text_init). 0 or 1 (printed). */
static int parse_bias(const char *s, text_opts *o) {
    const char *eq = strchr(s, '=');
    char *end;
    const size_t digits = strspn(s, "0123456789");
    const double b = eq ? strtod(eq + 1, &end) : 0;
    if (!eq || digits == 0 || digits > 10 || s + digits != eq || end == eq + 1 || *end ||
        !(b >= -100 && b <= 100))
        return cli_error("invalid --logit-bias '%s' (expected ID=BIAS: a token id and a number in "
                         "[-100, 100], e.g. 151643=-100)",
                         s);
    const long long id = atoll(s);
    if (id > INT32_MAX) return cli_error("invalid --logit-bias '%s' (no such token id)", s);
    int32_t i = 0;
    while (i < o->n_bias && o->bias[i].id != (int32_t)id)
        i++;
    if (i == TEXT_MAX_BIAS) return cli_error("at most %d --logit-bias options", TEXT_MAX_BIAS);
    o->bias[i] = (sl_logit_bias){(int32_t)id, (float)b};
    o->n_bias = SL_MAX(o->n_bias, i + 1);
    o->sp.logit_bias = o->bias;
    o->sp.n_logit_bias = o->n_bias;
    return 0;
}

int text_parse(int argc, char **argv, const char *help, int need_prompt, text_opts *o,
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
            if (o->n_stops == TEXT_MAX_STOPS)
                return cli_error("at most %d --stop strings", TEXT_MAX_STOPS);
            if (!*optarg) return cli_error("--stop needs a non-empty text");
            o->stops[o->n_stops++] = optarg;
            break;
        case OPT_LOGIT_BIAS:
            if (parse_bias(optarg, o)) return 1;
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

/* Ctrl-C during a reply: the CLI's one flag, set by the handler text_reply installs. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

void text_free(text_ctx *t) {
    sl_token_ids_free(&t->ids);
    sl_gen_free(&t->g);
}

/* A seed for runs given none: each run differs, and --stats / -v show it to repeat one. */
static uint64_t random_seed(void) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed =
            (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() ^ (uint64_t)clock();
    return seed & INT64_MAX; /* --seed takes [0, 2^63) */
}

int text_init(text_ctx *t, text_opts *o, const char *model) {
    sl_error err = {0};
    t->o = o;
    t->model = model;
    sl_gen_setup su = {.model = model,
                       .tokenizer = o->tokenizer,
                       .template_name = o->template_name,
                       .raw = o->raw};
    if (cli_gen_open(&t->g, &su, &o->m)) return 1;
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
        (int32_t)(o->repeat_last_n < 0 ? sl_session_max_ctx(t->g.seq.s) : o->repeat_last_n);
    for (int32_t i = 0; i < o->n_bias; i++)
        if (o->bias[i].id >= t->g.info.vocab_size)
            return cli_error("--logit-bias %d=...: the vocabulary has %d ids (0 to %d)",
                             o->bias[i].id, t->g.info.vocab_size, t->g.info.vocab_size - 1);
    if (sl_sampler_create(&o->sp, t->g.info.vocab_size, &t->g.seq.smp, &err))
        return cli_error("%s", err.msg);
    return 0;
}

int text_finish(text_ctx *t) {
    cli_print_summary(t->g.m, stderr);
    if (t->o->m.stats || t->o->m.verbose)
        fprintf(stderr, "seed %llu (--seed %llu repeats this run)\n",
                (unsigned long long)t->o->sp.seed, (unsigned long long)t->o->sp.seed);
    return cli_model_finish(t->g.m, &t->o->m);
}

/*
 * With a template, message text never becomes control tokens: "<|im_end|>" typed in a prompt
 * is text, and only the template inserts <|im_start|> and the like (sl_chat_encode). Without
 * one (--raw, --chat-template raw, a model that has none) the text is the prompt as written,
 * special tokens' text included, as llama.cpp's --special: the documented raw mode, where
 * nothing else could insert them. It starts with the BOS the tokenizer adds to a text
 * (Llama-4, DeepSeek, Mixtral, Gemma; not Qwen), as tokenizer(text) does: a template writes
 * its own.
 */
int text_encode(text_ctx *t, const sl_chat_msg *msgs, int32_t n) {
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
    st = sl_tokenizer_encode_prompt(t->g.tok, text, need, &t->ids, &err); /* with its BOS */
    free(text);
    return st ? cli_error("%s", err.msg) : 0;
}

static int emit_file(void *user, const char *text, size_t len) {
    fwrite(text, 1, len, (FILE *)user);
    fflush((FILE *)user);
    return 0;
}

/* A reply read by its template's layout (harmony): the content to the reply's stream, the
 * reasoning to stderr, where it shows on a terminal and stays out of a redirected answer. */
typedef struct reply_sink {
    FILE *out;
    sl_reply_parser parser;
    int reasoning_open; /* reasoning shown and not yet ended by a newline */
} reply_sink;

static void reply_part(void *user, sl_reply_part part, const char *text, size_t len) {
    reply_sink *k = user;
    if (part == SL_REPLY_CONTENT && k->reasoning_open) fputc('\n', stderr);
    k->reasoning_open = part == SL_REPLY_REASONING;
    emit_file(k->reasoning_open ? stderr : k->out, text, len);
}

static int emit_parts(void *user, const char *text, size_t len) {
    reply_sink *k = user;
    sl_reply_feed(&k->parser, text, len, reply_part, k);
    return 0;
}

static int was_interrupted(void *user) {
    (void)user;
    return interrupted;
}

int text_reply(text_ctx *t, FILE *out, sl_gen_result *res) {
    sl_error err = {0};
    sl_gen_params p = {.max_tokens = t->o->max_tokens,
                       .stops = t->o->stops,
                       .n_stops = t->o->n_stops,
                       .ignore_eos = t->o->ignore_eos,
                       .emit = emit_file,
                       .cancelled = was_interrupted,
                       .user = out};
    reply_sink parts = {.out = out};
    if (sl_reply_needs_special(&t->g.tpl)) {
        sl_reply_init(&parts.parser, &t->g.tpl);
        p.keep_special = 1;
        p.emit = emit_parts;
        p.user = &parts;
    }
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigaction(SIGINT, &sa, &old);
    interrupted = 0;
    int rc = 0;
    if (sl_gen_reply(&t->g, t->ids.ids, (int32_t)t->ids.n, &p, res, &err))
        rc = cli_error("%s", err.msg);
    if (p.emit == emit_parts) {
        sl_reply_finish(&parts.parser, reply_part, &parts);
        if (parts.reasoning_open) fputc('\n', stderr);
    }
    sigaction(SIGINT, &old, NULL);
    fputc('\n', out);
    fflush(out);
    return rc;
}

int text_interrupted(void) {
    return interrupted;
}
