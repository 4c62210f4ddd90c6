/* sluice: the command-line entry point. Each command is one file, cmd_NAME.c (tokenize and
 * detokenize share cmd_tokenize.c); the helpers they share are in common.c, model_opts.c
 * (the model options), text_opts.c (run, chat) and ids_opts.c (logits, generate). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char usage[] =
    "usage: sluice <command> [options]\n"
    "\n"
    "Runs Mixture-of-Experts language models from Hugging Face checkpoints and GGUF files.\n"
    "\n"
    "commands:\n"
    "  run MODEL -p TEXT                     stream the reply to a prompt\n"
    "  chat MODEL                            interactive conversation in the terminal\n"
    "  serve MODEL [--port N]                OpenAI-compatible HTTP server\n"
    "  logits MODEL --ids 1,2,3 --out FILE   float32 logits of every prompt position\n"
    "  generate MODEL --ids 1,2,3 -n N       greedy continuation through the KV cache\n"
    "  pack SRC OUT --quant int8|int4|bf16   convert a checkpoint to the streaming format\n"
    "  verify DIR                            check a pack's sizes and SHA-256 hashes\n"
    "  inspect MODEL                         architecture, sizes, quantisation, template\n"
    "  perplexity MODEL -f TEXT              perplexity, and KL divergence from a base run\n"
    "  trace-replay TRACE                    expert-cache policies against the optimum\n"
    "  tokenize TOKENIZER --jsonl FILE       token ids of JSON-string lines\n"
    "  detokenize TOKENIZER --ids 1,2,3      the text of token ids\n"
    "\n"
    "MODEL is a Hugging Face checkpoint directory (config.json, *.safetensors),\n"
    "a directory made by 'sluice pack', or a GGUF file (the first of a split set).\n"
    "'sluice <command> --help' describes each command's options.\n";

/* The commands, in the order of the usage above. */
static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} commands[] = {
    {"run", cli_run},
    {"chat", cli_chat},
    {"serve", cli_serve},
    {"logits", cli_logits},
    {"generate", cli_generate},
    {"pack", cli_pack},
    {"verify", cli_verify},
    {"inspect", cli_inspect},
    {"perplexity", cli_perplexity},
    {"trace-replay", cli_trace_replay},
    {"tokenize", cli_tokenize},
    {"detokenize", cli_detokenize},
};

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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (try 'sluice --help')", cmd);
    return 1;
}
