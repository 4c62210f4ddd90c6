/* The pipeline split's planner (model/split.h): boundaries by memory, budgets, errors. */
#include "test.h"

#include "model/split.h"

/* Plans L layers of the given bytes over n partitions; first[] receives the plan. */
static sl_status plan(const int64_t *bytes, int32_t L, int64_t first_b, int64_t last_b, int32_t n,
                      const int64_t *budget, int32_t *first, sl_error *err) {
    const sl_split_params p = {.n_layers = L,
                               .layer_bytes = bytes,
                               .first_bytes = first_b,
                               .last_bytes = last_b,
                               .n_parts = n,
                               .budget = budget};
    *err = (sl_error){0};
    return sl_split_plan(&p, first, err);
}

TEST(split_equal_layers) {
    const int64_t b[8] = {10, 10, 10, 10, 10, 10, 10, 10};
    int32_t f[9];
    sl_error err;
    CHECK(plan(b, 8, 0, 0, 1, NULL, f, &err) == SL_OK && f[0] == 0 && f[1] == 8);
    CHECK(plan(b, 8, 0, 0, 2, NULL, f, &err) == SL_OK && f[0] == 0 && f[1] == 4 && f[2] == 8);
    CHECK(plan(b, 8, 0, 0, 4, NULL, f, &err) == SL_OK && f[1] == 2 && f[2] == 4 && f[3] == 6 &&
          f[4] == 8);
    /* 3 into 8: the largest partition holds 3 layers, and ties take the earlier boundaries */
    CHECK(plan(b, 8, 0, 0, 3, NULL, f, &err) == SL_OK && f[1] == 2 && f[2] == 5 && f[3] == 8);
    /* one layer each */
    CHECK(plan(b, 8, 0, 0, 8, NULL, f, &err) == SL_OK);
    for (int32_t i = 0; i <= 8; i++)
        CHECK(f[i] == i);
}

TEST(split_embedding_and_head) {
    /* a large embedding on partition 0 and head on the last push layers to the middle */
    const int64_t b[6] = {10, 10, 10, 10, 10, 10};
    int32_t f[4];
    sl_error err;
    CHECK(plan(b, 6, 25, 0, 2, NULL, f, &err) == SL_OK && f[1] == 2); /* 45 | 40 */
    CHECK(plan(b, 6, 0, 25, 2, NULL, f, &err) == SL_OK && f[1] == 4); /* 40 | 45 */
    /* 30 30 40 or 30 40 30: the largest is 40 either way */
    CHECK(plan(b, 6, 20, 20, 3, NULL, f, &err) == SL_OK);
    const sl_split_params p = {
        .n_layers = 6, .layer_bytes = b, .first_bytes = 20, .last_bytes = 20, .n_parts = 3};
    for (int32_t q = 0; q < 3; q++)
        CHECK(sl_split_bytes(&p, f, q) <= 40);
}

TEST(split_uneven_layers_and_budgets) {
    /* dense layers light, MoE layers heavy: balanced by bytes, not by count */
    const int64_t b[6] = {1, 1, 50, 50, 50, 50};
    int32_t f[4];
    sl_error err;
    CHECK(plan(b, 6, 0, 0, 2, NULL, f, &err) == SL_OK && f[1] == 4); /* 102 | 100 */
    /* a budget twice the other's takes twice the bytes */
    const int64_t bud[2] = {200, 100};
    const int64_t e[6] = {10, 10, 10, 10, 10, 10};
    CHECK(plan(e, 6, 0, 0, 2, bud, f, &err) == SL_OK && f[1] == 4);
    const int64_t bud2[2] = {100, 200};
    CHECK(plan(e, 6, 0, 0, 2, bud2, f, &err) == SL_OK && f[1] == 2);
    /* exactly full fits */
    const int64_t tight[3] = {20, 20, 20};
    CHECK(plan(e, 6, 0, 0, 3, tight, f, &err) == SL_OK && f[1] == 2 && f[2] == 4);
    sl_split_params p = {.n_layers = 6, .layer_bytes = e, .n_parts = 3, .budget = tight};
    for (int32_t q = 0; q < 3; q++)
        CHECK(sl_split_bytes(&p, f, q) == 20);
}

TEST(split_errors) {
    const int64_t b[4] = {10, 10, 10, 40};
    int32_t f[6];
    sl_error err;
    CHECK(plan(b, 4, 0, 0, 0, NULL, f, &err) == SL_ERR_ARG && strstr(err.msg, "give 1 to 4"));
    CHECK(plan(b, 4, 0, 0, 5, NULL, f, &err) == SL_ERR_ARG &&
          strstr(err.msg, "5 partitions of a model of 4 layers"));
    const int64_t zero[2] = {100, 0};
    CHECK(plan(b, 4, 0, 0, 2, zero, f, &err) == SL_ERR_ARG && strstr(err.msg, "partition 1"));
    /* 70 bytes in all fit 2 x 40 only if the 40-byte layer is alone: it is */
    const int64_t ok[2] = {40, 40};
    CHECK(plan(b, 4, 0, 0, 2, ok, f, &err) == SL_OK && f[1] == 3);
    /* with a head of 5 it cannot: the last partition needs 45 */
    CHECK(plan(b, 4, 0, 5, 2, ok, f, &err) == SL_ERR_NOMEM &&
          strstr(err.msg, "does not fit in 2 partitions") && strstr(err.msg, "partition 1"));
}
