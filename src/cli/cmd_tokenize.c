/* `tokenize`: ids of JSON-string lines, one JSON array per line (the tokenizer's test contract). */
#include <jansson.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static const char tokenize_help[] =
    "usage: sluice tokenize TOKENIZER --jsonl FILE\n"
    "       sluice tokenize TOKENIZER -p TEXT\n"
    "\n"
    "Encodes text with TOKENIZER (a tokenizer.json, or a model directory holding\n"
    "one) and prints the ids as one JSON array per input, no BOS/EOS added. With\n"
    "--jsonl every line of FILE ('-' for standard input) is a JSON string.\n";

static int print_ids(const sl_tokenizer *tok, const char *text, size_t len, sl_token_ids *ids) {
    sl_error err = {0};
    if (sl_tokenizer_encode(tok, text, len, ids, &err)) return cli_error("%s", err.msg);
    putchar('[');
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? ", %d" : "%d", ids->ids[i]);
    puts("]");
    return 0;
}

int cli_tokenize(int argc, char **argv) {
    const char *path = NULL, *jsonl = NULL, *text = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(tokenize_help, stdout);
            return 0;
        } else if ((!strcmp(argv[i], "--jsonl") || !strcmp(argv[i], "-p")) && i + 1 < argc) {
            *(argv[i][1] == 'p' ? &text : &jsonl) = argv[i + 1];
            i++;
        } else if (argv[i][0] == '-') {
            return cli_error("unknown option or missing value '%s' (see --help)", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_error("unexpected argument '%s' (see --help)", argv[i]);
        }
    }
    if (!path || !jsonl == !text)
        return cli_error("tokenize needs TOKENIZER and one of --jsonl FILE or -p TEXT");
    sl_error err = {0};
    sl_tokenizer *tok = NULL;
    if (sl_tokenizer_load(path, &tok, &err)) return cli_error("%s", err.msg);
    sl_token_ids ids = {0};
    int rc = 0;
    if (text) {
        rc = print_ids(tok, text, strlen(text), &ids);
    } else {
        FILE *f = strcmp(jsonl, "-") ? fopen(jsonl, "r") : stdin;
        if (!f) rc = cli_error("%s: cannot open", jsonl);
        char *line = NULL;
        size_t cap = 0;
        long lineno = 0;
        while (!rc && f && getline(&line, &cap, f) >= 0) {
            lineno++;
            json_error_t je;
            json_t *s = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!json_is_string(s))
                rc = cli_error("%s:%ld: not a JSON string", jsonl, lineno);
            else
                rc = print_ids(tok, json_string_value(s), json_string_length(s), &ids);
            json_decref(s);
        }
        free(line);
        if (f && f != stdin) fclose(f);
    }
    sl_token_ids_free(&ids);
    sl_tokenizer_free(tok);
    return rc;
}
