#include "kiln/serving/status.h"

#include <new>

#include "kiln/core/error.h"

namespace kiln::serving {

std::string_view code_name(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kCancelled: return "CANCELLED";
    case Code::kUnknown: return "UNKNOWN";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kAborted: return "ABORTED";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnimplemented: return "UNIMPLEMENTED";
    case Code::kInternal: return "INTERNAL";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDataLoss: return "DATA_LOSS";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Status status_of(const std::exception& e) {
  if (auto* ke = dynamic_cast<const Error*>(&e)) return {static_cast<Code>(ke->code()), ke->message()};
  if (dynamic_cast<const std::bad_alloc*>(&e)) return {Code::kResourceExhausted, "out of memory"};
  return {Code::kInternal, e.what()};
}

Status status_of_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return status_of(e);
  } catch (...) {
    return {Code::kInternal, "unknown exception"};
  }
}

void throw_if_error(const Status& s) {
  if (!s.ok()) throw_error(static_cast<ErrorCode>(s.code), s.message);
}

int http_status(Code c) {
  switch (c) {
    case Code::kOk: return 200;
    case Code::kCancelled: return 499;
    case Code::kInvalidArgument:
    case Code::kFailedPrecondition:
    case Code::kOutOfRange: return 400;
    case Code::kDeadlineExceeded: return 504;
    case Code::kNotFound: return 404;
    case Code::kAlreadyExists:
    case Code::kAborted: return 409;
    case Code::kPermissionDenied: return 403;
    case Code::kResourceExhausted: return 429;
    case Code::kUnimplemented: return 501;
    case Code::kUnavailable: return 503;
    case Code::kUnauthenticated: return 401;
    case Code::kUnknown:
    case Code::kInternal:
    case Code::kDataLoss: return 500;
  }
  return 500;
}

}  // namespace kiln::serving
