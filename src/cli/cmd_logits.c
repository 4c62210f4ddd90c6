/*
 * `sluice logits MODEL --ids 1,2,3 --out FILE`: the float32 logits of every prompt position,
 * from one prefill pass (what the parity tests compare with transformers).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ids_opts.h"

static const struct option long_opts[] = {
    {"ids", required_argument, 0, OPT_IDS},
    {"out", required_argument, 0, OPT_OUT},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

static const char logits_help[] =
    "usage: sluice logits MODEL --ids 1,2,3 --out FILE [options]\n"
    "\n"
    "Runs the prompt through the model in one prefill pass and writes the logits\n"
    "of every position: T rows of vocab_size float32 values, little-endian.\n"
    "MODEL is a Hugging Face checkpoint directory, a sluice pack or a GGUF file.\n"
    "\n"
    "  --ids LIST             comma-separated prompt token ids\n"
    "  --out FILE             where to write the T x V logits ('-': standard output,\n"
    "                         which then receives nothing else)\n"
    "  (the context is the prompt, at most the model's max_position_embeddings: --ctx does\n"
    "  nothing here)\n" CLI_MODEL_HELP;

int cli_logits(int argc, char **argv) {
    ids_opts o = {0};
    const char *model;
    int r = ids_parse(argc, argv, logits_help, ":h" CLI_MODEL_SHORTOPTS, long_opts, &o, &model);
    if (r) return r == 2 ? 0 : 1;
    if (!o.out) return cli_error("missing --out FILE (see --help)");
    if (o.m.ctx) cli_warn("--ctx does nothing in logits: the context is the --ids");
    int32_t *ids, n, max_position, vocab;
    if (cli_parse_ids(o.ids_str, &ids, &n)) return 1;
    const int known = ids_config_limits(model, &max_position, &vocab);
    if (known && ids_prompt_fits(ids, n, vocab, max_position, 0)) return free(ids), 1;
    sl_model *m = cli_load_model(model, &o.m.mp);
    if (!m) return free(ids), 1;
    sl_model_info info;
    sl_model_get_info(m, &info);
    int rc = 1;
    sl_error err = {0};
    sl_session *s = NULL;
    float *logits = NULL;
    const int to_stdout = !strcmp(o.out, "-");
    FILE *f = NULL;
    sl_session_params sp = {.max_ctx = n, .max_batch = n};
    if (!known && ids_prompt_fits(ids, n, info.vocab_size, info.max_position, 0)) goto done;
    if (sl_session_create(m, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_model_report(m, &o.m, n);
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
    f = to_stdout ? stdout : fopen(o.out, "wb");
    const size_t count = (size_t)n * (size_t)info.vocab_size;
    if (!f || fwrite(logits, sizeof(float), count, f) != count || fflush(f)) {
        cli_error("cannot write %s", to_stdout ? "the logits to standard output" : o.out);
        goto done;
    }
    rc = cli_model_finish(m, &o.m);
done:
    if (f && !to_stdout && fclose(f) && rc == 0) rc = cli_error("cannot write %s", o.out);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
    free(ids);
    return rc;
}
