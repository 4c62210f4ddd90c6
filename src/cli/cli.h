/* The command-line tool: one function per command (cmd_NAME.c), shared option helpers. */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "gen/generate.h"
#include "sluice.h"

#define SL_CLI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SL_CLI_MAX(a, b) ((a) > (b) ? (a) : (b))

int cli_logits(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_pack(int argc, char **argv);
int cli_verify(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_perplexity(int argc, char **argv);
int cli_trace_replay(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);

/* ---- options every model-running command takes (model_opts.c) ---- */

enum {
    CLI_OPT_THREADS = 256,
    CLI_OPT_CTX,
    CLI_OPT_BATCH,
    CLI_OPT_EXPERTS,
    CLI_OPT_CACHE_EXPERTS,
    CLI_OPT_CACHE_MEM,
    CLI_OPT_CACHE_POLICY,
    CLI_OPT_DIRECT_IO,
    CLI_OPT_IO_THREADS,
    CLI_OPT_PREFETCH,
    CLI_OPT_STATS,
    CLI_OPT_ROUTER_HIST,
    CLI_OPT_BACKEND,
    CLI_OPT_GPU_EXPERTS,
    CLI_OPT_GRAPHS,
    CLI_OPT_CUDA_NO_PDL,
    CLI_OPT_CUDA_INT4_FLOAT_ACT,
    CLI_OPT_CUDA_NO_TENSOR_CORES,
    CLI_OPT_INT4_FLOAT_ACT,
    CLI_OPT_ROUTER_TRACE,
    CLI_OPT_ROUTE_REPLAY,
    CLI_OPT_IO_ENGINE,
    CLI_OPT_NO_OVERLAP,
    CLI_OPT_PARTS,
    CLI_OPT_PART_MEM,
    CLI_OPT_GPUS,
    CLI_OPT_COMMAND = 512 /* first code of a command's own options */
};

/* getopt_long entries of the model options, to put in a command's table, and their short
 * letters, to put in its getopt string. */
#define CLI_MODEL_SHORTOPTS "t:c:m:v"
#define CLI_MODEL_LONGOPTS                                                                         \
    {"threads", required_argument, 0, CLI_OPT_THREADS}, {"model", required_argument, 0, 'm'},      \
        {"ctx", required_argument, 0, CLI_OPT_CTX},                                                \
        {"ctx-size", required_argument, 0, CLI_OPT_CTX}, {"verbose", no_argument, 0, 'v'},         \
        {"batch", required_argument, 0, CLI_OPT_BATCH},                                            \
        {"experts", required_argument, 0, CLI_OPT_EXPERTS},                                        \
        {"cache-experts", required_argument, 0, CLI_OPT_CACHE_EXPERTS},                            \
        {"cache-mem", required_argument, 0, CLI_OPT_CACHE_MEM},                                    \
        {"cache-policy", required_argument, 0, CLI_OPT_CACHE_POLICY},                              \
        {"direct-io", no_argument, 0, CLI_OPT_DIRECT_IO},                                          \
        {"io-threads", required_argument, 0, CLI_OPT_IO_THREADS},                                  \
        {"prefetch", required_argument, 0, CLI_OPT_PREFETCH},                                      \
        {"io-engine", required_argument, 0, CLI_OPT_IO_ENGINE},                                    \
        {"no-overlap", no_argument, 0, CLI_OPT_NO_OVERLAP},                                        \
        {"stats", no_argument, 0, CLI_OPT_STATS},                                                  \
        {"router-hist", required_argument, 0, CLI_OPT_ROUTER_HIST},                                \
        {"router-trace", required_argument, 0, CLI_OPT_ROUTER_TRACE},                              \
        {"route-replay", required_argument, 0, CLI_OPT_ROUTE_REPLAY},                              \
        {"backend", required_argument, 0, CLI_OPT_BACKEND},                                        \
        {"gpu-experts", required_argument, 0, CLI_OPT_GPU_EXPERTS},                                \
        {"cuda-graphs", no_argument, 0, CLI_OPT_GRAPHS},                                           \
        {"cuda-no-pdl", no_argument, 0, CLI_OPT_CUDA_NO_PDL},                                      \
        {"cuda-int4-float-act", no_argument, 0, CLI_OPT_CUDA_INT4_FLOAT_ACT},                      \
        {"cuda-no-tensor-cores", no_argument, 0, CLI_OPT_CUDA_NO_TENSOR_CORES},                    \
        {"int4-float-act", no_argument, 0, CLI_OPT_INT4_FLOAT_ACT},                                \
        {"parts", required_argument, 0, CLI_OPT_PARTS},                                            \
        {"part-mem", required_argument, 0, CLI_OPT_PART_MEM},                                      \
        {"gpus", required_argument, 0, CLI_OPT_GPUS}, {                                            \
        "help", no_argument, 0, 'h'                                                                \
    }

#define CLI_MODEL_HELP                                                                             \
    "  -m, --model MODEL      the model directory (instead of the MODEL operand)\n"                \
    "  -t, --threads N        compute threads (default: all cores)\n"                              \
    "  -c, --ctx-size N       KV cache length in tokens (also --ctx)\n"                            \
    "  --batch N              prompt tokens per prefill chunk (default 512; 1 = token by\n"        \
    "                         token through the decode path)\n"                                    \
    "  --experts MODE         mapped (default) | resident | stream (packs, GGUF)\n"                \
    "  --cache-experts N      stream: expert slots per MoE layer\n"                                \
    "  --cache-mem SIZE       stream: slot budget for all layers, e.g. 512M, 4G; auto: the\n"      \
    "                         memory available less the core, KV cache and a page-cache reserve\n" \
    "  --cache-policy P       stream: decay (default: frequency with ageing) | lfu | lru\n"        \
    "  --direct-io            stream: read experts with O_DIRECT (no page cache)\n"                \
    "  --io-threads N         stream: parallel expert reads (default 8)\n"                         \
    "  --io-engine E          stream: auto (default: io_uring with --direct-io where built in)\n"  \
    "                         | uring | threads\n"                                                 \
    "  --no-overlap           stream: read a group's misses before computing any of its experts\n" \
    "  --prefetch N           stream: read each token's N likeliest experts of the next MoE\n"     \
    "                         layer ahead, predicted by its router (default 0: off)\n"             \
    "  --stats                print the full statistics table at the end\n"                        \
    "  -v, --verbose          the load details, the seed and the statistics table\n"               \
    "  --router-hist FILE     write per-layer expert selection counts as JSON\n"                   \
    "  --router-trace FILE    write every token's experts at every MoE layer as a routing\n"       \
    "                         trace ('sluice trace-replay FILE' replays it)\n"                     \
    "  --route-replay FILE    benchmarks: the experts each token picks come from this routing\n"   \
    "                         trace, not the routers (the output is not the model's)\n"            \
    "  --backend B            cpu | cuda (default: cuda when built in and a GPU is present)\n"     \
    "  --gpu-experts N        cuda: expert slots per MoE layer in GPU memory (default: all)\n"     \
    "  --cuda-graphs          cuda: run each decode step as one CUDA graph, replayed while the\n"  \
    "                         steps ask for the same launches (the same results; off by\n"         \
    "                         default: as fast as launches on an H200, BENCHMARKS section 11)\n"   \
    "  --cuda-no-pdl          cuda: launch kernels without programmatic dependent launch (the\n"   \
    "                         same results; decode ~20% slower on an H200)\n"                      \
    "  --cuda-int4-float-act  cuda: int4 products on float activations (the scalar CPU's\n"        \
    "                         formula) instead of activations quantised to int8 (faster)\n"        \
    "  --cuda-no-tensor-cores cuda: prompt products in float32 on the CUDA cores instead of\n"     \
    "                         the tensor cores (the same products summed in another order;\n"      \
    "                         much slower)\n"                                                      \
    "  --int4-float-act       int4 products on float activations on any backend (and int8\n"       \
    "                         ones on the CPU): the exact product of the dequantised weights\n"    \
    "                         (slower; for parity checks)\n"                                       \
    "  --gpus N               split the layers over GPUs 0..N-1 of this host by memory (CUDA),\n"  \
    "                         each with its own expert cache; each token's hidden state crosses\n" \
    "                         each boundary once (peer copies); the same results as one GPU\n"     \
    "  --parts N              the same split into N partitions, each on a backend of its own,\n"   \
    "                         all on one device (testing: N CPU backends, or N CUDA backends\n"    \
    "                         on GPU 0)\n"                                                         \
    "  --part-mem SIZE        with --parts/--gpus: each partition's memory, which the split "      \
    "must\n"                                                                                       \
    "                         fit (--gpus: at most each GPU's free memory less a reserve)\n"       \
    "  -h, --help             this help\n"

typedef struct cli_model_opts {
    sl_model_params mp;
    const char *model;  /* -m/--model, else NULL (the MODEL operand) */
    int64_t ctx, batch; /* 0 = the command's default */
    int stats, verbose;
    int policy_set; /* --cache-policy given (its default is 0) */
    const char *router_hist;
} cli_model_opts;

/* Resets getopt (optind 1, no messages of its own) and checks argv before it reads it: an
 * option of several letters after one dash (llama.cpp's "-ngl 99", which getopt reads as
 * "-n gl") is an unknown option, with a hint for llama.cpp options that sluice spells
 * differently. 0 to go on, 1 when an error was printed. */
int cli_getopt_start(int argc, char **argv, const char *shortopts, const struct option *longopts);
/* Handles option c ('t', 'c', 'm', 'v' or a CLI_OPT_ code): 1 handled, 0 not a model option,
 * -1 error (printed). */
int cli_model_option(int c, const char *arg, cli_model_opts *o);
/* Checks combinations once all options are read; 0 when fine (else printed). Options that do
 * nothing in this combination are warned about. */
int cli_model_opts_check(const cli_model_opts *o);
/* Once the model is loaded and the KV cache has ctx tokens: warns about a context longer than
 * the model's positions and options the backend ignores; with -v, the load details. */
void cli_model_report(const sl_model *m, const cli_model_opts *o, int64_t ctx);
/* End of a run: the statistics (--stats, -v), router histogram and routing trace asked for;
 * 0 or 1. */
int cli_model_finish(sl_model *m, const cli_model_opts *o);

/* Prints "sluice: <msg>" to stderr; returns 1 (the exit status for errors). */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "sluice: warning: <msg>" to stderr: something asked for that does nothing here. */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Commands taking exactly one path: 0 to go on with argv[1], 1 on error (printed),
 * 2 after printing help. what: "one DIR", "one MODEL directory". */
int cli_one_path(int argc, char **argv, const char *help, const char *cmd, const char *what);
/* After getopt: the model, given by -m/--model (opt_model, no operand then) or as the one
 * MODEL operand at argv[optind]; NULL (error printed) when there is none or more than one. */
const char *cli_model_operand(int argc, char **argv, int optind, const char *opt_model);
/* Parses "1,2,3" into a new array; 0 on success. */
int cli_parse_ids(const char *s, int32_t **ids, int32_t *n);
/* Parses a decimal integer in [lo, hi]; 0 on success. */
int cli_parse_int(const char *s, const char *what, int64_t lo, int64_t hi, int64_t *out);
/* Index of s in the NULL-terminated names; prints "invalid WHAT 's' (a, b or c)" and
 * returns -1 otherwise. */
int cli_parse_choice(const char *s, const char *what, const char *const *names);
/* Parses a byte size: "4096", "512K", "1.5G" (powers of 1024); 0 on success. */
int cli_parse_size(const char *s, const char *what, int64_t *out);
/* Loads a model (progress bar on a terminal) or prints the error; NULL on failure. */
sl_model *cli_load_model(const char *dir, sl_model_params *mp);
/* sl_gen_init with the model options of o (su's model, tokenizer, template_name and raw set by
 * the caller), then what cli_load_model and cli_model_report say. 0, or 1 with the error
 * printed; sl_gen_free in both cases. */
int cli_gen_open(sl_gen *g, sl_gen_setup *su, const cli_model_opts *o);
/* Progress callback drawing a bar on stderr when it is a terminal, silent otherwise. */
void cli_progress(void *user, const char *stage, int64_t done, int64_t total);
/* One line: tokens, prefill and decode tokens/s, expert hit rate, bytes read. */
void cli_print_summary(const sl_model *m, FILE *f);
/* The full table of --stats. */
void cli_print_stats(const sl_model *m, FILE *f);

#endif /* SL_CLI_H */
