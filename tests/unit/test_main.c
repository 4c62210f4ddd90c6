/* Test runner: runs every registered test, or those whose name contains argv[2]. */
#include <math.h>
#include <unistd.h>

#include "test.h"

#include "sluice.h"

/* Filled by the TEST constructors before main; grows as they come (no limit to outgrow). */
static struct test_entry {
    const char *name;
    test_fn fn;
} * tests;
static int n_tests, cap_tests;
int test_failures;
const char *test_fixtures = "tests/fixtures";
static char tmpdir[256];

void test_register(const char *name, test_fn fn) {
    if (n_tests == cap_tests) {
        cap_tests = cap_tests ? 2 * cap_tests : 64;
        tests = realloc(tests, (size_t)cap_tests * sizeof *tests);
        if (!tests) {
            fprintf(stderr, "test_register: out of memory at test %d (%s)\n", n_tests, name);
            abort();
        }
    }
    tests[n_tests].name = name;
    tests[n_tests++].fn = fn;
}

int test_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static void remove_tmpdir(void) {
    if (!tmpdir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

const char *test_tmpdir(void) {
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/sluice-test-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(remove_tmpdir);
    }
    return tmpdir;
}

/* Logits of every prompt position, or NULL (error printed). stats receives the counters. */
double test_rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

float *test_logits(const char *dir, const sl_model_params *mp, const int32_t *ids, int32_t n,
                   int32_t chunk, sl_stats *stats, int32_t *vocab) {
    sl_model *m = NULL;
    sl_session *s = NULL;
    sl_error err = {0};
    float *out = NULL;
    if (sl_model_load(dir, mp, &m, &err)) goto fail;
    sl_model_info info;
    sl_model_get_info(m, &info);
    *vocab = info.vocab_size;
    sl_session_params sp = {.max_ctx = n, .max_batch = chunk};
    out = malloc((size_t)n * (size_t)info.vocab_size * sizeof(float));
    if (sl_session_create(m, &sp, &s, &err) || sl_session_forward(s, ids, n, out, 1, &err))
        goto fail;
    if (stats) sl_model_get_stats(m, stats);
    sl_session_free(s);
    sl_model_free(m);
    return out;
fail:
    fprintf(stderr, "  %s: %s\n", dir, err.msg);
    free(out);
    sl_session_free(s);
    sl_model_free(m);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) test_fixtures = argv[1];
    const char *filter = argc > 2 ? argv[2] : NULL;
    int passed = 0, failed = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        test_failures = 0;
        tests[i].fn();
        printf("%s %s\n", test_failures ? "FAIL" : "ok  ", tests[i].name);
        fflush(stdout);
        if (test_failures)
            failed++;
        else
            passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    free(tests);
    return failed ? 1 : 0;
}
