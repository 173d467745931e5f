// Status and Result in tests: assertions that print the error when they fail.
//
//   KILN_EXPECT_OK(device.drain(s));               // Status or Result<T>
//   KILN_ASSERT_OK(session.sync());
//   ASSERT_OK_AND_ASSIGN(Tensor t, s.from_host(v, {3}));
//   EXPECT_THAT(s.reshape(t, {7}), StatusIs(ErrorCode::IncompatibleShapes, "reshape"));
//   Tensor y = ok(s.exp(x));                       // the value; a failure is reported
//
// A bare EXPECT_TRUE(r.ok()) prints "false" and nothing of the error: use these instead.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "kiln/base/result.h"

namespace kiln::testing {

inline Status status_of(const Status& s) { return s; }
template <class T>
Status status_of(const Result<T>& r) {
  return r.status();
}

// For EXPECT_PRED_FORMAT1: success, or the expression and its error.
// Anything else with ok() (the plan cache's reports, ...) passes or fails on ok() alone.
template <class S>
::testing::AssertionResult IsOk(const char* expression, const S& value) {
  if constexpr (requires { status_of(value); }) {
    const Status st = status_of(value);
    if (st.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << expression << " failed: " << st.error().to_string();
  } else {
    if (value.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << expression << " is not ok";
  }
}

// The value of a Result a test expects to succeed. A failure is reported with its error, then
// thrown (GoogleTest ends the test and reports it), so that no test reads a value that is not
// there. Call it on the test's own thread.
template <class T>
T ok(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << "expected a value, got " << r.error().to_string();
    throw std::runtime_error("kiln::testing::ok: " + r.error().to_string());
  }
  return std::move(r).value();
}

// Matches an error Status or Result of `code` whose message contains `substring`.
MATCHER_P2(StatusIs, code, substring,
           std::string(negation ? "is not" : "is") + " an error " + error_code_name(code) + " containing \"" +
               std::string(substring) + "\"") {
  const Status st = ::kiln::testing::status_of(arg);
  if (st.ok()) {
    *result_listener << "which is ok";
    return false;
  }
  *result_listener << "which is " << st.error().to_string();
  return st.error().code == code && st.error().message.find(substring) != std::string::npos;
}

}  // namespace kiln::testing

#define KILN_EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::kiln::testing::IsOk, expr)
#define KILN_ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::kiln::testing::IsOk, expr)
#define KILN_ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                                                  \
  auto tmp = (expr);                                                                                    \
  ASSERT_TRUE(tmp.ok()) << #expr << " failed: " << ::kiln::testing::status_of(tmp).error().to_string(); \
  lhs = std::move(tmp).value()
#define ASSERT_OK_AND_ASSIGN(lhs, expr) KILN_ASSERT_OK_AND_ASSIGN_IMPL(KILN_CONCAT(_kiln_aoa_, __LINE__), lhs, expr)
