// komputed_watchdog_bench: what one session's runaway kernel costs the daemon's other sessions.
//
// An in-process daemon with --max_kernel_time=--limit serves two remote kp::Managers over TCP
// loopback: a neighbour that runs the tiny eval (x*2+1 over 1024 floats, synced up and back) in a
// loop, and a runaway that evaluates a kernel that never ends by itself (a loop without end on a
// GPU; on lavapipe, which ends every loop after about 65535 iterations, hours of work spread over
// 65535 x 64 workgroups). The neighbour's latency is measured on the idle daemon, during the
// runaway, and after the watchdog has stopped it. Printed: p50, p99 and max of each phase, the
// ratios against the idle daemon, and the time from the limit to the runaway's end (its eval
// fails with DEADLINE_EXCEEDED once its submission has ended) and to the neighbour's next
// completed eval. Exits 1 when the runaway is not stopped with DEADLINE_EXCEEDED or a neighbour's
// result is wrong.
//
// With --neighbour_address the neighbour runs on another daemon (another process on the same GPU):
// what a process per tenant would give, where the GPU time-slices between processes.
//
// The limit counts from the moment the runaway's submission reaches the head of its queue; the
// daemon is idle when it is submitted, so that is when it is submitted.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <kompute/Kompute.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_common.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/cancel_check.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/status.h"
#include "komputed/core/tensor.h"
#include "server.h"
#include "support/slow_kernel.h"

ABSL_FLAG(absl::Duration, limit, absl::Seconds(5), "the daemon's --max_kernel_time");
ABSL_FLAG(absl::Duration, idle, absl::Seconds(3),
          "how long the neighbour's latency is measured on the idle daemon, and again after");
ABSL_FLAG(double, dispatch_share, 0.75,
          "the daemon's --dispatch_share: the share of the GPU's invocation slots that one "
          "dispatch (the runaway's) may hold at a time; 1: no bound");
ABSL_FLAG(bool, core, false,
          "no daemon: the runaway and the neighbour (its tiny dispatch between two syncs) are "
          "core sequences on two queues of one device in this process, and the runaway is "
          "stopped by setting its cancel word at --limit: what the GPU itself gives the "
          "neighbour");
ABSL_FLAG(uint32_t, runaway_queue, 1, "with --core: the runaway's queue (the device's order)");
ABSL_FLAG(uint32_t, neighbour_queue, 0, "with --core: the neighbour's queue");
ABSL_FLAG(uint32_t, device, 0, "the physical device (Vulkan index) that the daemon serves");
ABSL_FLAG(std::string, address, "",
          "run against the daemon at this address instead of starting one in process (give "
          "--limit equal to its --max_kernel_time)");
ABSL_FLAG(std::string, neighbour_address, "",
          "where the neighbour runs: empty, on the bench's own daemon beside the runaway; else on "
          "the daemon at this address (another process, so another GPU context, on the same GPU)");

namespace komputed_bench {
namespace {

// One neighbour eval: when it completed, and how long it took.
struct Sample {
  absl::Time done;
  absl::Duration took;
};

struct Stats {
  size_t n = 0;
  absl::Duration p50, p99, max;
};

Stats Summarise(std::vector<absl::Duration> d) {
  Stats s;
  s.n = d.size();
  if (d.empty()) return s;
  std::sort(d.begin(), d.end());
  s.p50 = Quantile(d, 0.50);
  s.p99 = Quantile(d, 0.99);
  s.max = d.back();
  return s;
}

std::string Us(absl::Duration d) {
  return absl::StrCat(static_cast<int64_t>(absl::ToDoubleMicroseconds(d)), " us");
}

void Print(const char* phase, const Stats& s) {
  std::printf("  %-28s n=%-7zu p50 %-12s p99 %-12s max %s\n", phase, s.n, Us(s.p50).c_str(),
              Us(s.p99).c_str(), Us(s.max).c_str());
}

// The neighbour's tiny eval, checked. Throws kp::Error; false on a wrong result.
bool TinyEval(KpTiny& tiny, uint64_t i) {
  const TinyStep step(i);
  tiny.tensor->data()[step.k] = step.v;
  tiny.sequence->eval();
  return tiny.tensor->data()[step.k] == step.expected();
}

// Runs the neighbour's eval until `until` returns true (checked before each eval); each eval's
// sample is appended to `out`. False on a wrong result.
template <typename Until>
bool Measure(KpTiny& tiny, uint64_t& i, std::vector<Sample>& out, Until until) {
  while (!until()) {
    const absl::Time start = absl::Now();
    if (!TinyEval(tiny, i++)) return false;
    const absl::Time done = absl::Now();
    out.push_back({done, done - start});
  }
  return true;
}

std::vector<absl::Duration> Took(const std::vector<Sample>& samples) {
  std::vector<absl::Duration> d;
  d.reserve(samples.size());
  for (const Sample& s : samples) d.push_back(s.took);
  return d;
}

// --core: the same two workloads without the daemon.
absl::Status RunCore() {
  namespace core = komputed::core;
  const absl::Duration limit = absl::GetFlag(FLAGS_limit);
  const absl::Duration idle = absl::GetFlag(FLAGS_idle);
  const uint32_t index = absl::GetFlag(FLAGS_device);
  KD_ASSIGN_OR_RETURN(std::vector<core::PhysicalDeviceInfo> all, core::Device::List());
  if (index >= all.size()) return absl::InvalidArgumentError("no such device");
  core::DeviceOptions options;
  options.physical_device_index = index;
  options.dispatch_share = absl::GetFlag(FLAGS_dispatch_share);
  options.queue_families = all[index].EveryComputeQueue();
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Device> device, core::Device::Create(options));
  const uint32_t rq = absl::GetFlag(FLAGS_runaway_queue);
  const uint32_t nq = absl::GetFlag(FLAGS_neighbour_queue);
  if (rq >= device->queue_count() || nq >= device->queue_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the device has ", device->queue_count(), " compute queues"));
  }
  KD_ASSIGN_OR_RETURN(std::vector<uint32_t> tiny_spirv,
                      core::CompileGlsl(kTinyShader, "tiny.comp"));
  KD_ASSIGN_OR_RETURN(std::vector<uint32_t> runaway_spirv,
                      core::CompileGlsl(komputed::test_support::kRunawayShader, "runaway.comp"));
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::CancelWord> word, core::CancelWord::Create(device));

  auto floats = [&](float value) {
    const std::vector<float> values(1024, value);
    return core::Tensor::Create(device, core::ElementType::kFloat32, values.size(), 0,
                                core::MemoryType::kDevice, values.data());
  };
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> data, floats(1.0f));
  core::AlgorithmSpec tiny;
  tiny.tensors = {data};
  tiny.spirv = tiny_spirv;
  tiny.workgroup = {16, 1, 1};
  tiny.cancel = word;  // as the daemon builds it (a loop-free module: no check is read)
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> tiny_algorithm,
                      core::Algorithm::Create(device, tiny));
  KD_ASSIGN_OR_RETURN(std::unique_ptr<core::Sequence> neighbour,
                      core::Sequence::Create(device, nq, 0));
  KD_RETURN_IF_ERROR(neighbour->Record(core::op::SyncToDevice{{data}}));
  KD_RETURN_IF_ERROR(neighbour->Record(core::op::Dispatch{tiny_algorithm, std::nullopt}));
  KD_RETURN_IF_ERROR(neighbour->Record(core::op::SyncToHost{{data}}));

  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> out, floats(0.0f));
  core::AlgorithmSpec runaway;
  runaway.tensors = {out};
  runaway.spirv = runaway_spirv;
  runaway.workgroup = {65535, 64, 1};
  runaway.push_constants.assign(4, 0);  // iterations 0: no end
  runaway.cancel = word;
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> runaway_algorithm,
                      core::Algorithm::Create(device, runaway));
  KD_ASSIGN_OR_RETURN(std::unique_ptr<core::Sequence> runaway_seq,
                      core::Sequence::Create(device, rq, 0));
  KD_RETURN_IF_ERROR(runaway_seq->Record(core::op::Dispatch{runaway_algorithm, std::nullopt}));

  const absl::Duration timeout = absl::Seconds(30);
  auto measure = [&](std::vector<absl::Duration>& out_samples, absl::Time until) -> absl::Status {
    while (absl::Now() < until) {
      const absl::Time start = absl::Now();
      KD_RETURN_IF_ERROR(neighbour->Eval(timeout));
      out_samples.push_back(absl::Now() - start);
    }
    return absl::OkStatus();
  };
  std::vector<absl::Duration> before, during, after;
  for (int w = 0; w < 50; ++w) KD_RETURN_IF_ERROR(neighbour->Eval(timeout));
  KD_RETURN_IF_ERROR(measure(before, absl::Now() + idle));
  const absl::Time submitted = absl::Now();
  KD_RETURN_IF_ERROR(runaway_seq->Submit());
  // Until the limit; an eval still waiting then (behind the runaway on its queue) completes after
  // the stop, and counts from its start.
  std::optional<absl::Time> waiting;
  while (absl::Now() < submitted + limit) {
    const absl::Time start = absl::Now();
    absl::Status s = neighbour->Eval(submitted + limit - start + absl::Milliseconds(1));
    if (absl::IsDeadlineExceeded(s)) {
      waiting = start;
      break;
    }
    KD_RETURN_IF_ERROR(s);
    during.push_back(absl::Now() - start);
  }
  const absl::Time stop = absl::Now();
  word->Set();
  absl::Status ended = runaway_seq->Wait(timeout);
  const absl::Time end = absl::Now();
  if (waiting.has_value()) {
    KD_RETURN_IF_ERROR(neighbour->Wait(timeout));
    during.push_back(absl::Now() - *waiting);
  }
  KD_RETURN_IF_ERROR(measure(after, absl::Now() + idle));
  const core::Workgroup d = runaway_algorithm->dispatched();
  std::printf(
      "komputed_watchdog_bench --core: %s, runaway on queue %u (family %u), neighbour on "
      "queue %u (family %u), dispatch_share %g: the runaway dispatches %u x %u x %u "
      "workgroups of 64\n",
      device->properties().deviceName, rq, device->queue(rq).family, nq, device->queue(nq).family,
      options.dispatch_share, d.x, d.y, d.z);
  std::printf("the neighbour's tiny eval (core, in-process):\n");
  Print("idle", Summarise(before));
  Print("during the runaway", Summarise(during));
  Print("after the runaway", Summarise(after));
  std::printf("the runaway ended %s after its word was set: %s\n",
              absl::FormatDuration(end - stop).c_str(), ended.ToString().c_str());
  return absl::OkStatus();
}

int Run() {
  const absl::Duration limit = absl::GetFlag(FLAGS_limit);
  const absl::Duration idle = absl::GetFlag(FLAGS_idle);
  spdlog::set_level(spdlog::level::warn);
  komputed::server::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.devices = {absl::GetFlag(FLAGS_device)};
  options.max_kernel_time = limit;
  options.dispatch_share = absl::GetFlag(FLAGS_dispatch_share);
  std::unique_ptr<komputed::server::Server> server;
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    absl::StatusOr<std::unique_ptr<komputed::server::Server>> started =
        komputed::server::Server::Start(options);
    if (!started.ok()) {
      std::fprintf(stderr, "komputed_watchdog_bench: %s\n", started.status().ToString().c_str());
      return 1;
    }
    server = *std::move(started);
    address = server->address();
  }
  absl::StatusOr<std::vector<uint32_t>> tiny_spirv =
      komputed::core::CompileGlsl(kTinyShader, "tiny.comp");
  absl::StatusOr<std::vector<uint32_t>> runaway_spirv =
      komputed::core::CompileGlsl(komputed::test_support::kRunawayShader, "runaway.comp");
  if (!tiny_spirv.ok() || !runaway_spirv.ok()) {
    std::fprintf(stderr, "komputed_watchdog_bench: the shaders do not compile\n");
    return 1;
  }

  int rc = 0;
  try {
    const std::string neighbour_address = absl::GetFlag(FLAGS_neighbour_address);
    kp::Manager neighbour_mgr(neighbour_address.empty() ? address : neighbour_address);
    KpTiny tiny = MakeKpTiny(neighbour_mgr, *tiny_spirv);
    uint64_t i = 0;
    for (int w = 0; w < 50; ++w) TinyEval(tiny, i++);  // warm up

    std::vector<Sample> before, during, after;
    absl::Time end = absl::Now() + idle;
    if (!Measure(tiny, i, before, [&] { return absl::Now() >= end; })) return 1;

    // The runaway, in its own session (on a device with several queues, on another queue).
    kp::Manager runaway_mgr(address);
    auto out = runaway_mgr.tensorT<float>(std::vector<float>(1024, 0.0f));
    auto algo = runaway_mgr.algorithm<float, uint32_t>({out}, *runaway_spirv,
                                                       kp::Workgroup{65535, 64, 1}, {}, {0u});
    auto seq = runaway_mgr.sequence();
    seq->record<kp::OpAlgoDispatch>(algo);
    std::atomic<bool> ended{false};
    absl::Time submitted, runaway_end;
    int runaway_code = 0;
    std::string runaway_message;
    submitted = absl::Now();
    seq->evalAsync();
    std::thread waiter([&] {
      try {
        seq->evalAwait();
        runaway_message = "completed without being stopped";
      } catch (const kp::Error& e) {
        runaway_code = static_cast<int>(e.code());
        runaway_message = e.what();
      }
      runaway_end = absl::Now();
      ended = true;
    });
    // The waiter is joined however the neighbour's evals end (the watchdog bounds the wait).
    bool right = false;
    std::exception_ptr failed;
    try {
      right = Measure(tiny, i, during, [&] { return ended.load(); });
    } catch (...) {
      failed = std::current_exception();
    }
    waiter.join();
    if (failed) std::rethrow_exception(failed);
    if (!right) return 1;
    end = absl::Now() + idle;
    if (!Measure(tiny, i, after, [&] { return absl::Now() >= end; })) return 1;

    // The evals that began while the runaway ran (on a one-queue device the one that waits for
    // its end among them), and the first that completed after the limit.
    std::vector<Sample> while_running;
    const absl::Time limit_at = submitted + limit;
    absl::Time first_after_limit = absl::InfiniteFuture();
    for (const std::vector<Sample>* v : {&during, &after}) {
      for (const Sample& s : *v) {
        if (s.done - s.took < runaway_end) while_running.push_back(s);
        if (s.done >= limit_at) first_after_limit = std::min(first_after_limit, s.done);
      }
    }
    const Stats idle_stats = Summarise(Took(before));
    const Stats during_stats = Summarise(Took(while_running));
    const Stats after_stats = Summarise(Took(after));
    std::printf("komputed_watchdog_bench: %s, --max_kernel_time=%s, --dispatch_share=%g\n",
                neighbour_mgr.getDeviceProperties().deviceName.data(),
                absl::FormatDuration(limit).c_str(), options.dispatch_share);
    std::printf(
        "the neighbour's tiny eval (remote, TCP loopback, %s):\n",
        neighbour_address.empty() ? "on the runaway's daemon" : "on another daemon process");
    Print("idle daemon", idle_stats);
    Print("during the runaway", during_stats);
    Print("after the runaway", after_stats);
    auto ratio = [](absl::Duration a, absl::Duration b) {
      return b > absl::ZeroDuration() ? absl::FDivDuration(a, b) : 0.0;
    };
    std::printf("  during/idle: p50 %.2fx, p99 %.2fx\n", ratio(during_stats.p50, idle_stats.p50),
                ratio(during_stats.p99, idle_stats.p99));
    std::printf("the runaway: code %d after %s: %s\n", runaway_code,
                absl::FormatDuration(runaway_end - submitted).c_str(), runaway_message.c_str());
    std::printf("from the limit to the runaway's end: %s\n",
                absl::FormatDuration(runaway_end - limit_at).c_str());
    std::printf("from the limit to the neighbour's next completed eval: %s\n",
                absl::FormatDuration(first_after_limit - limit_at).c_str());
    if (runaway_code != static_cast<int>(absl::StatusCode::kDeadlineExceeded)) {
      std::printf("FAILED: the runaway was not stopped with DEADLINE_EXCEEDED\n");
      rc = 1;
    }
  } catch (const kp::Error& e) {
    std::fprintf(stderr, "komputed_watchdog_bench: %s\n", e.what());
    rc = 1;
  }
  if (server != nullptr) server->Shutdown();
  return rc;
}

}  // namespace
}  // namespace komputed_bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "What one session's runaway kernel costs the other sessions of a komputed daemon.");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_core)) {
    absl::Status s = komputed_bench::RunCore();
    if (!s.ok()) std::fprintf(stderr, "komputed_watchdog_bench: %s\n", s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  return komputed_bench::Run();
}
