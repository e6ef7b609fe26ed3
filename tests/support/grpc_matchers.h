#pragma once
// gMock matchers for grpc::Status (or anything with ok(), error_code() and error_message()):
// EXPECT_THAT(status, IsOk()), EXPECT_THAT(status, HasCode(grpc::StatusCode::NOT_FOUND)). A
// mismatch prints the status's code and message.

#include <gmock/gmock.h>

namespace komputed::test_support {

MATCHER(IsOk, "") {
  if (arg.ok()) return true;
  *result_listener << "code " << static_cast<int>(arg.error_code()) << ": " << arg.error_message();
  return false;
}

MATCHER_P(HasCode, code, "") {
  if (arg.error_code() == code) return true;
  *result_listener << "code " << static_cast<int>(arg.error_code()) << ": " << arg.error_message();
  return false;
}

}  // namespace komputed::test_support
