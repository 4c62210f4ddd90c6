/*
 * `sluice perplexity MODEL -f TEXT`: perplexity over a text, and with --kl-base the KL
 * divergence and top-1 agreement of this model's predictions against a base run's (what a
 * quantisation costs), as llama.cpp's perplexity tool reports them (gen/perplexity.h).
 *
 * The base file: "SLKLBASE", u32 version 1, u32 vocab, u32 ctx, u32 chunks, the chunks' token
 * ids (i32), then per chunk the log-softmax rows of its scored positions (float32,
 * little-endian).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gen/perplexity.h"

enum { OPT_FILE = CLI_OPT_COMMAND, OPT_CHUNKS, OPT_KL_BASE, OPT_KL, OPT_TOKENIZER };

static const struct option long_opts[] = {
    {"file", required_argument, 0, 'f'},
    {"chunks", required_argument, 0, OPT_CHUNKS},
    {"kl-base", required_argument, 0, OPT_KL_BASE},
    {"kl", no_argument, 0, OPT_KL},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

static const char ppl_help[] =
    "usage: sluice perplexity MODEL -f TEXT [options]\n"
    "\n"
    "Perplexity of the model over a text file: the text is cut into chunks of --ctx-size\n"
    "tokens, each run from an empty context, and the second half of each chunk is scored\n"
    "(as llama.cpp's perplexity tool does, so the figures compare). Progress on stderr,\n"
    "the result on stdout.\n"
    "\n"
    "  -f, --file TEXT        the text (UTF-8)\n"
    "  -c, --ctx-size N       tokens per chunk (default 512, at most the model's positions)\n"
    "  --chunks N             score at most the first N chunks\n"
    "  --kl-base FILE         write this run's predictions to FILE (a float run: the base)\n"
    "  --kl                   with --kl-base: read FILE instead and report the KL divergence\n"
    "                         from it, the top-1 agreement and both perplexities\n"
    "  --tokenizer PATH       tokenizer.json (default: the model's)\n" CLI_MODEL_HELP;

typedef struct ppl_opts {
    const char *file, *kl_base, *tokenizer;
    int kl;
    int64_t chunks;
    cli_model_opts m;
} ppl_opts;

static int parse(int argc, char **argv, ppl_opts *o, const char **model) {
    const char *shortopts = ":hf:" CLI_MODEL_SHORTOPTS;
    int c, r;
    if (cli_getopt_start(argc, argv, shortopts, long_opts)) return 1;
    while ((c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
        if ((r = cli_model_option(c, optarg, &o->m))) {
            if (r < 0) return 1;
            continue;
        }
        switch (c) {
        case 'h': fputs(ppl_help, stdout); return 2;
        case 'f': o->file = optarg; break;
        case OPT_CHUNKS:
            if (cli_parse_int(optarg, "--chunks", 1, INT32_MAX, &o->chunks)) return 1;
            break;
        case OPT_KL_BASE: o->kl_base = optarg; break;
        case OPT_KL: o->kl = 1; break;
        case OPT_TOKENIZER: o->tokenizer = optarg; break;
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (!(*model = cli_model_operand(argc, argv, optind, o->m.model))) return 1;
    if (!o->file) return cli_error("missing -f TEXT (see --help)");
    if (o->kl && !o->kl_base) return cli_error("--kl needs --kl-base FILE (see --help)");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

typedef struct kl_header {
    char magic[8];
    uint32_t version, vocab, ctx, chunks;
} kl_header;

int cli_perplexity(int argc, char **argv) {
    ppl_opts o = {0};
    const char *model = NULL;
    int r = parse(argc, argv, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    char *text = NULL;
    size_t len = 0;
    sl_error err = {0};
    if (sl_read_file(o.file, &text, &len, &err)) return cli_error("%s", err.msg);
    int rc = 1;
    sl_gen g = {0};
    sl_token_ids ids = {0};
    float *logits = NULL, *logp = NULL, *base = NULL;
    FILE *kf = NULL;
    const int64_t ctx = o.m.ctx ? o.m.ctx : 512;
    if (ctx < 4) {
        cli_error("--ctx-size %lld is too short to score anything (at least 4)", (long long)ctx);
        goto done;
    }
    sl_gen_setup su = {.model = model, .tokenizer = o.tokenizer, .raw = 1, .max_ctx = (int32_t)ctx};
    if (cli_gen_open(&g, &su, &o.m)) goto done;
    if (sl_tokenizer_encode(g.tok, text, len, &ids, &err)) {
        cli_error("%s: %s", o.file, err.msg);
        goto done;
    }
    const int32_t V = g.info.vocab_size, first = (int32_t)(ctx / 2);
    const int32_t scored = (int32_t)ctx - 1 - first;
    int64_t chunks = (int64_t)ids.n / ctx;
    if (o.chunks && chunks > o.chunks) chunks = o.chunks;
    if (chunks < 1) {
        cli_error("%s: %zu tokens, fewer than one chunk of %lld (--ctx-size)", o.file, ids.n,
                  (long long)ctx);
        goto done;
    }
    logits = malloc((size_t)ctx * V * sizeof(float));
    logp = o.kl_base ? malloc((size_t)scored * V * sizeof(float)) : NULL;
    if (!logits || (o.kl_base && !logp)) {
        cli_error("out of memory for %lld x %d logits", (long long)ctx, V);
        goto done;
    }
    if (o.kl_base) {
        kl_header h = {{'S', 'L', 'K', 'L', 'B', 'A', 'S', 'E'},
                       1,
                       (uint32_t)V,
                       (uint32_t)ctx,
                       (uint32_t)chunks};
        const size_t n_ids = (size_t)chunks * (size_t)ctx;
        if (!(kf = fopen(o.kl_base, o.kl ? "rb" : "wb"))) {
            cli_error("cannot open %s", o.kl_base);
            goto done;
        }
        if (o.kl) {
            kl_header b;
            int32_t *bid = malloc(n_ids * sizeof(int32_t));
            const int same = bid && fread(&b, sizeof b, 1, kf) == 1 &&
                             memcmp(&b, &h, sizeof h) == 0 &&
                             fread(bid, sizeof(int32_t), n_ids, kf) == n_ids &&
                             memcmp(bid, ids.ids, n_ids * sizeof(int32_t)) == 0;
            free(bid);
            if (!same) {
                cli_error("%s is not a base run of this text with this vocabulary, --ctx-size "
                          "and --chunks (%d, %lld, %lld)",
                          o.kl_base, V, (long long)ctx, (long long)chunks);
                goto done;
            }
            if (!(base = malloc((size_t)scored * V * sizeof(float)))) {
                cli_error("out of memory");
                goto done;
            }
        } else if (fwrite(&h, sizeof h, 1, kf) != 1 ||
                   fwrite(ids.ids, sizeof(int32_t), n_ids, kf) != n_ids) {
            cli_error("cannot write %s", o.kl_base);
            goto done;
        }
    }
    sl_ppl acc = {0};
    for (int64_t c = 0; c < chunks; c++) {
        const int32_t *chunk = ids.ids + c * ctx;
        sl_gen_reset(&g);
        if (sl_session_forward(g.seq.s, chunk, (int32_t)ctx, logits, 1, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        if (base && fread(base, sizeof(float), (size_t)scored * V, kf) != (size_t)scored * V) {
            cli_error("%s: shorter than its header says", o.kl_base);
            goto done;
        }
        sl_ppl_score(&acc, logits + (size_t)first * V, V, chunk + first + 1, scored,
                     o.kl_base && !o.kl ? logp : NULL, base);
        if (o.kl_base && !o.kl &&
            fwrite(logp, sizeof(float), (size_t)scored * V, kf) != (size_t)scored * V) {
            cli_error("cannot write %s", o.kl_base);
            goto done;
        }
        double e;
        fprintf(stderr, "[%lld/%lld] perplexity %.4f\n", (long long)c + 1, (long long)chunks,
                sl_ppl_value(&acc, &e));
    }
    double pe, ke;
    const double ppl = sl_ppl_value(&acc, &pe);
    printf("perplexity     %.4f +/- %.4f (%lld tokens scored in %lld chunks of %lld)\n", ppl, pe,
           (long long)acc.n, (long long)chunks, (long long)ctx);
    if (base) {
        const double kl = sl_ppl_kl(&acc, &ke);
        printf("base           perplexity %.4f; ln(PPL / PPL base) %.5f\n",
               exp(acc.base_nll / (double)acc.n_kl), log(ppl) - acc.base_nll / (double)acc.n_kl);
        printf("KL divergence  %.6f +/- %.6f (mean over tokens, nats)\n", kl, ke);
        printf("same top-1     %.3f%%\n", 100.0 * (double)acc.same_top / (double)acc.n_kl);
    }
    rc = cli_model_finish(g.m, &o.m);
done:
    if (kf && fclose(kf) && !o.kl && rc == 0) rc = cli_error("cannot write %s", o.kl_base);
    free(text), free(logits), free(logp), free(base);
    sl_token_ids_free(&ids);
    sl_gen_free(&g);
    return rc;
}
