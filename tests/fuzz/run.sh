#!/usr/bin/env bash
# Runs fuzz targets of a fuzz build (KOMPUTED_FUZZ=ON): each over its checked-in corpus
# (tests/fuzz/corpus/<name>), then fuzzing for SECONDS, with its dictionary, -max_len and
# -rss_limit_mb; prints the inputs executed per target. New inputs go to BUILD/fuzz-work/<name>
# (kept from run to run), or to a fresh FUZZ_WORK/<name> when FUZZ_WORK is set (the smoke runs);
# crashes, leaks and timeouts go to BUILD/fuzz-artifacts/ (reproduce one with
# `BUILD/fuzz/fuzz_<name> FILE`). Fails when any target found one. FUZZ_FORK=1: libFuzzer's fork
# mode, which goes on past a crash, leak or timeout (each saved) until SECONDS have passed.
# The smoke runs (FUZZ_WORK set) check for leaks once, at the end, rather than after every input
# that allocated more than it freed: each such check stops every thread of the process to scan
# it (LeakSanitizer's StopTheWorld), which, in a process with a device's worker threads, at times
# fails as "LeakSanitizer has encountered a fatal error" without any leak to report.
#   tests/fuzz/run.sh BUILD SECONDS [NAME...]   (no NAME: every target)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
seconds=$2
shift 2
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=(session tensor_chunk spirv glsl glsl_pipe channel); fi

# Per target: the longest input, and its dictionary (none: "").
declare -A max_len=([session]=16384 [tensor_chunk]=16384 [spirv]=8196 [glsl]=4096 [glsl_pipe]=256
                     [channel]=16384)
declare -A dict=([session]=spirv.dict [tensor_chunk]="" [spirv]=spirv.dict [glsl]=glsl.dict
                 [glsl_pipe]="" [channel]="")

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/../../scripts/lsan.supp}

status=0
for name in "${targets[@]}"; do
  if [[ -n ${FUZZ_WORK:-} ]]; then
    work=$FUZZ_WORK/$name
    rm -rf "$work"
  else
    work=$build/fuzz-work/$name
  fi
  artifacts=$build/fuzz-artifacts
  mkdir -p "$work" "$artifacts"
  log=$work.log
  args=(-max_total_time="$seconds" -max_len="${max_len[$name]}" -rss_limit_mb=3072 -timeout=20
        -print_final_stats=1 -artifact_prefix="$artifacts/$name-")
  if [[ -n ${dict[$name]} ]]; then args+=(-dict="$here/${dict[$name]}"); fi
  if [[ -n ${FUZZ_WORK:-} ]]; then args+=(-detect_leaks=0); fi
  if [[ ${FUZZ_FORK:-0} == 1 ]]; then
    args+=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
  fi
  start=$(date +%s)
  "$build/fuzz/fuzz_$name" "${args[@]}" "$work" "$here/corpus/$name" >"$log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # Fork mode prints no final stats: its last progress line counts every job's inputs.
  if [[ -z $runs ]]; then runs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -1); fi
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  found=$(sed -n 's/.*oom\/timeout\/crash: \([0-9\/]*\).*/\1/p' "$log" | tail -1)
  if [[ $rc -eq 0 && ( -z $found || $found == 0/0/0 ) ]]; then
    echo "fuzz_$name: ${runs:-?} inputs executed in ${took}s, corpus ${corpus:-?} inputs, no crash"
  else
    echo "fuzz_$name: FAILED (exit $rc, oom/timeout/crash ${found:-?}) after ${runs:-?} inputs in" \
      "${took}s; artifacts in $artifacts; from its log ($log):"
    findings=$(grep -aE 'ERROR|SUMMARY|fuzz check|#[0-9]+ 0x|Test unit written|^#[0-9]+:|Sanitizer|HINT|CHECK failed' \
      "$log" | tail -60)
    # Nothing recognised: the log's end says what happened.
    if [[ $(grep -cv 'Test unit written' <<<"$findings") -eq 0 ]]; then findings=$(tail -40 "$log"); fi
    echo "$findings"
    status=1
  fi
done
exit $status
