#pragma once
// kiln's typed error model.
//
// Every user mistake (bad shape, bad dtype, bad file, bad request) is reported by
// throwing a subclass of kiln::Error. The code says what kind of mistake it was, so
// that front ends can map it (e.g. to HTTP/gRPC status codes as TensorFlow Serving
// does); the message says what was expected and what came. kiln never aborts the
// process on bad input.
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

enum class ErrorCode {
  kInvalidArgument,
  kOutOfRange,
  kNotFound,
  kResourceExhausted,
  kFailedPrecondition,
  kUnimplemented,
  kInternal,
  kDataLoss,
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
#undef KILN_DEFINE_ERROR

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
