/* The command-line tool: one function per subcommand, shared option helpers. */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "sluice.h"

#define SL_CLI_MIN(a, b) ((a) < (b) ? (a) : (b))

int cli_logits(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_pack(int argc, char **argv);
int cli_verify(int argc, char **argv);
int cli_inspect(int argc, char **argv);

/* Prints "sluice: <msg>" to stderr; returns 1 (the exit status for errors). */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses "1,2,3" into a new array; 0 on success. */
int cli_parse_ids(const char *s, int32_t **ids, int32_t *n);
/* Parses a decimal integer in [lo, hi]; 0 on success. */
int cli_parse_int(const char *s, const char *what, int64_t lo, int64_t hi, int64_t *out);
/* Index of s in the NULL-terminated names; prints "invalid WHAT 's' (a, b or c)" and
 * returns -1 otherwise. */
int cli_parse_choice(const char *s, const char *what, const char *const *names);
/* Parses a byte size: "4096", "512K", "1.5G" (powers of 1024); 0 on success. */
int cli_parse_size(const char *s, const char *what, int64_t *out);
/* Loads a model (progress bar on a terminal) or prints the error; NULL on failure. */
sl_model *cli_load_model(const char *dir, sl_model_params *mp);
/* Progress callback drawing a bar on stderr when it is a terminal, silent otherwise. */
void cli_progress(void *user, const char *stage, int64_t done, int64_t total);
/* One line: tokens, prefill and decode tokens/s, expert hit rate, bytes read. */
void cli_print_summary(const sl_model *m, FILE *f);
/* The full table of --stats. */
void cli_print_stats(const sl_model *m, FILE *f);

#endif /* SL_CLI_H */
