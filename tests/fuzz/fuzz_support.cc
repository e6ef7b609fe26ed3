#include "fuzz_support.h"

#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>
#include <shaderc/shaderc.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace komputed::fuzz {

void Check(bool condition, absl::string_view what, const absl::Status& status) {
  if (condition) return;
  std::fprintf(stderr, "fuzz check failed: %.*s%s%s\n", static_cast<int>(what.size()), what.data(),
               status.ok() ? "" : ": ", status.ok() ? "" : status.ToString().c_str());
  std::abort();
}

void CheckClientError(const absl::Status& status, absl::string_view what) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDeadlineExceeded:
      return;
    default:
      Check(false, absl::StrCat(what, ": an error that bad input must not cause"), status);
  }
}

void InitProcess() {
  google::protobuf::SetLogHandler(nullptr);
  static shaderc::Compiler* const kept = new shaderc::Compiler();
  (void)kept;
}

std::shared_ptr<core::Device> FuzzDevice() {
  static const std::shared_ptr<core::Device>* device = [] {
    absl::StatusOr<std::shared_ptr<core::Device>> d = core::Device::Create({});
    if (!d.ok()) {
      std::fprintf(stderr, "the fuzz targets need a Vulkan device: %s\n",
                   d.status().ToString().c_str());
      std::exit(1);
    }
    return new std::shared_ptr<core::Device>(*std::move(d));
  }();
  return *device;
}

void CheckNoValidationErrors() {
  static uint64_t seen = core::ValidationErrorCount();
  const uint64_t now = core::ValidationErrorCount();
  Check(now == seen, "the Vulkan validation layers reported an error (see above)");
}

server::Quota FuzzQuota() {
  server::Quota q;
  q.device_memory_bytes = 4 << 20;
  q.host_memory_bytes = 4 << 20;
  q.objects_per_session = 64;
  q.inflight_submissions = 4;
  q.ops_per_sequence = 64;
  q.tensor_bytes = 256 << 10;
  q.dispatch_invocations = 1 << 16;
  q.source_bytes = 16 << 10;
  q.client_name_bytes = 64;
  return q;
}

SessionEnv& SessionEnv::Get() {
  static SessionEnv* env = new SessionEnv();
  return *env;
}

SessionEnv::SessionEnv() {
  options_.eval_timeout = absl::Milliseconds(200);
  options_.eval_inline_wait = absl::Milliseconds(1);
  // Recovery of a lost device is not the target; a loss shows as a check failure instead.
  options_.device_recovery_interval = absl::ZeroDuration();
  options_.max_message_bytes = 1 << 20;
  options_.max_kernel_time = absl::Milliseconds(100);
  options_.watchdog_interval = absl::Milliseconds(10);
  options_.default_quota = FuzzQuota();
  auto pool = server::DevicePool::Create(options_, &metrics_);
  if (!pool.ok()) {
    std::fprintf(stderr, "the fuzz targets need a Vulkan device: %s\n",
                 pool.status().ToString().c_str());
    std::exit(1);
  }
  pool_ = *std::move(pool);
  account_ = std::make_shared<server::TenantAccount>("fuzz", FuzzQuota(), &metrics_);
  // The kernel watchdog, as the daemon runs it: shaders get its cancel checks, and a submission
  // past max_kernel_time is stopped (the daemon then closes the session; here the input's eval
  // fails and the session closes at the input's end).
  watchdog_ = server::Watchdog::Create(options_.watchdog_interval,
                                       [](const std::string&, absl::Duration) {});
}

std::shared_ptr<server::Session> SessionEnv::NewSession() {
  server::PooledDevice& device = pool_->at(0);
  std::vector<uint32_t> wanted;  // every queue of every compute family, as the daemon serves
  for (uint32_t f = 0; f < device.info().queue_families.size(); ++f) {
    if (!device.info().HasCompute(f)) continue;
    for (uint32_t q = 0; q < device.info().queue_families[f].queueCount; ++q) wanted.push_back(f);
  }
  auto queues = device.AcquireQueues(wanted);
  Check(queues.ok(), "resolving the device's queues", queues.status());
  server::SessionFacts facts;
  facts.id = absl::StrCat("fuzz-", ++sessions_);
  facts.device = &device;
  facts.instance = device.instance();
  facts.queues = *std::move(queues);
  facts.client_name = "fuzz";
  facts.account = account_;
  facts.watchdog = watchdog_;
  return std::make_shared<server::Session>(std::move(facts), options_, &metrics_, nullptr);
}

void SessionEnv::CloseAndCheck(std::shared_ptr<server::Session> session) {
  session->Close();
  session->device().ReleaseQueues(session->queues());
  Check(session->memory_bytes() == 0, "a closed session still counts memory");
  session.reset();
  // Submissions that ran past their eval's timeout are still held by the waiter until they
  // complete; everything must be given back once they have.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto held = [&] {
    return account_->used(server::Counted::kDeviceMemory) != 0 ||
           account_->used(server::Counted::kHostMemory) != 0 ||
           account_->used(server::Counted::kSubmissions) != 0 || pool_->at(0).memory_in_use() != 0;
  };
  while (held() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  Check(!held(), absl::StrCat("after the session closed, still held: device memory ",
                              account_->used(server::Counted::kDeviceMemory), ", host memory ",
                              account_->used(server::Counted::kHostMemory), ", submissions ",
                              account_->used(server::Counted::kSubmissions),
                              ", device memory in use ", pool_->at(0).memory_in_use()));
  Check(pool_->at(0).usable(), "the device was lost");
}

}  // namespace komputed::fuzz
