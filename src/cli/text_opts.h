/*
 * What the text commands, `run` (one prompt, streamed reply) and `chat` (an interactive
 * conversation kept in the KV cache), share: their options, and the setup, prompt encoding and
 * streamed reply around the library's generation loop (gen/generate.h).
 */
#ifndef SL_CLI_TEXT_OPTS_H
#define SL_CLI_TEXT_OPTS_H

#include "cli/cli.h"

#define TEXT_MAX_STOPS 8
#define TEXT_MAX_BIAS  256 /* --logit-bias options */

typedef struct text_opts {
    const char *prompt, *file, *system, *tokenizer, *template_name;
    const char *stops[TEXT_MAX_STOPS];
    int n_stops, raw, think, max_tokens, ignore_eos;
    int64_t repeat_last_n;             /* -1: the context's length */
    sl_logit_bias bias[TEXT_MAX_BIAS]; /* --logit-bias, one per id; sp.logit_bias points here */
    int32_t n_bias;
    sl_sampler_params sp;
    int sp_set; /* SET_* bits: sampling options given on the command line */
    cli_model_opts m;
} text_opts;

/* Sampling options given explicitly win over generation_config.json's defaults. */
enum { SET_TEMP = 1, SET_TOP_K = 2, SET_TOP_P = 4, SET_MIN_P = 8, SET_SEED = 16 };

#define TEXT_HELP                                                                                  \
    "  --system TEXT          system message (chat templates; a raw prompt has none)\n"            \
    "  --chat-template NAME   chatml | chatml-think | qwen3-coder | harmony | gemma4 | gemma |\n"  \
    "                         deepseek | llama4 | mistral | tulu | raw (default: from the "        \
    "model)\n"                                                                                     \
    "  --think, --no-think    the thinking switch of models that have one (default: on)\n"         \
    "                         (harmony's reasoning, its analysis channel, goes to stderr)\n"       \
    "  --tokenizer PATH       tokenizer.json (default: the one in MODEL)\n"                        \
    "  -n, --max-tokens N     most tokens per reply (also --n-predict; -1: until the\n"            \
    "                         context is full)\n"                                                  \
    "  --ignore-eos           go on past the end-of-turn and EOS ids\n"                            \
    "  --temp T               temperature; 0 = greedy (default: generation_config.json, else 0)\n" \
    "  --top-k K, --top-p P, --min-p P          filters (defaults as --temp)\n"                    \
    "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F\n"                          \
    "                         penalties of the tokens in the last --repeat-last-n\n"               \
    "  --repeat-last-n N      the penalties' window (default 64; 0 = off, -1 = the context)\n"     \
    "  -s, --seed N           random seed (default: a random one, shown by --stats and -v;\n"      \
    "                         the same seed and options repeat a run)\n"                           \
    "  --stop TEXT            stop when the reply contains TEXT (repeatable)\n"                    \
    "  --logit-bias ID=BIAS   add BIAS (-100 to 100) to token ID's logit after the penalties\n"    \
    "                         (repeatable; +100 forces the token, -100 bans it)\n"                 \
    "  (-c/--ctx-size defaults to the model's maximum, at most 8192)\n"

/* Reads argv into o and *model. 0 to go on, 1 error (printed), 2 help printed. need_prompt: run
 * (1: -p or -f) or chat (0). */
int text_parse(int argc, char **argv, const char *help, int need_prompt, text_opts *o,
               const char **model);

/* Everything a text command holds. */
typedef struct text_ctx {
    text_opts *o;
    const char *model;
    sl_gen g;
    sl_token_ids ids;
} text_ctx;

/* Loads what the command needs (cli_gen_open) and its sampler: sampling options given on the
 * command line win over generation_config.json's. 0 or 1 (printed); text_free in both cases. */
int text_init(text_ctx *t, text_opts *o, const char *model);
void text_free(text_ctx *t);
/* The end of a text command: the statistics line, the seed and the table when asked for, the
 * router histogram. 0 or 1. */
int text_finish(text_ctx *t);
/* Renders msgs with the chat template and tokenizes them into t->ids. 0 or 1 (printed). */
int text_encode(text_ctx *t, const sl_chat_msg *msgs, int32_t n);
/* Runs t->ids after the ids in the KV cache that they start with (they fit the context), then
 * streams a reply to out; Ctrl-C (SIGINT) stops the reply. 0 or 1 (error printed). */
int text_reply(text_ctx *t, FILE *out, sl_gen_result *res);
/* The last reply was stopped by Ctrl-C. */
int text_interrupted(void);

#endif /* SL_CLI_TEXT_OPTS_H */
