# Makefile — a thin wrapper over meson/ninja for the common commands.
#   make demo          set up, build, train a small GPT on a word list, sample from it
#   make test [T=x]    plain + ASan/UBSan builds, run the suite in both, then the
#                      libFuzzer targets when clang is installed
#                      (T: only tests whose name contains one of its words)
#   make fuzz [S=secs] build-fuzz/ with clang, run each fuzz target S seconds (default 25)
#   make build         set up and build build/
#   make bench [B=x]   build, run the benchmarks (build/bench/bench_ops)
#   make setup         check/install the system packages the build needs
#   make clean         remove the build directories
BUILD ?= build

.PHONY: all demo test fuzz build bench setup clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	@bash scripts/setup.sh
	meson setup $(BUILD)

build: setup $(BUILD)/build.ninja
	ninja -C $(BUILD)

demo: build
	@bash scripts/setup.sh demo
	@bash scripts/demo.sh

test:
	@bash scripts/run_tests.sh $(T)

fuzz:
	@bash scripts/fuzz.sh $(S)

bench: build
	@if [ -x $(BUILD)/bench/bench_ops ]; then ./$(BUILD)/bench/bench_ops $(B); \
	else echo "bench: no benchmark binary yet ($(BUILD)/bench/bench_ops is not built by bench/meson.build)" >&2; exit 1; fi

clean:
	rm -rf build build-asan build-portable build-fuzz $(filter-out build build-asan build-portable build-fuzz,$(BUILD))
