# The commands a user types. Everything builds in build/ (Release, Ninja, ccache when present).
BUILD ?= build
BUILD_TYPE ?= Release
CTEST_JOBS ?= 2

.PHONY: setup configure build run example test sanitize format format-check ci bench install clean \
	fuzz fuzz-build fuzz-configure fuzz-smoke

LISTEN ?= 127.0.0.1:50051

setup:
	@bash scripts/setup

configure: setup
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD)

# The daemon in the foreground on the default device (lavapipe without a GPU); Ctrl-C stops it.
run: configure
	cmake --build $(BUILD) --target komputed komputectl array_multiplication
	@echo "komputed: starting on $(LISTEN). In another terminal, run the example against it:"
	@echo "  KOMPUTED_ADDRESS=$(LISTEN) $(BUILD)/client/examples/array_multiplication"
	@echo "  $(BUILD)/client/komputectl --address=$(LISTEN) devices"
	$(BUILD)/server/komputed --listen=$(LISTEN)

# The example in-process (no daemon).
example: configure
	cmake --build $(BUILD) --target array_multiplication
	$(BUILD)/client/examples/array_multiplication

# Every suite, then the fuzz targets' smoke runs (each over its corpus and a few seconds of
# fuzzing, in build-fuzz/). The daemons the suites start stop kernels after 10 s rather than the
# default 3 s: a shared 2-core machine running lavapipe can take seconds over an ordinary test
# kernel (the watchdog's own tests set their limits).
test: build fuzz-build
	KOMPUTED_TEST_MAX_KERNEL_TIME=10s ctest --test-dir $(BUILD) --output-on-failure -j $(CTEST_JOBS)
	ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j $(CTEST_JOBS)

# The libFuzzer targets (tests/fuzz) in build-fuzz/: clang, -fsanitize=fuzzer-no-link,address,
# undefined on komputed's code and libFuzzer on the targets. `make fuzz` runs each for
# FUZZ_SECONDS (FUZZ_TARGETS: a subset, e.g. "spirv glsl") and prints the inputs executed;
# crashes go to build-fuzz/fuzz-artifacts/.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz-configure: setup
	@test -f $(FUZZ_BUILD)/build.ninja || CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DKOMPUTED_FUZZ=ON

fuzz-build: fuzz-configure
	cmake --build $(FUZZ_BUILD) --target fuzz_targets

fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-smoke: fuzz-build
	ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j $(CTEST_JOBS)

# The unit and behaviour suites under AddressSanitizer and UndefinedBehaviorSanitizer (clang, with
# -Werror and -Wthread-safety), in build-asan/.
sanitize: setup
	bash scripts/sanitize

# clang-format over every C++ file of the repository: `format` rewrites, `format-check` fails on
# any difference.
CXX_FILES = git ls-files '*.cc' '*.h' '*.hpp'
format:
	$(CXX_FILES) | xargs clang-format -i
format-check: setup
	$(CXX_FILES) | xargs clang-format --dry-run -Werror

# What CI runs (.ci/run): the format check, every test, and the sanitizer suites.
ci: format-check test sanitize

bench: build
	$(BUILD)/tests/bench/komputed_bench
	$(BUILD)/tests/bench/komputed_watchdog_bench
	$(BUILD)/tests/bench/komputed_cluster_bench
	$(BUILD)/tests/bench/komputed_scale_bench
	if [ -x $(BUILD)/tests/bench/komputed_python_bench ]; then $(BUILD)/tests/bench/komputed_python_bench; fi

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
