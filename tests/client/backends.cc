#include "backends.h"

#include <cstdlib>
#include <stdexcept>

#include "kp_test.h"

namespace kptest {
namespace {

// A hung evaluation fails its test within a minute instead of kp's default ten minutes (unless
// the environment says otherwise). kp reads the variable at the process's first evaluation.
void BoundEvaluations() { setenv("KOMPUTED_EVAL_TIMEOUT_S", "60", /*overwrite=*/0); }

}  // namespace

std::string Name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kInProcess:
      return "InProcess";
  }
  return "Unknown";
}

std::unique_ptr<kp::Manager> MakeManager(BackendKind kind) {
  BoundEvaluations();
  switch (kind) {
    case BackendKind::kInProcess:
      unsetenv("KOMPUTED_ADDRESS");  // which would make kp::Manager remote
      return std::make_unique<kp::Manager>();
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
  }
  throw std::logic_error("unknown backend " + Name(kind));
}

INSTANTIATE_TEST_SUITE_P(Backends, KpTest, ::testing::Values(BackendKind::kInProcess),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return Name(info.param);
                         });

}  // namespace kptest
