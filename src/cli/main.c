/* sluice: command-line entry point and the helpers every subcommand shares. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char usage[] =
    "usage: sluice <command> [options]\n"
    "\n"
    "Runs Mixture-of-Experts language models from Hugging Face checkpoints.\n"
    "\n"
    "commands:\n"
    "  logits MODEL --ids 1,2,3 --out FILE   float32 logits of every prompt position\n"
    "  generate MODEL --ids 1,2,3 -n N       greedy continuation through the KV cache\n"
    "\n"
    "MODEL is a directory holding config.json and *.safetensors.\n"
    "'sluice <command> --help' describes each command's options.\n";

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sluice: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
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

sl_model *cli_load_model(const char *dir, int32_t n_threads) {
    sl_error err = {0};
    sl_model *m = NULL;
    sl_model_params mp = {.n_threads = n_threads};
    if (sl_model_load(dir, &mp, &m, &err) != SL_OK) {
        cli_error("%s", err.msg);
        return NULL;
    }
    return m;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 1;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("sluice %s\n", SL_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "logits")) return cli_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 1, argv + 1);
    cli_error("unknown command '%s' (try 'sluice --help')", cmd);
    return 1;
}
