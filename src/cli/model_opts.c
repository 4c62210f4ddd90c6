/* The options every model-running command shares (threads, KV cache, expert store, stats), and
 * the check of argv that runs before getopt in every command. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* ---------------------------------------------------------------- argv before getopt */

#define HINT_GPU                                                                                   \
    "sluice has no layer split: --backend cuda puts the whole resident core on the GPU, and "      \
    "--gpu-experts N sets the expert slots per MoE layer there"
#define HINT_EXPERTS "--experts MODE and --gpu-experts N say where the routed experts live"
#define HINT_BATCH   "--batch N sets the prompt tokens per prefill chunk"
#define HINT_THREADS "-t/--threads N sets the threads of prompt and decode alike"
#define HINT_CHAT    "'sluice chat MODEL' is the conversation mode"

/* llama.cpp options that sluice spells differently or does without, and what to use. */
static const struct {
    const char *name, *hint;
} llama_opts[] = {
    {"ngl", HINT_GPU},
    {"n-gpu-layers", HINT_GPU},
    {"gpu-layers", HINT_GPU},
    {"ot", HINT_EXPERTS},
    {"override-tensor", HINT_EXPERTS},
    {"b", HINT_BATCH},
    {"batch-size", HINT_BATCH},
    {"ub", HINT_BATCH},
    {"ubatch-size", HINT_BATCH},
    {"tb", HINT_THREADS},
    {"threads-batch", HINT_THREADS},
    {"cnv", HINT_CHAT},
    {"conversation", HINT_CHAT},
    {"sys", "--system TEXT sets the system message"},
    {"system-prompt", "--system TEXT sets the system message"},
    {"np", "'sluice serve --parallel N' admits N requests at once"},
};

static const char *llama_hint(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof llama_opts / sizeof llama_opts[0]; i++)
        if (strlen(llama_opts[i].name) == len && !strncmp(llama_opts[i].name, name, len))
            return llama_opts[i].hint;
    return NULL;
}

/* The long option that --name (len bytes) selects, as getopt_long does: the exact name or the
 * one option it abbreviates; NULL when none or several. */
static const struct option *long_option(const struct option *opts, const char *name, size_t len) {
    const struct option *found = NULL;
    for (const struct option *o = opts; o->name; o++) {
        if (strncmp(o->name, name, len)) continue;
        if (strlen(o->name) == len) return o;
        if (found && (found->has_arg != o->has_arg || found->val != o->val)) return NULL;
        found = o;
    }
    return found;
}

static int is_number(const char *s) {
    char *end;
    strtod(s, &end);
    return end != s && !*end;
}

int cli_getopt_start(int argc, char **argv, const char *shortopts, const struct option *longopts) {
    optind = 1;
    opterr = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (a[0] == '-' && a[1] == '-') { /* --name or --name=value */
            const size_t len = strcspn(a + 2, "=");
            const struct option *o = long_option(longopts, a + 2, len);
            const char *hint = o ? NULL : llama_hint(a + 2, len);
            if (hint) return cli_error("unknown option '%.*s': %s", (int)len + 2, a, hint);
            if (!o) return 0; /* not an option of this command: getopt says so */
            if (o->has_arg == required_argument && !a[2 + len]) i++; /* its value */
            continue;
        }
        /* operands, "-", and negative numbers (values; getopt decides what they are) */
        if (a[0] != '-' || !isalpha((unsigned char)a[1])) continue;
        const char *p = strchr(shortopts, a[1]);
        const int takes_value = p && p[1] == ':';
        if (p && !a[2]) { /* -x, and its value */
            i += takes_value;
            continue;
        }
        if (takes_value && is_number(a + 2)) continue; /* -n8, -t4 */
        /* An unknown letter, or several letters after one dash: llama.cpp's style, which getopt
         * would read as a short option with a value ("-ngl" as -n gl) or a cluster of flags. */
        const char *hint = llama_hint(a + 1, strlen(a + 1));
        if (hint) return cli_error("unknown option '%s': %s", a, hint);
        const struct option *o = long_option(longopts, a + 1, strlen(a + 1));
        if (a[2] && o && !strcmp(o->name, a + 1))
            return cli_error("unknown option '%s' (did you mean '-%s'?)", a, a);
        return cli_error("unknown option '%s' (see --help)", a);
    }
    return 0;
}

/* ---------------------------------------------------------------- the model options */

int cli_model_option(int c, const char *arg, cli_model_opts *o) {
    int64_t v;
    switch (c) {
    case 't':
    case CLI_OPT_THREADS:
        if (cli_parse_int(arg, "--threads", 1, 1024, &v)) return -1;
        o->mp.n_threads = (int32_t)v;
        return 1;
    case 'm': o->model = arg; return 1;
    case 'c':
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
    case CLI_OPT_CACHE_MEM:
        if (!strcmp(arg, "auto")) {
            o->mp.cache_mem_auto = 1;
            o->mp.cache_mem = 0;
            return 1;
        }
        o->mp.cache_mem_auto = 0;
        return cli_parse_size(arg, "--cache-mem", &o->mp.cache_mem) ? -1 : 1;
    case CLI_OPT_CACHE_POLICY: {
        static const char *const policies[] = {"decay", "lfu", "lru", NULL}; /* sl_cache_policy */
        int i = cli_parse_choice(arg, "--cache-policy", policies);
        if (i < 0) return -1;
        o->mp.cache_policy = (sl_cache_policy)i;
        o->policy_set = 1;
        return 1;
    }
    case CLI_OPT_DIRECT_IO: o->mp.direct_io = 1; return 1;
    case CLI_OPT_IO_THREADS:
        if (cli_parse_int(arg, "--io-threads", 1, 256, &v)) return -1;
        o->mp.io_threads = (int32_t)v;
        return 1;
    case CLI_OPT_PREFETCH:
        if (cli_parse_int(arg, "--prefetch", 0, 1 << 16, &v)) return -1;
        o->mp.prefetch = (int32_t)v;
        return 1;
    case CLI_OPT_IO_ENGINE: {
        static const char *const engines[] = {"auto", "threads", "uring", NULL}; /* sl_io_engine */
        int i = cli_parse_choice(arg, "--io-engine", engines);
        if (i < 0) return -1;
        o->mp.io_engine = (sl_io_engine)i;
        return 1;
    }
    case CLI_OPT_NO_OVERLAP: o->mp.no_overlap = 1; return 1;
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
    case CLI_OPT_CUDA_NO_PDL: o->mp.cuda.no_pdl = 1; return 1;
    case CLI_OPT_CUDA_INT4_FLOAT_ACT: o->mp.cuda.int4_float_act = 1; return 1;
    case CLI_OPT_CUDA_NO_TENSOR_CORES: o->mp.cuda.no_tensor_cores = 1; return 1;
    case CLI_OPT_INT4_FLOAT_ACT: o->mp.int4_float_act = 1; return 1;
    case CLI_OPT_PARTS:
        if (cli_parse_int(arg, "--parts", 1, 1024, &v)) return -1;
        o->mp.n_parts = (int32_t)v;
        return 1;
    case CLI_OPT_PART_MEM: return cli_parse_size(arg, "--part-mem", &o->mp.part_mem) ? -1 : 1;
    case CLI_OPT_GPUS:
        if (cli_parse_int(arg, "--gpus", 1, 64, &v)) return -1;
        o->mp.n_parts = (int32_t)v;
        o->mp.part_gpus = 1;
        return 1;
    case CLI_OPT_STATS: /* its table has the oracle's hit rate, from the run's requests */
        o->stats = 1;
        o->mp.keep_routes = 1;
        return 1;
    case 'v': o->verbose = 1; return 1;
    case CLI_OPT_ROUTER_HIST: o->router_hist = arg; return 1;
    case CLI_OPT_ROUTER_TRACE: o->mp.router_trace = arg; return 1;
    case CLI_OPT_ROUTE_REPLAY: o->mp.route_replay = arg; return 1;
    default: return 0;
    }
}

int cli_model_opts_check(const cli_model_opts *o) {
    if (o->mp.experts == SL_EXPERTS_STREAM) return 0;
    /* A slot budget is a bound on memory that the other modes cannot keep: an error, not a
     * warning. The policy and the readers only change how the stream mode works. */
    if (o->mp.cache_experts || o->mp.cache_mem || o->mp.cache_mem_auto || o->mp.direct_io)
        return cli_error("--cache-experts, --cache-mem and --direct-io need --experts stream");
    if (o->mp.io_engine || o->mp.no_overlap)
        cli_warn("--io-engine and --no-overlap do nothing without --experts stream");
    if (o->policy_set) cli_warn("--cache-policy does nothing without --experts stream");
    if (o->mp.io_threads) cli_warn("--io-threads does nothing without --experts stream");
    if (o->mp.prefetch) cli_warn("--prefetch does nothing without --experts stream");
    return 0;
}

void cli_model_report(const sl_model *m, const cli_model_opts *o, int64_t ctx) {
    sl_model_info in;
    sl_model_get_info(m, &in);
    if (ctx > in.max_position)
        cli_warn("a context of %lld tokens is longer than the model's %d positions "
                 "(max_position_embeddings): what comes past them may be poor",
                 (long long)ctx, in.max_position);
    if (strcmp(in.backend, "cuda") && (o->mp.gpu_experts || o->mp.graphs || o->mp.cuda.no_pdl ||
                                       o->mp.cuda.int4_float_act || o->mp.cuda.no_tensor_cores)) {
        const char *why = o->mp.backend == SL_BACKEND_CPU
                              ? " (--backend cpu)"
                              : ": this sluice has no CUDA (make CUDA=1) or found no GPU";
        if (o->mp.gpu_experts) cli_warn("--gpu-experts does nothing on the CPU backend%s", why);
        if (o->mp.graphs) cli_warn("--cuda-graphs does nothing on the CPU backend%s", why);
        if (o->mp.cuda.no_pdl) cli_warn("--cuda-no-pdl does nothing on the CPU backend%s", why);
        if (o->mp.cuda.int4_float_act)
            cli_warn("--cuda-int4-float-act does nothing on the CPU backend%s", why);
        if (o->mp.cuda.no_tensor_cores)
            cli_warn("--cuda-no-tensor-cores does nothing on the CPU backend%s", why);
    }
    if (in.cache_auto_bytes)
        fprintf(stderr,
                "sluice: cache-mem auto: %.1f GiB of %.1f GiB available -> %d slots a layer "
                "(%.0f%%)\n",
                (double)in.cache_auto_bytes / (1 << 30), (double)in.cache_auto_avail / (1 << 30),
                in.cache_slots, 100.0 * in.cache_auto_share);
    if (!o->verbose) return;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(stderr,
            "sluice: %s, %d layers (%d with %d routed experts, top-%d%s), hidden %d, "
            "vocabulary %d, %d positions\n",
            in.arch, in.n_layers, in.n_moe_layers, in.n_experts, in.n_experts_used,
            in.shared_expert ? ", shared expert" : "", in.hidden_size, in.vocab_size,
            in.max_position);
    fprintf(stderr,
            "sluice: %s, experts %s %s (%.2f MB each), resident core %.1f MB, backend %s, "
            "%d threads, context %lld tokens\n",
            in.source, in.weights, in.experts_mode, (double)in.expert_bytes / 1e6,
            (double)in.resident_bytes / 1e6, in.backend,
            o->mp.n_threads ? o->mp.n_threads : (int)cores, (long long)ctx);
    if (!strcmp(in.experts_mode, "stream"))
        fprintf(stderr, "sluice: expert cache %d slots per MoE layer (%.1f MB), %s\n",
                in.cache_slots, (double)in.cache_slots * in.n_moe_layers * in.expert_bytes / 1e6,
                o->mp.cache_policy == SL_CACHE_LRU     ? "LRU"
                : o->mp.cache_policy == SL_CACHE_DECAY ? "decayed LFU"
                                                       : "LFU");
    if (!strcmp(in.experts_mode, "stream") && in.io_engine)
        fprintf(stderr, "sluice: expert reads: %s%s\n", in.io_engine,
                o->mp.no_overlap ? ", no overlap" : ", overlapped with compute");
    if (!strcmp(in.backend, "cuda"))
        fprintf(stderr, "sluice: GPU expert slots %d per MoE layer%s\n", in.gpu_expert_slots,
                in.graphs ? ", CUDA graphs" : "");
    if (in.split) fprintf(stderr, "sluice: %d partitions: %s\n", in.n_parts, in.split);
}

int cli_model_finish(sl_model *m, const cli_model_opts *o) {
    sl_error terr = {0};
    if (sl_model_trace_close(m, &terr)) return cli_error("%s", terr.msg);
    if (o->stats || o->verbose) cli_print_stats(m, stderr);
    if (o->router_hist) {
        sl_error err = {0};
        if (sl_model_write_router_hist(m, o->router_hist, &err)) return cli_error("%s", err.msg);
    }
    return 0;
}
