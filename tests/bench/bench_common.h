// What komputed_bench's source files share: the sizes, the host data pattern, and the kp
// benchmarks that run the same way through an in-process and a remote kp::Manager.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <kompute/Kompute.hpp>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace komputed_bench {

inline constexpr uint32_t kTinyCount = 1024;
inline constexpr uint32_t kTinyLocalSize = 64;
inline constexpr uint64_t kTinyBytes = kTinyCount * sizeof(float);
inline constexpr uint64_t kBulkBytes = uint64_t{256} << 20;
inline constexpr uint64_t kBulkCount = kBulkBytes / sizeof(float);
// The large transfers, run on GPUs only (a CPU device's figures at this size say nothing new).
inline constexpr uint64_t kGiBBytes = uint64_t{1} << 30;

// The tiny eval's shader: v[i] = v[i] * 2 + 1 over kTinyCount floats, kTinyLocalSize per group.
inline constexpr char kTinyShader[] = R"(
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Data { float v[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  v[i] = v[i] * 2.0 + 1.0;
}
)";

// The host's part of each tiny iteration: write element k, then (after the round trip) expect
// 2v+1 there.
struct TinyStep {
  uint32_t k;
  float v;
  explicit TinyStep(uint64_t i)
      : k(static_cast<uint32_t>(i % kTinyCount)), v(static_cast<float>(i % 4096)) {}
  float expected() const { return v * 2.0f + 1.0f; }
};

// The `q` quantile (0.5: the median) of samples sorted in ascending order; not empty.
template <typename T>
T Quantile(const std::vector<T>& sorted, double q) {
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
}

// Host data for the 256 MiB transfers: a pattern that a wrong copy does not reproduce.
float Pattern(uint64_t i);
std::vector<float> PatternVector(uint64_t count);
// Checks a spread of elements (and the last) against the pattern.
bool MatchesPattern(const float* data, uint64_t count);

// The minor page faults and CPU time (user + system, every thread) so far of this process (client
// and in-process daemons alike) and of the daemons' processes named with CountUsageOf.
struct ProcessUsage {
  uint64_t minor_faults = 0;
  double cpu_seconds = 0;
  static ProcessUsage Now();
};
// From now on ProcessUsage counts `pid` (a daemon of the benchmark's, in a process of its own)
// with this process; StopCountingUsageOf before it ends. Thread-safe.
void CountUsageOf(pid_t pid);
void StopCountingUsageOf(pid_t pid);
// The transfer benchmarks' counters since `before`, over `bytes` moved: faults_per_MiB (on a VM a
// fault costs microseconds; a path that touches fresh memory on every transfer shows here) and
// cpu_s_per_GiB (CPU spent per GiB, less sensitive than wall time to other load on the host).
void SetTransferCounters(benchmark::State& state, const ProcessUsage& before, uint64_t bytes);

// The tiny sequence through kp: a tensor of kTinyCount floats, the x*2+1 algorithm over it and a
// sequence recorded once with sync to device, dispatch, sync to host; without `dispatch`, only the
// two syncs (the data comes back as it went: work that takes the device next to no time).
struct KpTiny {
  std::shared_ptr<kp::TensorT<float>> tensor;
  std::shared_ptr<kp::Algorithm> algorithm;
  std::shared_ptr<kp::Sequence> sequence;
  bool dispatch = true;
  // What an element written as `step.v` reads after an eval.
  float Expected(const TinyStep& step) const { return dispatch ? step.expected() : step.v; }
};

// Throws kp::Error.
KpTiny MakeKpTiny(kp::Manager& mgr, const std::vector<uint32_t>& tiny_spirv, bool dispatch = true);

// One eval of `tiny` as step `i` of a run: writes one input, evaluates, and says whether the
// output read back is right. Throws kp::Error.
bool EvalTinyStep(KpTiny& tiny, uint64_t i);

// One sequence->eval() per iteration, each writing one input and checking one output.
void RunKpTiny(benchmark::State& state, KpTiny& tiny, const char* what);
// The same with `gap` between two evals, not timed, spent polling the clock: the device idles
// between submissions as it does between the evals of a client one round trip away.
void RunKpTinyPaced(benchmark::State& state, KpTiny& tiny, const char* what, absl::Duration gap);

// Keeps one sequence of each of `lanes` in flight: Fill evalAsync's each; Step awaits the oldest
// (round robin), checks its result and submits it again; Drain awaits every one still in flight.
// Fill and Step throw kp::Error; Drain ignores errors (the sequences are left idle).
class AsyncLanes {
 public:
  explicit AsyncLanes(std::vector<KpTiny>& lanes) : lanes_(lanes) {}
  void Fill();
  bool Step();  // false: a wrong result
  void Drain();

 private:
  std::vector<KpTiny>& lanes_;
  std::vector<TinyStep> steps_;
  uint64_t i_ = 0;
  size_t next_ = 0;
};

// Pipelined asynchronous evals: every lane's sequence is evalAsync'ed, then each iteration awaits
// the oldest (round robin), checks its result and submits it again, so that lanes.size() evals
// are always in flight. One item per completed eval; the counter kProcessCpuPerEval is the
// CPU time of the process and its daemons (ProcessUsage: every thread of the client, the daemons
// and the driver) per eval, in us.
inline constexpr char kProcessCpuPerEval[] = "process_cpu_us";
void RunKpAsync(benchmark::State& state, std::vector<KpTiny>& lanes, const char* what);

// A tensor of `bytes` (a multiple of 4) through kp, moved one step at a time: what RunKpUpload and
// RunKpDownload time, for rows that take its transfers in turn with others. The constructor makes
// the pattern and creates the tensor on the device (untimed: a remote Manager creates it with its
// first eval); `downloads`: room for Download's copy too. Throws kp::Error, as each step does.
class KpBulk {
 public:
  KpBulk(kp::Manager& mgr, uint64_t bytes, bool downloads);
  ~KpBulk();  // destroys the sequence and the tensor (errors ignored)
  KpBulk(const KpBulk&) = delete;
  KpBulk& operator=(const KpBulk&) = delete;

  // The host memcpy of the pattern into the tensor's host data, then eval<OpTensorSyncDevice>.
  void Upload();
  // eval<OpTensorSyncLocal>, then the host memcpy out of the tensor's host data; whether the
  // element that step `i` looks at (a spread over the tensor) holds the pattern.
  bool Download(uint64_t i);
  // Zeroes the tensor's host data, so that a download that follows shows what the device holds.
  void ClearHost();
  // Whether the device holds the pattern: the host data zeroed, then all of it downloaded.
  bool DeviceHoldsPattern();

 private:
  uint64_t bytes_;
  uint64_t count_;
  std::shared_ptr<kp::TensorT<float>> tensor_;
  std::vector<std::shared_ptr<kp::Tensor>> params_;
  std::shared_ptr<kp::Sequence> sequence_;
  std::vector<float> src_;
  std::vector<float> dst_;
};

// `bytes` (a multiple of 4) through kp: eval<OpTensorSyncDevice> / eval<OpTensorSyncLocal> on an
// eDevice tensor, the host memcpy into (out of) the tensor's host data included. `mgr` is
// in-process or remote.
void RunKpUpload(benchmark::State& state, kp::Manager& mgr, const char* what,
                 uint64_t bytes = kBulkBytes);
void RunKpDownload(benchmark::State& state, kp::Manager& mgr, const char* what,
                   uint64_t bytes = kBulkBytes);

}  // namespace komputed_bench
