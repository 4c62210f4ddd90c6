/* The options and checks `logits` and `generate` share (see ids_opts.h). */
#include <getopt.h>
#include <stdio.h>

#include "cli/ids_opts.h"

int ids_parse(int argc, char **argv, const char *help, const char *shortopts,
              const struct option *opts, ids_opts *o, const char **model) {
    int c, r;
    int64_t v;
    if (cli_getopt_start(argc, argv, shortopts, opts)) return 1;
    while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        if ((r = cli_model_option(c, optarg, &o->m))) {
            if (r < 0) return 1;
            continue;
        }
        switch (c) {
        case 'h': fputs(help, stdout); return 2;
        case OPT_IDS: o->ids_str = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, "-n", 0, 1 << 24, &o->n_new)) return 1;
            break;
        case 's':
            if (cli_parse_int(optarg, "--seed", 0, INT64_MAX, &v)) return 1;
            o->sampling = 1;
            break;
        case OPT_REPEAT_LAST_N:
            if (cli_parse_int(optarg, "--repeat-last-n", -1, INT32_MAX, &v)) return 1;
            o->sampling = 1;
            break;
        case OPT_IGNORE_EOS: break; /* generate never stops at EOS */
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (!(*model = cli_model_operand(argc, argv, optind, o->m.model))) return 1;
    if (!o->ids_str) return cli_error("missing --ids (see --help)");
    if (o->sampling) cli_warn("generate is greedy (argmax): --seed and --repeat-last-n do nothing");
    return cli_model_opts_check(&o->m) ? 1 : 0;
}

int ids_config_limits(const char *dir, int32_t *max_position, int32_t *vocab) {
    sl_error err = {0};
    return sl_model_peek(dir, max_position, vocab, &err) == SL_OK;
}

int ids_prompt_fits(const int32_t *ids, int32_t n, int32_t vocab, int64_t room, int ctx_given) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= vocab) /* the wording of sl_session_forward, which checks it too */
            return cli_error("token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i,
                             vocab);
    if (n <= room) return 0;
    if (ctx_given)
        return cli_error("the prompt (%d ids) is longer than the context of %lld tokens (--ctx)", n,
                         (long long)room);
    return cli_error("the prompt (%d ids) is longer than the model's %lld positions "
                     "(max_position_embeddings)",
                     n, (long long)room);
}
