# Thin driver over CMake. Every target installs what it needs first.
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
# libFuzzer's seed; 0 draws one. CI fixes it, so that a run explores what the last one did.
FUZZ_SEED ?= 0
FUZZERS := safetensors config checkpoint_index run_input kda_call
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

# Every compile goes through ccache, its cache outside the clone. CMake reads the launcher from the
# environment when it first configures a build tree (the Python package's too). BASEDIR makes the
# paths under this clone relative, so that another clone's compiles hit; NOHASHDIR keeps the build
# directory out of the hash of -g compiles.
KDA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kda
export CCACHE_DIR ?= $(KDA_CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CCACHE_MAXSIZE ?= 5G
export CMAKE_CXX_COMPILER_LAUNCHER ?= ccache

.PHONY: deps build test test-python python-env test-asan fuzz run lint clean

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja $(BUILD)/Makefile: | deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: deps $(BUILD)/Makefile
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)
	@$(MAKE) --no-print-directory test-python

# The Python package (numpy, JAX, PyTorch) and the examples, through pytest in the venv of
# scripts/python-env.sh (KDA_VENV; outside the clone). KDA_BINARY_DIR: where the golden_generate
# fixture of ctest wrote the generated golden sets.
PYTEST_ARGS ?=
python-env: deps
	@bash scripts/python-env.sh

test-python: deps
	@venv=$$(bash scripts/python-env.sh) && cd python/tests && \
	  KDA_BINARY_DIR=$(abspath $(BUILD)) KDA_REQUIRE_XLA_FFI=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(JOBS)} \
	  "$$venv/bin/python" -m pytest -q -rs $(PYTEST_ARGS) .

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKDA_SANITIZE=ON -DKDA_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# Each libFuzzer harness of fuzz/ for FUZZ_SECONDS (clang, ASan + UBSan), starting from its seeds in
# fuzz/corpus/NAME. New inputs are kept in $(FUZZ_BUILD)/corpus/NAME (the seeds in the tree stay as they are).
# A crash, hang, leak or sanitizer report stops here with the log's tail; the input is left in
# $(FUZZ_BUILD)/crashes/NAME/ (replay: $(FUZZ_BUILD)/fuzz/NAME_fuzzer FILE).
fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -DKDA_BUILD_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@for f in $(FUZZERS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$f $(FUZZ_BUILD)/crashes/$$f; \
	  echo "fuzz: $$f for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz/$${f}_fuzzer -max_total_time=$(FUZZ_SECONDS) -seed=$(FUZZ_SEED) -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/$$f/ $(FUZZ_BUILD)/corpus/$$f fuzz/corpus/$$f \
	    >$(FUZZ_BUILD)/$$f.log 2>&1 || { tail -n 60 $(FUZZ_BUILD)/$$f.log; echo "fuzz: $$f FAILED"; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^#[0-9]+ +DONE' $(FUZZ_BUILD)/$$f.log | tr '\n' ' '; echo; \
	done

# The main job.
run: build
	@$(BUILD)/kda bench

# python-env: the compile database of the Python bindings (build-py/) for clang-tidy.
lint: build python-env
	@pre-commit run --all-files

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) build-py
