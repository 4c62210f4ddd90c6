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
    const char *model, *ids_str, *out;
    int64_t n_new;
    cli_model_opts m;
} run_opts;

enum { OPT_IDS = CLI_OPT_COMMAND, OPT_OUT };

static const struct option long_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"out", required_argument, 0, OPT_OUT},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

/* Returns 0 to go on, 1 on error, 2 after printing help. */
static int parse(int argc, char **argv, const char *help, const char *shortopts, run_opts *o) {
    optind = 1;
    opterr = 0;
    int c, r;
    while ((c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
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
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (!(o->model = cli_model_operand(argc, argv, optind))) return 1;
    if (!o->ids_str) return cli_error("missing --ids (see --help)");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

static const char logits_help[] =
    "usage: sluice logits MODEL --ids 1,2,3 --out FILE [options]\n"
    "\n"
    "Runs the prompt through the model in one prefill pass and writes the logits\n"
    "of every position: T rows of vocab_size float32 values, little-endian.\n"
    "MODEL is a Hugging Face checkpoint directory or a sluice pack.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  --out FILE             where to write the T x V logits\n" CLI_MODEL_HELP;

int cli_logits(int argc, char **argv) {
    run_opts o = {0};
    int r = parse(argc, argv, logits_help, ":ht:", &o);
    if (r) return r == 2 ? 0 : 1;
    if (!o.out) return cli_error("missing --out FILE (see --help)");
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    sl_session_params sp = {.max_ctx = n, .max_batch = n};
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
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
    f = fopen(o.out, "wb");
    const size_t count = (size_t)n * (size_t)info.vocab_size;
    if (!f || fwrite(logits, sizeof(float), count, f) != count) {
        cli_error("cannot write %s", o.out);
        goto done;
    }
    rc = cli_model_finish(m, &o.m);
done:
    if (f && fclose(f) && rc == 0) rc = cli_error("cannot write %s", o.out);
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
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  -n N                   tokens to generate (default 16)\n"
    "  (--ctx defaults to the prompt plus N)\n" CLI_MODEL_HELP;

int cli_generate(int argc, char **argv) {
    run_opts o = {.n_new = 16};
    int r = parse(argc, argv, generate_help, ":hn:t:", &o);
    if (r) return r == 2 ? 0 : 1;
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    int32_t *out = malloc(((size_t)o.n_new + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    sl_session_params sp = {.max_ctx =
                                (int32_t)(o.m.ctx ? o.m.ctx : SL_CLI_MIN(n + o.n_new, INT32_MAX)),
                            .max_batch = (int32_t)o.m.batch};
    if (!out || !logits) {
        cli_error("out of memory");
        goto done;
    }
    if (sl_session_create(m, &sp, &s, &err) || sl_session_forward(s, ids, n, logits, 0, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    for (int64_t i = 0; i < o.n_new; i++) {
        out[i] = sl_argmax(logits, info.vocab_size);
        if (i + 1 < o.n_new && sl_session_forward(s, &out[i], 1, logits, 0, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
    }
    cli_print_summary(m, stderr);
    for (int64_t i = 0; i < o.n_new; i++)
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
