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
    const char *model, *ids_str, *out, *router_hist;
    int64_t n_new, ctx, batch;
    int stats;
    sl_model_params mp;
} run_opts;

enum {
    OPT_IDS = 256,
    OPT_OUT,
    OPT_THREADS,
    OPT_CTX,
    OPT_EXPERTS,
    OPT_CACHE_EXPERTS,
    OPT_CACHE_MEM,
    OPT_CACHE_POLICY,
    OPT_DIRECT_IO,
    OPT_IO_THREADS,
    OPT_STATS,
    OPT_ROUTER_HIST,
    OPT_BATCH,
};

static const struct option long_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"out", required_argument, 0, OPT_OUT},
    {"threads", required_argument, 0, OPT_THREADS},
    {"ctx", required_argument, 0, OPT_CTX},
    {"batch", required_argument, 0, OPT_BATCH},
    {"experts", required_argument, 0, OPT_EXPERTS},
    {"cache-experts", required_argument, 0, OPT_CACHE_EXPERTS},
    {"cache-mem", required_argument, 0, OPT_CACHE_MEM},
    {"cache-policy", required_argument, 0, OPT_CACHE_POLICY},
    {"direct-io", no_argument, 0, OPT_DIRECT_IO},
    {"io-threads", required_argument, 0, OPT_IO_THREADS},
    {"stats", no_argument, 0, OPT_STATS},
    {"router-hist", required_argument, 0, OPT_ROUTER_HIST},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

#define MODEL_OPTIONS_HELP                                                                         \
    "  -t, --threads N        compute threads (default: all cores)\n"                              \
    "  --experts MODE         mapped (default) | resident | stream (packed models)\n"              \
    "  --cache-experts N      stream: expert slots per MoE layer\n"                                \
    "  --cache-mem SIZE       stream: slot budget for all layers, e.g. 512M, 4G\n"                 \
    "  --cache-policy P       stream: lfu (default) | lru\n"                                       \
    "  --direct-io            stream: read experts with O_DIRECT (no page cache)\n"                \
    "  --io-threads N         stream: parallel expert reads (default 8)\n"                         \
    "  --stats                print the full statistics table at the end\n"                        \
    "  --router-hist FILE     write per-layer expert selection counts as JSON\n"                   \
    "  -h, --help             this help\n"

/* Returns 0 to go on, 1 on error, 2 after printing help. */
static int parse(int argc, char **argv, const char *help, const char *shortopts, run_opts *o) {
    optind = 1;
    opterr = 0;
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(help, stdout); return 2;
        case OPT_IDS: o->ids_str = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_ROUTER_HIST: o->router_hist = optarg; break;
        case OPT_STATS: o->stats = 1; break;
        case OPT_DIRECT_IO: o->mp.direct_io = 1; break;
        case 'n':
            if (cli_parse_int(optarg, "-n", 0, 1 << 24, &o->n_new)) return 1;
            break;
        case 't':
        case OPT_THREADS:
            if (cli_parse_int(optarg, "--threads", 1, 1024, &v)) return 1;
            o->mp.n_threads = (int32_t)v;
            break;
        case OPT_CTX:
            if (cli_parse_int(optarg, "--ctx", 1, INT32_MAX, &o->ctx)) return 1;
            break;
        case OPT_BATCH:
            if (cli_parse_int(optarg, "--batch", 1, 1 << 20, &o->batch)) return 1;
            break;
        case OPT_EXPERTS: {
            /* the order of sl_experts_mode */
            static const char *const modes[] = {"mapped", "resident", "stream", NULL};
            int i = cli_parse_choice(optarg, "--experts", modes);
            if (i < 0) return 1;
            o->mp.experts = (sl_experts_mode)i;
            break;
        }
        case OPT_CACHE_EXPERTS:
            if (cli_parse_int(optarg, "--cache-experts", 1, 1 << 20, &v)) return 1;
            o->mp.cache_experts = (int32_t)v;
            break;
        case OPT_CACHE_MEM:
            if (cli_parse_size(optarg, "--cache-mem", &o->mp.cache_mem)) return 1;
            break;
        case OPT_CACHE_POLICY: {
            static const char *const policies[] = {"lfu", "lru", NULL}; /* sl_cache_policy */
            int i = cli_parse_choice(optarg, "--cache-policy", policies);
            if (i < 0) return 1;
            o->mp.cache_policy = (sl_cache_policy)i;
            break;
        }
        case OPT_IO_THREADS:
            if (cli_parse_int(optarg, "--io-threads", 1, 256, &v)) return 1;
            o->mp.io_threads = (int32_t)v;
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
    if (o->mp.experts != SL_EXPERTS_STREAM &&
        (o->mp.cache_experts || o->mp.cache_mem || o->mp.direct_io))
        return cli_error("--cache-experts, --cache-mem and --direct-io need --experts stream");
    return 0;
}

/* End of a run: the statistics and the router histogram the user asked for. */
static int finish(sl_model *m, const run_opts *o) {
    if (o->stats) cli_print_stats(m, stderr);
    if (o->router_hist) {
        sl_error err = {0};
        if (sl_model_write_router_hist(m, o->router_hist, &err)) return cli_error("%s", err.msg);
    }
    return 0;
}

static const char logits_help[] =
    "usage: sluice logits MODEL --ids 1,2,3 --out FILE [options]\n"
    "\n"
    "Runs the prompt through the model in one prefill pass and writes the logits\n"
    "of every position: T rows of vocab_size float32 values, little-endian.\n"
    "MODEL is a Hugging Face checkpoint directory or a sluice pack.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  --out FILE             where to write the T x V logits\n" MODEL_OPTIONS_HELP;

int cli_logits(int argc, char **argv) {
    run_opts o = {0};
    int r = parse(argc, argv, logits_help, ":ht:", &o);
    if (r) return r == 2 ? 0 : 1;
    if (!o.out) return cli_error("missing --out FILE (see --help)");
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, &o.mp);
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
    rc = finish(m, &o);
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
    "  --ctx N                KV cache length (default: prompt + N)\n"
    "  --batch N              prompt tokens per prefill chunk (default 512; 1 = token by\n"
    "                         token through the decode path)\n" MODEL_OPTIONS_HELP;

int cli_generate(int argc, char **argv) {
    run_opts o = {.n_new = 16};
    int r = parse(argc, argv, generate_help, ":hn:t:", &o);
    if (r) return r == 2 ? 0 : 1;
    int32_t *ids, n;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    sl_model *m = cli_load_model(o.model, &o.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    int32_t *out = malloc(((size_t)o.n_new + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    sl_session_params sp = {.max_ctx =
                                (int32_t)(o.ctx ? o.ctx : SL_CLI_MIN(n + o.n_new, INT32_MAX)),
                            .max_batch = (int32_t)o.batch};
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
    rc = finish(m, &o);
done:
    free(out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}
