# wlbtrain - build, test, demo. See README.md.
#
#   make            install missing Debian packages, build ./wlbtrain (CUDA backend when nvcc is found)
#   make CUDA=0     build without the CUDA backend
#   make test       build and run every test, optimized and under ASan+UBSan; last line "N passed, ..."
#   make run        the README's run command: build, make the demo corpus, run the main job on it
#   make demo       the demo corpus only (data/demo/)
#
# Build variants live side by side: build/release (-O2, CUDA), build/release-nocuda (make CUDA=0)
# and build/asan (-O1, sanitizers, no CUDA).
# Header dependencies are tracked (-MMD -MP), so a changed header rebuilds what includes it.

.DEFAULT_GOAL := all
.SECONDARY:
SHELL := /bin/bash

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA ?= $(if $(NVCC),1,0)
CUDA_ARCHS ?= 80 90
VARIANT ?= release
# The CUDA and the CPU-only release builds have their own folders: switching CUDA= never mixes them.
RELEASE := build/release$(if $(filter 1,$(CUDA)),,-nocuda)
B := $(if $(filter asan,$(VARIANT)),build/asan,$(RELEASE))
# make V=1 shows the full commands
Q := $(if $(V),,@)

CC := gcc
CXX := g++
ifeq ($(VARIANT),asan)
  OPT := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
  CUDA_BUILD := 0
else
  OPT := -O2 -g
  CUDA_BUILD := $(CUDA)
endif

# Recursive (=) so that mpicc is asked only when a recipe runs, after `deps` has installed it.
MPI_CFLAGS = $(shell mpicc --showme:compile)
MPI_LIBS = $(shell mpicc --showme:link)
CFLAGS = -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Werror -fopenmp -I. \
         -MMD -MP $(OPT) $(MPI_CFLAGS) $(if $(filter 1,$(CUDA_BUILD)),-DWLB_CUDA)
LIBS = -lyaml -lz -ljansson -lpcre2-8 -lm $(MPI_LIBS)

LIB_SRCS := backends.c $(wildcard util/*.c cli/*.c config/*.c data/*.c engine/*/*.c cpu/*.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o)
# The engine's cost profiles (engine/plan/profiles/*.json) built into the program as C strings
# (cost_engine_profiles, engine/plan/cost.h): the files stay the one source of their numbers.
PROFILE_JSONS := $(sort $(wildcard engine/plan/profiles/*.json))
LIB_OBJS += $(B)/obj/gen/engine_profiles.o
CU_SRCS := $(wildcard cuda/*.cu)
ifeq ($(CUDA_BUILD),1)
  CU_OBJS := $(CU_SRCS:%.cu=$(B)/obj/%.o)
  NVCCFLAGS := -O2 -std=c++17 -I. -DWLB_CUDA -MMD -MP -Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Werror $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lnccl -lstdc++
endif
# cuDNN's fused attention (cuda/cuda_cudnn*.{cu,cpp}): the cudnn-frontend headers that
# scripts/install-deps.sh unpacks into build/deps/ (pinned); without them (make CUDNN=0, or no
# network when they were fetched) the path is compiled out. Its C++ file is compiled by g++ (the
# library's headers are heavy for nvcc) with the library as a system include, so that -Werror covers
# wlbtrain's code and not the library's; libcudnn.so.9 is opened at run time (dlopen).
CUDNN_FE_INC := build/deps/cudnn-frontend-1.32.0/include
CUDNN ?= $(if $(wildcard $(CUDNN_FE_INC)/cudnn_frontend.h),1,0)
ifeq ($(CUDA_BUILD)$(CUDNN),11)
  NVCCFLAGS += -DWLB_CUDNN
  CUDNN_OBJS := $(B)/obj/cuda/cuda_cudnn_graph.o
  # -Os: graphs are built a few times a run, and each program that links the backend carries this
  # code (a device call's 64 MiB: 1.0 MB of text each instead of 1.4 at -O2); no -g: the library's
  # templates make its debug information the slow part of the build (75 s -> 65 s here)
  CUDNN_CXXFLAGS := -std=c++17 -D_GNU_SOURCE -Wall -Wextra -Werror -I. -MMD -MP -Os -DWLB_CUDA -DWLB_CUDNN \
                    -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -isystem $(CUDNN_FE_INC) -isystem $(CUDA_HOME)/include
  CUDA_LIBS += -ldl
endif
TEST_SRCS := $(wildcard test/test_*.c)
TEST_BINS := $(TEST_SRCS:test/%.c=$(B)/test/%)
# C++ tests: the CUDA kernels' own source on the host, under test/flash_emu.cc (no GPU needed).
CXXFLAGS = -std=c++17 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unknown-pragmas -fopenmp -I. -MMD -MP $(OPT)
TEST_CXX_SRCS := $(wildcard test/test_*.cc)
TEST_BINS += $(TEST_CXX_SRCS:test/%.cc=$(B)/test/%)
# Tools the Python tests run (test/dump_*.c): plain programs over libwlb.a, no test framework.
TOOL_SRCS := $(wildcard test/dump_*.c)
TOOL_BINS := $(TOOL_SRCS:test/%.c=$(B)/test/%)
# Benchmark programs (bench/*.c) the bench scripts run.
BENCH_SRCS := $(wildcard bench/*.c)
TOOL_BINS += $(BENCH_SRCS:bench/%.c=$(B)/bench/%)

# The variants' own makes compile in parallel, a job per core (make JOBS=1 for one at a time).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps test-deps variant variant-tests test run demo clean
all: deps
	@$(MAKE) --no-print-directory -j$(JOBS) VARIANT=release variant
	@cp -f $(RELEASE)/wlbtrain ./wlbtrain

deps:
	@scripts/install-deps.sh build

test-deps:
	@scripts/install-deps.sh test

# One variant: its library, its wlbtrain and its test programs.
variant: $(B)/wlbtrain
variant-tests: $(B)/wlbtrain $(TEST_BINS) $(TOOL_BINS)

$(B)/libwlb.a: $(LIB_OBJS) $(CU_OBJS) $(CUDNN_OBJS)
	@rm -f $@
	$(Q)ar rcs $@ $^

$(B)/wlbtrain: $(B)/obj/main.o $(B)/libwlb.a
	@echo "  LD    $@"
	$(Q)$(CC) $(OPT) -fopenmp -o $@ $^ $(LIBS) $(CUDA_LIBS)

# The CPU backend's kernels: -O3 vectorizes their loops, FMA contraction is allowed, and
# reassociation lets the vectorizer split sums (one binary still gives the same bits every run: the
# order is fixed at compile time).
$(B)/obj/cpu/%.o: CFLAGS += -O3 -ffp-contract=fast -fno-math-errno -fno-trapping-math -fno-signed-zeros \
                           -fassociative-math

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC    $< ($(VARIANT))"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(B)/gen/engine_profiles.c: $(PROFILE_JSONS) scripts/embed_profiles.sh
	@mkdir -p $(dir $@)
	@echo "  GEN   $@"
	$(Q)scripts/embed_profiles.sh $(PROFILE_JSONS) > $@.tmp && mv $@.tmp $@

$(B)/obj/gen/%.o: $(B)/gen/%.c
	@mkdir -p $(dir $@)
	@echo "  CC    $< ($(VARIANT))"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(B)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@echo "  CXX   $< ($(VARIANT))"
	$(Q)$(CXX) $(CXXFLAGS) -c -o $@ $<

$(B)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(B)/obj/cuda/%.o: cuda/%.cpp
	@mkdir -p $(dir $@)
	@echo "  CXX   $< (cudnn-frontend)"
	$(Q)$(CXX) $(CUDNN_CXXFLAGS) -c -o $@ $<

# cuda_cudnn.cu is compiled with or without the cuDNN path: build/*/cudnn.choice
# holds the choice and is rewritten (so newer) only when it changes, which rebuilds them.
$(B)/cudnn.choice: FORCE
	@mkdir -p $(dir $@)
	@echo "$(CUDNN)" | cmp -s - $@ || echo "$(CUDNN)" > $@
$(B)/obj/cuda/cuda_cudnn.o: $(B)/cudnn.choice
.PHONY: FORCE
FORCE:

$(B)/test/dump_%: $(B)/obj/test/dump_%.o $(B)/libwlb.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CC) $(OPT) -fopenmp -o $@ $^ $(LIBS) $(CUDA_LIBS)

$(B)/bench/%: $(B)/obj/bench/%.o $(B)/libwlb.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CC) $(OPT) -fopenmp -o $@ $^ $(LIBS) $(CUDA_LIBS)

# The fuzz regression test replays test/fuzz/ through the fuzz targets (scripts/fuzz.sh fuzzes them).
$(B)/test/test_fuzz_corpus: $(B)/obj/test/test_fuzz_corpus.o $(B)/obj/fuzz/fuzz_targets.o $(B)/obj/test/testlib.o \
                            $(B)/libwlb.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CC) $(OPT) -fopenmp -o $@ $^ -lcmocka $(LIBS) $(CUDA_LIBS)

$(B)/test/test_flash_emulated: $(B)/obj/test/test_flash_emulated.o $(B)/obj/test/flash_emu.o $(B)/libwlb.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CXX) $(OPT) -fopenmp -o $@ $^ -lcmocka $(LIBS) $(CUDA_LIBS)

# The host side of cuDNN's attention path (cuda/cuda_cudnn_batch.h: plain C++), tested on the CPU;
# in a build with the path, also its graphs (cuda_cudnn_graph.o, validated without a GPU).
ifeq ($(CUDA_BUILD)$(CUDNN),11)
  TEST_CUDNN_GRAPH := $(B)/obj/cuda/cuda_cudnn_graph.o
$(B)/obj/test/test_cudnn_batch.o: CXXFLAGS += -DWLB_CUDNN
endif
$(B)/obj/test/test_cudnn_batch.o: $(B)/cudnn.choice
$(B)/test/test_cudnn_batch: $(B)/obj/test/test_cudnn_batch.o $(TEST_CUDNN_GRAPH)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CXX) $(OPT) -o $@ $^ -lcmocka $(if $(TEST_CUDNN_GRAPH),$(CUDA_LIBS))

$(B)/test/%: $(B)/obj/test/%.o $(B)/obj/test/testlib.o $(B)/obj/test/plan_checks.o $(B)/libwlb.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	$(Q)$(CC) $(OPT) -fopenmp -o $@ $^ -lcmocka $(LIBS) $(CUDA_LIBS)

# The whole suite, both variants. test/run.sh prints one summary line per variant; the last line
# is the total that CI reads.
test: deps test-deps
	@$(MAKE) --no-print-directory -j$(JOBS) VARIANT=release variant-tests
	@cp -f $(RELEASE)/wlbtrain ./wlbtrain
	@$(MAKE) --no-print-directory -j$(JOBS) VARIANT=asan variant-tests
	@$(MAKE) --no-print-directory demo
	@test/run.sh $(RELEASE) build/asan

demo: all
	@scripts/make-demo-corpus.sh

run: demo
	@scripts/run-demo.sh

clean:
	rm -rf build wlbtrain

# (build/pyenv is skipped: Python packages ship folders named *.d)
-include $(shell find build -path build/pyenv -prune -o -name '*.d' -type f -print 2>/dev/null)
