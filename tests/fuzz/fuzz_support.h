#pragma once
// What the fuzz targets share: the one device of the process, the check that turns a broken
// invariant into a crash that libFuzzer reports with its input, and (for the targets that drive
// the session layer) a DevicePool with a tenant account whose quotas bound every input.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "device_pool.h"
#include "komputed/core/device.h"
#include "metrics.h"
#include "quota.h"
#include "server_options.h"
#include "session.h"
#include "watchdog.h"

namespace komputed::fuzz {

// Aborts with `what` (and the status, when given) unless `condition` holds: libFuzzer saves the
// input that did it.
void Check(bool condition, absl::string_view what, const absl::Status& status = absl::OkStatus());

// Aborts unless `status` has a code that the daemon may answer bad input with: OK,
// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, RESOURCE_EXHAUSTED,
// OUT_OF_RANGE or DEADLINE_EXCEEDED (DESIGN.md, "Errors"). INTERNAL, UNKNOWN, UNAVAILABLE... on
// a healthy device mean that something reached the driver or a branch that input should not.
void CheckClientError(const absl::Status& status, absl::string_view what);

// The Vulkan device of this process (core's default choice: lavapipe without a GPU), opened on
// first use and kept until exit; exits with the reason when there is none. With the environment
// variable KOMPUTED_VALIDATION=1 the validation layers are on, and CheckNoValidationErrors()
// aborts at the first input that made them report an error.
std::shared_ptr<core::Device> FuzzDevice();
void CheckNoValidationErrors();

// What every target's LLVMFuzzerInitialize calls: protobuf's parse errors are not logged (most
// inputs are malformed), and shaderc keeps glslang's tables of built-ins for the process (without
// a compiler alive, each CompileGlsl parses them again: most of an input's time).
void InitProcess();

// The quotas that keep one input within milliseconds and a few MiB.
server::Quota FuzzQuota();

// A DevicePool on the default device, its metrics and options, and one tenant account (with
// FuzzQuota) that every session of the process charges. Made once per process (Get()).
class SessionEnv {
 public:
  static SessionEnv& Get();

  // A new session on device 0 with every queue of it, charged to the account and followed by the
  // kernel watchdog.
  std::shared_ptr<server::Session> NewSession();
  // Closes `session` and waits (a few seconds at most) until everything it held is given back:
  // the account's device memory, host memory and submissions, and the device's memory in use.
  // Aborts when something stays held: an input leaked a charge.
  void CloseAndCheck(std::shared_ptr<server::Session> session);

  const server::ServerOptions& options() const { return options_; }
  server::TenantAccount& account() { return *account_; }

 private:
  SessionEnv();

  server::ServerOptions options_;
  server::Metrics metrics_;
  std::unique_ptr<server::DevicePool> pool_;
  std::shared_ptr<server::TenantAccount> account_;
  std::shared_ptr<server::Watchdog> watchdog_;
  uint64_t sessions_ = 0;
};

}  // namespace komputed::fuzz
