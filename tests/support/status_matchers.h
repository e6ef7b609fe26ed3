#pragma once
// absl::Status assertions shared by the tests: EXPECT_THAT(x, StatusIs(code[, message matcher])),
// ASSERT_OK(status), ASSERT_OK_AND_ASSIGN(lhs, statusor).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace komputed {

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
inline const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P(StatusIs, code, absl::StrCat("has status code ", absl::StatusCodeToString(code))) {
  const absl::Status& s = ToStatus(arg);
  *result_listener << "whose status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message,
           absl::StrCat("has status code ", absl::StatusCodeToString(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message))) {
  const absl::Status& s = ToStatus(arg);
  *result_listener << "whose status is " << s;
  return s.code() == code && ::testing::Matches(message)(std::string(s.message()));
}

#define KD_TEST_CONCAT_INNER(a, b) a##b
#define KD_TEST_CONCAT(a, b) KD_TEST_CONCAT_INNER(a, b)
#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const absl::Status kd_assert_status_ = (expr);            \
    ASSERT_TRUE(kd_assert_status_.ok()) << kd_assert_status_; \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(KD_TEST_CONCAT(kd_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  ASSERT_TRUE(tmp.ok()) << tmp.status();          \
  lhs = std::move(tmp).value()

}  // namespace komputed
