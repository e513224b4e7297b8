# Thin driver over CMake. Every target installs what it needs first.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: deps build test test-asan run lint clean

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja $(BUILD)/Makefile: | deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: deps $(BUILD)/Makefile
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKDA_SANITIZE=ON -DKDA_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# The main job.
run: build
	@$(BUILD)/kda bench

lint: build
	@pre-commit run --all-files

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD)
