/* `sluice trace-replay TRACE`: expert-cache policies replayed offline over a routing trace
 * (--router-trace), each beside the clairvoyant optimum (Belady) for the same slots. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "moe/cache_sim.h"

static const char replay_help[] =
    "usage: sluice trace-replay TRACE [options]\n"
    "\n"
    "Replays a routing trace (written by --router-trace, or by a training script in\n"
    "the same format) through each MoE layer's expert cache, the engine's own slot\n"
    "cache code, and prints per policy and cache size the hit rate (all layers, and\n"
    "the lowest and highest layer's), the experts read per token, and the optimal\n"
    "(Belady, clairvoyant) hit rate for the same slots beside it. Without a size:\n"
    "10%, 25% and 50% of the experts; without --policy: every policy.\n"
    "\n"
    "  --cache-experts N[,N..]  slots per MoE layer\n"
    "  --cache-frac F[,F..]     slots per MoE layer as a fraction of the experts\n"
    "  --policy P               lfu | lru | decay (the engine's default) | all (default all)\n"
    "  --halflife H             decay: a use's weight halves every H requests (default 32)\n"
    "  --prefetch               also replay the trace's predictions (kind-1 records): each\n"
    "                           request's predicted experts read into its layer's cache\n"
    "                           before it, as the engine's --prefetch places them; prints the\n"
    "                           hit rate then, the share found read ahead (neither hit nor\n"
    "                           miss, as --stats counts them), the reads per token\n"
    "                           (prefetches included), and the predictions' recall,\n"
    "                           precision and wasted reads per token\n"
    "  --expert-bytes SIZE      one expert's bytes (sluice inspect): reads also in MB\n"
    "  -h, --help               this help\n";

/* The policies in the table's order, and --policy's names. */
static const struct {
    const char *name;
    sl_cache_policy policy;
} policies[] = {{"lfu", SL_CACHE_LFU}, {"lru", SL_CACHE_LRU}, {"decay", SL_CACHE_DECAY}};
static const char *const policy_names[] = {"lfu", "lru", "decay", NULL};
#define N_POLICIES 3

enum { OPT_EXPERTS = CLI_OPT_COMMAND, OPT_FRAC, OPT_POLICY, OPT_HALFLIFE, OPT_PREFETCH, OPT_BYTES };

#define MAX_SIZES 32

/* Appends the comma-separated numbers of s to v[*n] (fractions when frac); 0 on success. */
static int parse_list(const char *s, const char *what, int frac, double *v, int *n) {
    for (const char *p = s;;) {
        char *end;
        const double x = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !isfinite(x) || x <= 0 ||
            (frac ? x > 1 : x != floor(x) || x > 65535))
            return cli_error("invalid %s '%s' (%s)", what, s,
                             frac ? "fractions in (0, 1], comma-separated"
                                  : "slot counts of 1 or more, comma-separated");
        if (*n == MAX_SIZES) return cli_error("%s: at most %d sizes", what, MAX_SIZES);
        v[(*n)++] = frac ? -x : x; /* fractions kept negative until the trace says E */
        if (!*end) return 0;
        p = end + 1;
    }
}

static double pct(int64_t a, int64_t b) {
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

int cli_trace_replay(int argc, char **argv) {
    static const struct option opts[] = {{"cache-experts", required_argument, 0, OPT_EXPERTS},
                                         {"cache-frac", required_argument, 0, OPT_FRAC},
                                         {"policy", required_argument, 0, OPT_POLICY},
                                         {"halflife", required_argument, 0, OPT_HALFLIFE},
                                         {"prefetch", no_argument, 0, OPT_PREFETCH},
                                         {"expert-bytes", required_argument, 0, OPT_BYTES},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    double sizes[MAX_SIZES];
    int n_sizes = 0, policy = -1, prefetch = 0;
    double halflife = 0;
    int64_t expert_bytes = 0, v;
    if (cli_getopt_start(argc, argv, ":h", opts)) return 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(replay_help, stdout); return 0;
        case OPT_EXPERTS:
            if (parse_list(optarg, "--cache-experts", 0, sizes, &n_sizes)) return 1;
            break;
        case OPT_FRAC:
            if (parse_list(optarg, "--cache-frac", 1, sizes, &n_sizes)) return 1;
            break;
        case OPT_POLICY:
            if (!strcmp(optarg, "all")) {
                policy = -1;
                break;
            }
            if ((policy = cli_parse_choice(optarg, "--policy", policy_names)) < 0) return 1;
            policy = (int)policies[policy].policy;
            break;
        case OPT_HALFLIFE:
            if (cli_parse_int(optarg, "--halflife", 1, 1 << 30, &v)) return 1;
            halflife = (double)v;
            break;
        case OPT_PREFETCH: prefetch = 1; break;
        case OPT_BYTES:
            if (cli_parse_size(optarg, "--expert-bytes", &expert_bytes)) return 1;
            break;
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (argc - optind != 1) return cli_error("trace-replay needs one TRACE file (see --help)");
    const char *path = argv[optind];
    sl_error err = {0};
    sl_trace t;
    if (sl_trace_load(&t, path, &err)) return cli_error("%s", err.msg);
    sl_requests r;
    sl_status st = sl_requests_build(&r, &t, &err);
    const int64_t n_records = t.n_records;
    sl_trace_free(&t);
    if (st) return cli_error("%s", err.msg);
    int64_t n_req = 0, max_size = 0, n_pred = 0;
    for (int32_t l = 0; l < r.n_layers; l++) {
        n_req += r.layers[l].n_req;
        max_size = SL_CLI_MAX(max_size, r.layers[l].max_size);
        n_pred += r.layers[l].poff ? r.layers[l].poff[r.layers[l].n_req] : 0;
    }
    printf("%s: %lld records, %d of %d layers with requests, %d experts, top-%d, %lld tokens, "
           "%lld requests (up to %lld experts each)%s\n",
           path, (long long)n_records, r.n_used, r.n_layers, r.n_experts, r.k, (long long)r.tokens,
           (long long)n_req, (long long)max_size, n_pred ? ", with predictions" : "");
    if (prefetch && !n_pred) cli_warn("--prefetch: the trace has no predictions (kind-1 records)");
    if (!n_sizes) {
        sizes[0] = -0.10, sizes[1] = -0.25, sizes[2] = -0.50;
        n_sizes = 3;
    }
    const int32_t E = r.n_experts;
    const double tokens = (double)SL_CLI_MAX(r.tokens, 1);
    printf("%6s %-6s %7s %15s %11s %7s %6s", "slots", "policy", "hits", "layers min-max",
           "reads/tok", "belady", "gap");
    if (expert_bytes) printf(" %9s", "MB/tok");
    if (prefetch)
        printf(" | %7s %7s %9s %7s %7s %9s", "+hits", "ahead", "reads/tok", "recall", "precis",
               "waste/tok");
    printf("\n");
    int rc = 0;
    for (int i = 0; i < n_sizes && !rc; i++) {
        int32_t S = sizes[i] < 0 ? (int32_t)lround(-sizes[i] * E) : (int32_t)sizes[i];
        S = SL_CLI_MAX(1, SL_CLI_MIN(S, E));
        sl_sim_result opt;
        if (sl_cache_belady(&r, S, &opt, &err)) {
            rc = cli_error("%s", err.msg);
            break;
        }
        for (int i_p = 0; i_p < N_POLICIES; i_p++) {
            const sl_cache_policy p = policies[i_p].policy;
            if (policy >= 0 && (int)p != policy) continue;
            sl_sim_result res, pre;
            if (sl_cache_sim(&r, S, p, halflife, 0, &res, &err) ||
                (prefetch && sl_cache_sim(&r, S, p, halflife, 1, &pre, &err))) {
                rc = cli_error("%s", err.msg);
                break;
            }
            const double h = pct(res.hits, res.requests), ho = pct(opt.hits, opt.requests);
            char range[32];
            snprintf(range, sizeof range, "%.1f-%.1f%%", 100 * res.layer_min, 100 * res.layer_max);
            const double reads = (double)(res.requests - res.hits) / tokens;
            printf("%6d %-6s %6.1f%% %15s %11.2f %6.1f%% %6.1f", S, policies[i_p].name, h, range,
                   reads, ho, ho - h);
            if (expert_bytes) printf(" %9.2f", reads * (double)expert_bytes / 1e6);
            if (prefetch)
                printf(" | %6.1f%% %6.1f%% %9.2f %6.1f%% %6.1f%% %9.2f",
                       pct(pre.hits, pre.requests), pct(pre.prefetch_used, pre.requests),
                       (double)(pre.requests - pre.hits - pre.prefetch_used + pre.inserts) / tokens,
                       pct(pre.predicted_right, pre.requested),
                       pct(pre.predicted_right, pre.predicted), (double)pre.wasted / tokens);
            printf("\n");
        }
    }
    sl_requests_free(&r);
    return rc;
}
