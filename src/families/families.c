/*
 * The registry: which family runs each config.json model_type. A new family is
 * a file (or a folder) under families/ and one line here.
 */
#include "model/model.h"

extern const sl_family sl_family_qwen3_moe;
extern const sl_family sl_family_qwen2_moe;
extern const sl_family sl_family_qwen3_next;
extern const sl_family sl_family_qwen3_5_moe;
extern const sl_family sl_family_qwen4_exp;
extern const sl_family sl_family_mixtral;
extern const sl_family sl_family_olmoe;
extern const sl_family sl_family_glm4_moe;
extern const sl_family sl_family_qwen3_vl_moe;
extern const sl_family sl_family_gpt_oss;
extern const sl_family sl_family_llama4;
extern const sl_family sl_family_gemma4;
extern const sl_family sl_family_deepseek_v3;

/* Qwen3.5-MoE and Qwen4-Exp each come as a vision-language checkpoint (of which the text
 * model runs) and as a text-only one: two model_types, one family. */
static const struct {
    const char *model_type;
    const sl_family *family;
} families[] = {
    /* clang-format off */
    {"qwen3_moe", &sl_family_qwen3_moe},
    {"qwen2_moe", &sl_family_qwen2_moe},
    {"qwen3_next", &sl_family_qwen3_next},
    {"qwen3_5_moe", &sl_family_qwen3_5_moe},
    {"qwen3_5_moe_text", &sl_family_qwen3_5_moe},
    {"qwen4_exp", &sl_family_qwen4_exp},
    {"qwen4_exp_text", &sl_family_qwen4_exp},
    {"mixtral", &sl_family_mixtral},
    {"olmoe", &sl_family_olmoe},
    {"glm4_moe", &sl_family_glm4_moe},
    {"qwen3_vl_moe", &sl_family_qwen3_vl_moe},
    {"qwen3_vl_moe_text", &sl_family_qwen3_vl_moe},
    {"gpt_oss", &sl_family_gpt_oss},
    {"llama4", &sl_family_llama4},
    {"llama4_text", &sl_family_llama4},
    {"gemma4", &sl_family_gemma4},
    {"gemma4_text", &sl_family_gemma4},
    {"deepseek_v3", &sl_family_deepseek_v3},
    {"kimi_k2", &sl_family_deepseek_v3}, /* Kimi-K2's remote code: DeepSeek-V3's architecture */
    /* clang-format on */
};

const sl_family *sl_family_find(const char *arch) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].model_type, arch) == 0) return families[i].family;
    return NULL;
}

const char *sl_family_names(void) {
    return "qwen3_moe, qwen2_moe, qwen3_next, qwen3_5_moe, qwen4_exp, gpt_oss, gemma4, mixtral, "
           "olmoe, glm4_moe, qwen3_vl_moe, deepseek_v3 (kimi_k2), llama4";
}
