// The test support library's assertions: they pass on success and, on failure, print the error.
#include "kiln/testing/status.h"

#include <gtest/gtest-spi.h>

#include <string>

namespace kiln::testing {
namespace {

using ::testing::Not;

Status failing() { return make_error(ErrorCode::IncompatibleShapes, "reshape: [2, 3] has 6 elements, not 7"); }
Result<int> value(int v) { return v; }
Result<int> no_value() { return make_error(ErrorCode::InvalidHandle, "t42 is not a tensor"); }

TEST(StatusAssertions, PassOnSuccess) {
  KILN_EXPECT_OK(Status::Ok());
  KILN_ASSERT_OK(value(3));
  ASSERT_OK_AND_ASSIGN(const int v, value(5));
  EXPECT_EQ(v, 5);
  EXPECT_EQ(ok(value(7)), 7);
}

TEST(StatusAssertions, FailuresPrintTheError) {
  EXPECT_NONFATAL_FAILURE(KILN_EXPECT_OK(failing()), "has 6 elements, not 7");
  EXPECT_NONFATAL_FAILURE(KILN_EXPECT_OK(no_value()), "t42 is not a tensor");
  EXPECT_FATAL_FAILURE(KILN_ASSERT_OK(failing()), "failing() failed");
  EXPECT_FATAL_FAILURE(
      {
        ASSERT_OK_AND_ASSIGN(const int v, no_value());
        (void)v;
      },
      "no_value() failed: InvalidHandle");
}

TEST(StatusAssertions, OkReportsAndStopsInsteadOfReadingNothing) {
  bool threw = false;
  EXPECT_NONFATAL_FAILURE(
      {
        try {
          (void)ok(no_value());
        } catch (const std::runtime_error&) {
          threw = true;
        }
      },
      "expected a value, got InvalidHandle");
  EXPECT_TRUE(threw);
}

TEST(StatusIsMatcher, MatchesCodeAndMessage) {
  EXPECT_THAT(failing(), StatusIs(ErrorCode::IncompatibleShapes, "not 7"));
  EXPECT_THAT(no_value(), StatusIs(ErrorCode::InvalidHandle, "t42"));
  EXPECT_THAT(failing(), Not(StatusIs(ErrorCode::InvalidHandle, "not 7"))) << "another code";
  EXPECT_THAT(failing(), Not(StatusIs(ErrorCode::IncompatibleShapes, "not 8"))) << "another message";
  EXPECT_THAT(Status::Ok(), Not(StatusIs(ErrorCode::Internal, "")));
  EXPECT_THAT(value(1), Not(StatusIs(ErrorCode::Internal, "")));
  const std::string explained = ::testing::DescribeMatcher<Status>(StatusIs(ErrorCode::Config, "max_plans"));
  EXPECT_EQ(explained, "is an error Config containing \"max_plans\"");
}

}  // namespace
}  // namespace kiln::testing
