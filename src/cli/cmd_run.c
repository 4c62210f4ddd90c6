/* The token-id commands: `logits` (one prefill pass) and `generate` (greedy decode). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Options common to both commands. */
typedef struct run_opts {
    const char *model, *ids_str, *out;
    int64_t n_new, threads, ctx;
} run_opts;

enum { OPT_IDS = 256, OPT_OUT, OPT_THREADS, OPT_CTX };

static const struct option long_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"out", required_argument, 0, OPT_OUT},
    {"threads", required_argument, 0, OPT_THREADS},
    {"ctx", required_argument, 0, OPT_CTX},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* Returns 0 to go on, 1 on error, 2 after printing help. */
static int parse(int argc, char **argv, const char *help, const char *shortopts, run_opts *o) {
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(help, stdout); return 2;
        case OPT_IDS: o->ids_str = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, "-n", 0, 1 << 24, &o->n_new)) return 1;
            break;
        case 't':
        case OPT_THREADS:
            if (cli_parse_int(optarg, "--threads", 1, 1024, &o->threads)) return 1;
            break;
        case OPT_CTX:
            if (cli_parse_int(optarg, "--ctx", 1, INT32_MAX, &o->ctx)) return 1;
            break;
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return cli_error(optind >= argc ? "missing MODEL directory (see --help)"
                                        : "unexpected argument '%s' (see --help)",
                         argv[optind + (optind < argc)]);
    o->model = argv[optind];
    if (!o->ids_str) return cli_error("missing --ids (see --help)");
    return 0;
}

static const char logits_help[] =
    "usage: sluice logits MODEL --ids 1,2,3 --out FILE [options]\n"
    "\n"
    "Runs the prompt through the model in one prefill pass and writes the logits\n"
    "of every position: T rows of vocab_size float32 values, little-endian.\n"
    "\n"
    "  --ids LIST      comma-separated prompt token ids\n"
    "  --out FILE      where to write the T x V logits\n"
    "  -t, --threads N compute threads (default: all cores)\n"
    "  -h, --help      this help\n";

int cli_logits(int argc, char **argv) {
    run_opts o = {0};
    int r = parse(argc, argv, logits_help, ":ht:", &o);
    if (r) return r == 2 ? 0 : 1;
    if (!o.out) return cli_error("missing --out FILE (see --help)");
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, (int32_t)o.threads);
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
    if (!f || fwrite(logits, sizeof(float), (size_t)n * (size_t)info.vocab_size, f) !=
                  (size_t)n * (size_t)info.vocab_size) {
        cli_error("cannot write %s", o.out);
        goto done;
    }
    rc = 0;
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
    "prints the new ids, comma-separated, on the last line of stdout. Timing goes\n"
    "to stderr.\n"
    "\n"
    "  --ids LIST      comma-separated prompt token ids\n"
    "  -n N            tokens to generate\n"
    "  --ctx N         KV cache length (default: min(model maximum, 4096))\n"
    "  -t, --threads N compute threads (default: all cores)\n"
    "  -h, --help      this help\n";

int cli_generate(int argc, char **argv) {
    run_opts o = {.n_new = 16};
    int r = parse(argc, argv, generate_help, ":hn:t:", &o);
    if (r) return r == 2 ? 0 : 1;
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, (int32_t)o.threads);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    int32_t *out = malloc(((size_t)o.n_new + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    sl_session_params sp = {.max_ctx = (int32_t)o.ctx};
    if (!out || !logits) {
        cli_error("out of memory");
        goto done;
    }
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    double t0 = now();
    if (sl_session_forward(s, ids, n, logits, 0, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    double t1 = now();
    for (int64_t i = 0; i < o.n_new; i++) {
        out[i] = sl_argmax(logits, info.vocab_size);
        if (i + 1 < o.n_new && sl_session_forward(s, &out[i], 1, logits, 0, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
    }
    double t2 = now();
    fprintf(stderr, "prompt: %d tokens, %.2f tok/s | generated: %lld tokens, %.2f tok/s\n", n,
            n / (t1 - t0), (long long)o.n_new,
            o.n_new > 1 ? (double)(o.n_new - 1) / (t2 - t1) : 0.0);
    for (int64_t i = 0; i < o.n_new; i++)
        printf("%s%d", i ? "," : "", out[i]);
    printf("\n");
    rc = 0;
done:
    free(out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}
