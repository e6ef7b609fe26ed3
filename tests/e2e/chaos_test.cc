// Faults and load against the real daemon, as a demanding user of a shared GPU service sees them:
// clients killed at random points leave nothing behind while other sessions keep getting exact
// results; many clients evaluating at once see no error; and SIGTERM under load loses no
// evaluation that the daemon accepted. Every wait is bounded; the figures (runtimes, rates, time
// for memory to return) are printed, not asserted.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <kompute/Kompute.hpp>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/poll.h"
#include "support/process.h"
#include "support/slow_kernel.h"
#include "support/stubs.h"

namespace {

namespace ts = komputed::test_support;
namespace v1 = komputed::v1;
using ts::DaemonProcess;
using ts::PollUntil;
using ts::Samples;

// out[i] = in[i] * 2654435761 + k (wrapping): exact in integers, so every element is checked.
constexpr char kHashShader[] = R"(
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer In { uint a[]; };
layout(set = 0, binding = 1) writeonly buffer Out { uint b[]; };
layout(push_constant) uniform Push { uint k; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * 2654435761u + k;
}
)";

const std::vector<uint32_t>& HashSpirv() {
  static const auto* spirv = new std::vector<uint32_t>(kp::compileSource(kHashShader));
  return *spirv;
}

const std::vector<uint32_t>& SlowSpirv() {
  static const auto* spirv = new std::vector<uint32_t>(kp::compileSource(ts::kSlowShader));
  return *spirv;
}

// kHashShader over n elements (a multiple of 64) in `mgr`: a sequence recorded once (sync the
// input up, dispatch, sync the output back) and evaluated with fresh input each round. Data above
// 4 MiB moves through the chunked WriteTensor / ReadTensor streams. Used by one thread at a time.
class HashPipeline {
 public:
  HashPipeline(kp::Manager& mgr, uint32_t n, uint32_t k) : k_(k) {
    in_ = mgr.tensorT<uint32_t>(std::vector<uint32_t>(n, 0));
    out_ = mgr.tensorT<uint32_t>(std::vector<uint32_t>(n, 0));
    std::vector<std::shared_ptr<kp::Tensor>> params = {in_, out_};
    auto algo =
        mgr.algorithm<float, uint32_t>(params, HashSpirv(), kp::Workgroup{n / 64, 1, 1}, {}, {k});
    seq_ = mgr.sequence();
    seq_->record<kp::OpTensorSyncDevice>(std::vector<std::shared_ptr<kp::Tensor>>{in_})
        ->record<kp::OpAlgoDispatch>(algo)
        ->record<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{out_});
  }

  // Writes the input of round `round` (distinct per `tag` and round).
  void Fill(uint32_t tag, uint32_t round) {
    uint32_t* in = in_->data();
    const uint32_t base = tag * 1000003u + round * 7919u;
    for (uint32_t i = 0; i < in_->size(); ++i) in[i] = base + i * 31u;
  }
  // Whether every output element is what the input of the last Fill gives.
  bool Correct() {
    const uint32_t* in = in_->data();
    const uint32_t* out = out_->data();
    for (uint32_t i = 0; i < in_->size(); ++i) {
      if (out[i] != in[i] * 2654435761u + k_) return false;
    }
    return true;
  }
  // One synchronous round; throws kp::Error.
  bool Run(uint32_t tag, uint32_t round) {
    Fill(tag, round);
    std::fill(out_->data(), out_->data() + out_->size(), 0u);
    seq_->eval();
    return Correct();
  }
  kp::Sequence& sequence() { return *seq_; }

 private:
  uint32_t k_;
  std::shared_ptr<kp::TensorT<uint32_t>> in_;
  std::shared_ptr<kp::TensorT<uint32_t>> out_;
  std::shared_ptr<kp::Sequence> seq_;
};

// kSlowShader doing `work` over n elements, recorded as sync up, dispatch, sync back.
class SlowPipeline {
 public:
  SlowPipeline(kp::Manager& mgr, const ts::SlowWork& work, uint32_t n) : work_(work) {
    t_ = mgr.tensorT<uint32_t>(std::vector<uint32_t>(n, 0));
    std::vector<std::shared_ptr<kp::Tensor>> params = {t_};
    auto algo = mgr.algorithm<float, uint32_t>(params, SlowSpirv(), kp::Workgroup{n, 1, 1}, {},
                                               {work.units, work.reps});
    seq_ = mgr.sequence();
    seq_->record<kp::OpTensorSyncDevice>(params)
        ->record<kp::OpAlgoDispatch>(algo)
        ->record<kp::OpTensorSyncLocal>(params);
  }
  // One synchronous round; whether the first and last elements are right. Throws kp::Error.
  bool Run(uint32_t round) {
    uint32_t* v = t_->data();
    const uint32_t n = static_cast<uint32_t>(t_->size());
    for (uint32_t i = 0; i < n; ++i) v[i] = round * 7919u + i;
    seq_->eval();
    return v[0] == ts::Lcg(round * 7919u, work_) &&
           v[n - 1] == ts::Lcg(round * 7919u + n - 1, work_);
  }

 private:
  ts::SlowWork work_;
  std::shared_ptr<kp::TensorT<uint32_t>> t_;
  std::shared_ptr<kp::Sequence> seq_;
};

// The slow kernel's elements (one invocation each).
constexpr uint32_t kSlowCount = 1024;

bool DeviceIsCpu(ts::Stubs& stubs) {
  grpc::ClientContext context;
  v1::ListDevicesResponse response;
  const grpc::Status s = stubs.devices->ListDevices(&context, v1::ListDevicesRequest(), &response);
  return s.ok() && response.devices_size() > 0 &&
         response.devices(0).device_type() == VK_PHYSICAL_DEVICE_TYPE_CPU;
}

// Slow-kernel work of about `target` per eval on the daemon's device 0.
ts::SlowWork CalibrateSlowWork(const std::string& address, absl::Duration target) {
  ts::Stubs stubs(address);
  const bool cpu = DeviceIsCpu(stubs);
  kp::Manager mgr{address};
  return ts::SlowWorkFor(target, cpu, [&](const ts::SlowWork& work) {
    SlowPipeline p(mgr, work, kSlowCount);
    EXPECT_TRUE(p.Run(0));  // the first also pays for the pipeline's compilation
    double seconds = 1e9;
    for (uint32_t round = 1; round <= 2; ++round) {
      const absl::Time start = absl::Now();
      EXPECT_TRUE(p.Run(round));
      seconds = std::min(seconds, absl::ToDoubleSeconds(absl::Now() - start));
    }
    return seconds;
  });
}

// Device 0's memory in use (ListDevices), or UINT64_MAX when the call fails.
uint64_t MemoryInUse(ts::Stubs& stubs) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListDevicesResponse response;
  const grpc::Status s = stubs.devices->ListDevices(&context, v1::ListDevicesRequest(), &response);
  if (!s.ok() || response.devices_size() == 0) return UINT64_MAX;
  return response.devices(0).memory_in_use_bytes();
}

// The ids of the open sessions (ListSessions), or {"error"} when the call fails.
std::vector<std::string> OpenSessions(ts::Stubs& stubs) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListSessionsResponse response;
  const grpc::Status s =
      stubs.sessions->ListSessions(&context, v1::ListSessionsRequest(), &response);
  if (!s.ok()) return {"error"};
  std::vector<std::string> ids;
  for (const auto& session : response.sessions()) ids.push_back(session.session_id());
  return ids;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// komputed_rpcs_total from a scrape: "METHOD CODE" -> count.
std::map<std::string, double> RpcCounts(const std::string& metrics) {
  std::map<std::string, double> counts;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, "komputed_rpcs_total{")) continue;
    auto label = [&](absl::string_view name) -> std::string {
      const std::string key = absl::StrCat(name, "=\"");
      const size_t at = line.find(key);
      if (at == absl::string_view::npos) return "";
      const size_t from = at + key.size();
      return std::string(line.substr(from, line.find('"', from) - from));
    };
    double value = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) continue;
    counts[absl::StrCat(label("method"), " ", label("code"))] += value;
  }
  return counts;
}

// Resident memory of process `pid` in MiB (0 when unknown): printed, never asserted.
double ResidentMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      double kib = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtod(parts[1], &kib)) return kib / 1024;
    }
  }
  return 0;
}

std::string ChaosClient() {
  const char* env = std::getenv("KOMPUTED_CHAOS_CLIENT");
  return env != nullptr && env[0] != '\0' ? env : CHAOS_CLIENT;
}

// The random seed: $KOMPUTED_CHAOS_SEED, else a fresh one (printed, so that a run can be
// repeated).
uint32_t Seed() {
  const char* env = std::getenv("KOMPUTED_CHAOS_SEED");
  uint32_t seed = 0;
  if (env == nullptr || !absl::SimpleAtoi(env, &seed)) seed = std::random_device()();
  std::printf("chaos seed: %u (KOMPUTED_CHAOS_SEED=%u repeats it)\n", seed, seed);
  return seed;
}

// Sessions that keep evaluating kHashShader while a test runs, each checking every element of
// every result. Witness i uses the unary Eval when i is even and evalAsync/evalAwait on the
// Execute stream when odd. The Managers live until Close(), so that their sessions (and their
// memory) stay open after Stop().
class Witnesses {
 public:
  Witnesses(const std::string& address, int count) : tallies_(count) {
    for (int i = 0; i < count; ++i) {
      managers_.push_back(std::make_unique<kp::Manager>(address));
      pipelines_.push_back(std::make_unique<HashPipeline>(*managers_.back(), 256, 17u + i));
    }
    for (int i = 0; i < count; ++i) threads_.emplace_back([this, i] { Loop(i); });
  }
  ~Witnesses() {
    Stop();
    Close();
  }

  // Waits until each witness has `n` correct results.
  bool WaitEach(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [&] {
      return std::all_of(tallies_.begin(), tallies_.end(),
                         [&](const Tally& t) { return t.ok >= n || !t.errors.empty(); });
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  // Ends the loops (idempotent).
  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // Closes their sessions (after Stop).
  void Close() {
    pipelines_.clear();
    managers_.clear();
  }
  int64_t TotalOk() {
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    for (const Tally& t : tallies_) n += t.ok;
    return n;
  }
  // The slowest round of any witness, in milliseconds.
  double MaxMs() {
    absl::MutexLock lock(&mu_);
    double ms = 0;
    for (const Tally& t : tallies_) ms = std::max(ms, t.max_ms);
    return ms;
  }
  // Every failure any witness saw: wrong results and errors.
  std::vector<std::string> Errors() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> all;
    for (size_t i = 0; i < tallies_.size(); ++i) {
      for (const std::string& e : tallies_[i].errors) all.push_back(absl::StrCat(i, ": ", e));
    }
    return all;
  }

 private:
  struct Tally {
    int64_t ok = 0;
    double max_ms = 0;  // the slowest round
    std::vector<std::string> errors;
  };

  void Loop(int i) {
    HashPipeline& p = *pipelines_[i];
    for (uint32_t round = 0; !stop_.load(); ++round) {
      std::string error;
      const absl::Time start = absl::Now();
      try {
        if (i % 2 == 0) {
          if (!p.Run(1000 + i, round)) error = absl::StrCat("round ", round, ": wrong result");
        } else {
          p.Fill(1000 + i, round);
          p.sequence().evalAsync();
          p.sequence().evalAwait();
          if (!p.Correct()) error = absl::StrCat("round ", round, ": wrong result (async)");
        }
      } catch (const kp::Error& e) {
        error =
            absl::StrCat("round ", round, ": code ", static_cast<int>(e.code()), ": ", e.what());
      }
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      absl::MutexLock lock(&mu_);
      tallies_[i].max_ms = std::max(tallies_[i].max_ms, ms);
      if (!error.empty()) {
        tallies_[i].errors.push_back(error);
        return;  // its session may be gone: one error is enough
      }
      ++tallies_[i].ok;
    }
  }

  std::vector<std::unique_ptr<kp::Manager>> managers_;
  std::vector<std::unique_ptr<HashPipeline>> pipelines_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<Tally> tallies_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------
// 100 clients killed at random points.

enum class Mode { kUpload, kStream, kEval };
constexpr const char* kModeNames[] = {"upload", "stream", "eval"};

// One chaos client: what it does, and when it is killed.
struct Victim {
  Mode mode;
  uint32_t upload_mib = 0;
  // Killed this long after it printed "ready", or, when early, after it started (so perhaps
  // before or while it opens its session).
  absl::Duration kill_after;
  bool early = false;
};

// What happened to one chaos client.
struct Fate {
  bool ready = false;
  bool mid_round = false;  // killed after a "begin" with no "done"
  int rounds_done = 0;
  std::string failure;  // non-empty: it failed before the kill, or was not killed by it
};

Fate RunVictim(const std::string& address, const Victim& v, const ts::SlowWork& work, int null_fd) {
  std::vector<std::string> argv = {ChaosClient(), address, kModeNames[static_cast<int>(v.mode)]};
  if (v.mode == Mode::kUpload) {
    argv.push_back(absl::StrCat(v.upload_mib));
  } else {
    argv.push_back(absl::StrCat(work.units));
    argv.push_back(absl::StrCat(kSlowCount));
  }
  Fate fate;
  int out = -1;
  const pid_t pid = ts::Spawn(argv, &out, null_fd);
  if (pid < 0) {
    fate.failure = "could not start";
    return fate;
  }
  std::vector<std::string> lines;
  if (!v.early) {
    lines.push_back(ts::ReadLine(out, absl::Now() + absl::Seconds(60)));
    if (lines.back() != "ready") fate.failure = absl::StrCat("not ready: '", lines.back(), "'");
  }
  // The random point of the kill (a sleep here is the fault injected, not a synchronisation).
  if (fate.failure.empty()) absl::SleepFor(v.kill_after);
  kill(pid, SIGKILL);
  const int status = ts::WaitExit(pid, absl::Seconds(30));
  for (std::string line = ts::ReadLine(out, absl::Now() + absl::Seconds(10)); !line.empty();
       line = ts::ReadLine(out, absl::Now() + absl::Seconds(10))) {
    lines.push_back(line);
  }
  close(out);
  for (const std::string& line : lines) {
    if (line == "ready") fate.ready = true;
    if (line == "done") ++fate.rounds_done;
    if (line == "wrong" || absl::StartsWith(line, "error")) fate.failure = line;
  }
  fate.mid_round = !lines.empty() && lines.back() == "begin";
  if (fate.failure.empty() &&
      !(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
    fate.failure = absl::StrCat("ended by itself, wait status ", status);
  }
  return fate;
}

TEST(Chaos, HundredClientsKilledAtRandomPointsLeaveNothingBehind) {
  constexpr int kVictims = 100;
  constexpr int kConcurrent = 8;
  constexpr int kWitnesses = 3;
  DaemonProcess daemon({"--session_idle_timeout=2s"});
  ASSERT_TRUE(daemon.started());
  ts::Stubs stubs(daemon.address());
  const absl::Time test_start = absl::Now();
  const ts::SlowWork work = CalibrateSlowWork(daemon.address(), absl::Milliseconds(150));
  ASSERT_TRUE(PollUntil(absl::Seconds(30), [&] { return OpenSessions(stubs).empty(); }));
  const uint64_t empty_memory = MemoryInUse(stubs);
  ASSERT_NE(empty_memory, UINT64_MAX);

  Witnesses witnesses(daemon.address(), kWitnesses);
  ASSERT_TRUE(witnesses.WaitEach(5, absl::Seconds(60)));
  ASSERT_THAT(witnesses.Errors(), testing::IsEmpty());
  const uint64_t baseline = MemoryInUse(stubs);
  const std::vector<std::string> witness_sessions = OpenSessions(stubs);
  ASSERT_EQ(witness_sessions.size(), size_t{kWitnesses});
  const Samples before = Samples::From(daemon);
  const double rss_before = ResidentMiB(daemon.pid());
  const int64_t witness_ok_before = witnesses.TotalOk();

  // The victims: modes in turn, sizes and kill points at random; one in ten killed at a random
  // point after it started rather than after it got ready.
  std::mt19937 rng(Seed());
  std::vector<Victim> victims(kVictims);
  for (int i = 0; i < kVictims; ++i) {
    Victim& v = victims[i];
    v.mode = static_cast<Mode>(i % 3);
    v.upload_mib = std::uniform_int_distribution<uint32_t>(16, 64)(rng);
    v.early = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
    v.kill_after =
        absl::Milliseconds(std::uniform_int_distribution<int>(0, v.early ? 400 : 800)(rng));
  }
  std::vector<Fate> fates(kVictims);
  std::atomic<int> next{0};
  const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  const absl::Time chaos_start = absl::Now();
  std::vector<std::thread> workers;
  for (int w = 0; w < kConcurrent; ++w) {
    workers.emplace_back([&] {
      for (int i = next.fetch_add(1); i < kVictims; i = next.fetch_add(1)) {
        fates[i] = RunVictim(daemon.address(), victims[i], work, null_fd);
      }
    });
  }
  for (auto& t : workers) t.join();
  close(null_fd);
  const absl::Time last_kill = absl::Now();
  const double rss_after_kills = ResidentMiB(daemon.pid());

  // Every victim's session is reaped and its memory returned; the queue empties.
  uint64_t memory = 0;
  std::vector<std::string> sessions;
  double metric_memory = -1, queue_depth = -1, queued_bytes = -1;
  // The daemon's account: every session a victim opened was reaped for idleness, no other way.
  // (A session leaves ListSessions a moment before the reaper has counted it; and a victim killed
  // while it opened one may leave the daemon opening it after the kill.)
  double opened = 0, reaped = 0, open_now = 0;
  const bool settled = PollUntil(absl::Seconds(90), [&] {
    memory = MemoryInUse(stubs);
    sessions = OpenSessions(stubs);
    const Samples s = Samples::From(daemon);
    metric_memory = s.Get("komputed_device_memory_used_bytes", {{"device", "0"}});
    queue_depth = s.Sum("komputed_queue_depth", {{"device", "0"}});
    queued_bytes = s.Get("komputed_execute_queued_bytes");
    opened = s.Get("komputed_sessions_opened_total") - before.Get("komputed_sessions_opened_total");
    reaped = s.Get("komputed_sessions_reaped_total", {{"reason", "idle"}}) -
             before.Get("komputed_sessions_reaped_total", {{"reason", "idle"}});
    open_now = s.Get("komputed_sessions_open");
    return memory == baseline && sessions.size() == witness_sessions.size() &&
           metric_memory == static_cast<double>(baseline) && queue_depth == 0 &&
           queued_bytes == 0 && reaped == opened && open_now == kWitnesses;
  });
  const absl::Time settled_at = absl::Now();
  const int64_t witness_ok_during = witnesses.TotalOk() - witness_ok_before;
  witnesses.Stop();
  EXPECT_TRUE(settled) << "memory in use " << memory << " (baseline " << baseline << "), metric "
                       << metric_memory << ", sessions " << sessions.size() << " (metric "
                       << open_now << "), queue depth " << queue_depth << ", queued event bytes "
                       << queued_bytes << ", victims' sessions opened " << opened << ", reaped "
                       << reaped;
  EXPECT_THAT(sessions, testing::UnorderedElementsAreArray(witness_sessions));
  EXPECT_THAT(witnesses.Errors(), testing::IsEmpty());
  if (HasFailure()) {
    std::string reaped;
    for (absl::string_view line : absl::StrSplit(daemon.Log(), '\n')) {
      for (const std::string& id : witness_sessions) {
        if (absl::StrContains(line, id.substr(0, 8))) absl::StrAppend(&reaped, line, "\n");
      }
    }
    std::printf("the witnesses in the daemon's log:\n%s", reaped.c_str());
  }

  // Victims: each was killed by the test, none saw an error or a wrong result first.
  int ready = 0;
  int mid[3] = {0, 0, 0}, between[3] = {0, 0, 0}, rounds[3] = {0, 0, 0};
  for (int i = 0; i < kVictims; ++i) {
    const Fate& f = fates[i];
    EXPECT_EQ(f.failure, "") << "victim " << i << " (" << kModeNames[int(victims[i].mode)] << ")";
    const int m = static_cast<int>(victims[i].mode);
    ready += f.ready;
    if (f.ready) (f.mid_round ? mid : between)[m]++;
    rounds[m] += f.rounds_done;
  }
  // The kills landed where they were meant to: inside uploads, streams and evals.
  for (int m = 0; m < 3; ++m) EXPECT_GT(mid[m], 0) << kModeNames[m];

  EXPECT_GE(opened, ready);
  EXPECT_LE(opened, kVictims);
  const std::map<std::string, double> rpcs = RpcCounts(ts::ScrapeMetrics(daemon.metrics_address()));
  std::string cancelled;
  for (const auto& [key, n] : rpcs) {
    // Killed clients' calls end CANCELLED; nothing of theirs is a malformed request or a fault
    // of the daemon.
    EXPECT_FALSE(absl::EndsWith(key, " INVALID_ARGUMENT") || absl::EndsWith(key, " INTERNAL") ||
                 absl::EndsWith(key, " UNKNOWN") || absl::EndsWith(key, " DATA_LOSS"))
        << key << " " << n;
    if (!absl::EndsWith(key, " OK")) absl::StrAppend(&cancelled, "\n    ", key, ": ", n);
  }

  // It still serves: health, and a new session's exact eval.
  EXPECT_EQ(Health(daemon.address()), grpc::health::v1::HealthCheckResponse::SERVING);
  {
    kp::Manager mgr{daemon.address()};
    HashPipeline p(mgr, 4096, 99);
    EXPECT_TRUE(p.Run(7, 1));
  }
  // With the witnesses gone too, the device holds nothing.
  witnesses.Close();
  EXPECT_TRUE(
      PollUntil(absl::Seconds(30),
                [&] { return OpenSessions(stubs).empty() && MemoryInUse(stubs) == empty_memory; }))
      << "memory in use " << MemoryInUse(stubs) << ", sessions " << OpenSessions(stubs).size();
  EXPECT_EQ(daemon.WaitExit(absl::ZeroDuration()), -1) << "the daemon exited";

  const double chaos_s = absl::ToDoubleSeconds(last_kill - chaos_start);
  std::printf(
      "chaos: %d clients (%d at a time) killed in %.1fs; %d got ready; slow kernel %u units "
      "(~150ms)\n"
      "  killed mid-round / between rounds / rounds completed: upload %d/%d/%d, stream %d/%d/%d, "
      "eval %d/%d/%d\n"
      "  sessions opened by them %.0f, reaped idle %.0f; memory back to baseline (%llu bytes) "
      "%.2fs after the last kill\n"
      "  witnesses: %lld exact evals during the chaos (%.0f/s, slowest %.0f ms)\n"
      "  daemon RSS %.0f MiB before, %.0f MiB after the kills, %.0f MiB at the end\n"
      "  non-OK RPCs:%s\n"
      "  test runtime %.1fs\n",
      kVictims, kConcurrent, chaos_s, ready, work.units, mid[0], between[0], rounds[0], mid[1],
      between[1], rounds[1], mid[2], between[2], rounds[2], opened, reaped,
      static_cast<unsigned long long>(baseline), absl::ToDoubleSeconds(settled_at - last_kill),
      static_cast<long long>(witness_ok_during),
      witness_ok_during / absl::ToDoubleSeconds(settled_at - chaos_start), witnesses.MaxMs(),
      rss_before, rss_after_kills, ResidentMiB(daemon.pid()), cancelled.c_str(),
      absl::ToDoubleSeconds(absl::Now() - test_start));
}

// ---------------------------------------------------------------------------------------------
// 64 clients x 1000 evals.

TEST(Chaos, SixtyFourClientsThousandEvalsEachWithoutError) {
  constexpr int kClients = 64;
  constexpr int kEvals = 1000;
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  HashSpirv();  // compiled once, before the clock starts
  std::atomic<int> ready{0};
  absl::Notification go;
  std::atomic<int64_t> wrong{0};
  std::vector<std::string> errors(kClients);
  std::vector<std::vector<double>> latencies(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        kp::Manager mgr{daemon.address()};
        HashPipeline p(mgr, 64, static_cast<uint32_t>(c));
        latencies[c].reserve(kEvals);
        ++ready;
        go.WaitForNotificationWithTimeout(absl::Seconds(120));
        for (uint32_t i = 0; i < kEvals; ++i) {
          const absl::Time start = absl::Now();
          const bool correct = p.Run(static_cast<uint32_t>(c), i);
          latencies[c].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
          if (!correct) ++wrong;
        }
      } catch (const kp::Error& e) {
        errors[c] = absl::StrCat("code ", static_cast<int>(e.code()), ": ", e.what());
      }
    });
  }
  const bool all_ready = PollUntil(absl::Seconds(120), [&] { return ready.load() == kClients; });
  const absl::Time start = absl::Now();
  go.Notify();
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_TRUE(all_ready);
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(errors[c], "") << "client " << c;
  EXPECT_EQ(wrong.load(), 0);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  EXPECT_EQ(all.size(), size_t{kClients} * kEvals);

  // The daemon's side: every call succeeded.
  const std::string scraped = ts::ScrapeMetrics(daemon.metrics_address());
  const std::map<std::string, double> rpcs = RpcCounts(scraped);
  // Evals of these same-host clients go on the shared-memory socket's channel, or over gRPC.
  double evals_ok = ts::Samples(scraped).Get("komputed_same_host_evals_total");
  for (const auto& [key, n] : rpcs) {
    EXPECT_TRUE(absl::EndsWith(key, " OK")) << key << " " << n;
    if (absl::StartsWith(key, "komputed.v1.Sequences/Eval ")) evals_ok += n;
  }
  EXPECT_GE(evals_ok, double{kClients} * kEvals);

  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  std::printf(
      "load: %d clients x %d evals (sync up, dispatch, sync back; 64 uints each) in %.1fs: "
      "%.0f evals/s, 0 errors, 0 wrong\n"
      "  latency ms: p50 %.2f, p90 %.2f, p99 %.2f, max %.1f\n",
      kClients, kEvals, seconds, all.size() / seconds, pct(0.5), pct(0.9), pct(0.99),
      all.empty() ? 0.0 : all.back());
}

// ---------------------------------------------------------------------------------------------
// SIGTERM under load.

// What one looper saw: evaluations completed exactly, the one refusal that ended it, or
// anything else (an evaluation that the daemon may have accepted and did not complete well).
struct Outcomes {
  int64_t completed = 0;
  int64_t refused = 0;
  std::string refusal;
  std::vector<std::string> lost;
};

// A refusal of work that the daemon did not accept: its drain refusing it (UNAVAILABLE,
// "komputed is draining"), or, once it has stopped listening, a call that found no daemon to
// connect to (UNAVAILABLE from the channel).
bool IsRefusal(const kp::Error& e) {
  if (e.code() != kp::ErrorCode::kUnavailable) return false;
  const std::string m = e.what();
  return absl::StrContains(m, "komputed is draining") ||
         absl::StrContains(m, "failed to connect to all addresses") ||
         absl::StrContains(m, "Connection refused");
}

TEST(Chaos, SigtermUnderLoadLosesNoAcceptedEvaluation) {
  constexpr int kUnary = 14;  // small evals, unary
  constexpr int kAsync = 4;   // two small sequences in flight on the Execute stream
  constexpr int kBig = 2;     // 8 MiB up and back through the chunked streams
  constexpr int kSlow = 2;    // a ~1 s kernel
  constexpr int kLoopers = kUnary + kAsync + kBig + kSlow;
  constexpr absl::Duration kDrainTimeout = absl::Seconds(20);
  DaemonProcess daemon({absl::StrCat("--drain_timeout=", absl::FormatDuration(kDrainTimeout))});
  ASSERT_TRUE(daemon.started());
  const ts::SlowWork work = CalibrateSlowWork(daemon.address(), absl::Milliseconds(1000));
  HashSpirv();
  // A client idle through the drain, which calls again once the daemon has gone.
  auto idle = std::make_unique<kp::Manager>(daemon.address());
  auto idle_pipeline = std::make_unique<HashPipeline>(*idle, 256, 5);
  ASSERT_TRUE(idle_pipeline->Run(5, 0));

  absl::Mutex mu;
  std::vector<Outcomes> outcomes(kLoopers);
  std::vector<std::thread> threads;
  for (int c = 0; c < kLoopers; ++c) {
    threads.emplace_back([&, c] {
      // One round of this looper's kind; whether its results were exact. Throws kp::Error.
      std::function<bool(uint32_t)> round;
      std::unique_ptr<kp::Manager> mgr;
      std::vector<std::unique_ptr<HashPipeline>> hash;
      std::unique_ptr<SlowPipeline> slow;
      try {
        // 22 clients connect at once: a connection that the loopback refuses outright gets
        // another try (this is setup, before the SIGTERM, not what the test measures).
        for (int attempt = 0;; ++attempt) {
          try {
            mgr = std::make_unique<kp::Manager>(daemon.address());
            break;
          } catch (const kp::Error& e) {
            if (attempt == 2 || e.code() != kp::ErrorCode::kUnavailable) throw;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
        if (c < kUnary) {
          hash.push_back(std::make_unique<HashPipeline>(*mgr, 256, c));
          round = [&](uint32_t r) { return hash[0]->Run(c, r); };
        } else if (c < kUnary + kAsync) {
          for (int i = 0; i < 2; ++i) hash.push_back(std::make_unique<HashPipeline>(*mgr, 256, c));
          round = [&](uint32_t r) {
            for (int i = 0; i < 2; ++i) {
              hash[i]->Fill(c * 2 + i, r);
              hash[i]->sequence().evalAsync();
            }
            bool correct = true;
            for (int i = 0; i < 2; ++i) {
              hash[i]->sequence().evalAwait();
              correct = correct && hash[i]->Correct();
            }
            return correct;
          };
        } else if (c < kUnary + kAsync + kBig) {
          hash.push_back(std::make_unique<HashPipeline>(*mgr, 2u << 20, c));
          round = [&](uint32_t r) { return hash[0]->Run(c, r); };
        } else {
          slow = std::make_unique<SlowPipeline>(*mgr, work, kSlowCount);
          round = [&](uint32_t r) { return slow->Run(r); };
        }
      } catch (const kp::Error& e) {
        absl::MutexLock lock(&mu);
        outcomes[c].lost.push_back(absl::StrCat("setup: ", e.what()));
        return;
      }
      for (uint32_t r = 0;; ++r) {
        std::string failure;
        bool refused = false;
        try {
          if (!round(r)) failure = absl::StrCat("round ", r, ": wrong result");
        } catch (const kp::Error& e) {
          refused = IsRefusal(e);
          failure =
              absl::StrCat("round ", r, ": code ", static_cast<int>(e.code()), ": ", e.what());
        }
        absl::MutexLock lock(&mu);
        Outcomes& o = outcomes[c];
        if (failure.empty()) {
          ++o.completed;
          continue;
        }
        if (refused) {
          ++o.refused;
          o.refusal = failure;
        } else {
          o.lost.push_back(failure);
        }
        break;
      }
      // Its session: closed now if the daemon still answers, else freed by the daemon's exit.
    });
  }
  struct Cleanup {
    std::function<void()> fn;
    ~Cleanup() { fn(); }
  } cleanup{[&] {
    if (daemon.pid() > 0) kill(daemon.pid(), SIGKILL);
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }};

  // Every looper is going (slow ones included), and evaluations are in flight: SIGTERM.
  ASSERT_TRUE(PollUntil(absl::Seconds(120), [&] {
    absl::MutexLock lock(&mu);
    return std::all_of(outcomes.begin(), outcomes.end(),
                       [](const Outcomes& o) { return o.completed >= 2 || !o.lost.empty(); });
  }));
  ASSERT_TRUE(PollUntil(absl::Seconds(30), [&] {
    return Samples::From(daemon).Sum("komputed_queue_depth", {{"device", "0"}}) >= 2;
  }));
  int64_t completed_before = 0;
  {
    absl::MutexLock lock(&mu);
    for (const Outcomes& o : outcomes) completed_before += o.completed;
  }
  const absl::Time sigterm = absl::Now();
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  const int status = daemon.WaitExit(kDrainTimeout + absl::Seconds(30));
  const double exit_s = absl::ToDoubleSeconds(absl::Now() - sigterm);
  ASSERT_NE(status, -1) << "komputed did not exit; log:\n" << daemon.Log();
  for (auto& t : threads) t.join();

  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status << "; log:\n" << daemon.Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string log = daemon.Log();
  EXPECT_THAT(log, testing::HasSubstr("komputed drained in"));  // not "drain timeout"

  // After the drain the daemon is gone: a client's next eval, unary or on the Execute stream, is
  // UNAVAILABLE from its channel (nothing was accepted).
  std::string after_exit[2];
  for (int async = 0; async < 2; ++async) {
    try {
      if (async == 1) {
        idle_pipeline->Fill(5, 2);
        idle_pipeline->sequence().evalAsync();
        idle_pipeline->sequence().evalAwait();
      } else {
        idle_pipeline->Run(5, 1);
      }
      ADD_FAILURE() << "an eval succeeded after the daemon exited";
    } catch (const kp::Error& e) {
      EXPECT_EQ(e.code(), kp::ErrorCode::kUnavailable) << e.what();
      // Why, in words a person can act on: there is no daemon to connect to.
      EXPECT_THAT(e.what(), testing::HasSubstr("connect")) << (async == 1 ? "evalAsync" : "eval");
      after_exit[async] = e.what();
    }
  }
  idle_pipeline.reset();
  idle.reset();
  int64_t completed = 0, refused = 0;
  std::map<std::string, int> refusal_kinds;
  for (int c = 0; c < kLoopers; ++c) {
    const Outcomes& o = outcomes[c];
    EXPECT_THAT(o.lost, testing::IsEmpty()) << "looper " << c;
    EXPECT_EQ(o.refused, 1) << "looper " << c;
    completed += o.completed;
    refused += o.refused;
    if (!o.refusal.empty()) {
      refusal_kinds[absl::StrContains(o.refusal, "komputed is draining") ? "draining"
                                                                         : "no daemon to reach"]++;
    }
  }
  std::string in_flight = "?";
  const size_t at = log.find("waiting up to");
  if (at != std::string::npos) in_flight = log.substr(at, log.find('\n', at) - at);
  std::string kinds;
  for (const auto& [kind, n] : refusal_kinds) {
    absl::StrAppend(&kinds, kinds.empty() ? "" : ", ", kind, " ", n);
  }
  std::printf(
      "drain: %d loopers (%d unary, %d async x2, %d x 8 MiB, %d slow ~1s); SIGTERM after %lld "
      "evals; %s\n"
      "  %lld evaluations completed exactly (%lld after the SIGTERM), %lld refused (%s), 0 lost; "
      "exit 0 %.2fs after the SIGTERM (drain timeout %s)\n"
      "  after the exit: eval '%s'; evalAsync '%s'\n",
      kLoopers, kUnary, kAsync, kBig, kSlow, static_cast<long long>(completed_before),
      in_flight.c_str(), static_cast<long long>(completed),
      static_cast<long long>(completed - completed_before), static_cast<long long>(refused),
      kinds.c_str(), exit_s, absl::FormatDuration(kDrainTimeout).c_str(), after_exit[0].c_str(),
      after_exit[1].c_str());
}

}  // namespace
