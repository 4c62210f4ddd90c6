/*
 * The pipeline split (issue 31): a model's layers over N partitions (the GPUs of one host, or
 * logical partitions on one device for tests), each a contiguous range, by memory. Pure: it
 * plans from byte counts and budgets, and knows nothing of backends.
 *
 *   partition:   0                    1                    N - 1
 *   layers:      [embed] 0 .. a-1 | a .. b-1 |  ...  | .. L-1 [norm, head]
 *
 * Each token's hidden state crosses each boundary once, so the split only decides where the
 * boundaries are: the one whose fullest partition (bytes over budget) is least full.
 */
#ifndef SL_SPLIT_H
#define SL_SPLIT_H

#include "core/common.h"

typedef struct sl_split_params {
    int32_t n_layers;
    /* [n_layers] what each layer puts on its partition: its resident weights, its rows of the
     * KV cache (or recurrent state), and its share of the expert cache */
    const int64_t *layer_bytes;
    int64_t first_bytes; /* what partition 0 holds besides its layers: the embedding */
    int64_t last_bytes;  /* ... and the last one: the final norm and the LM head */
    int32_t n_parts;     /* 1 to n_layers */
    /* [n_parts] each partition's memory in bytes, or NULL: no limit, equal shares */
    const int64_t *budget;
} sl_split_params;

/* The partitions' first layers into first[0..n_parts] (first[0] = 0, first[n_parts] =
 * n_layers; partition p runs layers [first[p], first[p + 1]), at least one each), chosen so
 * that the largest share of a budget any partition takes is the least it can be; ties go to the
 * split with the earlier boundaries. Fails, saying by how much, when no split fits the
 * budgets. */
sl_status sl_split_plan(const sl_split_params *p, int32_t *first, sl_error *err);

/* The bytes partition `part` of the plan `first` holds. */
int64_t sl_split_bytes(const sl_split_params *p, const int32_t *first, int32_t part);

#endif /* SL_SPLIT_H */
