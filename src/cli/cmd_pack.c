/* `sluice pack SRC OUT`: a Hugging Face checkpoint or a GGUF file in the streaming format. */
#include <getopt.h>
#include <string.h>

#include "cli/cli.h"

static const char pack_help[] =
    "usage: sluice pack SRC OUT [--quant int8|int4|bf16|keep] [--quant-router] [--force]\n"
    "\n"
    "Converts the Hugging Face checkpoint in SRC (a directory), or the GGUF file SRC,\n"
    "into a sluice pack in OUT: a manifest, core.bin with the resident tensors, and\n"
    "one experts-LLL.bin per MoE layer with every routed expert as one 4 KiB-aligned\n"
    "blob (docs/FORMAT.md). Works tensor by tensor, so models larger than memory pack\n"
    "fine. OUT is created, or must be empty; it can never be SRC, lie inside SRC or\n"
    "contain it. A GGUF keeps its types (Q4_K, Q6_K, ...: bytes copied, never\n"
    "quantised twice); its tokenizer, chat template and generation config become\n"
    "the pack's tokenizer.json, chat_template.jinja and generation_config.json.\n"
    "\n"
    "  --quant Q         int8 (default for a checkpoint), int4 (group-64 affine, BF16\n"
    "                    scale and bias), bf16 (no quantisation), or keep (every\n"
    "                    tensor as it is: the default for a GGUF, the only choice for\n"
    "                    one whose weights are already quantised)\n"
    "  --quant-router    quantise the router too (default: keep it BF16)\n"
    "  --force           write into an OUT that is not empty, replacing the pack's files\n"
    "  -h, --help        this help\n";

int cli_pack(int argc, char **argv) {
    static const struct option opts[] = {{"quant", required_argument, 0, 'q'},
                                         {"quant-router", no_argument, 0, 'r'},
                                         {"force", no_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    sl_pack_params p = {.quant = SL_QUANT_AUTO, .progress = cli_progress};
    if (cli_getopt_start(argc, argv, ":h", opts)) return 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(pack_help, stdout); return 0;
        case 'r': p.quant_router = 1; break;
        case 'f': p.force = 1; break;
        case 'q': {
            static const char *const quants[] = {"bf16", "int8", "int4", "keep",
                                                 NULL}; /* sl_quant */
            int q = cli_parse_choice(optarg, "--quant", quants);
            if (q < 0) return 1;
            p.quant = (sl_quant)q;
            break;
        }
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (argc - optind != 2)
        return cli_error("pack needs SRC and OUT: a checkpoint or GGUF file, and a directory");
    sl_error err = {0};
    if (sl_pack(argv[optind], argv[optind + 1], &p, &err)) return cli_error("%s", err.msg);
    fprintf(stderr, "packed %s -> %s\n", argv[optind], argv[optind + 1]);
    return 0;
}
