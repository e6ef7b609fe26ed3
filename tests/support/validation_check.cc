// Linked into a test program, this makes a run under VK_LAYER_KHRONOS_validation
// (KOMPUTED_VALIDATION=1, synchronization validation included) fail on any error the layer
// reports: in the test's own process, where core logs each one as "vulkan validation: ..." at
// error level (counted by a sink on spdlog's default logger, which the kp library shares), or in
// a komputed daemon that the test started (DaemonProcess::ValidationErrors reads its log). The
// tests during which errors appeared are named at the end. Without the variable it does nothing.

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/daemon_process.h"

namespace komputed::test_support {
namespace {

class ValidationErrorSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  uint64_t count() const { return count_.load(); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    constexpr char kPrefix[] = "vulkan validation";
    if (msg.level >= spdlog::level::err && msg.payload.size() >= sizeof(kPrefix) - 1 &&
        std::memcmp(msg.payload.data(), kPrefix, sizeof(kPrefix) - 1) == 0) {
      count_.fetch_add(1);
    }
  }
  void flush_() override {}

 private:
  std::atomic<uint64_t> count_{0};
};

uint64_t Errors(const ValidationErrorSink& sink) {
  return sink.count() + DaemonProcess::ValidationErrors();
}

// Names the tests during whose run the count grew.
class Attribution : public ::testing::EmptyTestEventListener {
 public:
  explicit Attribution(std::shared_ptr<ValidationErrorSink> sink) : sink_(std::move(sink)) {}
  void OnTestStart(const ::testing::TestInfo&) override { before_ = Errors(*sink_); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const uint64_t now = Errors(*sink_);
    if (now > before_) {
      culprits_.push_back(std::string(info.test_suite_name()) + "." + info.name() + " (" +
                          std::to_string(now - before_) + ")");
    }
  }
  const std::vector<std::string>& culprits() const { return culprits_; }

 private:
  std::shared_ptr<ValidationErrorSink> sink_;
  uint64_t before_ = 0;
  std::vector<std::string> culprits_;
};

class ValidationCheck : public ::testing::Environment {
 public:
  void SetUp() override {
    sink_ = std::make_shared<ValidationErrorSink>();
    spdlog::default_logger()->sinks().push_back(sink_);
    attribution_ = new Attribution(sink_);
    ::testing::UnitTest::GetInstance()->listeners().Append(attribution_);  // owned by gtest
  }
  void TearDown() override {
    const uint64_t errors = Errors(*sink_);
    if (errors == 0) return;
    std::string culprits;
    for (const std::string& c : attribution_->culprits()) culprits += "\n  " + c;
    ADD_FAILURE() << errors << " Vulkan validation error(s) were reported (see the log above"
                  << " and the daemons' logs); during:" << culprits;
  }

 private:
  std::shared_ptr<ValidationErrorSink> sink_;
  Attribution* attribution_ = nullptr;
};

bool ValidationRequested() {
  const char* v = std::getenv("KOMPUTED_VALIDATION");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

[[maybe_unused]] const bool kRegistered = [] {
  if (ValidationRequested()) ::testing::AddGlobalTestEnvironment(new ValidationCheck());
  return true;
}();

}  // namespace
}  // namespace komputed::test_support
