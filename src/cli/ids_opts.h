/*
 * What the token-id commands, `logits` (one prefill pass) and `generate` (greedy decode),
 * share: their options (--ids, and the model options) and the check that a prompt can run.
 */
#ifndef SL_CLI_IDS_OPTS_H
#define SL_CLI_IDS_OPTS_H

#include "cli/cli.h"

typedef struct ids_opts {
    const char *ids_str, *out;
    int64_t n_new;
    int sampling; /* --seed or --repeat-last-n given: generate is greedy, they do nothing */
    cli_model_opts m;
} ids_opts;

/* The commands' own option codes. */
enum {
    OPT_IDS = CLI_OPT_COMMAND,
    OPT_OUT,
    OPT_N_PREDICT,
    OPT_SEED,
    OPT_REPEAT_LAST_N,
    OPT_IGNORE_EOS
};

/* Reads argv into o and *model (shortopts and opts: the command's). 0 to go on, 1 on error
 * (printed), 2 after printing help. */
int ids_parse(int argc, char **argv, const char *help, const char *shortopts,
              const struct option *opts, ids_opts *o, const char **model);
/* The model's positions and vocabulary from its config alone (config.json, or the "config" of
 * a pack's manifest.json), read before any weight: a prompt that cannot run is refused at once,
 * not after a load that may read gigabytes (--experts resident) nor after minutes of prefill
 * (60,000 ids on a 512-position model ran past two minutes). 1 when known; 0 when the config
 * cannot be read here, and then the load that follows says why and the check runs after it. */
int ids_config_limits(const char *dir, int32_t *max_position, int32_t *vocab);
/* 0 when the prompt can run: every id in the vocabulary and at most `room` of them, the
 * context (--ctx) when ctx_given, else the model's positions. Else 1, with one line giving
 * both numbers. Ids past the positions have no meaning to the model (no position was trained
 * there), so logits never go past them; generate does with an explicit --ctx, as run does,
 * after cli_model_report's warning. */
int ids_prompt_fits(const int32_t *ids, int32_t n, int32_t vocab, int64_t room, int ctx_given);

#endif /* SL_CLI_IDS_OPTS_H */
