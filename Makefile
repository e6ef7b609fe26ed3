# The commands a user types. Everything builds in build/ (Release, Ninja, ccache when present).
BUILD ?= build
BUILD_TYPE ?= Release
CTEST_JOBS ?= 2

.PHONY: setup configure build run test bench install clean

setup:
	@bash scripts/setup

configure: setup
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD)

run: build
	$(BUILD)/client/examples/array_multiplication

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(CTEST_JOBS)

bench: build
	$(BUILD)/tests/bench/komputed_bench

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
