#pragma once
// The scripted stand-in for komputed_glslc that fuzz_glsl_pipe runs as the child of
// CompileGlslInChild: the "source" it is sent begins with a script of what to do, step by step
// (read stdin, write stdout or stderr, close one of them, sleep, spin, exit, raise a signal), so
// that the fuzzer drives both sides of the pipes. Header-only: the child (glslc_script.cc) runs
// the script, the fuzz target reads the same script to know what the result must be.
//
// The script: byte 0 is the number of steps n (at most kMaxSteps), then two bytes per step: its
// kind (ScriptStep::Kind, modulo their number) and its amount. Whatever follows is more source.

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace komputed::fuzz {

struct ScriptStep {
  enum Kind : uint8_t {
    kRead,      // read up to amount * 64 bytes of stdin
    kOut,       // write amount * 16 bytes to stdout (ScriptOutByte)
    kErr,       // write amount * 4 bytes to stderr (ScriptErrByte)
    kCloseIn,   // close stdin
    kCloseOut,  // close stdout
    kCloseErr,  // close stderr
    kSleep,     // sleep amount * 4 ms
    kSpin,      // use the CPU for amount ms
    kExit,      // exit with ScriptExitCode(amount)
    kSignal,    // raise ScriptSignal(amount)
    kKinds
  };
  Kind kind = kRead;
  uint8_t amount = 0;
};

inline constexpr size_t kMaxScriptSteps = 32;
// The child's sleeps and spins add up to at most this (further ones are skipped).
inline constexpr int kMaxScriptMs = 2000;

inline std::vector<ScriptStep> ParseScript(const std::string& header) {
  std::vector<ScriptStep> steps;
  if (header.empty()) return steps;
  const size_t n = static_cast<uint8_t>(header[0]) % (kMaxScriptSteps + 1);
  for (size_t i = 0; i < n && 2 + 2 * i < header.size(); ++i) {
    ScriptStep step;
    step.kind =
        static_cast<ScriptStep::Kind>(static_cast<uint8_t>(header[1 + 2 * i]) % ScriptStep::kKinds);
    step.amount = static_cast<uint8_t>(header[2 + 2 * i]);
    steps.push_back(step);
  }
  return steps;
}

// The script's bytes: what the child reads before it starts.
inline size_t ScriptBytes(uint8_t first) { return 1 + 2 * (first % (kMaxScriptSteps + 1)); }

inline char ScriptOutByte(size_t at) { return static_cast<char>((at * 7 + 1) & 0xff); }
inline char ScriptErrByte(size_t at) { return static_cast<char>('a' + at % 26); }
inline int ScriptExitCode(uint8_t amount) {
  static constexpr int kCodes[] = {0, 1, 2, 127};
  return kCodes[amount % 4];
}
inline int ScriptSignal(uint8_t amount) {
  static constexpr int kSignals[] = {SIGSEGV, SIGABRT, SIGKILL, SIGXCPU, SIGTERM};
  return kSignals[amount % 5];
}

}  // namespace komputed::fuzz
