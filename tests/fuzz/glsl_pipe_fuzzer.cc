// fuzz_glsl_pipe: CompileGlslInChild's side of the pipes (writing the source, reading SPIR-V and
// messages within their caps, the wall-clock deadline, and reading the child's end) against a
// child that the input scripts (glslc_script.h): it may read all, some or none of its stdin, write
// any amount to stdout and stderr in any order, close them early, sleep, use the CPU, exit with
// any status or die of a signal.
//
// The input: byte 0 chooses the harness's settings (bit 0: a memory bound for the child; bits
// 1-3: how many 32 KiB of padding follow the source, more than a pipe holds); the rest is the
// source sent to the child, whose first bytes are its script.
//
// Checked: the call returns within the wall time and a margin whatever the child does; a child
// that finishes well within the wall time gets exactly the result the contract states
// (glsl_compiler.h): its words, its messages cut at the cap, or the error naming the bound.
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fuzz_support.h"
#include "glsl_compiler.h"
#include "glslc_script.h"

namespace komputed::fuzz {
namespace {

constexpr absl::Duration kWallTime = absl::Milliseconds(500);
// What the call may take beyond the wall time: killing and reaping the child, on a loaded
// machine. Less than the child may sleep (kMaxScriptMs), so that a wait for it shows.
constexpr absl::Duration kMargin = absl::Milliseconds(700);
constexpr uint64_t kSpirvCap = 512;
constexpr uint64_t kMessageCap = 64;

// What the script makes the child do, as the parent sees it.
struct Simulated {
  std::string out, err;  // what reaches the pipes
  int exit_code = 0;
  int signal = 0;   // 0: exited
  int busy_ms = 0;  // sleeping and spinning before it ended
};

Simulated Simulate(const std::vector<ScriptStep>& steps) {
  Simulated s;
  bool out_open = true, err_open = true;
  size_t out_at = 0, err_at = 0;
  int budget_ms = kMaxScriptMs;
  for (const ScriptStep& step : steps) {
    switch (step.kind) {
      case ScriptStep::kOut:
        for (int i = 0; i < step.amount * 16; ++i) {
          const char c = ScriptOutByte(out_at++);
          if (out_open) s.out += c;
        }
        break;
      case ScriptStep::kErr:
        for (int i = 0; i < step.amount * 4; ++i) {
          const char c = ScriptErrByte(err_at++);
          if (err_open) s.err += c;
        }
        break;
      case ScriptStep::kCloseOut:
        out_open = false;
        break;
      case ScriptStep::kCloseErr:
        err_open = false;
        break;
      case ScriptStep::kSleep:
      case ScriptStep::kSpin: {
        const int ms =
            std::min(step.kind == ScriptStep::kSleep ? step.amount * 4 : step.amount, budget_ms);
        budget_ms -= ms;
        s.busy_ms += ms;
        break;
      }
      case ScriptStep::kExit:
        s.exit_code = ScriptExitCode(step.amount);
        return s;
      case ScriptStep::kSignal:
        s.signal = ScriptSignal(step.amount);
        return s;
      default:
        break;
    }
  }
  return s;
}

// The result the contract states for a child that ended well within the wall time.
void CheckResult(const Simulated& child, bool memory_bound,
                 const absl::StatusOr<std::vector<uint32_t>>& result) {
  const absl::Status status = result.status();
  if (child.out.size() > kSpirvCap) {
    Check(
        absl::IsResourceExhausted(status) && absl::StrContains(status.message(), "bytes of SPIR-V"),
        "SPIR-V over the cap must be RESOURCE_EXHAUSTED", status);
  } else if (child.signal != 0) {
    const bool bound = child.signal == SIGKILL || child.signal == SIGXCPU || memory_bound;
    Check(bound ? absl::IsResourceExhausted(status) : absl::IsInternal(status),
          absl::StrCat("a child killed by signal ", child.signal), status);
  } else if (child.exit_code == 0 && !child.out.empty() && child.out.size() % 4 == 0) {
    Check(result.ok(), "a child that wrote whole words and exited 0", status);
    Check(result->size() * 4 == child.out.size() &&
              std::memcmp(result->data(), child.out.data(), child.out.size()) == 0,
          "the SPIR-V words are not what the child wrote");
  } else if (child.exit_code == 1) {
    Check(absl::IsInvalidArgument(status), "a child that exited 1", status);
    Check(status.message() == child.err.substr(0, kMessageCap),
          absl::StrCat("the messages are not the child's stderr cut at ", kMessageCap, " bytes: '",
                       status.message(), "'"));
  } else {
    Check(absl::IsInternal(status),
          absl::StrCat("a child that exited ", child.exit_code, " after ", child.out.size(),
                       " bytes of output"),
          status);
  }
}

}  // namespace
}  // namespace komputed::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  komputed::fuzz::InitProcess();
  // As the daemon does (Server::Start): writing to a child that is gone fails with EPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace komputed::fuzz;
  if (size == 0) return -1;
  const uint8_t settings = data[0];
  std::string source(reinterpret_cast<const char*>(data) + 1, size - 1);
  source.append(static_cast<size_t>((settings >> 1) & 7) * 32768, ' ');
  // What the child reads as its script: a short input's script goes on into the padding.
  const std::vector<ScriptStep> steps = ParseScript(source);
  komputed::server::GlslCompileLimits limits;
  limits.wall_time = kWallTime;
  limits.memory_bytes = (settings & 1) != 0 ? uint64_t{256} << 20 : 0;
  limits.spirv_bytes = kSpirvCap;
  limits.message_bytes = kMessageCap;
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::vector<uint32_t>> result =
      komputed::server::CompileGlslInChild(KOMPUTED_GLSLC_SCRIPT, source, "fuzz", limits);
  const absl::Duration took = absl::Now() - start;
  Check(took <= kWallTime + kMargin,
        absl::StrCat("CompileGlslInChild took ", absl::FormatDuration(took),
                     ", past its wall time ", absl::FormatDuration(kWallTime)),
        result.status());
  const Simulated child = Simulate(steps);
  if (child.busy_ms <= 100) {
    CheckResult(child, (settings & 1) != 0, result);
  } else if (child.busy_ms >= 700) {
    Check(absl::IsResourceExhausted(result.status()), "a child that ran past the wall time",
          result.status());
  }
  return 0;
}
