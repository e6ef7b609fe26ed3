// komputed_scale_bench: one daemon (the komputed binary, a child process) and many sessions.
//
// Each of --sessions kp::Managers (one connection each) creates a tensor of 1024 floats, the tiny
// x*2+1 algorithm over it and a sequence that syncs it up, dispatches and syncs it back, and
// evaluates it once asynchronously (opening its stream). Measured:
// - the daemon's resident memory after each of those stages for every session, per session (a
//   lavapipe tensor's device memory and compiled pipeline are host memory and count here; on a
//   GPU they mostly do not), and its threads with no session and with every session open and idle
//   (none per session is the design). One session goes through every stage first and stays open,
//   so that what the daemon pays once (code paged in on first use, a driver's compiler, the
//   pipeline that sessions of one tenant share) is not counted per session; each stage also
//   reports how much of its memory is the process's own (anonymous and shared memory, the
//   per-session part) and how much is files mapped in (code);
// - then every session evaluates at once, each from a client thread of its own, evalAsync and
//   evalAwait in a loop for --seconds: the p50 and p99 of the evaluations' latency, and their
//   ratio (target p99/p50 <= 5).
//
// Exits 1 when a session fails or an evaluation's result is wrong.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <kompute/Kompute.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_common.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/stubs.h"

ABSL_FLAG(int, sessions, 256, "sessions, each a kp::Manager with a connection of its own");
ABSL_FLAG(double, seconds, 5, "how long every session evaluates at once");
ABSL_FLAG(std::vector<std::string>, daemon_flags, {},
          "flags for the daemon, comma-separated (--daemon_flags=--pool_tensor_memory=false)");

namespace komputed_bench {
namespace {

using komputed::test_support::DaemonProcess;
using komputed::test_support::Samples;

// A field of /proc/PID/status ("VmRSS", "Threads"): its number (kB for sizes), or -1.
int64_t ProcStatus(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    std::string value = line.substr(field.size() + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value = value.substr(0, value.find_first_of(" \t"));
    int64_t n = -1;
    return absl::SimpleAtoi(value, &n) ? n : -1;
  }
  return -1;
}

struct Session {
  std::unique_ptr<komputed::test_support::Stubs> bare;  // a connection without a session
  std::unique_ptr<kp::Manager> mgr;
  KpTiny tiny;
};

// A connection of its own (not shared with other channels to the daemon) with one Ping on it.
void BareConnection(Session& x, const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  x.bare = std::make_unique<komputed::test_support::Stubs>(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  komputed::v1::PingResponse pong;
  const grpc::Status status = x.bare->sessions->Ping(&ctx, komputed::v1::PingRequest(), &pong);
  if (!status.ok())
    throw std::runtime_error("a Ping on a bare connection failed: " + status.error_message());
}

// One evaluation of the tiny sequence, asynchronously: false when its result is wrong.
bool EvalOnce(KpTiny& tiny, uint64_t i) {
  const TinyStep step(i);
  tiny.tensor->data()[step.k] = step.v;
  tiny.sequence->evalAsync();
  tiny.sequence->evalAwait();
  return tiny.tensor->data()[step.k] == step.expected();
}

int Run() {
  const int sessions = absl::GetFlag(FLAGS_sessions);
  DaemonProcess daemon(absl::GetFlag(FLAGS_daemon_flags));
  if (!daemon.started()) {
    std::fprintf(stderr, "the daemon did not start\n");
    return 1;
  }
  const std::vector<uint32_t> spirv = kp::compileSource(kTinyShader);
  // Each stage for one session (the warm-up), then for every session: what each costs per session.
  Session warm;
  std::vector<Session> all(sessions);
  struct Memory {
    int64_t rss = 0, own = 0;  // KiB: resident, of which anonymous and shared memory
  };
  auto memory = [&] {
    return Memory{ProcStatus(daemon.pid(), "VmRSS"),
                  ProcStatus(daemon.pid(), "RssAnon") + ProcStatus(daemon.pid(), "RssShmem")};
  };
  struct Stage {
    const char* what;
    std::function<void(Session&, int)> step;
  };
  const std::vector<Stage> stages = {
      {"a session (kp::Manager, a connection of its own)",
       [&](Session& x, int) {
         x.mgr = std::make_unique<kp::Manager>(kp::Remote{daemon.address(), 0, {}});
       }},
      {"a tensor of 1024 floats",
       [](Session& x, int) {
         x.tiny.tensor = x.mgr->tensorT<float>(std::vector<float>(kTinyCount, 0.0f));
       }},
      {"the tiny algorithm",
       [&](Session& x, int) {
         x.tiny.algorithm = x.mgr->algorithm({x.tiny.tensor}, spirv,
                                             kp::Workgroup{kTinyCount / kTinyLocalSize, 1, 1});
       }},
      {"a sequence: sync up, dispatch, sync back; one async eval",
       [](Session& x, int s) {
         const std::vector<std::shared_ptr<kp::Tensor>> params = {x.tiny.tensor};
         x.tiny.sequence = x.mgr->sequence();
         x.tiny.sequence->record<kp::OpTensorSyncDevice>(params)
             ->record<kp::OpAlgoDispatch>(x.tiny.algorithm)
             ->record<kp::OpTensorSyncLocal>(params);
         if (!EvalOnce(x.tiny, s)) throw std::runtime_error("a first evaluation came back wrong");
       }},
  };
  for (const Stage& stage : stages) stage.step(warm, 0);
  absl::SleepFor(absl::Milliseconds(300));
  const Memory start = memory();
  const int64_t rss0 = start.rss;
  const int64_t threads0 = ProcStatus(daemon.pid(), "Threads");
  std::printf(
      "daemon RSS: %lld KiB with one warm-up session; then for each of %d sessions "
      "(resident; of it the daemon's own memory, the rest files mapped in):\n",
      static_cast<long long>(rss0), sessions);
  Memory before = start;
  for (const Stage& stage : stages) {
    const absl::Time began = absl::Now();
    for (int s = 0; s < sessions; ++s) stage.step(all[s], s);
    const absl::Duration took = absl::Now() - began;
    absl::SleepFor(absl::Milliseconds(300));
    const Memory now = memory();
    std::printf("  %-58s %7.1f KiB; own %7.1f KiB per session  (%s for all)\n", stage.what,
                static_cast<double>(now.rss - before.rss) / sessions,
                static_cast<double>(now.own - before.own) / sessions,
                absl::FormatDuration(took).c_str());
    before = now;
  }
  const Memory idle = before;
  const int64_t rss1 = idle.rss;
  const int64_t threads1 = ProcStatus(daemon.pid(), "Threads");
  std::printf(
      "daemon RSS with every session just idle: %lld KiB, %.1f KiB per session; own memory "
      "%.1f KiB per session\n",
      static_cast<long long>(rss1), static_cast<double>(rss1 - rss0) / sessions,
      static_cast<double>(idle.own - start.own) / sessions);
  // The daemon's default --sequence_release_after (10 s): idle sequences give their command
  // buffers back within 1.5 times it (the warm-up session's too, a 1/sessions share of one).
  absl::SleepFor(absl::Seconds(16));
  const Memory released = memory();
  std::printf(
      "daemon RSS with every session idle for 16 s (%.0f command buffers given back): %lld KiB, "
      "%.1f KiB per session; own memory %.1f KiB per session  target <= 64\n",
      Samples::From(daemon).Get("komputed_sequences_released_total"),
      static_cast<long long>(released.rss), static_cast<double>(released.rss - rss0) / sessions,
      static_cast<double>(released.own - start.own) / sessions);
  // Of a session's memory, its connection's: as much again in bare connections, each with one
  // Ping on it, then closed.
  for (Session& x : all) BareConnection(x, daemon.address());
  absl::SleepFor(absl::Milliseconds(300));
  const Memory connected = memory();
  std::printf(
      "  of which a connection (as much again in bare ones, one Ping each): %.1f KiB; own "
      "%.1f KiB per connection\n",
      static_cast<double>(connected.rss - released.rss) / sessions,
      static_cast<double>(connected.own - released.own) / sessions);
  for (Session& x : all) x.bare.reset();
  std::printf("daemon threads: %lld idle, %lld with the sessions\n",
              static_cast<long long>(threads0), static_cast<long long>(threads1));

  std::atomic<bool> failed{false};
  absl::Mutex mu;
  std::vector<double> micros;
  const absl::Time until = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      std::vector<double> mine;
      try {
        for (uint64_t i = 0; absl::Now() < until && !failed; ++i) {
          const absl::Time start = absl::Now();
          if (!EvalOnce(all[s].tiny, i)) {
            failed = true;
            std::fprintf(stderr, "session %d: a result came back wrong\n", s);
          }
          mine.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
        }
      } catch (const std::exception& e) {
        failed = true;
        std::fprintf(stderr, "session %d: %s\n", s, e.what());
      }
      absl::MutexLock lock(&mu);
      micros.insert(micros.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  if (failed || micros.empty()) return 1;
  std::sort(micros.begin(), micros.end());
  auto at = [&](double q) { return Quantile(micros, q); };
  std::printf(
      "%d sessions evaluating at once: %zu evals, %.0f/s, p50 %.0f us, p99 %.0f us, "
      "max %.0f us\n",
      sessions, micros.size(), micros.size() / absl::GetFlag(FLAGS_seconds), at(0.5), at(0.99),
      micros.back());
  std::printf("ratio p99/p50 (%d sessions): %.2f  target <= 5\n", sessions, at(0.99) / at(0.5));
  std::printf("ratio daemon threads with %d sessions / idle: %.2f\n", sessions,
              static_cast<double>(threads1) / threads0);
  all.clear();
  return 0;
}

}  // namespace
}  // namespace komputed_bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Many sessions on one daemon: memory, threads and eval latency.");
  absl::ParseCommandLine(argc, argv);
  try {
    return komputed_bench::Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "komputed_scale_bench: %s\n", e.what());
    return 1;
  }
}
