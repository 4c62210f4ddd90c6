/*
 * `sluice serve MODEL`: the OpenAI-compatible HTTP server (src/server/). This
 * file reads the options, loads the model, and waits for SIGTERM or SIGINT to
 * stop gracefully. It is the one place in src/cli/ that calls the server
 * (server/server.h); the server itself sits on the library, not on the CLI.
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <string.h>

#include "cli/cli.h"
#include "server/server.h"

enum {
    OPT_HOST = CLI_OPT_COMMAND,
    OPT_PORT,
    OPT_API_KEY,
    OPT_API_KEY_FILE,
    OPT_CORS,
    OPT_PARALLEL,
    OPT_PREFILL_CHUNK,
    OPT_QUEUE,
    OPT_QUEUE_TIMEOUT,
    OPT_TIMEOUT,
    OPT_IDLE_TIMEOUT,
    OPT_HEADER_TIMEOUT,
    OPT_MAX_CONNS,
    OPT_MAX_CONNS_PER_IP,
    OPT_SHUTDOWN_TIMEOUT,
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
    {"api-key-file", required_argument, 0, OPT_API_KEY_FILE},
    {"cors", required_argument, 0, OPT_CORS},
    {"parallel", required_argument, 0, OPT_PARALLEL},
    {"prefill-chunk", required_argument, 0, OPT_PREFILL_CHUNK},
    {"queue", required_argument, 0, OPT_QUEUE},
    {"queue-timeout", required_argument, 0, OPT_QUEUE_TIMEOUT},
    {"timeout", required_argument, 0, OPT_TIMEOUT},
    {"idle-timeout", required_argument, 0, OPT_IDLE_TIMEOUT},
    {"header-timeout", required_argument, 0, OPT_HEADER_TIMEOUT},
    {"max-connections", required_argument, 0, OPT_MAX_CONNS},
    {"max-connections-per-ip", required_argument, 0, OPT_MAX_CONNS_PER_IP},
    {"shutdown-timeout", required_argument, 0, OPT_SHUTDOWN_TIMEOUT},
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
    "  POST /v1/chat/completions, POST /v1/completions (streaming or not; logprobs,\n"
    "  logit_bias, tools with ChatML templates, completions echo, response_format\n"
    "  json_object and json_schema), POST /tokenize, POST /detokenize, GET /v1/models\n"
    "  (with the context length), GET /health, GET /metrics (Prometheus); and\n"
    "  Anthropic's POST /v1/messages (tools too), POST /v1/messages/count_tokens.\n"
    "Up to --parallel requests generate together (continuous batching: a decode step\n"
    "runs a token of every reply at once, its expert reads shared); more wait in a\n"
    "FIFO queue. SIGTERM or\n"
    "SIGINT stops accepting requests and finishes those in flight (see\n"
    "--shutdown-timeout); a second signal ends the process at once.\n"
    "\n"
    "Access:\n"
    "  --host ADDR            address to listen on (default 127.0.0.1). On a loopback\n"
    "                         address only requests to localhost, 127.0.0.1, [::1] or\n"
    "                         ADDR are answered (403 otherwise: DNS rebinding); any\n"
    "                         other ADDR opens the server to every name, and warns\n"
    "                         when no API key is set\n"
    "  --port N               port (default 8080; 0 = any free port, printed at start)\n"
    "  --api-key-file FILE    require 'Authorization: Bearer KEY' on /v1/ routes, KEY\n"
    "                         being FILE's first line (an empty one is refused)\n"
    "  --api-key KEY          the same with KEY itself (other users can see it in ps:\n"
    "                         prefer --api-key-file or $SLUICE_API_KEY)\n"
    "                         (default: $SLUICE_API_KEY if set, else none; set but\n"
    "                         empty is refused)\n"
    "  --cors ORIGIN          let web pages of ORIGIN (e.g. http://localhost:3000) read\n"
    "                         responses and send preflights; repeatable; '*' = any\n"
    "                         origin (default: none, no CORS headers, OPTIONS is a 405)\n"
    "\n"
    "Load and time limits:\n"
    "  --parallel N           requests generating at once (default 4, at most 256),\n"
    "                         each on a KV cache of its own (-c tokens): memory grows\n"
    "                         with N; a request's reply is the same whatever the others\n"
    "  --prefill-chunk N      prompt tokens a step runs while other replies decode\n"
    "                         (default 128): a long prompt delays their next tokens by\n"
    "                         one chunk at most\n"
    "  --queue N              more requests that wait for one of those places (default\n"
    "                         64); past that a request gets 503 at once\n"
    "  --queue-timeout SEC    a waiting request that gets no place this long: 503\n"
    "                         (default 120)\n"
    "  (-c/--ctx-size N below: default min(model's maximum, 8192); longer prompts get\n"
    "  400, a reply that reaches the end of the context ends with finish_reason 'length')\n"
    "  --timeout SEC          longest time a request may take, queue included (default\n"
    "                         600); generation then stops with finish_reason 'length'\n"
    "  --header-timeout SEC   a request (headers, then body) must arrive within SEC of\n"
    "                         its connection's opening or its first line (default 10);\n"
    "                         slower connections are closed\n"
    "  --idle-timeout SEC     close connections idle this long (default 60)\n"
    "  --max-connections N    open connections at once, more wait to be accepted\n"
    "                         (default: parallel + queue + 64)\n"
    "  --max-connections-per-ip N\n"
    "                         open connections from one address, more are refused\n"
    "                         (default 64)\n"
    "  --shutdown-timeout SEC on SIGTERM/SIGINT, how long requests in flight get to\n"
    "                         finish before they are cancelled (default 10); the\n"
    "                         process exits at most 3 s later, even with the model\n"
    "                         stuck in a read\n"
    "  --max-body SIZE        largest request body (default 8M); larger gets 413\n"
    "\n"
    "Model and output:\n"
    "  --model-name NAME      the model id in /v1/models and responses (default: the\n"
    "                         MODEL directory's name)\n"
    "  --tokenizer PATH       tokenizer.json (default: the one in MODEL)\n"
    "  --chat-template NAME   chatml | chatml-think | qwen3-coder | harmony | gemma4 | gemma |\n"
    "                         deepseek | llama4 | mistral | tulu | raw (default: from the model)\n"
    "  --think, --no-think    default of chat_template_kwargs.enable_thinking (on)\n"
    "  --quiet                no line per request on stderr\n" CLI_MODEL_HELP;

static int parse_seconds(const char *s, const char *what, int32_t *out) {
    int64_t v;
    if (cli_parse_int(s, what, 1, 86400, &v)) return 1;
    *out = (int32_t)v;
    return 0;
}

static int parse_count(const char *s, const char *what, int64_t lo, int32_t *out) {
    int64_t v;
    if (cli_parse_int(s, what, lo, 65536, &v)) return 1;
    *out = (int32_t)v;
    return 0;
}

/* The first line of path, without its line end and trailing blanks, into *key (malloc'ed).
 * 0, or 1 with the error printed: unreadable, or an empty first line (which would otherwise
 * turn on authentication that any empty bearer passes). */
static int read_key_file(const char *path, char **key) {
    FILE *f = fopen(path, "r");
    if (!f) return cli_error("--api-key-file %s: %s", path, strerror(errno));
    char line[4096];
    const int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    size_t n = got ? strcspn(line, "\r\n") : 0;
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t'))
        n--;
    line[n] = '\0';
    if (!n) return cli_error("--api-key-file %s: the first line is empty (no key)", path);
    if (!(*key = strdup(line))) return cli_error("out of memory");
    return 0;
}

int cli_serve(int argc, char **argv) {
    srv_params cfg = {.host = "127.0.0.1",
                      .port = 8080,
                      .parallel = 4,
                      .prefill_chunk = 128,
                      .queue = 64,
                      .queue_timeout_s = 120,
                      .max_body = 8 << 20,
                      .timeout_s = 600,
                      .idle_timeout_s = 60,
                      .header_timeout_s = 10,
                      .max_conns_per_ip = 64,
                      .shutdown_timeout_s = 10,
                      .think = 1,
                      .log = 1};
    cli_model_opts mo = {0};
    const char *tokenizer = NULL, *template_name = NULL, *key_file = NULL;
    char *key = NULL; /* --api-key's copy (its argv bytes are blanked) or --api-key-file's */
    const char *cors[16];
    int32_t n_cors = 0;
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
            free(key);
            if (!(key = strdup(optarg))) return cli_error("out of memory");
            /* Out of /proc/PID/cmdline (ps) from now on; it was visible until here, hence
             * --api-key-file. */
            memset(optarg, 'x', strlen(optarg));
            key_file = NULL;
            break;
        case OPT_API_KEY_FILE:
            free(key);
            key = NULL;
            key_file = optarg;
            break;
        case OPT_CORS:
            if (!*optarg)
                return cli_error("--cors needs an origin (e.g. http://localhost:3000) or '*'");
            if (n_cors == (int32_t)(sizeof cors / sizeof cors[0]))
                return cli_error("--cors: at most %zu origins", sizeof cors / sizeof cors[0]);
            cors[n_cors++] = optarg;
            break;
        case OPT_PARALLEL:
            if (cli_parse_int(optarg, "--parallel", 1, SRV_MAX_PARALLEL, &v)) return 1;
            cfg.parallel = (int32_t)v;
            break;
        case OPT_PREFILL_CHUNK:
            if (cli_parse_int(optarg, "--prefill-chunk", 1, 1 << 20, &v)) return 1;
            cfg.prefill_chunk = (int32_t)v;
            break;
        case OPT_QUEUE:
            if (parse_count(optarg, "--queue", 0, &cfg.queue)) return 1;
            break;
        case OPT_QUEUE_TIMEOUT:
            if (parse_seconds(optarg, "--queue-timeout", &cfg.queue_timeout_s)) return 1;
            break;
        case OPT_HEADER_TIMEOUT:
            if (parse_seconds(optarg, "--header-timeout", &cfg.header_timeout_s)) return 1;
            break;
        case OPT_MAX_CONNS:
            if (parse_count(optarg, "--max-connections", 1, &cfg.max_conns)) return 1;
            break;
        case OPT_MAX_CONNS_PER_IP:
            if (parse_count(optarg, "--max-connections-per-ip", 1, &cfg.max_conns_per_ip)) return 1;
            break;
        case OPT_SHUTDOWN_TIMEOUT:
            if (parse_seconds(optarg, "--shutdown-timeout", &cfg.shutdown_timeout_s)) return 1;
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
    if (!model || cli_model_opts_check(&mo)) return free(key), 1;
    /* The key: --api-key or --api-key-file, else the environment. An empty key would turn
     * on authentication that an empty bearer passes: refused rather than guessed at. */
    if (key_file && read_key_file(key_file, &key)) return 1;
    const char *env_key = getenv("SLUICE_API_KEY");
    if (!key && env_key && !*env_key)
        return cli_error("SLUICE_API_KEY is set but empty: set a key, or unset it to serve "
                         "without one");
    cfg.api_key = key ? key : env_key;
    cfg.cors = cors;
    cfg.n_cors = n_cors;
    if (!cfg.max_conns) cfg.max_conns = cfg.parallel + cfg.queue + 64;
    char name[256];
    snprintf(name, sizeof name, "%s", model);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/')
        name[--n] = '\0';
    if (!cfg.model_id) cfg.model_id = basename(name);

    sl_gen g = {0};
    sl_gen_setup su = {.model = model, .tokenizer = tokenizer, .template_name = template_name};
    if (cli_gen_open(&g, &su, &mo)) {
        sl_gen_free(&g);
        free(key);
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
    sl_error err = {0};
    int rc = srv_start(&s, &g, &cfg, &err) ? cli_error("%s", err.msg) : 0;
    if (!rc) {
        fprintf(stderr,
                "sluice serve: %s (%s), context %d tokens, %d requests at once (each its own KV "
                "cache) and %d waiting%s\n"
                "sluice serve: listening on http://%s%s%s:%d\n",
                cfg.model_id, g.info.arch, sl_session_max_ctx(g.seq.s), cfg.parallel, cfg.queue,
                cfg.api_key ? ", API key required" : "", strchr(cfg.host, ':') ? "[" : "", cfg.host,
                strchr(cfg.host, ':') ? "]" : "", srv_port(s));
        int sig = 0;
        sigwait(&stop, &sig);
        /* A second signal ends the process at once (their default action). */
        pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
        fprintf(stderr, "sluice serve: %s, finishing the requests in flight\n",
                sig == SIGTERM ? "SIGTERM" : "SIGINT");
        if (srv_shutdown(s)) {
            /* The worker (or a request's thread) still runs and uses g and s: free nothing,
             * and let the process end take them. */
            fprintf(stderr, "sluice serve: stopped (forced)\n");
            return 1;
        }
        cli_print_summary(g.m, stderr);
        int64_t steps, rows;
        srv_batch_stats(s, &steps, &rows);
        if (steps)
            fprintf(stderr, "sluice serve: %lld decode steps, %.2f replies a step on average\n",
                    (long long)steps, (double)rows / (double)steps);
        rc = cli_model_finish(g.m, &mo);
        fprintf(stderr, "sluice serve: stopped\n");
    }
    srv_free(s);
    sl_gen_free(&g);
    free(key);
    return rc;
}
