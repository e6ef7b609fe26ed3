#include "backends.h"

#include <cstdlib>
#include <stdexcept>

#include "kp_test.h"
#include "support/daemon_process.h"
#include "support/scoped_env.h"

namespace kptest {
namespace {

// The daemon of a remote backend: started on first use, killed at exit. Throws when it did not
// start.
const std::string& DaemonAddress(BackendKind kind) {
  if (kind == BackendKind::kSameHost) {
    static const std::string socket_dir = [] {
      char dir[] = "/tmp/kp-test-XXXXXX";
      if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
      return std::string(dir);
    }();
    static std::unique_ptr<komputed::test_support::DaemonProcess> daemon =
        std::make_unique<komputed::test_support::DaemonProcess>(
            std::vector<std::string>{"--listen=unix:" + socket_dir + "/komputed.sock"});
    if (!daemon->started()) throw std::runtime_error("komputed did not start");
    return daemon->address();
  }
  static std::unique_ptr<komputed::test_support::DaemonProcess> daemon =
      std::make_unique<komputed::test_support::DaemonProcess>(
          std::vector<std::string>{"--shared_memory=false"});
  if (!daemon->started()) throw std::runtime_error("komputed did not start");
  return daemon->address();
}

// A hung evaluation fails its test within a minute instead of kp's default ten minutes (unless
// the environment says otherwise). kp reads the variable at the process's first evaluation.
void BoundEvaluations() { setenv("KOMPUTED_EVAL_TIMEOUT_S", "60", /*overwrite=*/0); }

}  // namespace

std::string Name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kInProcess:
      return "InProcess";
    case BackendKind::kRemote:
      return "Remote";
    case BackendKind::kSameHost:
      return "SameHost";
  }
  return "Unknown";
}

std::unique_ptr<kp::Manager> MakeManager(BackendKind kind) {
  BoundEvaluations();
  switch (kind) {
    case BackendKind::kInProcess:
      unsetenv("KOMPUTED_ADDRESS");  // which would make kp::Manager remote
      return std::make_unique<kp::Manager>();
    case BackendKind::kRemote:
    case BackendKind::kSameHost:
      return std::make_unique<kp::Manager>(kp::Remote{DaemonAddress(kind), 0, {}});
  }
  throw std::logic_error("unknown backend " + Name(kind));
}

std::unique_ptr<kp::Manager> MakeDefaultManager(BackendKind kind) {
  BoundEvaluations();
  switch (kind) {
    case BackendKind::kInProcess:
      unsetenv("KOMPUTED_ADDRESS");
      return std::make_unique<kp::Manager>();
    case BackendKind::kRemote:
    case BackendKind::kSameHost: {
      komputed::test_support::ScopedEnv address("KOMPUTED_ADDRESS", DaemonAddress(kind));
      return std::make_unique<kp::Manager>();
    }
  }
  throw std::logic_error("unknown backend " + Name(kind));
}

std::unique_ptr<kp::Manager> MakeManager(BackendKind kind, uint32_t device_index,
                                         const std::vector<uint32_t>& family_queue_indices,
                                         const std::vector<std::string>& extensions) {
  BoundEvaluations();
  switch (kind) {
    case BackendKind::kInProcess:
      unsetenv("KOMPUTED_ADDRESS");  // which would make kp::Manager remote
      return std::make_unique<kp::Manager>(device_index, family_queue_indices, extensions);
    case BackendKind::kRemote:
    case BackendKind::kSameHost:
      // Device extensions are the daemon's to choose.
      return std::make_unique<kp::Manager>(
          kp::Remote{DaemonAddress(kind), device_index, family_queue_indices});
  }
  throw std::logic_error("unknown backend " + Name(kind));
}

INSTANTIATE_TEST_SUITE_P(Backends, KpTest,
                         ::testing::Values(BackendKind::kInProcess, BackendKind::kRemote,
                                           BackendKind::kSameHost),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return Name(info.param);
                         });

}  // namespace kptest
