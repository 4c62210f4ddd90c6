/*
 * The tokenize pair, one command and its inverse sharing their operands and line reading:
 * `tokenize`: ids of JSON-string lines, one JSON array per line (the tokenizer's test contract),
 * optionally with each id's text piece; `detokenize`: the way back, ids to text.
 */
#include <getopt.h>
#include <jansson.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static const char tokenize_help[] =
    "usage: sluice tokenize TOKENIZER --jsonl FILE [--pieces]\n"
    "       sluice tokenize TOKENIZER -p TEXT [--pieces]\n"
    "\n"
    "Encodes text with TOKENIZER (a tokenizer.json, or a model directory holding\n"
    "one) and prints the ids as one JSON array per input, no BOS/EOS added. With\n"
    "--jsonl every line of FILE ('-' for standard input) is a JSON string.\n"
    "\n"
    "  --pieces          print [id, \"piece\"] pairs instead of ids: the text each id\n"
    "                    completes, so the pieces join into the decoded text (an id\n"
    "                    that ends inside a UTF-8 character has the piece \"\", and the\n"
    "                    character goes with the id that completes it)\n"
    "  -h, --help        this help\n";

/* [[id, "piece"], ...] of ids through the streaming detokenizer; 0 or 1 (printed). */
static int print_pieces(const sl_tokenizer *tok, const sl_token_ids *ids) {
    sl_error err = {0};
    sl_detok d;
    sl_detok_init(&d, tok, 0);
    json_t *pairs = json_array();
    const char *text;
    size_t len;
    int rc = pairs ? 0 : cli_error("out of memory");
    for (size_t i = 0; !rc && i < ids->n; i++) {
        if (sl_detok_push(&d, ids->ids[i], &text, &len, &err)) {
            rc = cli_error("%s", err.msg);
            break;
        }
        /* The detokenizer emits whole UTF-8 characters only, so json_stringn accepts it. */
        json_t *pair = json_pack("[i, o]", ids->ids[i], json_stringn(text, len));
        if (!pair || json_array_append_new(pairs, pair)) rc = cli_error("out of memory");
    }
    /* A last character left incomplete (U+FFFD once flushed) belongs to the last id. */
    if (!rc && sl_detok_flush(&d, &text, &len, &err)) rc = cli_error("%s", err.msg);
    if (!rc && len && ids->n) {
        json_t *last = json_array_get(json_array_get(pairs, ids->n - 1), 1);
        const size_t have = json_string_length(last);
        char *joined = malloc(have + len);
        if (!joined) {
            rc = cli_error("out of memory");
        } else {
            memcpy(joined, json_string_value(last), have);
            memcpy(joined + have, text, len);
            json_array_set_new(json_array_get(pairs, ids->n - 1), 1,
                               json_stringn(joined, have + len));
            free(joined);
        }
    }
    char *out = rc ? NULL : json_dumps(pairs, 0);
    if (!rc && !out) rc = cli_error("out of memory");
    if (!rc) puts(out);
    free(out);
    json_decref(pairs);
    sl_detok_free(&d);
    return rc;
}

static int print_ids(const sl_tokenizer *tok, const char *text, size_t len, int pieces,
                     sl_token_ids *ids) {
    sl_error err = {0};
    if (sl_tokenizer_encode(tok, text, len, ids, &err)) return cli_error("%s", err.msg);
    if (pieces) return print_pieces(tok, ids);
    putchar('[');
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? ", %d" : "%d", ids->ids[i]);
    puts("]");
    return 0;
}

/* Calls fn on every line of file ('-': standard input) until it returns non-zero; 0, or the
 * first non-zero return (errors printed). */
static int each_line(const char *file, int (*fn)(void *user, const char *line, long lineno),
                     void *user) {
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!f) return cli_error("%s: cannot open", file);
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (!rc && getline(&line, &cap, f) >= 0)
        rc = fn(user, line, ++lineno);
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

/* The operand TOKENIZER after getopt, and exactly one of the two inputs; 0 or 1 (printed). */
static int tok_operands(int argc, char **argv, const char *in0, const char *in1, const char *usage,
                        const char **path) {
    if (optind >= argc || !in0 == !in1) return cli_error("%s (see --help)", usage);
    if (optind < argc - 1)
        return cli_error("unexpected argument '%s' (see --help)", argv[optind + 1]);
    *path = argv[optind];
    return 0;
}

typedef struct tok_job {
    const sl_tokenizer *tok;
    const char *file;
    int pieces;
    sl_token_ids ids;
} tok_job;

static int tokenize_line(void *user, const char *line, long lineno) {
    tok_job *j = user;
    json_error_t je;
    json_t *s = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    int rc = json_is_string(s) ? print_ids(j->tok, json_string_value(s), json_string_length(s),
                                           j->pieces, &j->ids)
                               : cli_error("%s:%ld: not a JSON string", j->file, lineno);
    json_decref(s);
    return rc;
}

int cli_tokenize(int argc, char **argv) {
    static const struct option opts[] = {{"jsonl", required_argument, 0, 'j'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"pieces", no_argument, 0, 'P'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = NULL, *text = NULL;
    tok_job j = {0};
    if (cli_getopt_start(argc, argv, ":hp:", opts)) return 1;
    int c;
    while ((c = getopt_long(argc, argv, ":hp:", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(tokenize_help, stdout); return 0;
        case 'j': j.file = optarg; break;
        case 'p': text = optarg; break;
        case 'P': j.pieces = 1; break;
        case ':': return cli_error("option '%s' needs a value (see --help)", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (tok_operands(argc, argv, j.file, text,
                     "tokenize needs TOKENIZER and one of --jsonl FILE or -p TEXT", &path))
        return 1;
    sl_error err = {0};
    sl_tokenizer *tok = NULL;
    if (sl_tokenizer_load(path, &tok, &err)) return cli_error("%s", err.msg);
    j.tok = tok;
    int rc = text ? print_ids(tok, text, strlen(text), j.pieces, &j.ids)
                  : each_line(j.file, tokenize_line, &j);
    sl_token_ids_free(&j.ids);
    sl_tokenizer_free(tok);
    return rc;
}

/* ---------------------------------------------------------------- detokenize */

static const char detokenize_help[] =
    "usage: sluice detokenize TOKENIZER --ids 1,2,3\n"
    "       sluice detokenize TOKENIZER --jsonl FILE\n"
    "\n"
    "Decodes token ids with TOKENIZER (a tokenizer.json, or a model directory holding\n"
    "one), special tokens included. With --ids it prints the text and a newline. With\n"
    "--jsonl every line of FILE ('-' for standard input) holds the ids of one text, as\n"
    "a JSON array ([1, 2, 3], what tokenize prints) or comma-separated (1,2,3), and\n"
    "each text is printed as one JSON string per line: the inverse of tokenize --jsonl.\n"
    "An id outside the vocabulary is an error naming it.\n";

/* The ids of one --jsonl line: a JSON array, or comma-separated ids, which are the same
 * array without its brackets. 0, or 1 (printed). */
static int parse_id_line(const char *line, const char *file, long lineno, sl_token_ids *ids) {
    const char *p = line + strspn(line, " \t");
    size_t len = strlen(p);
    while (len && strchr(" \t\r\n", p[len - 1]))
        len--;
    json_t *arr = NULL;
    json_error_t je;
    if (*p == '[') {
        arr = json_loadb(p, len, 0, &je);
    } else {
        char *wrapped = malloc(len + 3);
        if (!wrapped) return cli_error("out of memory");
        wrapped[0] = '[';
        memcpy(wrapped + 1, p, len);
        memcpy(wrapped + 1 + len, "]", 2);
        arr = json_loads(wrapped, 0, &je);
        free(wrapped);
    }
    int rc = json_is_array(arr) ? 0
                                : cli_error("%s:%ld: expected a JSON array of token ids or "
                                            "comma-separated ids",
                                            file, lineno);
    ids->n = 0;
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            rc = cli_error("%s:%ld: item %zu is not a token id", file, lineno, i + 1);
        } else if (ids->n == ids->cap) {
            size_t cap = ids->cap ? 2 * ids->cap : 64;
            int32_t *grown = realloc(ids->ids, cap * sizeof *grown);
            if (!grown) rc = cli_error("out of memory");
            ids->ids = grown ? grown : ids->ids;
            ids->cap = grown ? cap : ids->cap;
        }
        if (!rc) ids->ids[ids->n++] = (int32_t)json_integer_value(v);
    }
    json_decref(arr);
    return rc;
}

typedef struct detok_job {
    const sl_tokenizer *tok;
    const char *file;
    sl_token_ids ids;
} detok_job;

static int detokenize_line(void *user, const char *line, long lineno) {
    detok_job *j = user;
    sl_error err = {0};
    char *text = NULL;
    size_t len = 0;
    if (parse_id_line(line, j->file, lineno, &j->ids)) return 1;
    if (sl_tokenizer_decode(j->tok, j->ids.ids, j->ids.n, 0, &text, &len, &err))
        return cli_error("%s:%ld: %s", j->file, lineno, err.msg);
    /* decode gives valid UTF-8 (U+FFFD for bytes that are not), as JSON needs */
    json_t *s = json_stringn(text, len);
    char *out = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    int rc = out ? (puts(out), 0) : cli_error("out of memory");
    free(out);
    json_decref(s);
    free(text);
    return rc;
}

int cli_detokenize(int argc, char **argv) {
    static const struct option opts[] = {{"jsonl", required_argument, 0, 'j'},
                                         {"ids", required_argument, 0, 'i'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = NULL, *id_list = NULL;
    detok_job j = {0};
    if (cli_getopt_start(argc, argv, ":h", opts)) return 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(detokenize_help, stdout); return 0;
        case 'j': j.file = optarg; break;
        case 'i': id_list = optarg; break;
        case ':': return cli_error("option '%s' needs a value (see --help)", argv[optind - 1]);
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (tok_operands(argc, argv, j.file, id_list,
                     "detokenize needs TOKENIZER and one of --ids 1,2,3 or --jsonl FILE", &path))
        return 1;
    int32_t n = 0;
    if (id_list && cli_parse_ids(id_list, &j.ids.ids, &n)) return 1;
    j.ids.n = j.ids.cap = (size_t)n;
    sl_error err = {0};
    sl_tokenizer *tok = NULL;
    int rc = 0;
    if (sl_tokenizer_load(path, &tok, &err)) {
        rc = cli_error("%s", err.msg);
    } else if (id_list) {
        char *text = NULL;
        size_t len = 0;
        if (sl_tokenizer_decode(tok, j.ids.ids, j.ids.n, 0, &text, &len, &err)) {
            rc = cli_error("--ids: %s", err.msg);
        } else {
            fwrite(text, 1, len, stdout);
            putchar('\n');
        }
        free(text);
    } else {
        j.tok = tok;
        rc = each_line(j.file, detokenize_line, &j);
    }
    sl_token_ids_free(&j.ids);
    sl_tokenizer_free(tok);
    return rc;
}
