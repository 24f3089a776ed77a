#include "kiln/core/error.h"

namespace kiln {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kCancelled: return "Cancelled";
    case ErrorCode::kUnknown: return "Unknown";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kDeadlineExceeded: return "DeadlineExceeded";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kAlreadyExists: return "AlreadyExists";
    case ErrorCode::kPermissionDenied: return "PermissionDenied";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kFailedPrecondition: return "FailedPrecondition";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kOutOfRange: return "OutOfRange";
    case ErrorCode::kUnimplemented: return "Unimplemented";
    case ErrorCode::kInternal: return "Internal";
    case ErrorCode::kUnavailable: return "Unavailable";
    case ErrorCode::kDataLoss: return "DataLoss";
    case ErrorCode::kUnauthenticated: return "Unauthenticated";
  }
  return "Unknown";
}

void throw_error(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgumentError(message);
    case ErrorCode::kOutOfRange: throw OutOfRangeError(message);
    case ErrorCode::kNotFound: throw NotFoundError(message);
    case ErrorCode::kResourceExhausted: throw ResourceExhaustedError(message);
    case ErrorCode::kFailedPrecondition: throw FailedPreconditionError(message);
    case ErrorCode::kUnimplemented: throw UnimplementedError(message);
    case ErrorCode::kInternal: throw InternalError(message);
    case ErrorCode::kDataLoss: throw DataLossError(message);
    case ErrorCode::kCancelled: throw CancelledError(message);
    case ErrorCode::kDeadlineExceeded: throw DeadlineExceededError(message);
    case ErrorCode::kUnavailable: throw UnavailableError(message);
    case ErrorCode::kAborted: throw AbortedError(message);
    case ErrorCode::kAlreadyExists: throw AlreadyExistsError(message);
    default: throw Error(code, message);
  }
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code), message_(message) {}

}  // namespace kiln
