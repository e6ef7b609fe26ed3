#include "bench_common.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace komputed_bench {

namespace {

struct Counted {
  std::mutex mu;
  std::set<pid_t> pids;
};
Counted& CountedProcesses() {
  static Counted* counted = new Counted();
  return *counted;
}

// Adds what `pid` has used so far: its CPU time from its CPU clock (nanoseconds, where
// /proc/PID/stat counts clock ticks) and its minor faults from /proc/PID/stat (field 10, after the
// command's name); nothing when the process is gone.
void AddUsageOf(pid_t pid, ProcessUsage& usage) {
  clockid_t clock;
  timespec t{};
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &t) != 0) return;
  usage.cpu_seconds += static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return;
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(name_end + 1), ' ', absl::SkipEmpty());
  uint64_t minflt = 0;
  if (fields.size() > 7 && absl::SimpleAtoi(fields[7], &minflt)) usage.minor_faults += minflt;
}

}  // namespace

void CountUsageOf(pid_t pid) {
  Counted& c = CountedProcesses();
  std::lock_guard<std::mutex> lock(c.mu);
  c.pids.insert(pid);
}

void StopCountingUsageOf(pid_t pid) {
  Counted& c = CountedProcesses();
  std::lock_guard<std::mutex> lock(c.mu);
  c.pids.erase(pid);
}

ProcessUsage ProcessUsage::Now() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  ProcessUsage u{static_cast<uint64_t>(usage.ru_minflt),
                 seconds(usage.ru_utime) + seconds(usage.ru_stime)};
  Counted& c = CountedProcesses();
  std::lock_guard<std::mutex> lock(c.mu);
  for (const pid_t pid : c.pids) AddUsageOf(pid, u);
  return u;
}

void SetTransferCounters(benchmark::State& state, const ProcessUsage& before, uint64_t bytes) {
  if (bytes == 0) return;
  const ProcessUsage now = ProcessUsage::Now();
  const double mib = static_cast<double>(bytes) / double{1 << 20};
  state.counters["faults_per_MiB"] =
      static_cast<double>(now.minor_faults - before.minor_faults) / mib;
  state.counters["cpu_s_per_GiB"] = (now.cpu_seconds - before.cpu_seconds) / (mib / 1024);
}

float Pattern(uint64_t i) { return static_cast<float>(i % 1000003); }

std::vector<float> PatternVector(uint64_t count) {
  std::vector<float> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = Pattern(i);
  return v;
}

bool MatchesPattern(const float* data, uint64_t count) {
  for (uint64_t i = 0; i < count; i += 4093) {
    if (data[i] != Pattern(i)) return false;
  }
  return data[count - 1] == Pattern(count - 1);
}

KpTiny MakeKpTiny(kp::Manager& mgr, const std::vector<uint32_t>& tiny_spirv, bool dispatch) {
  KpTiny t;
  t.dispatch = dispatch;
  t.tensor = mgr.tensor(std::vector<float>(kTinyCount, 0.0f));
  const std::vector<std::shared_ptr<kp::Tensor>> params = {t.tensor};
  t.sequence = mgr.sequence();
  t.sequence->record<kp::OpTensorSyncDevice>(params);
  if (dispatch) {
    t.algorithm =
        mgr.algorithm(params, tiny_spirv, kp::Workgroup{kTinyCount / kTinyLocalSize, 1, 1});
    t.sequence->record<kp::OpAlgoDispatch>(t.algorithm);
  }
  t.sequence->record<kp::OpTensorSyncLocal>(params);
  return t;
}

bool EvalTinyStep(KpTiny& tiny, uint64_t i) {
  const TinyStep step(i);
  float* data = tiny.tensor->data();
  data[step.k] = step.v;
  tiny.sequence->eval();
  return data[step.k] == tiny.Expected(step);
}

void RunKpTiny(benchmark::State& state, KpTiny& t, const char* what) {
  RunKpTinyPaced(state, t, what, absl::ZeroDuration());
}

void RunKpTinyPaced(benchmark::State& state, KpTiny& t, const char* what, absl::Duration gap) {
  uint64_t i = 0;
  try {
    for (auto _ : state) {
      if (gap > absl::ZeroDuration()) {
        state.PauseTiming();
        const absl::Time until = absl::Now() + gap;
        while (absl::Now() < until) {
        }
        state.ResumeTiming();
      }
      if (!EvalTinyStep(t, i++)) {
        state.SkipWithError(absl::StrCat(what, ": wrong result").c_str());
        break;
      }
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(absl::StrCat(what, ": ", e.what()).c_str());
  }
}

void AsyncLanes::Fill() {
  steps_.clear();
  next_ = 0;
  for (KpTiny& lane : lanes_) {
    steps_.emplace_back(i_++);
    lane.tensor->data()[steps_.back().k] = steps_.back().v;
    lane.sequence->evalAsync();
  }
}

bool AsyncLanes::Step() {
  KpTiny& lane = lanes_[next_];
  lane.sequence->evalAwait();
  float* data = lane.tensor->data();
  if (data[steps_[next_].k] != lane.Expected(steps_[next_])) return false;
  steps_[next_] = TinyStep(i_++);
  data[steps_[next_].k] = steps_[next_].v;
  lane.sequence->evalAsync();
  next_ = next_ + 1 == lanes_.size() ? 0 : next_ + 1;
  return true;
}

void AsyncLanes::Drain() {
  for (KpTiny& lane : lanes_) {
    try {
      lane.sequence->evalAwait();
    } catch (const kp::Error&) {
    }
  }
}

void RunKpAsync(benchmark::State& state, std::vector<KpTiny>& lanes, const char* what) {
  AsyncLanes async(lanes);
  try {
    async.Fill();  // untimed: fills the pipeline
    const ProcessUsage before = ProcessUsage::Now();
    for (auto _ : state) {
      if (!async.Step()) {
        state.SkipWithError(absl::StrCat(what, ": wrong result").c_str());
        break;
      }
    }
    state.SetItemsProcessed(state.iterations());
    if (state.iterations() > 0) {
      state.counters[kProcessCpuPerEval] = (ProcessUsage::Now().cpu_seconds - before.cpu_seconds) *
                                           1e6 / static_cast<double>(state.iterations());
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(absl::StrCat(what, ": ", e.what()).c_str());
  }
  async.Drain();
}

KpBulk::KpBulk(kp::Manager& mgr, uint64_t bytes, bool downloads)
    : bytes_(bytes), count_(bytes / sizeof(float)), src_(PatternVector(count_)) {
  if (downloads) dst_.resize(count_);
  tensor_ = mgr.tensorT<float>(count_);
  params_ = {tensor_};
  sequence_ = mgr.sequence();
  sequence_->eval<kp::OpTensorSyncDevice>(params_);
}

KpBulk::~KpBulk() {
  try {
    sequence_->destroy();
    tensor_->destroy();
  } catch (const kp::Error&) {
  }
}

void KpBulk::Upload() {
  tensor_->setRawData(src_.data());
  sequence_->eval<kp::OpTensorSyncDevice>(params_);
}

bool KpBulk::Download(uint64_t i) {
  sequence_->eval<kp::OpTensorSyncLocal>(params_);
  std::memcpy(dst_.data(), tensor_->data(), bytes_);
  const uint64_t k = (i * 7919) % count_;
  return dst_[k] == Pattern(k);
}

void KpBulk::ClearHost() { std::memset(tensor_->data(), 0, bytes_); }

bool KpBulk::DeviceHoldsPattern() {
  ClearHost();
  sequence_->eval<kp::OpTensorSyncLocal>(params_);
  return MatchesPattern(tensor_->data(), count_);
}

void RunKpUpload(benchmark::State& state, kp::Manager& mgr, const char* what, uint64_t bytes) {
  try {
    KpBulk bulk(mgr, bytes, /*downloads=*/false);
    const ProcessUsage usage = ProcessUsage::Now();
    for (auto _ : state) bulk.Upload();
    SetTransferCounters(state, usage, state.iterations() * bytes);
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
    // Untimed: the data must be on the device.
    if (!bulk.DeviceHoldsPattern()) {
      state.SkipWithError(
          absl::StrCat(what, ": the device does not hold the uploaded data").c_str());
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(absl::StrCat(what, ": ", e.what()).c_str());
  }
  mgr.clear();
}

void RunKpDownload(benchmark::State& state, kp::Manager& mgr, const char* what, uint64_t bytes) {
  try {
    KpBulk bulk(mgr, bytes, /*downloads=*/true);
    bulk.Upload();
    bulk.ClearHost();
    uint64_t i = 0;
    const ProcessUsage usage = ProcessUsage::Now();
    for (auto _ : state) {
      if (!bulk.Download(i++)) {
        state.SkipWithError(absl::StrCat(what, ": wrong data").c_str());
        break;
      }
    }
    SetTransferCounters(state, usage, state.iterations() * bytes);
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  } catch (const kp::Error& e) {
    state.SkipWithError(absl::StrCat(what, ": ", e.what()).c_str());
  }
  mgr.clear();
}

}  // namespace komputed_bench
