#pragma once
// kiln's typed error model.
//
// Every user mistake (bad shape, bad dtype, bad file, bad request) is reported by
// throwing a subclass of kiln::Error. The code says what kind of mistake it was, so
// that front ends can map it (e.g. to HTTP/gRPC status codes as TensorFlow Serving
// does); the message says what was expected and what came. kiln never aborts the
// process on bad input.
//
// One taxonomy for every layer: the codes are gRPC's and TensorFlow's canonical codes,
// with their numbers (OK aside), so the model server sends them as they are
// (kiln/serving/status.h) and a client sees what the library threw.
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

enum class ErrorCode : int {
  kCancelled = 1,           // the caller gave up (a client went away)
  kUnknown = 2,
  kInvalidArgument = 3,     // bad input, whatever the state
  kDeadlineExceeded = 4,    // a deadline passed before the work finished
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,   // memory, a queue, a limit
  kFailedPrecondition = 9,  // valid input, wrong state
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,           // a broken invariant of kiln itself
  kUnavailable = 14,        // not ready or shutting down: retry later
  kDataLoss = 15,           // corrupt or truncated data
  kUnauthenticated = 16,
};

std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }
  // The message without the "<CodeName>: " prefix that what() carries.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

#define KILN_DEFINE_ERROR(Name, Code)                                         \
  class Name : public Error {                                                 \
   public:                                                                    \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
  };
KILN_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument)
KILN_DEFINE_ERROR(OutOfRangeError, kOutOfRange)
KILN_DEFINE_ERROR(NotFoundError, kNotFound)
KILN_DEFINE_ERROR(ResourceExhaustedError, kResourceExhausted)
KILN_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition)
KILN_DEFINE_ERROR(UnimplementedError, kUnimplemented)
KILN_DEFINE_ERROR(InternalError, kInternal)
KILN_DEFINE_ERROR(DataLossError, kDataLoss)
KILN_DEFINE_ERROR(CancelledError, kCancelled)
KILN_DEFINE_ERROR(DeadlineExceededError, kDeadlineExceeded)
KILN_DEFINE_ERROR(UnavailableError, kUnavailable)
KILN_DEFINE_ERROR(AbortedError, kAborted)
KILN_DEFINE_ERROR(AlreadyExistsError, kAlreadyExists)
#undef KILN_DEFINE_ERROR

// Throws the error class of `code` (kiln::Error itself for the codes without one).
[[noreturn]] void throw_error(ErrorCode code, const std::string& message);

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kiln

// KILN_CHECK_ARG(cond, msg...) throws InvalidArgumentError with the streamed message.
#define KILN_CHECK_ARG(cond, ...)                                          \
  do {                                                                     \
    if (!(cond)) throw ::kiln::InvalidArgumentError(::kiln::detail::str_cat(__VA_ARGS__)); \
  } while (0)
// KILN_CHECK_INTERNAL(cond, msg...) guards invariants of kiln itself.
#define KILN_CHECK_INTERNAL(cond, ...)                                     \
  do {                                                                     \
    if (!(cond))                                                           \
      throw ::kiln::InternalError(::kiln::detail::str_cat(__FILE__, ":", __LINE__, ": ", __VA_ARGS__)); \
  } while (0)
