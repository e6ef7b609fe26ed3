#pragma once
// The kp behaviour suite: KpTest is parametrised over the backends (backends.h) and gives every
// test a fresh Manager on the default device. Shared helpers for the *_test.cc files.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kompute/Kompute.hpp>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends.h"

namespace kptest {

using TensorList = std::vector<std::shared_ptr<kp::Tensor>>;

// "kInvalidArgument" etc.
std::string CodeName(kp::ErrorCode code);

// Every tensor memory type, and its name ("eDevice" etc.).
inline constexpr kp::Tensor::TensorTypes kAllMemoryTypes[] = {
    kp::Tensor::TensorTypes::eDevice, kp::Tensor::TensorTypes::eHost,
    kp::Tensor::TensorTypes::eStorage, kp::Tensor::TensorTypes::eDeviceAndHost};
std::string MemoryName(kp::Tensor::TensorTypes type);
void PrintTo(BackendKind kind, std::ostream* os);

// Success when `f()` throws a kp::Error with `code`; otherwise says what happened instead.
template <typename F>
::testing::AssertionResult ThrowsKpError(kp::ErrorCode code, F&& f) {
  try {
    f();
  } catch (const kp::Error& e) {
    if (e.code() == code) return ::testing::AssertionSuccess() << e.what();
    return ::testing::AssertionFailure() << "threw kp::Error " << CodeName(e.code()) << " ("
                                         << e.what() << "), expected " << CodeName(code);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-kp exception (" << e.what()
                                         << "), expected kp::Error " << CodeName(code);
  }
  return ::testing::AssertionFailure() << "did not throw; expected kp::Error " << CodeName(code);
}

// EXPECT_KP_ERROR(kInvalidArgument, statement...): the statement throws kp::Error with that code.
#define EXPECT_KP_ERROR(code, ...) \
  EXPECT_TRUE(::kptest::ThrowsKpError(::kp::ErrorCode::code, [&] { __VA_ARGS__; }))

// Every test gets its own Manager on the backend under test.
class KpTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override { mgr_ = MakeManager(GetParam()); }
  void TearDown() override { mgr_.reset(); }

  kp::Manager& mgr() { return *mgr_; }

  std::unique_ptr<kp::Manager> mgr_;
};

}  // namespace kptest
