/* `inspect`: what a model directory holds, without running it. */
#include <string.h>

#include "chat/genconfig.h"
#include "chat/template.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static const char inspect_help[] =
    "usage: sluice inspect MODEL\n"
    "\n"
    "Prints the architecture, sizes, quantisation, chat template and end-of-turn\n"
    "tokens found in MODEL (a Hugging Face directory, a sluice pack or a GGUF file).\n";

/* bytes in the unit its size calls for, so a 7 MB model does not print "0.00 GB". Decimal
 * units, as the statistics lines print MB. buf: 32 bytes; returns buf. */
static const char *size_str(double bytes, char *buf) {
    static const char *const units[] = {"KB", "MB", "GB", "TB"};
    if (bytes < 1e3) {
        snprintf(buf, 32, "%.0f B", bytes);
        return buf;
    }
    int u = 0;
    for (bytes /= 1e3; bytes >= 1e3 && u < 3; u++)
        bytes /= 1e3;
    snprintf(buf, 32, "%.2f %s", bytes, units[u]);
    return buf;
}

int cli_inspect(int argc, char **argv) {
    int r = cli_one_path(argc, argv, inspect_help, "inspect", "one MODEL directory");
    if (r) return r == 2 ? 0 : 1;
    const char *dir = argv[1];
    /* The CPU backend: describing a model needs no GPU, and a CUDA load would upload (and read
     * and check) every expert first. */
    sl_model_params mp = {.n_threads = 1, .backend = SL_BACKEND_CPU};
    sl_model *m = cli_load_model(dir, &mp);
    if (!m) return 1;
    sl_model_info i;
    sl_model_get_info(m, &i);
    sl_error err = {0};
    sl_chat_template t;
    sl_gen_config g;
    if (sl_chat_template_detect(dir, &t, &err) || sl_gen_config_load(dir, &g, &err)) {
        sl_model_free(m);
        return cli_error("%s", err.msg);
    }
    char s1[32], s2[32], s3[32];
    const double active = (double)i.resident_bytes +
                          (double)i.n_moe_layers * i.n_experts_used * (double)i.expert_bytes;
    printf("model          %s (%s)\n", dir, i.source);
    printf("architecture   %s\n", i.arch);
    printf("layers         %d (%d with routed experts)\n", i.n_layers, i.n_moe_layers);
    printf("hidden         %d, %d heads / %d KV heads of %d\n", i.hidden_size, i.n_heads,
           i.n_kv_heads, i.head_dim);
    printf("experts        %d per layer, top-%d, expert size %d%s\n", i.n_experts, i.n_experts_used,
           i.moe_intermediate_size, i.shared_expert ? ", shared expert" : "");
    printf("router         %s\n", i.router ? i.router : "-");
    printf("vocabulary     %d, context %d\n", i.vocab_size, i.max_position);
    if (i.features && i.features[0]) printf("features       %s\n", i.features);
    printf("weights        experts %s; resident core %s; one expert %s; all experts %s\n",
           i.weights, size_str((double)i.resident_bytes, s1), size_str((double)i.expert_bytes, s2),
           size_str((double)i.n_moe_layers * i.n_experts * (double)i.expert_bytes, s3));
    printf("types          %s\n", i.types);
    printf("per token      at most %s read (resident core + %d experts x %d layers)\n",
           size_str(active, s1), i.n_experts_used, i.n_moe_layers);
    printf("backend        %s", i.backend);
    if (i.gpu_expert_slots) printf(", %d expert slots per layer in GPU memory", i.gpu_expert_slots);
    printf("\n");
    if (i.attention) printf("attention      %s\n", i.attention);
    if (i.n_ple_layers)
        printf("PLE            %d layer(s), n-gram tables %s on disk, %d rows per token "
               "and layer\n",
               i.n_ple_layers, size_str((double)i.ple_table_bytes, s1), i.ple_rows_per_token);
    sl_tokenizer *tok = NULL;
    sl_error terr = {0};
    if (sl_tokenizer_load(dir, &tok, &terr) == SL_OK) {
        printf("tokenizer      %s, %d ids (model: %d)\n",
               strcmp(i.source, "GGUF") ? "tokenizer.json" : "from the GGUF metadata",
               sl_tokenizer_vocab_size(tok), i.vocab_size);
        sl_tokenizer_free(tok);
    } else {
        printf("tokenizer      none usable (%s)\n", terr.msg);
    }
    printf("chat template  %s%s%s%s\n", sl_chat_template_kind_name(t.kind),
           t.thinking_switch ? ", thinking switch" : "",
           t.default_system[0] ? ", default system message" : "",
           t.empty_thought ? ", empty thought channel when not thinking" : "");
    printf("end of turn    ");
    for (int32_t k = 0; k < g.n_eos; k++)
        printf("%s%d", k ? ", " : "", g.eos[k]);
    printf("%s\n", g.n_eos                    ? ""
                   : strcmp(i.source, "GGUF") ? "(none in generation_config.json)"
                                              : "(none in the GGUF metadata)");
    sl_model_free(m);
    return 0;
}
