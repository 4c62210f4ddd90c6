/* The helpers every command shares: messages, option values, loading, statistics. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

const char *cli_model_operand(int argc, char **argv, int optind, const char *opt_model) {
    if (opt_model && optind < argc) {
        cli_error("unexpected argument '%s' (the model is given with -m/--model)", argv[optind]);
        return NULL;
    }
    if (opt_model) return opt_model;
    if (optind == argc - 1) return argv[optind];
    cli_error(optind >= argc ? "missing MODEL directory (see --help)"
                             : "unexpected argument '%s' (see --help)",
              argv[optind + (optind < argc)]);
    return NULL;
}

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sluice: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

void cli_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sluice: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_one_path(int argc, char **argv, const char *help, const char *cmd, const char *what) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(help, stdout);
        return 2;
    }
    if (argc == 2 && argv[1][0] == '-')
        return cli_error("unknown option '%s' (see --help)", argv[1]);
    if (argc != 2) return cli_error("%s needs %s (see --help)", cmd, what);
    return 0;
}

int cli_parse_int(const char *s, const char *what, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error("invalid %s '%s' (expected an integer in [%lld, %lld])", what, s, (long long)lo,
                  (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, int32_t *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return cli_error("out of memory");
    int32_t count = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return cli_error("invalid --ids '%s' (expected comma-separated token ids)", s);
        }
        v[count++] = (int32_t)x;
        if (!*end) break;
        p = end + 1;
    }
    *ids = v;
    *n = count;
    return 0;
}

int cli_parse_choice(const char *s, const char *what, const char *const *names) {
    char list[256] = "";
    size_t n = 0;
    for (int i = 0; names[i]; i++) {
        if (!strcmp(s, names[i])) return i;
        n += (size_t)snprintf(list + n, sizeof list - SL_CLI_MIN(n, sizeof list), "%s%s",
                              i == 0         ? ""
                              : names[i + 1] ? ", "
                                             : " or ",
                              names[i]);
    }
    cli_error("invalid %s '%s' (%s)", what, s, list);
    return -1;
}

int cli_parse_size(const char *s, const char *what, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (errno || end == s || *end || !(v > 0) || v * mult > 9e18) {
        cli_error("invalid %s '%s' (expected a size such as 512M or 4G)", what, s);
        return -1;
    }
    *out = (int64_t)(v * mult);
    return 0;
}

void cli_progress(void *user, const char *stage, int64_t done, int64_t total) {
    (void)user;
    if (!isatty(STDERR_FILENO) || total <= 0) return;
    const int width = 30;
    int fill = (int)(width * done / total);
    fprintf(stderr, "\r%-14s [%.*s%*s] %3d%%", stage, fill, "##############################",
            width - fill, "", (int)(100 * done / total));
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

/* A pack without checksums loads, but is worth a line. */
static void pack_notice(const sl_model *m, const char *dir) {
    sl_model_info info;
    sl_model_get_info(m, &info);
    if (info.packed && info.pack_version < 2)
        cli_warn("%s: pack format %d has no checksums, so nothing read from it is verified; "
                 "'sluice verify --upgrade %s' adds them",
                 dir, info.pack_version, dir);
}

sl_model *cli_load_model(const char *dir, sl_model_params *mp) {
    sl_error err = {0};
    sl_model *m = NULL;
    mp->progress = cli_progress;
    if (sl_model_load(dir, mp, &m, &err) != SL_OK) {
        cli_error("%s", err.msg);
        return NULL;
    }
    pack_notice(m, dir);
    return m;
}

int cli_gen_open(sl_gen *g, sl_gen_setup *su, const cli_model_opts *mo) {
    sl_error err = {0};
    su->model_params = mo->mp;
    su->model_params.progress = cli_progress;
    su->max_ctx = (int32_t)mo->ctx;
    su->max_batch = (int32_t)mo->batch;
    const sl_status st = sl_gen_init(g, su, &err);
    if (g->m) pack_notice(g->m, su->model); /* loaded, even if what followed failed */
    if (st) return cli_error("%s", err.msg);
    cli_model_report(g->m, mo, sl_session_max_ctx(g->seq.s));
    return 0;
}

static double rate(double n, double t) {
    return t > 0 ? n / t : 0;
}

void cli_print_summary(const sl_model *m, FILE *f) {
    sl_stats s;
    sl_model_get_stats(m, &s);
    fprintf(f,
            "prompt %lld tok, %.2f tok/s | decode %lld tok, %.2f tok/s | experts hit %.1f%%, "
            "read %.1f MB\n",
            (long long)s.prompt_tokens, rate((double)s.prompt_tokens, s.prefill_time),
            (long long)s.gen_tokens, rate((double)s.gen_tokens, s.decode_time),
            s.expert_requests ? 100.0 * (double)s.expert_hits / (double)s.expert_requests : 100.0,
            (double)s.bytes_read / 1e6);
}

void cli_print_stats(const sl_model *m, FILE *f) {
    sl_stats s;
    sl_model_get_stats(m, &s);
    const double total = s.prefill_time + s.decode_time;
    const double other =
        total - s.t_attention - s.t_router - s.t_expert_io - s.t_expert_compute - s.t_ple_io;
    const int64_t dec_bytes = s.bytes_read - s.prefill_bytes_read;
    fprintf(f, "--- sluice statistics ---\n");
    fprintf(f, "prompt tokens        %lld (%.2f tok/s, %.3f s)\n", (long long)s.prompt_tokens,
            rate((double)s.prompt_tokens, s.prefill_time), s.prefill_time);
    fprintf(f, "decode steps         %lld (%.2f tok/s, %.3f s)\n", (long long)s.gen_tokens,
            rate((double)s.gen_tokens, s.decode_time), s.decode_time);
    fprintf(f, "expert requests      %lld, hits %lld (%.1f%%)\n", (long long)s.expert_requests,
            (long long)s.expert_hits,
            s.expert_requests ? 100.0 * (double)s.expert_hits / (double)s.expert_requests : 100.0);
    int64_t oreq, ohits;
    int32_t oslots;
    sl_error oerr = {0};
    if (!sl_model_cache_oracle(m, &oreq, &ohits, &oslots, &oerr) && oreq)
        fprintf(f, "  optimal (Belady)   hits %lld (%.1f%%) with the same %d slots per layer\n",
                (long long)ohits, 100.0 * (double)ohits / (double)oreq, oslots);
    if (s.decode_picks)
        fprintf(f, "  decode repeats     %.1f%% of picks were the previous step's at that layer\n",
                100.0 * (double)s.decode_repeats / (double)s.decode_picks);
    if (s.pred_experts)
        fprintf(f,
                "  pre-gating         %.1f experts predicted a decode step: recall %.1f%%, "
                "precision %.1f%%\n",
                rate((double)s.pred_experts, (double)s.gen_tokens),
                100.0 * (double)s.pred_hits / (double)SL_MAX(s.pred_needed, 1),
                100.0 * (double)s.pred_hits / (double)s.pred_experts);
    /* read_time is the time spent waiting for reads: overlapped reads hide the rest */
    fprintf(f, "expert bytes read    %.1f MB, waited %.3f s for them (%.1f MB/s of waiting)\n",
            (double)s.bytes_read / 1e6, s.read_time, rate((double)s.bytes_read / 1e6, s.read_time));
    fprintf(f, "  per prompt token   %.2f MB\n",
            rate((double)s.prefill_bytes_read / 1e6, (double)s.prompt_tokens));
    fprintf(f, "  per decode step    %.2f MB\n",
            rate((double)dec_bytes / 1e6, (double)s.gen_tokens));
    if (s.prefetch_reads) {
        const double toks = (double)(s.prompt_tokens + s.gen_tokens);
        fprintf(f,
                "prefetched experts   %lld (%.2f per token), used %.1f%%, %.2f MB wasted per "
                "token\n",
                (long long)s.prefetch_reads, rate((double)s.prefetch_reads, toks),
                100.0 * (double)s.prefetch_used / (double)s.prefetch_reads,
                rate((double)(s.prefetch_bytes - s.prefetch_used_bytes) / 1e6, toks));
    }
    if (s.gpu_expert_requests)
        fprintf(
            f, "GPU expert cache     %lld requests, hits %lld (%.1f%%), %.1f MB copied in %.3f s\n",
            (long long)s.gpu_expert_requests, (long long)s.gpu_expert_hits,
            100.0 * (double)s.gpu_expert_hits / (double)s.gpu_expert_requests,
            (double)s.gpu_bytes_copied / 1e6, s.gpu_copy_time);
    if (s.gpu_steps_ahead || s.gpu_steps_rerun)
        fprintf(f, "  ahead of the host  %lld MoE layer steps stood, %lld ran again after a miss\n",
                (long long)s.gpu_steps_ahead, (long long)s.gpu_steps_rerun);
    if (s.graph_steps || s.graph_fallbacks)
        fprintf(f,
                "CUDA graphs          %lld decode steps (%lld replayed as recorded), %lld "
                "dropped\n",
                (long long)s.graph_steps, (long long)s.graph_replays, (long long)s.graph_fallbacks);
    if (s.part_moves)
        fprintf(f, "split                %lld moves between partitions, %.1f KB a token\n",
                (long long)s.part_moves,
                rate((double)s.part_bytes / 1e3, (double)(s.prompt_tokens + s.gen_tokens)));
    if (s.ple_rows)
        fprintf(f, "PLE n-gram rows      %lld, %.2f MB in %.3f s (%.1f KB per token)\n",
                (long long)s.ple_rows, (double)s.ple_bytes / 1e6, s.t_ple_io,
                rate((double)s.ple_bytes / 1e3, (double)(s.prompt_tokens + s.gen_tokens)));
    fprintf(f, "time: attention      %.3f s\n", s.t_attention);
    fprintf(f, "      router         %.3f s\n", s.t_router);
    fprintf(f, "      expert I/O     %.3f s\n", s.t_expert_io);
    fprintf(f, "      expert compute %.3f s\n", s.t_expert_compute);
    if (s.ple_rows) fprintf(f, "      PLE row reads  %.3f s\n", s.t_ple_io);
    fprintf(f, "      other          %.3f s (embedding, norms, dense FFN, head)\n",
            other > 0 ? other : 0);
}
