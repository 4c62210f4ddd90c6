/*
 * `sluice serve MODEL`: the OpenAI-compatible HTTP server (src/server/). This
 * file reads the options, loads the model, and waits for SIGTERM or SIGINT to
 * stop gracefully.
 */
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <string.h>

#include "cli/generate.h"
#include "server/server.h"

enum {
    OPT_HOST = CLI_OPT_COMMAND,
    OPT_PORT,
    OPT_API_KEY,
    OPT_PARALLEL,
    OPT_TIMEOUT,
    OPT_IDLE_TIMEOUT,
    OPT_MAX_BODY,
    OPT_MODEL_NAME,
    OPT_TOKENIZER,
    OPT_TEMPLATE,
    OPT_THINK,
    OPT_NO_THINK,
    OPT_QUIET,
};

static const struct option long_opts[] = {
    {"host", required_argument, 0, OPT_HOST},
    {"port", required_argument, 0, OPT_PORT},
    {"api-key", required_argument, 0, OPT_API_KEY},
    {"parallel", required_argument, 0, OPT_PARALLEL},
    {"timeout", required_argument, 0, OPT_TIMEOUT},
    {"idle-timeout", required_argument, 0, OPT_IDLE_TIMEOUT},
    {"max-body", required_argument, 0, OPT_MAX_BODY},
    {"model-name", required_argument, 0, OPT_MODEL_NAME},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"chat-template", required_argument, 0, OPT_TEMPLATE},
    {"think", no_argument, 0, OPT_THINK},
    {"no-think", no_argument, 0, OPT_NO_THINK},
    {"quiet", no_argument, 0, OPT_QUIET},
    CLI_MODEL_LONGOPTS,
    {0, 0, 0, 0},
};

static const char serve_help[] =
    "usage: sluice serve MODEL [options]\n"
    "\n"
    "Serves the model over an OpenAI-compatible HTTP API:\n"
    "  POST /v1/chat/completions, POST /v1/completions (streaming or not),\n"
    "  GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
    "One request generates at a time; the others wait in a FIFO queue. SIGTERM or\n"
    "SIGINT stops accepting requests and finishes those already admitted.\n"
    "\n"
    "  --host ADDR            address to listen on (default 127.0.0.1)\n"
    "  --port N               port (default 8080; 0 = any free port, printed at start)\n"
    "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/ routes\n"
    "                         (default: $SLUICE_API_KEY if set, else none)\n"
    "  --parallel N           requests admitted at once, running + queued (default 8);\n"
    "                         more get 503\n"
    "  (-c/--ctx-size N below: default min(model's maximum, 8192); longer prompts get\n"
    "  400, a reply that reaches the end of the context ends with finish_reason 'length')\n"
    "  --timeout SEC          longest time a request may take, queue included (default\n"
    "                         600); generation then stops with finish_reason 'length'\n"
    "  --idle-timeout SEC     close connections idle this long (default 60)\n"
    "  --max-body SIZE        largest request body (default 8M); larger gets 413\n"
    "  --model-name NAME      the model id in /v1/models and responses (default: the\n"
    "                         MODEL directory's name)\n"
    "  --tokenizer PATH       tokenizer.json (default: the one in MODEL)\n"
    "  --chat-template NAME   chatml | chatml-think | raw (default: from the model)\n"
    "  --think, --no-think    default of chat_template_kwargs.enable_thinking (on)\n"
    "  --quiet                no line per request on stderr\n" CLI_MODEL_HELP;

static int parse_seconds(const char *s, const char *what, int32_t *out) {
    int64_t v;
    if (cli_parse_int(s, what, 1, 86400, &v)) return 1;
    *out = (int32_t)v;
    return 0;
}

int cli_serve(int argc, char **argv) {
    srv_config cfg = {.host = "127.0.0.1",
                      .port = 8080,
                      .api_key = getenv("SLUICE_API_KEY"),
                      .parallel = 8,
                      .max_body = 8 << 20,
                      .timeout_s = 600,
                      .idle_timeout_s = 60,
                      .think = 1,
                      .log = 1};
    cli_model_opts mo = {0};
    const char *tokenizer = NULL, *template_name = NULL;
    int64_t v;
    int c, r;
    static const char shortopts[] = ":h" CLI_MODEL_SHORTOPTS;
    if (cli_getopt_start(argc, argv, shortopts, long_opts)) return 1;
    while ((c = getopt_long(argc, argv, shortopts, long_opts, NULL)) != -1) {
        if ((r = cli_model_option(c, optarg, &mo))) {
            if (r < 0) return 1;
            continue;
        }
        switch (c) {
        case 'h': fputs(serve_help, stdout); return 0;
        case OPT_HOST: cfg.host = optarg; break;
        case OPT_PORT:
            if (cli_parse_int(optarg, "--port", 0, 65535, &v)) return 1;
            cfg.port = (int32_t)v;
            break;
        case OPT_API_KEY:
            if (!*optarg) return cli_error("--api-key needs a non-empty key");
            cfg.api_key = optarg;
            break;
        case OPT_PARALLEL:
            if (cli_parse_int(optarg, "--parallel", 1, 4096, &v)) return 1;
            cfg.parallel = (int32_t)v;
            break;
        case OPT_TIMEOUT:
            if (parse_seconds(optarg, "--timeout", &cfg.timeout_s)) return 1;
            break;
        case OPT_IDLE_TIMEOUT:
            if (parse_seconds(optarg, "--idle-timeout", &cfg.idle_timeout_s)) return 1;
            break;
        case OPT_MAX_BODY:
            if (cli_parse_size(optarg, "--max-body", &cfg.max_body)) return 1;
            break;
        case OPT_MODEL_NAME: cfg.model_id = optarg; break;
        case OPT_TOKENIZER: tokenizer = optarg; break;
        case OPT_TEMPLATE: template_name = optarg; break;
        case OPT_THINK: cfg.think = 1; break;
        case OPT_NO_THINK: cfg.think = 0; break;
        case OPT_QUIET: cfg.log = 0; break;
        case ':': return cli_error("option '%s' needs a value", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    const char *model = cli_model_operand(argc, argv, optind, mo.model);
    if (!model || cli_model_opts_check(&mo)) return 1;
    char name[256];
    snprintf(name, sizeof name, "%s", model);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/')
        name[--n] = '\0';
    if (!cfg.model_id) cfg.model_id = basename(name);

    cli_gen g = {0};
    cli_gen_setup su = {
        .model = model, .tokenizer = tokenizer, .template_name = template_name, .mo = &mo};
    if (cli_gen_init(&g, &su)) {
        cli_gen_free(&g);
        return 1;
    }
    /* Sampling defaults: generation_config.json, else the OpenAI API's (temperature 1). */
    cfg.sp = sl_sampler_defaults();
    cfg.sp.temperature = g.gen.temperature >= 0 ? g.gen.temperature : 1.0f;
    if (g.gen.top_k >= 0) cfg.sp.top_k = g.gen.top_k;
    if (g.gen.top_p > 0) cfg.sp.top_p = g.gen.top_p;
    if (g.gen.min_p >= 0) cfg.sp.min_p = g.gen.min_p;

    /* Every thread inherits these signals blocked; this one waits for them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv *s = NULL;
    int rc = srv_start(&s, &g, &cfg);
    if (!rc) {
        fprintf(stderr,
                "sluice serve: %s (%s), context %d tokens, %d requests at once%s\n"
                "sluice serve: listening on http://%s:%d\n",
                cfg.model_id, g.info.arch, sl_session_max_ctx(g.s), cfg.parallel,
                cfg.api_key ? ", API key required" : "", cfg.host, srv_port(s));
        int sig = 0;
        sigwait(&stop, &sig);
        fprintf(stderr, "sluice serve: %s, finishing the requests in flight\n",
                sig == SIGTERM ? "SIGTERM" : "SIGINT");
        srv_shutdown(s);
        cli_print_summary(g.m, stderr);
        rc = cli_model_finish(g.m, &mo);
        fprintf(stderr, "sluice serve: stopped\n");
    }
    srv_free(s);
    cli_gen_free(&g);
    return rc;
}
