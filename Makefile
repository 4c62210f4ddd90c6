# sluice: plain Makefile. Objects under build/, dependencies via -MMD -MP.
#
#   make            build/sluice
#   make test       unit tests, parity against transformers, CLI checks,
#                   sanitizer (ASan/UBSan) run, short fuzz runs, side by side on every core
#   make run        builds and runs the default job
#   make bench      speed measurements, kept out of make test (tokenizer encoding, CPU matmul
#                   over block types; with CUDA=1 the CUDA op benchmarks too)
#   make format     clang-format every source file (.c, .h, .cu, .cuh)
#   make fuzz       longer libFuzzer runs (clang)
#   make CUDA=1     build-cuda/sluice with the CUDA backend too (nvcc)
#
# Each of them first installs what it lacks (tools/deps.sh: the Debian packages, with
# apt-get as root or through sudo), or stops with the one command to run. A machine
# without the -dev packages and without a mirror (the GPU machine) builds against
# .deps, copies of them made by tools/cuda_deps.sh elsewhere, picked when it is there.

# Dependencies first, before anything below tests what is installed (the fuzz targets'
# libFuzzer): what the goals need is found or installed, once per command line. DEPS
# comes back set where the system lacks the headers and .deps has them.
TEST_GOALS := test test-suites unit cli-test cli-test-% server-test fault-test san \
              fuzz-smoke fuzz-smoke-% fuzz fuzz-run-%
ifeq ($(MAKELEVEL),0)
ifneq ($(filter-out clean format,$(or $(MAKECMDGOALS),all)),)
DEPS_NEEDS := build $(if $(filter $(TEST_GOALS),$(MAKECMDGOALS)),test) $(if $(filter 1,$(CUDA)),cuda) \
              $(if $(filter test-cuda,$(MAKECMDGOALS)),cuda python)
DEPS_FOUND := $(shell DEPS=$(DEPS) tools/deps.sh $(DEPS_NEEDS))
ifneq ($(.SHELLSTATUS),0)
$(error missing build dependencies: see above)
endif
DEPS := $(or $(DEPS),$(DEPS_FOUND))
export DEPS
endif
endif
# The python3 that runs tools/make_synth.py, in the test scripts too (exported): one that
# has numpy (python3 on the PATH may be another one, a pyenv's, without it).
ifneq ($(filter $(TEST_GOALS) test-cuda,$(MAKECMDGOALS)),)
ifndef PYTHON
PYTHON := $(shell tools/deps.sh pick-python)
endif
export PYTHON
endif

CC      ?= cc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpointer-arith -Werror -Wno-format-truncation -fopenmp -Iinclude -Isrc -MMD -MP
LDLIBS  += -ljansson -lcrypto -lpcre2-8 -lutf8proc -lm
# The command-line tool alone links libedit (line editing for `chat`) and libmicrohttpd (the
# HTTP server of `serve`, src/server/).
CLI_LIBS := -ledit -lmicrohttpd -lpthread
# A machine without the -dev packages (the GPU machine) builds against copies of their headers
# and libraries (tools/cuda_deps.sh): static ones, and libmicrohttpd with its GnuTLS chain as
# shared ones (no static GnuTLS chain exists) found at run time through the binary's RPATH
# (an RPATH, not a RUNPATH: it also serves the libraries' own dependencies).
ifdef DEPS
CFLAGS  += -I$(DEPS)/include
LDLIBS  += -L$(DEPS)/lib -ldl -lpthread
CLI_LIBS := -ledit -ltinfo -lbsd -lmd -lmicrohttpd -lpthread \
            -Wl,-rpath,$(abspath $(DEPS))/lib -Wl,--disable-new-dtags
endif
# io_uring expert reads (src/moe/experts.c) where liburing's header is there (tools/deps.sh
# installs liburing-dev; an older .deps may lack it): else the reader threads alone.
HAVE_URING := $(shell echo '\#include <liburing.h>' | $(CC) $(if $(DEPS),-I$(DEPS)/include) -E -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_URING),1)
CFLAGS  += -DSL_HAVE_URING
LDLIBS  += -luring
endif
LDFLAGS += -fopenmp
BUILD   := build

# The library is every C file under src/ but the two programs' folders (a family may be a
# folder of its own: src/families/NAME/). The kernels come first: they take two thirds of its
# compile time, three files most of it, so that under -j the others fill in around them.
LIB_SRC := $(sort $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/server/*' \
                               -not -path 'src/kernels/cuda/*'))
LIB_SRC := $(filter src/kernels/%,$(LIB_SRC)) $(filter-out src/kernels/%,$(LIB_SRC))
CLI_SRC := $(sort $(wildcard src/cli/*.c src/server/*.c))
# The op table (tests/ops/) is one source run by the unit tests (CPU) and test_cuda (CUDA).
UNIT_SRC := $(sort $(wildcard tests/unit/*.c)) tests/ops/ops_table.c

# CUDA=1 builds the CUDA backend (src/kernels/cuda/*.cu, nvcc; sm_90 code plus PTX
# that newer GPUs JIT-compile) in place of its stub; the default build has no CUDA.
NVCC     ?= nvcc
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
ifeq ($(CUDA),1)
BUILD    := build-cuda
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC)))
NVFLAGS  ?= -O3
NVFLAGS  += -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
            -Iinclude -Isrc -Xcompiler -Wall -MMD -MP
LIB_SRC  := $(filter-out src/kernels/cuda_stub.c,$(LIB_SRC))
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(sort $(wildcard src/kernels/cuda/*.cu)))
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lstdc++
BACKENDS := CPU + CUDA backends
else
BACKENDS := CPU backend; CUDA $(if $(HAVE_NVCC),found: make CUDA=1 builds it,not found (no nvcc))
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
UNIT_OBJ := $(UNIT_SRC:%.c=$(BUILD)/%.o)

# The sanitizer build: same sources, separate objects.
SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
             -fno-omit-frame-pointer
SAN_LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/san/%.o)
SAN_UNIT_OBJ := $(UNIT_SRC:%.c=$(BUILD)/san/%.o)

.PHONY: all test test-suites unit parity fam-test cli-test cli-test-main cli-test-mlx cli-test-fam \
        server-test fault-test san fuzz-smoke fuzz bench run format clean

all: $(BUILD)/sluice
	@echo "sluice built: $(BUILD)/sluice ($(BACKENDS); SIMD chosen at run time$(if $(DEPS),; libraries from $(DEPS)))"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/san/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

$(BUILD)/libsluice.a: $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/sluice: $(CLI_OBJ) $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) $(CLI_LIBS) -o $@

$(BUILD)/test_unit: $(UNIT_OBJ) $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/san/test_unit: $(SAN_UNIT_OBJ) $(SAN_LIB_OBJ)
	$(CC) $(LDFLAGS) $(SAN_FLAGS) $^ $(LDLIBS) -o $@

# ---- tests ---------------------------------------------------------------

# Qwen3's tokenizer.json (11 MB) is kept xz-compressed in the tree (2 MB: the whole tree must
# travel to the GPU machine) and unpacked for what reads it.
QWEN3_TOK := tests/tokenizer/qwen3/tokenizer.json
$(QWEN3_TOK): $(QWEN3_TOK).xz
	xz -dc $< > $@.tmp && mv $@.tmp $@

# make test runs the suites, and the builds they need, side by side on every core (TEST_JOBS;
# a -j given to make wins): one after the other they left one core of two idle most of the
# time. Each suite has a scratch directory (mktemp) and ports (--port 0) of its own, so they can
# run at once; -Otarget keeps each one's output together, printed as it ends. Two steps, as make
# starts every compile it can reach before it comes back to what waited on one: what the
# longest suites need first (the CLI, the tokenizer), so that they start at once while the
# sanitizer and fuzz builds take the other core. OpenMP threads that wait sleep rather than spin
# (OMP_WAIT_POLICY): spinning, libgomp's default, made tests/cli_test.sh 5 times slower beside
# one busy core, and costs a fifth of its CPU time even alone.
ifndef TEST_JOBS
TEST_JOBS := $(shell nproc 2>/dev/null || echo 2)
endif
TEST_MAKE = $(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(TEST_JOBS)) -Otarget
test:
	+@$(TEST_MAKE) $(BUILD)/sluice $(QWEN3_TOK)
	+@OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $(TEST_MAKE) test-suites
	@echo "make test: all suites passed"

# In the order make starts them: the suites that run longest on one core first.
test-suites: server-test cli-test-main cli-test-fam cli-test-mlx san unit fault-test fuzz-smoke

unit: $(BUILD)/test_unit $(QWEN3_TOK)
	$(BUILD)/test_unit tests/fixtures

# Three scripts, which make runs at once under -j.
cli-test: cli-test-main cli-test-mlx cli-test-fam
cli-test-main: $(BUILD)/sluice $(QWEN3_TOK)
	bash tests/cli_test.sh $(BUILD)/sluice tests/fixtures
cli-test-mlx: $(BUILD)/sluice
	bash tests/mlx_test.sh $(BUILD)/sluice tests/fixtures
cli-test-fam: $(BUILD)/sluice
	PYTHON=/usr/bin/python3 bash tests/fam_test.sh $(BUILD)/sluice $(FAM_RUNS)

# The issue-27 families against transformers (tests/fixtures/fam); FAM_CASES picks cases.
# FAM_RUNS: the cases of the families main runs.
FAM_RUNS ?= gpt_oss_a gpt_oss_mxfp4 deepseek_v3_a deepseek_v3_b glm4_moe_a mixtral_a olmoe_a \
            qwen3_vl_moe_a gemma4_a gemma4_b llama4_a llama4_vlm
fam-test: $(BUILD)/sluice
	PYTHON=/usr/bin/python3 bash tests/fam_test.sh $(BUILD)/sluice $(FAM_CASES)

# The OpenAI-compatible server driven by the official `openai` npm client
# (installed into tests/server/node_modules on first run), curl and a load test.
server-test: $(BUILD)/sluice $(QWEN3_TOK)
	bash tests/server/server_test.sh $(BUILD)/sluice

# Integrity and I/O faults end to end (issue 24): corrupt packs on disk, and reads that fail,
# come back short, stall or bring back corrupt bytes, injected by an LD_PRELOAD shim of our
# own (tests/fault/shim.c) under the CLI and a driver linked with the library.
$(BUILD)/fault/shim.so: tests/fault/shim.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -shared $< -o $@ -ldl

$(BUILD)/fault/fault_test: $(BUILD)/tests/fault/fault_test.o $(BUILD)/libsluice.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lpthread -o $@

fault-test: $(BUILD)/sluice $(BUILD)/fault/shim.so $(BUILD)/fault/fault_test
	bash tests/fault/fault_test.sh $(BUILD)/sluice $(BUILD)/fault

san: $(BUILD)/san/test_unit $(QWEN3_TOK)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=2 \
	    $(BUILD)/san/test_unit tests/fixtures

# Fuzz targets: libFuzzer under clang when available; otherwise the same
# targets replay their seed corpus through a plain driver. The library is compiled once,
# instrumented (ASan, UBSan, and libFuzzer's coverage where it is there), into one archive
# that every target links. Its kernels come uninstrumented from the plain build (clang 14 does
# not know every CPU feature name of their run-time dispatch); no parser reaches them, but the
# families' code the config parser's registry links does (libgomp: gcc's OpenMP).
FUZZ_LIB_SRC := $(filter-out src/kernels/%,$(LIB_SRC))
FUZZ_KERNELS := $(filter $(BUILD)/src/kernels/%,$(LIB_OBJ))
# (In the order of their runs' length in make test, the longest first: make -j starts them so.)
FUZZ_TARGETS := config tokenizer gguf safetensors pack tokjson toolcall jsonschema trace
FUZZ_FLAGS   := -std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -Iinclude -Isrc -MMD -MP \
                $(if $(DEPS),-I$(DEPS)/include)
HAVE_LIBFUZZER := $(shell echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){return 0;}' \
    | clang -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null && echo 1)

ifeq ($(HAVE_LIBFUZZER),1)
FUZZ_CC   := clang
FUZZ_SAN  := -fsanitize=fuzzer-no-link,address,undefined
FUZZ_LINK := -fsanitize=fuzzer,address,undefined
FUZZ_MAIN :=
# In `make test` the runs are fixed in number and seed (about 10 s each), so CI is
# reproducible; `make fuzz` runs for a time and keeps its corpus.
FUZZ_RUN = $< $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS) -seed=1,-max_total_time=$(1)) -rss_limit_mb=2048 \
           $(BUILD)/fuzz/corpus_$* tests/fuzz/seeds_$*
else
FUZZ_CC   := $(CC)
FUZZ_SAN  := -fsanitize=address,undefined
FUZZ_LINK := -fsanitize=address,undefined
FUZZ_MAIN := $(BUILD)/fuzz/obj/tests/fuzz/replay.o
FUZZ_RUN = $< tests/fuzz/seeds_$*
endif

.PRECIOUS: $(BUILD)/fuzz/obj/%.o
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SAN) -c $< -o $@

$(BUILD)/fuzz/libsluice_fuzz.a: $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/obj/tests/fuzz/fuzz_%.o $(FUZZ_MAIN) $(FUZZ_KERNELS) \
                     $(BUILD)/fuzz/libsluice_fuzz.a
	$(FUZZ_CC) -fopenmp $(FUZZ_LINK) $^ $(LDLIBS) -lgomp -o $@

# One target a run, so that make -j runs them side by side; each starts from an empty corpus.
# 1,000,000 runs where no number is given here.
FUZZ_SMOKE_RUNS_tokenizer := 40000
FUZZ_SMOKE_RUNS_config    := 300000
FUZZ_SMOKE_RUNS_tokjson   := 100000
FUZZ_SMOKE_RUNS_gguf      := 200000
FUZZ_SMOKE_RUNS_toolcall  := 200000
FUZZ_SMOKE_RUNS_jsonschema := 200000
FUZZ_SMOKE_RUNS_trace      := 100000
fuzz-smoke: $(FUZZ_TARGETS:%=fuzz-smoke-%)
fuzz-smoke-%: FUZZ_RUNS = $(or $(FUZZ_SMOKE_RUNS_$*),1000000)
fuzz-smoke-%: $(BUILD)/fuzz/fuzz_% $(QWEN3_TOK)
	@rm -rf $(BUILD)/fuzz/corpus_$*
	$(FUZZ_RUN_RECIPE)

fuzz: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%) $(QWEN3_TOK)
	@for t in $(FUZZ_TARGETS); do mkdir -p $(BUILD)/fuzz/corpus_$$t; done
	@set -e; for t in $(FUZZ_TARGETS); do \
	    $(MAKE) --no-print-directory fuzz-run-$$t FUZZ_SECONDS=300; done

define FUZZ_RUN_RECIPE
@echo "fuzz $*: $(if $(FUZZ_RUNS),$(FUZZ_RUNS) runs,$(FUZZ_SECONDS)s)"
@mkdir -p $(BUILD)/fuzz/corpus_$*
@$(call FUZZ_RUN,$(FUZZ_SECONDS)) > $(BUILD)/fuzz/$*.log 2>&1 || \
    { tail -n 40 $(BUILD)/fuzz/$*.log; echo "fuzz $*: FAILED"; exit 1; }
@echo "fuzz $*: $$(tail -n 1 $(BUILD)/fuzz/$*.log)"
endef
fuzz-run-%: $(BUILD)/fuzz/fuzz_%
	$(FUZZ_RUN_RECIPE)

# ---- speed (make bench) ----------------------------------------------------

# What prints a speed rather than passes or fails: out of `make test`, whose time it would
# only add to.
$(BUILD)/bench_tokenizer: $(BUILD)/tests/bench/bench_tokenizer.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# CPU matmul over ggml's block types against BF16/Q8/Q4 (a decode GEMV; bench_blocks N K T threads).
$(BUILD)/bench_blocks: $(BUILD)/tests/bench/bench_blocks.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The JSON constraint's mask over Qwen3's vocabulary (response_format; ms per token).
$(BUILD)/bench_json: $(BUILD)/tests/bench/bench_json.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

bench: $(QWEN3_TOK) $(BUILD)/bench_tokenizer $(BUILD)/bench_blocks $(BUILD)/bench_json \
       $(if $(filter 1,$(CUDA)),$(BUILD)/test_cuda)
	$(BUILD)/bench_tokenizer tests/fixtures
	$(BUILD)/bench_json tests/fixtures
	$(BUILD)/bench_blocks
	$(if $(filter 1,$(CUDA)),$(BUILD)/test_cuda bench)

# ---- the default job -------------------------------------------------------

# The demo model (tools/train_demo.py): a Qwen2-MoE trained on the King James
# Bible, packed at int8. Its experts stream from disk through a cache holding
# half of them (4 of 8 slots per layer).
RUN_MODEL ?= models/kjv-moe
RUN_PROMPT ?= And it came to pass
run: $(BUILD)/sluice
	$(BUILD)/sluice run $(RUN_MODEL) --raw -p "$(RUN_PROMPT)" -n 160 --temp 0.8 --top-p 0.95 \
	    --seed 1 --experts stream --cache-experts 4

# Every C and CUDA source; .cu and .cuh files are C++ to clang-format, with the same style.
format:
	@command -v clang-format >/dev/null || { echo "make format: clang-format is not installed" \
	    "(Debian: apt-get install clang-format)"; exit 1; }
	clang-format -i $$(find include src tests -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \
	    | grep -v '/node_modules/')

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- CUDA (on a machine with nvcc and a GPU) ------------------------------
# make test-cuda: the op table (tests/ops/) on the CUDA backend and the GPU's own bitwise
# contracts against the CPU (test_cuda; its benchmarks: make bench CUDA=1), then end-to-end
# parity of the CUDA backend with the CPU backend and transformers on the
# fixtures and on a synthetic tiny-k64 checkpoint (test_cuda_model); ggml's block types against a
# host reference of their own (test_cuda_blocks).
# bench_cuda: tools/bench_cuda.sh's decode benchmark.
$(BUILD)/test_cuda: $(BUILD)/tests/cuda/test_cuda_ops.o $(BUILD)/tests/ops/ops_table.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/test_cuda_model: $(BUILD)/tests/cuda/test_cuda_model.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/test_cuda_blocks: $(BUILD)/tests/cuda/test_cuda_blocks.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bench_cuda: $(BUILD)/tests/cuda/bench_cuda.o $(BUILD)/libsluice.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

test-cuda: $(QWEN3_TOK)
	$(MAKE) CUDA=1 build-cuda/test_cuda build-cuda/test_cuda_model build-cuda/test_cuda_blocks
	build-cuda/test_cuda tests/fixtures
	build-cuda/test_cuda_blocks
	$(PYTHON) tools/make_synth.py /tmp/sluice-synth-k64 --preset tiny-k64 >/dev/null
	build-cuda/test_cuda_model tests/fixtures /tmp/sluice-synth-k64
