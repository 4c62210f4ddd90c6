/* The command-line tool: one function per subcommand, shared option helpers. */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdint.h>

#include "sluice.h"

int cli_logits(int argc, char **argv);
int cli_generate(int argc, char **argv);

/* Prints "sluice: <msg>" to stderr; returns 1 (the exit status for errors). */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses "1,2,3" into a new array; 0 on success. */
int cli_parse_ids(const char *s, int32_t **ids, int32_t *n);
/* Parses a decimal integer in [lo, hi]; 0 on success. */
int cli_parse_int(const char *s, const char *what, int64_t lo, int64_t hi, int64_t *out);
/* Loads a model or prints the error; NULL on failure. */
sl_model *cli_load_model(const char *dir, int32_t n_threads);

#endif /* SL_CLI_H */
