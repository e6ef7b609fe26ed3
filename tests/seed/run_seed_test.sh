#!/usr/bin/env bash
# Usage: run_seed_test.sh SEED_FILE BUILD_DIR WORK_DIR
# Extracts the first C++ code block of SEED_FILE, puts only includes and a compileSource
# using-declaration in front of it, builds it against komputed installed from BUILD_DIR through
# find_package(komputed CONFIG), runs it and checks the two results it prints.
# With KOMPUTED_ADDRESS set the program runs on that daemon.
set -euo pipefail
seed=$1 build=$2 work=$3
if [[ ! -f $seed ]]; then
  echo "seed file $seed not found; skipping" >&2
  exit 77
fi
rm -rf "$work" && mkdir -p "$work/consumer"
cmake --install "$build" --prefix "$work/prefix" >/dev/null

{
  echo '#include <iostream>'
  echo '#include <memory>'
  echo '#include <string>'
  echo '#include <vector>'
  echo '#include <kompute/Kompute.hpp>'
  echo 'using kp::compileSource;'
  awk '/^```c\+\+/{inside=1; next} inside && /^```/{exit} inside{print}' "$seed"
} > "$work/consumer/main.cc"
if ! grep -q 'kp::Manager' "$work/consumer/main.cc"; then
  echo "no C++ example found in $seed" >&2
  exit 1
fi

cat > "$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(seed_consumer CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(komputed CONFIG REQUIRED)
add_executable(seed main.cc)
target_link_libraries(seed PRIVATE komputed::kompute)
CMAKE

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build "$work/consumer/build" >/dev/null

output=$("$work/consumer/build/seed")
echo "seed example printed: $output"
normalised=$(echo "$output" | tr -s ' \n' ' ' | sed 's/ *$//')
expected="4 8 12 10 10 10"
if [[ $normalised != "$expected" ]]; then
  echo "expected: $expected" >&2
  exit 1
fi
echo "seed example OK${KOMPUTED_ADDRESS:+ (remote: $KOMPUTED_ADDRESS)}"
