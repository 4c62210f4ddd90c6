/*
 * A minimal test harness: TEST(name) registers a function; CHECK records a
 * failure with file:line and goes on. The runner prints "N passed, N failed".
 */
#ifndef SL_TEST_H
#define SL_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
extern int test_failures;         /* failures in the running test */
extern const char *test_fixtures; /* tests/fixtures directory */

#define TEST(name)                                                                                 \
    static void name(void);                                                                        \
    __attribute__((constructor)) static void register_##name(void) {                               \
        test_register(#name, name);                                                                \
    }                                                                                              \
    static void name(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);             \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

/* Writes bytes to path; returns 0 on success. */
int test_write_file(const char *path, const void *data, size_t n);
/* Logits of every position of ids[0..n) through one session of max_batch chunk, or
 * NULL (error printed); vocab receives the vocabulary size, stats (if not NULL) the
 * model's counters afterwards. */
struct sl_model_params;
struct sl_stats;
float *test_logits(const char *dir, const struct sl_model_params *mp, const int32_t *ids, int32_t n,
                   int32_t chunk, struct sl_stats *stats, int32_t *vocab);

/* sqrt(sum (a - ref)^2 / sum ref^2) over n values, in double. */
double test_rel_l2(const float *a, const float *ref, size_t n);

/* A fresh temporary directory (removed at exit). */
const char *test_tmpdir(void);

#endif /* SL_TEST_H */
