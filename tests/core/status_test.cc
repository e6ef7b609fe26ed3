// Tests of status.h: VkResult names, their mapping onto status codes, and the macros.

#include "komputed/core/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(VkStatus, Names) {
  EXPECT_EQ(VkResultName(VK_SUCCESS), "VK_SUCCESS");
  EXPECT_EQ(VkResultName(VK_TIMEOUT), "VK_TIMEOUT");
  EXPECT_EQ(VkResultName(VK_ERROR_DEVICE_LOST), "VK_ERROR_DEVICE_LOST");
  EXPECT_EQ(VkResultName(VK_ERROR_OUT_OF_DEVICE_MEMORY), "VK_ERROR_OUT_OF_DEVICE_MEMORY");
  EXPECT_EQ(VkResultName(static_cast<VkResult>(-123456)), "VK_RESULT_UNKNOWN");
}

TEST(VkStatus, SuccessIsOk) { EXPECT_TRUE(VkStatus(VK_SUCCESS, "vkAnything").ok()); }

TEST(VkStatus, Mapping) {
  const std::pair<VkResult, absl::StatusCode> cases[] = {
      {VK_ERROR_DEVICE_LOST, absl::StatusCode::kUnavailable},
      {VK_ERROR_OUT_OF_HOST_MEMORY, absl::StatusCode::kResourceExhausted},
      {VK_ERROR_OUT_OF_DEVICE_MEMORY, absl::StatusCode::kResourceExhausted},
      {VK_ERROR_OUT_OF_POOL_MEMORY, absl::StatusCode::kResourceExhausted},
      {VK_ERROR_TOO_MANY_OBJECTS, absl::StatusCode::kResourceExhausted},
      {VK_ERROR_FRAGMENTED_POOL, absl::StatusCode::kResourceExhausted},
      {VK_ERROR_FRAGMENTATION, absl::StatusCode::kResourceExhausted},
      {VK_TIMEOUT, absl::StatusCode::kDeadlineExceeded},
      {VK_ERROR_LAYER_NOT_PRESENT, absl::StatusCode::kFailedPrecondition},
      {VK_ERROR_EXTENSION_NOT_PRESENT, absl::StatusCode::kFailedPrecondition},
      {VK_ERROR_FEATURE_NOT_PRESENT, absl::StatusCode::kFailedPrecondition},
      {VK_ERROR_INCOMPATIBLE_DRIVER, absl::StatusCode::kFailedPrecondition},
      {VK_ERROR_FORMAT_NOT_SUPPORTED, absl::StatusCode::kFailedPrecondition},
      {VK_ERROR_INITIALIZATION_FAILED, absl::StatusCode::kInternal},
      {VK_ERROR_UNKNOWN, absl::StatusCode::kInternal},
  };
  for (const auto& [result, code] : cases) {
    SCOPED_TRACE(std::string(VkResultName(result)));
    const absl::Status s = VkStatus(result, "vkSomething");
    EXPECT_EQ(s.code(), code);
    // The message names the call and the result, by name and number.
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("vkSomething failed"), HasSubstr(std::string(VkResultName(result))),
                      HasSubstr(std::to_string(static_cast<int>(result)))));
  }
}

absl::Status ReturnIfError(absl::Status inner, bool* reached_end) {
  KD_RETURN_IF_ERROR(inner);
  *reached_end = true;
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnIfError) {
  bool reached = false;
  EXPECT_TRUE(ReturnIfError(absl::OkStatus(), &reached).ok());
  EXPECT_TRUE(reached);
  reached = false;
  EXPECT_EQ(ReturnIfError(absl::NotFoundError("x"), &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(reached);
}

absl::StatusOr<int> Doubled(absl::StatusOr<int> in) {
  KD_ASSIGN_OR_RETURN(int value, std::move(in));
  KD_ASSIGN_OR_RETURN(const int again, absl::StatusOr<int>(value));  // twice in one function
  return value + again;
}

TEST(StatusMacros, AssignOrReturn) {
  absl::StatusOr<int> ok = Doubled(21);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 42);
  EXPECT_EQ(Doubled(absl::AbortedError("no")).status().code(), absl::StatusCode::kAborted);
}

absl::Status VkCall(VkResult result) {
  KD_VK_RETURN_IF_ERROR(result, "vkFake");
  return absl::OkStatus();
}

TEST(StatusMacros, VkReturnIfError) {
  EXPECT_TRUE(VkCall(VK_SUCCESS).ok());
  const absl::Status s = VkCall(VK_ERROR_DEVICE_LOST);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("vkFake"));
  // Non-error results other than VK_SUCCESS are failures too (e.g. VK_TIMEOUT from a wait).
  EXPECT_EQ(VkCall(VK_TIMEOUT).code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace komputed::core
