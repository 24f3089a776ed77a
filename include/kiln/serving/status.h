#pragma once
// Status codes of the model server: gRPC's canonical codes (the numbers are gRPC's and
// TensorFlow's error::Code, and kiln::ErrorCode's: kiln/core/error.h, one taxonomy for
// every layer), and the HTTP status TensorFlow Serving answers for each. The server
// throws kiln's typed errors (UnavailableError, DeadlineExceededError, ...) like every
// other layer; status_of() turns any exception into a Status.
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln::serving {

enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view code_name(Code c);  // "INVALID_ARGUMENT", as gRPC and TensorFlow spell it

struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
};

// kiln::Error -> its code (the same number), std::bad_alloc -> RESOURCE_EXHAUSTED,
// anything else -> INTERNAL.
Status status_of(const std::exception& e);
Status status_of_current_exception();  // inside a catch block

// TensorFlow Serving's HTTP mapping: 400 invalid/failed precondition/out of range,
// 404 not found, 409 already exists/aborted, 429 resource exhausted, 499 cancelled,
// 501 unimplemented, 503 unavailable, 504 deadline exceeded, 500 otherwise.
int http_status(Code c);

// Throws the kiln::Error of a failed status (its code and message); nothing for OK.
void throw_if_error(const Status& s);

}  // namespace kiln::serving
