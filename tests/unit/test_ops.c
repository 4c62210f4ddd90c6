/*
 * The op table (tests/ops/ops_table.c) on the CPU backend at every ISA this processor runs:
 * the scalar reference and each SIMD path against the table's plain references. test_cuda runs
 * the same table on the CUDA backend.
 */
#include "../ops/ops_table.h"
#include "kernels/blocks.h"
#include "kernels/quant.h"
#include "test.h"

TEST(test_ops_table_cpu) {
    for (int isa = SL_ISA_SCALAR; isa <= (int)sl_cpu_best_isa(); isa++) {
        sl_backend be;
        sl_backend_cpu_init(&be, 2, (sl_isa)isa);
        const ops_table_params p = {.q4_int8 = sl_quant_int8_available(&be),
                                    .q8_int8 = sl_quant_int8_available(&be),
                                    .block_types = 1,
                                    .block_int8 = sl_blocks_int8_on(&be)};
        const int failed = ops_table_run(&be, &p);
        CHECKF(failed == 0, "isa %s: %d cases failed", sl_isa_name(be.isa), failed);
    }
}
