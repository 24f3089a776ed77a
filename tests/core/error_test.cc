// kiln's one error taxonomy (kiln/core/error.h): gRPC's canonical code numbers, a name
// per code, and throw_error raising the class of each code.
#include <string>

#include "kiln/core/error.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(ErrorCodes, AreGrpcCanonicalCodes) {
  EXPECT_EQ(static_cast<int>(ErrorCode::kCancelled), 1);
  EXPECT_EQ(static_cast<int>(ErrorCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(ErrorCode::kDeadlineExceeded), 4);
  EXPECT_EQ(static_cast<int>(ErrorCode::kNotFound), 5);
  EXPECT_EQ(static_cast<int>(ErrorCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(ErrorCode::kFailedPrecondition), 9);
  EXPECT_EQ(static_cast<int>(ErrorCode::kOutOfRange), 11);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnimplemented), 12);
  EXPECT_EQ(static_cast<int>(ErrorCode::kInternal), 13);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnavailable), 14);
  EXPECT_EQ(static_cast<int>(ErrorCode::kDataLoss), 15);
  EXPECT_EQ(static_cast<int>(ErrorCode::kUnauthenticated), 16);
}

TEST(ErrorCodes, ThrowErrorRaisesEachCodesClass) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<ErrorCode>(c);
    SCOPED_TRACE(std::string(error_code_name(code)));
    EXPECT_NE(error_code_name(code), "");
    try {
      throw_error(code, "what happened");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_EQ(e.message(), "what happened");
      EXPECT_EQ(std::string(e.what()), std::string(error_code_name(code)) + ": what happened");
    }
  }
  EXPECT_THROW(throw_error(ErrorCode::kUnavailable, "x"), UnavailableError);
  EXPECT_THROW(throw_error(ErrorCode::kDeadlineExceeded, "x"), DeadlineExceededError);
  EXPECT_THROW(throw_error(ErrorCode::kCancelled, "x"), CancelledError);
  EXPECT_THROW(throw_error(ErrorCode::kDataLoss, "x"), DataLossError);
}

}  // namespace
}  // namespace kiln
