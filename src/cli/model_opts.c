/* The options every model-running command shares (threads, KV cache, expert store, stats). */
#include "cli/cli.h"

int cli_model_option(int c, const char *arg, cli_model_opts *o) {
    int64_t v;
    switch (c) {
    case 't':
    case CLI_OPT_THREADS:
        if (cli_parse_int(arg, "--threads", 1, 1024, &v)) return -1;
        o->mp.n_threads = (int32_t)v;
        return 1;
    case CLI_OPT_CTX: return cli_parse_int(arg, "--ctx", 1, INT32_MAX, &o->ctx) ? -1 : 1;
    case CLI_OPT_BATCH: return cli_parse_int(arg, "--batch", 1, 1 << 20, &o->batch) ? -1 : 1;
    case CLI_OPT_EXPERTS: {
        static const char *const modes[] = {"mapped", "resident", "stream", NULL}; /* enum order */
        int i = cli_parse_choice(arg, "--experts", modes);
        if (i < 0) return -1;
        o->mp.experts = (sl_experts_mode)i;
        return 1;
    }
    case CLI_OPT_CACHE_EXPERTS:
        if (cli_parse_int(arg, "--cache-experts", 1, 1 << 20, &v)) return -1;
        o->mp.cache_experts = (int32_t)v;
        return 1;
    case CLI_OPT_CACHE_MEM: return cli_parse_size(arg, "--cache-mem", &o->mp.cache_mem) ? -1 : 1;
    case CLI_OPT_CACHE_POLICY: {
        static const char *const policies[] = {"lfu", "lru", NULL}; /* sl_cache_policy */
        int i = cli_parse_choice(arg, "--cache-policy", policies);
        if (i < 0) return -1;
        o->mp.cache_policy = (sl_cache_policy)i;
        return 1;
    }
    case CLI_OPT_DIRECT_IO: o->mp.direct_io = 1; return 1;
    case CLI_OPT_IO_THREADS:
        if (cli_parse_int(arg, "--io-threads", 1, 256, &v)) return -1;
        o->mp.io_threads = (int32_t)v;
        return 1;
    case CLI_OPT_BACKEND: {
        static const char *const kinds[] = {"auto", "cpu", "cuda", NULL}; /* sl_backend_kind */
        int i = cli_parse_choice(arg, "--backend", kinds);
        if (i < 0) return -1;
        o->mp.backend = (sl_backend_kind)i;
        return 1;
    }
    case CLI_OPT_GPU_EXPERTS:
        if (cli_parse_int(arg, "--gpu-experts", 1, 1 << 20, &v)) return -1;
        o->mp.gpu_experts = (int32_t)v;
        return 1;
    case CLI_OPT_GRAPHS: o->mp.graphs = 1; return 1;
    case CLI_OPT_STATS: o->stats = 1; return 1;
    case CLI_OPT_ROUTER_HIST: o->router_hist = arg; return 1;
    default: return 0;
    }
}

int cli_model_opts_check(const cli_model_opts *o) {
    if (o->mp.experts != SL_EXPERTS_STREAM &&
        (o->mp.cache_experts || o->mp.cache_mem || o->mp.direct_io))
        return cli_error("--cache-experts, --cache-mem and --direct-io need --experts stream");
    return 0;
}

int cli_model_finish(sl_model *m, const cli_model_opts *o) {
    if (o->stats) cli_print_stats(m, stderr);
    if (o->router_hist) {
        sl_error err = {0};
        if (sl_model_write_router_hist(m, o->router_hist, &err)) return cli_error("%s", err.msg);
    }
    return 0;
}
