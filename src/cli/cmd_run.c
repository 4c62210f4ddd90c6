/*
 * The token-id commands: `logits` (one prefill pass) and `generate` (greedy
 * decode), with the expert-store options every model-running command takes.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

typedef struct run_opts {
    const char *ids_str, *out;
    int64_t n_new;
    int sampling; /* --seed or --repeat-last-n given: generate is greedy, they do nothing */
    cli_model_opts m;
} run_opts;

enum {
    OPT_IDS = CLI_OPT_COMMAND,
    OPT_OUT,
    OPT_N_PREDICT,
    OPT_SEED,
    OPT_REPEAT_LAST_N,
    OPT_IGNORE_EOS
};

static const struct option long_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"out", required_argument, 0, OPT_OUT},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

/* generate's also: the names llama.cpp users type */
static const struct option generate_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"n-predict", required_argument, 0, 'n'},
    {"seed", required_argument, 0, 's'},
    {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

/* Returns 0 to go on, 1 on error, 2 after printing help. */
static int parse(int argc, char **argv, const char *help, const char *shortopts,
                 const struct option *opts, run_opts *o, const char **model) {
    int c, r;
    int64_t v;
    if (cli_getopt_start(argc, argv, shortopts, opts)) return 1;
    while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        if ((r = cli_model_option(c, optarg, &o->m))) {
            if (r < 0) return 1;
            continue;
        }
        switch (c) {
        case 'h': fputs(help, stdout); return 2;
        case OPT_IDS: o->ids_str = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, "-n", 0, 1 << 24, &o->n_new)) return 1;
            break;
        case 's':
            if (cli_parse_int(optarg, "--seed", 0, INT64_MAX, &v)) return 1;
            o->sampling = 1;
            break;
        case OPT_REPEAT_LAST_N:
            if (cli_parse_int(optarg, "--repeat-last-n", -1, INT32_MAX, &v)) return 1;
            o->sampling = 1;
            break;
        case OPT_IGNORE_EOS: break; /* generate never stops at EOS */
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (!(*model = cli_model_operand(argc, argv, optind, o->m.model))) return 1;
    if (!o->ids_str) return cli_error("missing --ids (see --help)");
    if (o->sampling) cli_warn("generate is greedy (argmax): --seed and --repeat-last-n do nothing");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

/*
 * The model's positions and vocabulary from its config alone (config.json, or the "config" of
 * a pack's manifest.json), read before any weight: a prompt that cannot run is refused at once,
 * not after a load that may read gigabytes (--experts resident) nor after minutes of prefill
 * (60,000 ids on a 512-position model ran past two minutes). 1 when known; 0 when the config
 * cannot be read here, and then the load that follows says why and the check runs after it.
 */
static int config_limits(const char *dir, int32_t *max_position, int32_t *vocab) {
    sl_error err = {0};
    return sl_model_peek(dir, max_position, vocab, &err) == SL_OK;
}

/*
 * 0 when the prompt can run: every id in the vocabulary and at most `room` of them, the
 * context (--ctx) when ctx_given, else the model's positions. Else 1, with one line giving
 * both numbers. Ids past the positions have no meaning to the model (no position was trained
 * there), so logits never go past them; generate does with an explicit --ctx, as run does,
 * after cli_model_report's warning.
 */
static int prompt_fits(const int32_t *ids, int32_t n, int32_t vocab, int64_t room, int ctx_given) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= vocab) /* the wording of sl_session_forward, which checks it too */
            return cli_error("token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i,
                             vocab);
    if (n <= room) return 0;
    if (ctx_given)
        return cli_error("the prompt (%d ids) is longer than the context of %lld tokens (--ctx)", n,
                         (long long)room);
    return cli_error("the prompt (%d ids) is longer than the model's %lld positions "
                     "(max_position_embeddings)",
                     n, (long long)room);
}

static const char logits_help[] =
    "usage: sluice logits MODEL --ids 1,2,3 --out FILE [options]\n"
    "\n"
    "Runs the prompt through the model in one prefill pass and writes the logits\n"
    "of every position: T rows of vocab_size float32 values, little-endian.\n"
    "MODEL is a Hugging Face checkpoint directory or a sluice pack.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  --out FILE             where to write the T x V logits ('-': standard output,\n"
    "                         which then receives nothing else)\n"
    "  (the context is the prompt, at most the model's max_position_embeddings: --ctx does\n"
    "  nothing here)\n" CLI_MODEL_HELP;

int cli_logits(int argc, char **argv) {
    run_opts o = {0};
    const char *model;
    int r = parse(argc, argv, logits_help, ":h" CLI_MODEL_SHORTOPTS, long_opts, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    if (!o.out) return cli_error("missing --out FILE (see --help)");
    if (o.m.ctx) cli_warn("--ctx does nothing in logits: the context is the --ids");
    int32_t *ids, n, max_position, vocab;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    const int known = config_limits(model, &max_position, &vocab);
    if (known && prompt_fits(ids, n, vocab, max_position, 0)) return free(ids), 1;
    sl_model *m = cli_load_model(model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    float *logits = NULL;
    const int to_stdout = !strcmp(o.out, "-");
    FILE *f = NULL;
    sl_session_params sp = {.max_ctx = n, .max_batch = n};
    if (!known && prompt_fits(ids, n, info.vocab_size, info.max_position, 0)) goto done;
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_model_report(m, &o.m, n);
    logits = malloc((size_t)n * (size_t)info.vocab_size * sizeof(float));
    if (!logits) {
        cli_error("out of memory for %d x %d logits", n, info.vocab_size);
        goto done;
    }
    if (sl_session_forward(s, ids, n, logits, 1, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    /* float32 is little-endian on every machine sluice builds for. */
    f = to_stdout ? stdout : fopen(o.out, "wb");
    const size_t count = (size_t)n * (size_t)info.vocab_size;
    if (!f || fwrite(logits, sizeof(float), count, f) != count || fflush(f)) {
        cli_error("cannot write %s", to_stdout ? "the logits to standard output" : o.out);
        goto done;
    }
    rc = cli_model_finish(m, &o.m);
done:
    if (f && !to_stdout && fclose(f) && rc == 0) rc = cli_error("cannot write %s", o.out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}

static const char generate_help[] =
    "usage: sluice generate MODEL --ids 1,2,3 -n N [options]\n"
    "\n"
    "Decodes N tokens greedily (argmax) through the incremental KV-cache path and\n"
    "prints the new ids, comma-separated, on the last line of stdout. One line of\n"
    "statistics goes to stderr. MODEL is a Hugging Face checkpoint or a sluice pack.\n"
    "A context too short for N stops early, with a notice: the ids made are printed.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  -n, --n-predict N      new tokens (default 16); the first comes from the prompt's\n"
    "                         logits, each goes through the model (decode N tok)\n"
    "  --ignore-eos           accepted: generate never stops at EOS\n"
    "  -s, --seed N, --repeat-last-n N   accepted with a warning: greedy has no use for them\n"
    "  (--ctx defaults to the prompt plus N, at most the model's max_position_embeddings;\n"
    "  a prompt longer than the context is refused)\n" CLI_MODEL_HELP;

int cli_generate(int argc, char **argv) {
    run_opts o = {.n_new = 16};
    const char *model;
    int r =
        parse(argc, argv, generate_help, ":hn:s:" CLI_MODEL_SHORTOPTS, generate_opts, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    int32_t *ids, n, max_position, vocab;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    /* The first new id comes from the prompt's last logits, with no position of its own: a
     * prompt that fills the context still gives one (and the notice below). */
    const int known = config_limits(model, &max_position, &vocab);
    if (known && prompt_fits(ids, n, vocab, o.m.ctx ? o.m.ctx : max_position, o.m.ctx != 0))
        return free(ids), 1;
    sl_model *m = cli_load_model(model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    int32_t *out = malloc(((size_t)o.n_new + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    /* By default the context stops at the model's positions, as run's does: decoding past them
     * takes an explicit --ctx (and gets cli_model_report's warning). */
    const int64_t ctx =
        o.m.ctx ? o.m.ctx : SL_CLI_MIN(SL_CLI_MIN(n + o.n_new, info.max_position), INT32_MAX);
    sl_session_params sp = {.max_ctx = (int32_t)ctx, .max_batch = (int32_t)o.m.batch};
    if (!known &&
        prompt_fits(ids, n, info.vocab_size, o.m.ctx ? o.m.ctx : info.max_position, o.m.ctx != 0))
        goto done;
    if (!out || !logits) {
        cli_error("out of memory");
        goto done;
    }
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_model_report(m, &o.m, sl_session_max_ctx(s));
    if (sl_session_forward(s, ids, n, logits, 0, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    /* Every new id goes through the model, the last one too, as in run, chat and serve (whose
     * KV cache keeps the reply for the next turn): -n N is N new ids, N decode steps, and the
     * statistics line says "decode N tok" in all of them. */
    int64_t made = 0;
    while (made < o.n_new) {
        out[made] = sl_argmax(logits, info.vocab_size);
        made++;
        if (sl_session_pos(s) == sl_session_max_ctx(s)) break; /* context full */
        if (sl_session_forward(s, &out[made - 1], 1, logits, 0, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
    }
    if (made < o.n_new)
        fprintf(stderr,
                "sluice: the context of %d tokens is full: stopped after %lld of %lld new ids "
                "(a larger --ctx gives more)\n",
                sl_session_max_ctx(s), (long long)made, (long long)o.n_new);
    cli_print_summary(m, stderr);
    for (int64_t i = 0; i < made; i++)
        printf("%s%d", i ? "," : "", out[i]);
    printf("\n");
    rc = cli_model_finish(m, &o.m);
done:
    free(out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}
